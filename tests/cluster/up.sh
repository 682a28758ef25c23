#!/usr/bin/env bash
# Start (or reuse) jobgen's real Slurm test cluster on this machine.
#
#   tests/cluster/up.sh [--accounting|--no-accounting] [--restart]
#
# One controller namespace (slurmctld; slurmdbd + a private MariaDB with --accounting) and three
# compute nodes n1..n3, each its own slurmd in its own network, mount and UTS namespace, joined by a
# private bridge. Every file lives under $JOBGEN_CLUSTER_DIR (default /tmp/jobgen-cluster); clients
# need `source $JOBGEN_CLUSTER_DIR/env.sh`. See tests/cluster/README.md.
# Several clusters can run side by side: give each its own JOBGEN_CLUSTER_NAME (namespaces
# NAME-ctl, NAME-n1.., bridge NAME-br), JOBGEN_CLUSTER_NET and JOBGEN_CLUSTER_DIR.
#
# Running it again with the same mode and an unchanged config leaves a healthy cluster (and its jobs)
# alone; another mode, a changed config, an unhealthy cluster or --restart tears it down
# (tests/cluster/down.sh) and starts it afresh, with empty Slurm state and an empty accounting DB.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The cluster's name: the prefix of its namespaces, bridge and veths. The default one is "jobgen"
# (jobgen-ctl, jobgen-n1.., jobgen-br, veths jg-ctl, jg-n1..); another name needs its own net and dir.
NAME="${JOBGEN_CLUSTER_NAME:-jobgen}"
if ! [[ "$NAME" =~ ^[a-z][a-z0-9]{0,9}$ ]]; then
    echo "up.sh: JOBGEN_CLUSTER_NAME must be 1-10 lowercase letters or digits, got '$NAME'" >&2
    exit 2
fi
if [ "$NAME" != jobgen ] && { [ -z "${JOBGEN_CLUSTER_NET:-}" ] || [ -z "${JOBGEN_CLUSTER_DIR:-}" ]; }; then
    echo "up.sh: JOBGEN_CLUSTER_NAME=$NAME needs its own JOBGEN_CLUSTER_NET and JOBGEN_CLUSTER_DIR" >&2
    exit 2
fi
D="${JOBGEN_CLUSTER_DIR:-/tmp/jobgen-cluster}"
# First three octets of the private bridge's /24. Nothing else on the machine may use it.
NET="${JOBGEN_CLUSTER_NET:-10.77.77}"
WAIT_S="${JOBGEN_CLUSTER_WAIT_S:-45}"
# Queue limits (tests/slurm/test_queue_limits.py): slurm.conf's MaxJobCount and MinJobAge, and
# AccountingStorageEnforce (e.g. "limits": QOS and association MaxSubmitJobs hold; accounting only).
MAX_JOB_COUNT="${JOBGEN_CLUSTER_MAX_JOB_COUNT:-100000}"
MIN_JOB_AGE="${JOBGEN_CLUSTER_MIN_JOB_AGE:-3600}"
ENFORCE="${JOBGEN_CLUSTER_ENFORCE:-}"
for value in "$MAX_JOB_COUNT" "$MIN_JOB_AGE"; do
    [[ "$value" =~ ^[0-9]+$ ]] || { echo "up.sh: JOBGEN_CLUSTER_MAX_JOB_COUNT/MIN_JOB_AGE must be numbers, got '$value'" >&2; exit 2; }
done
[[ "$ENFORCE" =~ ^[a-z,]*$ ]] || { echo "up.sh: JOBGEN_CLUSTER_ENFORCE must be words like limits,qos, got '$ENFORCE'" >&2; exit 2; }
NODES=(n1 n2 n3)
BRIDGE="$NAME-br"
CTL_NS="$NAME-ctl"
VETH="$NAME"
[ "$NAME" != jobgen ] || VETH=jg   # the machine's end of each namespace's veth: $VETH-ctl, $VETH-n1..
CTL_IP="$NET.1"
HOST_IP="$NET.254"   # the machine's own leg on the bridge, so that sbatch/sacct here reach the controller
CTLD_PORT=6817
SLURMD_PORT=6818
DBD_PORT=6819
DB_PORT=3306
DAEMON_PATH=/usr/sbin:/usr/bin:/sbin:/bin

