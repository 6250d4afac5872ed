#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying hydra/launcher=slurm and for tests/test_slurm.py.
#
#   scripts/slurm_local.sh start [--dir DIR]    install slurm-wlm and munge if missing (apt-get, as root), write the
#                                              config, start munged, slurmctld and slurmd, wait until the node is idle
#   eval "$(scripts/slurm_local.sh env)"       point sbatch, squeue, scontrol (and submitit) at this cluster
#   scripts/slurm_local.sh status | stop | install    (each command takes --dir DIR)
#
# Every file it writes lies under one folder (DIR, default $HEADCOUNT_SLURM_DIR or /tmp/headcount-slurm): slurm.conf,
# the munge key and socket, daemon state, pid files and logs. Nothing goes to /etc: the commands find the cluster
# through SLURM_CONF (`env` prints it). Running `start` twice leaves the running cluster alone; `stop` cancels the
# cluster's jobs and stops the daemons, and keeps DIR for its logs (remove it with rm -r). slurmctld and slurmd
# listen on ports 6817 and 6818, or $HEADCOUNT_SLURM_PORT and the next one.
#
# The cluster: one node (this machine's CPUs and memory, from `slurmd -C`), one default partition `local`, daemons
# running as root and talking over 127.0.0.1. Inside a container there are no cgroups to confine jobs to, so
# processes are tracked by parentage (proctrack/linuxproc) and tasks are not bound to cores (task/none). JobRequeue=0,
# as on many clusters: only a job submitted with `sbatch --requeue` may be requeued, as conf/hydra/launcher/slurm.yaml
# asks, so tests/test_slurm.py fails if it stops asking. Requeued jobs may start again after 10 s (Slurm's default:
# 120). No accounting database: `sacct` fails (submitit warns, then learns that a job ended from its result file).
set -euo pipefail

DIR="${HEADCOUNT_SLURM_DIR:-/tmp/headcount-slurm}"
CTLD_PORT="${HEADCOUNT_SLURM_PORT:-6817}"  # slurmd listens on the next port
PARTITION=local

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

command="${1:-}"
[[ -n "$command" ]] || usage
shift
while [[ $# -gt 0 ]]; do
    case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --dir=*) DIR="${1#--dir=}"; shift ;;
    *) usage ;;
    esac
done
DIR="$(realpath -m "$DIR")"
CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/run/munge.socket"  # its folder must be searchable by all; the key's is private
export SLURM_CONF="$CONF"

say() { echo "slurm_local: $*"; }
die() { echo "slurm_local: error: $*" >&2; exit 1; }

installed() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null; }

install_packages() {
    if installed; then
        say "slurm-wlm and munge are installed ($(slurmctld -V))"
        return
    fi
    [[ $EUID -eq 0 ]] || die "slurm-wlm and munge are missing; installing them needs root (apt-get)"
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get to install them"
    say "installing slurm-wlm and munge with apt-get"
    # Whatever services the packages start read /etc; the daemons below run from DIR, on their own socket and ports.
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge >"$DIR/apt.log" 2>&1 \
        || { apt-get update >>"$DIR/apt.log" 2>&1 \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge \
                >>"$DIR/apt.log" 2>&1; } \
        || die "apt-get could not install slurm-wlm and munge (see $DIR/apt.log)"
    installed || die "apt-get ran but slurmctld, slurmd, sbatch or munged is still missing (see $DIR/apt.log)"
    say "installed $(slurmctld -V)"
}

pid_file() { echo "$DIR/run/$1.pid"; }

alive() {  # alive munged|slurmctld|slurmd: its pid file names a running process of that name (not a reused pid)
    local pid
    pid="$(cat "$(pid_file "$1")" 2>/dev/null)" && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$1" ]]
}

