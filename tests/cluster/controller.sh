#!/usr/bin/env bash
# Stop or start the test cluster's slurmctld alone, keeping its state (jobs survive), to test what
# users see when the controller goes away mid-sweep.
#   tests/cluster/controller.sh stop|start
set -euo pipefail
D="${JOBGEN_CLUSTER_DIR:-/tmp/jobgen-cluster}"
# The controller's namespace: NAME-ctl for the cluster named in $D/cluster.state (up.sh writes it).
NAME="$(sed -n 's/^name=//p' "$D/cluster.state" 2>/dev/null || true)"
CTL_NS="${NAME:-jobgen}-ctl"
CONF="$D/etc/slurm.conf"
HOSTS="$D/etc/hosts"
PID_FILE="$D/run/slurmctld.pid"
DAEMON_PATH=/usr/sbin:/usr/bin:/sbin:/bin

stop() {
    local pid
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    # Only the controller up.sh started: its pid must live in the controller's network namespace.
    [ "$(readlink "/proc/$pid/ns/net")" = "$(readlink -f "/run/netns/$CTL_NS" | xargs stat -L -c 'net:[%i]')" ] \
        || { echo "controller.sh: pid $pid is not in $CTL_NS; not killing it" >&2; exit 1; }
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    echo "controller.sh: slurmctld (pid $pid) did not stop" >&2
    exit 1
}

start() {
    # shellcheck disable=SC2016  # $1 $2 $@ belong to the inner sh
    setsid env -i PATH="$DAEMON_PATH" LANG=C.UTF-8 SLURM_CONF="$CONF" \
        nsenter --net="/run/netns/$CTL_NS" unshare --mount --propagation slave --uts \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
        sh "$HOSTS" ctl slurmctld -f "$CONF" </dev/null >>"$D/log/ctl.out" 2>&1 9>&-
    for _ in $(seq 150); do
        SLURM_CONF="$CONF" scontrol ping 2>/dev/null | grep -q UP && return 0
        sleep 0.2
    done
    echo "controller.sh: slurmctld did not answer in 30 s (see $D/log/slurmctld.log)" >&2
    exit 1
}

case "${1:-}" in
    stop) stop ;;
    start) start ;;
    *) echo "usage: $0 stop|start" >&2; exit 2 ;;
esac