usage() {
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

accounting=1
restart=0
for arg in "$@"; do
    case "$arg" in
        --accounting) accounting=1 ;;
        --no-accounting) accounting=0 ;;
        --restart) restart=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "up.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done
mode=accounting
[ "$accounting" = 1 ] || mode=no-accounting

if [ "$(id -u)" != 0 ]; then
    echo "up.sh: must run as root (it creates network namespaces and starts Slurm daemons as root)" >&2
    exit 1
fi
if ! [[ "$NET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "up.sh: JOBGEN_CLUSTER_NET must be three octets like 10.77.77, got '$NET'" >&2
    exit 2
fi

start_s=$SECONDS
mkdir -p "$D"
# Two test processes may call up.sh at once; the second waits and then finds the cluster healthy.
if [ -z "${JOBGEN_CLUSTER_LOCKED:-}" ]; then
    exec 9>"$D/.lock"
    flock -w 300 9 || { echo "up.sh: could not lock $D/.lock within 300 s" >&2; exit 1; }
    export JOBGEN_CLUSTER_LOCKED=1   # down.sh, called below, must not wait for our own lock
fi

# ---------------------------------------------------------------- packages
# charliecloud-runtime: ch-run, the container runtime the container tests run for real (unprivileged).
packages=(slurmctld slurmd slurm-client shellcheck iproute2 util-linux charliecloud-runtime)
[ "$accounting" = 1 ] && packages+=(slurmdbd mariadb-server)
missing=()
for p in "${packages[@]}"; do
    if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != installed ]; then
        missing+=("$p")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "up.sh: installing ${missing[*]}"
    # Package scripts must not start system-wide daemons: we run private ones. Docker-style images
    # already carry a policy-rc.d that says so; add one for the install only where it is missing.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    apt_opts=(-q -y --no-install-recommends -o DPkg::Lock::Timeout=300)
    DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300 update >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" "${missing[@]}" >"$D/apt.log" 2>&1 \
        || { tail -n 30 "$D/apt.log" >&2; [ "$own_policy" = 1 ] && rm -f "$policy"; exit 1; }
    [ "$own_policy" = 1 ] && rm -f "$policy"
    echo "up.sh: packages installed after $((SECONDS - start_s)) s"
fi

# ---------------------------------------------------------------- configuration
ETC="$D/etc"
CONF="$ETC/slurm.conf"
HOSTS="$ETC/hosts"
new="$D/etc.new"
rm -rf "$new"
mkdir -p "$new"

node_ip() { # n1 -> $NET.11
    echo "$NET.$((10 + ${1#n}))"
}

{
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    echo "$CTL_IP ctl"
    for n in "${NODES[@]}"; do echo "$(node_ip "$n") $n"; done
} >"$new/hosts"

if [ "$accounting" = 1 ]; then
    acct_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$CTL_IP
AccountingStoragePort=$DBD_PORT
AccountingStoreFlags=job_script${ENFORCE:+
AccountingStorageEnforce=$ENFORCE}"
else
    acct_lines="AccountingStorageType=accounting_storage/none"
fi

cat >"$new/slurm.conf" <<EOF
# Written by tests/cluster/up.sh ($mode). Edit the script, not this file.
ClusterName=jobgen
SlurmctldHost=ctl($CTL_IP)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$D/state/ctld
SlurmdSpoolDir=$D/spool/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# A job's tasks run at the nice value of the sbatch that submitted it, not at slurmd's: the probe
# test's timed jobs run at a higher CPU priority than the rest of the suite (tests/slurm/test_probe.py).
PropagatePrioProcess=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Schedule often (defaults 60 s / 30 s): a requeued or dependent job should not idle in a test.
SchedulerParameters=sched_interval=5,bf_interval=5
# A requeued job may start again only after the credential lifetime (default 120 s; Slurm's least 5 s):
# measured, a requeued job waited 22 s at 20, 6 s at 5. Each job step's launch must reach its slurmd
# within it ("credential expired" otherwise), so not the least on a busy 2-core machine: 10 s.
AuthInfo=cred_expire=10
MpiDefault=none
# Nodes advertise 64 CPUs / 512000 MB / 4 GPUs (a typical 4-GPU node) whatever this box has.
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
JobRequeue=1
# Small on purpose: jobgen must split larger sweeps into several arrays.
MaxArraySize=11
# Finished jobs stay visible to scontrol/squeue for an hour (status without accounting).
MinJobAge=$MIN_JOB_AGE
# With them held that long, the default limit (10,000 jobs) would refuse bench/bench_scale.py's sweeps of
# 10,000; a limit costs nothing until jobs fill it. (Queue-limit tests start a cluster with a low one.)
MaxJobCount=$MAX_JOB_COUNT
KillWait=10
InactiveLimit=0
GresTypes=gpu
$acct_lines
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
EOF
for n in "${NODES[@]}"; do
    echo "NodeName=$n NodeHostname=$n NodeAddr=$(node_ip "$n") CPUs=64 RealMemory=512000 Gres=gpu:4 State=UNKNOWN"
done >>"$new/slurm.conf"
nodelist="n[1-${#NODES[@]}]"
cat >>"$new/slurm.conf" <<EOF
PartitionName=debug Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$nodelist MaxTime=7-00:00:00 State=UP
EOF
# Preemption (tests/slurm/test_preemption.py): a job in `high` preempts the jobs in `low` (tier 1 > 0)
# that hold what it needs: Slurm sends them SIGTERM, and after GraceTime kills and requeues them.
# debug and gpu keep the default tier, 1, as high: nothing preempts their jobs.
cat >>"$new/slurm.conf" <<EOF
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=low Nodes=$nodelist MaxTime=INFINITE PriorityTier=0 GraceTime=30 State=UP
PartitionName=high Nodes=$nodelist MaxTime=INFINITE PriorityTier=1 State=UP
EOF

# Fake GPUs: character devices (a regular file is refused, and Count= alone drains the node).
cat >"$new/gres.conf" <<EOF
AutoDetect=off
NodeName=$nodelist Name=gpu File=$D/dev/nvidia[0-3]
EOF

if [ "$accounting" = 1 ]; then
    cat >"$new/slurmdbd.conf" <<EOF
AuthType=auth/none
DbdHost=ctl
DbdAddr=$CTL_IP
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$D/log/slurmdbd.log
PidFile=$D/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$new/slurmdbd.conf"
    # Runs at every MariaDB start: the accounting DB starts empty, like the Slurm state.
    cat >"$new/mariadb-init.sql" <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';
DROP DATABASE IF EXISTS slurm_acct_db;
EOF
fi

# ---------------------------------------------------------------- helpers
ns_inode() { stat -L -c %i "/run/netns/$1" 2>/dev/null || true; }

# pid_in_ns PIDFILE NS: the recorded pid is alive and lives in our namespace NS.
pid_in_ns() {
    local pid ino
    pid="$(cat "$1" 2>/dev/null || true)"
    ino="$(ns_inode "$2")"
    [ -n "$pid" ] && [ -n "$ino" ] && [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null || true)" = "net:[$ino]" ]
}

export SLURM_CONF="$CONF"

healthy() {
    [ "$(cat "$D/mode" 2>/dev/null || true)" = "$mode" ] || return 1
    local f
    for f in "$new"/*; do
        cmp -s "$f" "$ETC/$(basename "$f")" || return 1
    done
    pid_in_ns "$D/run/slurmctld.pid" "$CTL_NS" || return 1
    if [ "$accounting" = 1 ]; then
        pid_in_ns "$D/run/slurmdbd.pid" "$CTL_NS" || return 1
        pid_in_ns "$D/run/mariadb.pid" "$CTL_NS" || return 1
    fi
    for n in "${NODES[@]}"; do
        pid_in_ns "$D/run/slurmd-$n.pid" "$NAME-$n" || return 1
    done
    timeout 10 scontrol ping >/dev/null 2>&1 || return 1
    local bad
    bad="$(timeout 10 sinfo -h -N -p debug -o '%T' 2>/dev/null | grep -Ei 'down|drain|fail|inval|unk|not_resp|\*' || true)"
    [ -z "$bad" ]
}

print_env() {
    echo "up.sh: cluster up ($mode) in $((SECONDS - start_s)) s: nodes ${NODES[*]}, partitions debug (default), gpu"
    echo "export SLURM_CONF=$CONF    # or: source $D/env.sh"
}

if [ "$restart" = 0 ] && healthy; then
    rm -rf "$new"
    print_env
    exit 0
fi

fail() {
    echo "up.sh: ERROR: $*" >&2
    local f
    for f in "$D"/log/*.log "$D"/log/*.out; do
        [ -s "$f" ] || continue
        echo "---- tail of $f" >&2
        tail -n 15 "$f" >&2
    done
    echo "up.sh: daemons left running for debugging; tests/cluster/down.sh stops them" >&2
    exit 1
}

# wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.2 s until it succeeds.
wait_for() {
    local limit="$1" what="$2"
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || fail "$what not ready after $limit s"
        sleep 0.2
    done
}

# ns_start [--fork] NS HOSTNAME COMMAND...: run COMMAND in network namespace NS, in a fresh mount
# namespace (slave propagation: it sees the machine's filesystem, its own bind of our hosts file stays
# private) and UTS namespace (its own hostname). nsenter, not `ip netns exec`: the latter remounts /sys
# and slurmd dies. setsid + env -i: daemons leave the caller's session and environment behind; 9>&-:
# they must not inherit (and so hold for ever) our lock.
# --fork is for a program that does not daemonize itself (mariadbd): no shell of ours stays its
# parent, holding the caller's stdout open.
ns_start() {
    local detach=(setsid)
    if [ "$1" = --fork ]; then detach=(setsid --fork); shift; fi
    local ns="$1" host="$2"
    shift 2
    # shellcheck disable=SC2016  # $1 $2 $@ belong to the inner sh
    "${detach[@]}" env -i PATH="$DAEMON_PATH" LANG=C.UTF-8 SLURM_CONF="$CONF" \
        nsenter --net="/run/netns/$ns" unshare --mount --propagation slave --uts \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' \
        sh "$HOSTS" "$host" "$@" </dev/null >>"$D/log/$host.out" 2>&1 9>&-
}

# shellcheck disable=SC2016  # $0 $1 belong to the inner bash
tcp_open() { timeout 1 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2"; }

# ---------------------------------------------------------------- (re)start
# The bridge's /24 must be ours alone (checked before anything is stopped).
taken="$( { ip -o -4 addr show to "$NET.0/24"; ip -4 route show to match "$NET.1"; } 2>/dev/null \
    | grep -v -e "$BRIDGE" -e "^default " | tr -s "\n\\\\ " " " || true)"
if [ -n "$taken" ]; then
    echo "up.sh: $NET.0/24 is already in use on this machine: $taken; choose another JOBGEN_CLUSTER_NET" >&2
    exit 1
fi
"$here/down.sh" >/dev/null

rm -rf "${ETC:?}" "${D:?}/state" "${D:?}/spool" "${D:?}/log" "${D:?}/run" "${D:?}/dev" "${D:?}/mode" "${D:?}/env.sh" "${D:?}/tmp"
mv "$new" "$ETC"
mkdir -p "$D/state/ctld" "$D/spool" "$D/log" "$D/run" "$D/dev"
for i in 0 1 2 3; do
    mknod -m 666 "$D/dev/nvidia$i" c 1 3
done

# Network: bridge (machine's leg $HOST_IP) + one veth per namespace. No default route inside: the
# cluster's traffic stays on this bridge and on each namespace's loopback.
printf 'name=%s\nbridge=%s\nnamespaces=%s\n' "$NAME" "$BRIDGE" "$CTL_NS ${NODES[*]/#/$NAME-}" >"$D/cluster.state"
ip link add "$BRIDGE" type bridge
# Bridged frames need not pass the machine's iptables (net.bridge.bridge-nf-call-iptables=1 here).
ip link set "$BRIDGE" type bridge nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0 2>/dev/null || true
ip addr add "$HOST_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
add_ns() { # NS IP VETH
    # A veth of a namespace deleted a moment ago may still be there: the kernel removes it later.
    local tries=0
    while ip link show "$3" >/dev/null 2>&1; do
        ip link delete "$3" 2>/dev/null || true
        tries=$((tries + 1))
        [ "$tries" -lt 50 ] || fail "link $3 is still there after 10 s; tests/cluster/down.sh removes it"
        sleep 0.2
    done
    ip netns add "$1"
    ip link add "$3" type veth peer name eth0 netns "$1"
    ip link set "$3" master "$BRIDGE" up
    ip -n "$1" link set lo up
    ip -n "$1" addr add "$2/24" dev eth0
    ip -n "$1" link set eth0 up
}
add_ns "$CTL_NS" "$CTL_IP" "$VETH-ctl"
for n in "${NODES[@]}"; do
    add_ns "$NAME-$n" "$(node_ip "$n")" "$VETH-$n"
done

if [ "$accounting" = 1 ]; then
    # Each cluster's MariaDB has a temporary folder of its own: a server starting removes every
    # "#sql*" file in its tmpdir, so with the machine's /tmp shared, one cluster's start deleted
    # another's install tables halfway ("Unknown table 'mysql.tmp_user_sys'") when several started
    # at once.
    mkdir -p "$D/tmp"
    if [ ! -d "$D/db/mysql" ]; then
        rm -rf "$D/db"
        mariadb-install-db --no-defaults --datadir="$D/db" --tmpdir="$D/tmp" --user=root --skip-test-db \
            --auth-root-authentication-method=socket >"$D/log/mariadb-install.log" 2>&1 \
            || fail "mariadb-install-db failed (see $D/log/mariadb-install.log)"
    fi
    ns_start --fork "$CTL_NS" ctl mariadbd --no-defaults --datadir="$D/db" --tmpdir="$D/tmp" --user=root \
        --socket="$D/run/mariadb.sock" --pid-file="$D/run/mariadb.pid" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --skip-name-resolve --skip-log-bin --log-error="$D/log/mariadb.log" \
        --init-file="$ETC/mariadb-init.sql" --innodb-buffer-pool-size=64M \
        --innodb-flush-log-at-trx-commit=0
    wait_for 30 MariaDB mariadb-admin --no-defaults --socket="$D/run/mariadb.sock" -uroot ping
    wait_for 10 "MariaDB's pid file" test -s "$D/run/mariadb.pid"
    ns_start "$CTL_NS" ctl slurmdbd || fail "slurmdbd did not start"
    wait_for 30 slurmdbd tcp_open "$CTL_IP" "$DBD_PORT"
fi

ns_start "$CTL_NS" ctl slurmctld -i -f "$CONF" || fail "slurmctld did not start"
wait_for 30 slurmctld scontrol ping
for n in "${NODES[@]}"; do
    ns_start "$NAME-$n" "$n" slurmd -f "$CONF" -N "$n" || fail "slurmd $n did not start"
done

# Jobs submitted before the nodes are idle can sit pending with ReqNodeNotAvail.
deadline=$((SECONDS + WAIT_S))
while :; do
    states="$(timeout 10 sinfo -h -N -p debug -o '%N=%T' 2>/dev/null || true)"
    if grep -Eqi 'inval|drain' <<<"$states"; then
        fail "a node is invalid or drained: $(timeout 10 sinfo -h -R 2>&1 | tr '\n' ';')"
    fi
    idle="$(grep -c '=idle$' <<<"$states" || true)"
    [ "$idle" = "${#NODES[@]}" ] && break
    [ "$SECONDS" -lt "$deadline" ] || fail "nodes not idle after $WAIT_S s: $(tr '\n' ' ' <<<"$states")"
    sleep 0.2
done
if [ "$accounting" = 1 ]; then
    # slurmctld registers the cluster in the DB on its own; sacct answers once it has.
    wait_for 30 "the cluster's accounting record" sh -c 'sacctmgr -n -P list cluster format=cluster | grep -qx jobgen'
fi

printf 'export SLURM_CONF=%q\nexport JOBGEN_CLUSTER_DIR=%q\nexport JOBGEN_CLUSTER_NAME=%q\n' "$CONF" "$D" "$NAME" >"$D/env.sh"
echo "$mode" >"$D/mode"
print_env
