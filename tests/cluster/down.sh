#!/usr/bin/env bash
# Stop jobgen's Slurm test cluster (tests/cluster/up.sh) and remove its namespaces and bridge.
#
#   tests/cluster/down.sh                    # the default cluster (/tmp/jobgen-cluster)
#   JOBGEN_CLUSTER_NAME=NAME JOBGEN_CLUSTER_DIR=DIR tests/cluster/down.sh   # another one
#
# Order: cancel jobs; stop the daemons by their recorded pids; kill whatever is still left inside the
# cluster's own network namespaces (slurmstepd, job tasks); delete the namespaces and the bridge.
# Nothing is killed by name. Safe to run when nothing is up. Files under $JOBGEN_CLUSTER_DIR stay
# (logs for debugging); up.sh wipes the Slurm state when it starts again.
set -euo pipefail

D="${JOBGEN_CLUSTER_DIR:-/tmp/jobgen-cluster}"
# The names up.sh uses for the cluster named $JOBGEN_CLUSTER_NAME (default jobgen); the cluster.state
# that up.sh left in $D records them too and wins: down.sh stops the cluster of that directory only.
NAME="${JOBGEN_CLUSTER_NAME:-jobgen}"
if ! [[ "$NAME" =~ ^[a-z][a-z0-9]{0,9}$ ]]; then
    echo "down.sh: JOBGEN_CLUSTER_NAME must be 1-10 lowercase letters or digits, got '$NAME'" >&2
    exit 2
fi
if [ "$NAME" != jobgen ] && [ -z "${JOBGEN_CLUSTER_DIR:-}" ]; then
    echo "down.sh: JOBGEN_CLUSTER_NAME=$NAME needs its JOBGEN_CLUSTER_DIR" >&2
    exit 2
fi
BRIDGE="$NAME-br"
NAMESPACES=("$NAME-ctl" "$NAME-n1" "$NAME-n2" "$NAME-n3")
if [ -r "$D/cluster.state" ]; then
    b="$(sed -n 's/^bridge=//p' "$D/cluster.state")"
    ns="$(sed -n 's/^namespaces=//p' "$D/cluster.state")"
    [ -z "$b" ] || BRIDGE="$b"
    # shellcheck disable=SC2206  # a space-separated list of plain names
    [ -z "$ns" ] || NAMESPACES=($ns)
fi

if [ "$(id -u)" != 0 ]; then
    echo "down.sh: must run as root" >&2
    exit 1
fi
if [ -d "$D" ] && [ -z "${JOBGEN_CLUSTER_LOCKED:-}" ]; then
    exec 9>"$D/.lock"
    flock -w 300 9 || { echo "down.sh: could not lock $D/.lock within 300 s" >&2; exit 1; }
fi

ns_inode() { stat -L -c %i "/run/netns/$1" 2>/dev/null || true; }

# Inodes of our network namespaces: a process belongs to the cluster iff its netns is one of them.
inodes=()
for ns in "${NAMESPACES[@]}"; do
    ino="$(ns_inode "$ns")"
    [ -z "$ino" ] || inodes+=("net:[$ino]")
done

ours() { # PID: lives in one of our network namespaces
    local link i
    link="$(readlink "/proc/$1/ns/net" 2>/dev/null)" || return 1
    for i in "${inodes[@]}"; do
        [ "$link" = "$i" ] && return 0
    done
    return 1
}

pids_in_namespaces() {
    local p pid
    [ "${#inodes[@]}" -gt 0 ] || return 0
    for p in /proc/[0-9]*; do
        pid="${p#/proc/}"
        if ours "$pid"; then echo "$pid"; fi
    done
}

# wait_gone SECONDS PID...: wait until none of the pids is alive.
wait_gone() {
    local deadline=$((SECONDS + $1)) pid alive
    shift
    while :; do
        alive=0
        for pid in "$@"; do
            if kill -0 "$pid" 2>/dev/null; then alive=1; fi
        done
        [ "$alive" = 1 ] && [ "$SECONDS" -lt "$deadline" ] || return 0
        sleep 0.2
    done
}

# 1. Jobs first, while slurmctld still answers, so that slurmd ends their steps properly.
export SLURM_CONF="$D/etc/slurm.conf"
if [ "${#inodes[@]}" -gt 0 ] && [ -r "$SLURM_CONF" ] && timeout 5 scontrol ping >/dev/null 2>&1; then
    mapfile -t jobs < <(timeout 10 squeue -h -o %A 2>/dev/null || true)
    if [ "${#jobs[@]}" -gt 0 ]; then
        echo "down.sh: cancelling jobs ${jobs[*]}" >&2
        timeout 10 scancel "${jobs[@]}" 2>/dev/null || true
        deadline=$((SECONDS + 15))
        while [ -n "$(timeout 5 squeue -h -o %A 2>/dev/null || true)" ] && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.3
        done
    fi
fi

# 2. Daemons, by their recorded pids (checked to be ours, in case a pid was reused).
daemons=()
for f in "$D"/run/slurmd-*.pid "$D/run/slurmctld.pid" "$D/run/slurmdbd.pid" "$D/run/mariadb.pid"; do
    [ -r "$f" ] || continue
    pid="$(cat "$f")"
    if [ -n "$pid" ] && ours "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        daemons+=("$pid")
    fi
done
[ "${#daemons[@]}" = 0 ] || wait_gone 15 "${daemons[@]}"

# 3. Anything left in the namespaces: slurmstepd, job tasks, daemons that ignored TERM.
mapfile -t left < <(pids_in_namespaces)
if [ "${#left[@]}" -gt 0 ]; then
    kill -TERM "${left[@]}" 2>/dev/null || true
    wait_gone 5 "${left[@]}"
    mapfile -t left < <(pids_in_namespaces)
    if [ "${#left[@]}" -gt 0 ]; then
        kill -KILL "${left[@]}" 2>/dev/null || true
        wait_gone 5 "${left[@]}"
    fi
fi

# 4. Veths, namespaces and the bridge. Each veth is deleted by name first: a namespace's own veth
# only goes when the kernel tears the namespace down, later and in the background, and a lingering
# one makes the next up.sh fail with "RTNETLINK answers: File exists".
if ip link show "$BRIDGE" >/dev/null 2>&1; then
    while read -r veth; do
        [ -z "$veth" ] || ip link delete "$veth" 2>/dev/null || true
    done < <(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}')
fi
for ns in "${NAMESPACES[@]}"; do
    [ ! -e "/run/netns/$ns" ] || ip netns delete "$ns"
done
if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link delete "$BRIDGE"
fi
rm -f "$D/mode" "$D/env.sh" "$D"/run/*.pid
echo "down.sh: cluster stopped"