write_config() {
    local node
    # `slurmd -C` prints this machine as a node line: NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
    node="$(slurmd -C | head -1)"
    [[ "$node" == NodeName=* ]] || die "slurmd -C printed no node line: $node"
    NODE_NAME="${node%% *}"
    NODE_NAME="${NODE_NAME#NodeName=}"
    cat >"$CONF.new" <<EOF
# Written by scripts/slurm_local.sh: a one-node cluster on this machine. Use it with SLURM_CONF=$CONF.
ClusterName=headcount
SlurmctldHost=$NODE_NAME(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (Slurm's default: 120 s)
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$DIR/state/slurmctld
SlurmdSpoolDir=$DIR/state/slurmd
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2  # a requeued job starts within seconds once eligible
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobRequeue=0
ReturnToService=2
KillWait=30  # seconds between SIGTERM and SIGKILL when a job is cancelled or requeued
MailProg=/bin/true
MinJobAge=600  # a finished job stays visible to scontrol (its Restarts count) for 10 min
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE_NAME Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.new" "$CONF"
    say "wrote $CONF ($node)"
}

start_munged() {
    if alive munged; then
        say "munged is running (pid $(cat "$(pid_file munged)"))"
        return
    fi
    if [[ ! -f "$DIR/munge/munge.key" ]]; then
        mungekey --create --keyfile="$DIR/munge/munge.key"
        say "created the munge key $DIR/munge/munge.key"
    fi
    chmod 600 "$DIR/munge/munge.key"
    munged --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCKET" --pid-file="$(pid_file munged)" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
    say "started munged (socket $MUNGE_SOCKET)"
}

start_daemon() {  # start_daemon slurmctld|slurmd
    if alive "$1"; then
        say "$1 is running (pid $(cat "$(pid_file "$1")"))"
        return
    fi
    # slurmctld -c: a fresh start forgets jobs of an earlier session (this cluster is for trying things out).
    if [[ "$1" == slurmctld ]]; then slurmctld -c -f "$CONF"; else slurmd -f "$CONF"; fi
    say "started $1 (log $DIR/log/$1.log)"
}

wait_until_idle() {
    local state=""
    for _ in $(seq 60); do
        state="$(sinfo -h -n "$NODE_NAME" -o %T 2>/dev/null || true)"
        if [[ "$state" == idle || "$state" == mixed || "$state" == allocated ]]; then
            say "node $NODE_NAME is $state in partition $PARTITION; the cluster is up"
            return
        fi
        sleep 0.5
    done
    die "node $NODE_NAME is not idle after 30 s (state: '${state:-no answer}'); see $DIR/log/"
}

start() {
    [[ $EUID -eq 0 ]] || die "the local cluster's daemons run as root"
    mkdir -p "$DIR"/{munge,run,log,state/slurmctld,state/slurmd}
    # munged's socket must be reachable by all: DIR and every folder above it open to all, only the key private.
    chmod 755 "$DIR"
    chmod 700 "$DIR/munge"
    chmod 755 "$DIR/run"
    install_packages
    if alive slurmctld && alive slurmd; then
        say "already running in $DIR"
        NODE_NAME="$(slurmd -C | head -1 | sed 's/^NodeName=\([^ ]*\).*/\1/')"
    else
        write_config
        start_munged
        start_daemon slurmctld
        start_daemon slurmd
    fi
    wait_until_idle
    say "use it with: export SLURM_CONF=$CONF"
}

stop() {
    if [[ -f "$CONF" ]] && alive slurmctld; then
        local jobs
        jobs="$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
        if [[ -n "${jobs// /}" ]]; then
            scancel --full $jobs && say "cancelled jobs $jobs"
            sleep 1
        fi
    fi
    for daemon in slurmd slurmctld munged; do
        if alive "$daemon"; then
            local pid
            pid="$(cat "$(pid_file "$daemon")")"
            kill "$pid"
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
            say "stopped $daemon (pid $pid)"
        else
            say "$daemon is not running"
        fi
        rm -f "$(pid_file "$daemon")"
    done
    say "files kept in $DIR (logs under $DIR/log); remove them with: rm -r $DIR"
}

status() {
    for daemon in munged slurmctld slurmd; do
        if alive "$daemon"; then say "$daemon running (pid $(cat "$(pid_file "$daemon")"))"
        else say "$daemon not running"; fi
    done
    if alive slurmctld; then sinfo; squeue; fi
}

case "$command" in
start) start ;;
stop) stop ;;
status) status ;;
install) mkdir -p "$DIR" && install_packages ;;
env) echo "export SLURM_CONF=$CONF" ;;
*) usage ;;
esac
