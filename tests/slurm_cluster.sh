#!/usr/bin/env bash
# A real single-node SLURM cluster (with accounting) on this machine, for integration tests.
#
#   slurm_cluster.sh start|stop|status|env [STATE_DIR]
#
# STATE_DIR defaults to ${SLURM_TEST_DIR:-/tmp/sacglam-slurm}; SLURM_TEST_CPUS sets the node's CPU
# count (default: max(nproc, 8)). Everything the cluster needs lives
# there: configs, spool and state, logs, pid files, the munge key and socket, the MariaDB data dir
# and socket, slurmdbd files. The only thing written outside it: symlinks /etc/slurm/slurm.conf and
# gres.conf to the generated files, made only where those paths do not exist yet (jobs' nested srun
# and Snakemake's slurm plugin read the compiled-in /etc/slurm/slurm.conf), and removed by `stop`.
#
# Daemons, started in this order: a private munged (as user munge), a private MariaDB (as user
# mysql, on 127.0.0.1 with a free port), slurmdbd, slurmctld -i and slurmd -N localhost.
# The node has 4 fake GPUs of GRES type `fake` (gres files that are symlinks to /dev/null).
#
#   eval "$(tests/slurm_cluster.sh env)"   # SLURM_CONF for sbatch/squeue/sacct/...
#
# Must run as root. `stop` kills only the processes whose pid files lie under STATE_DIR (and checks
# that they really are those daemons, started with this STATE_DIR).
set -euo pipefail

readonly PROG=slurm_cluster
readonly PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
readonly CLUSTER_NAME=sacglam
readonly CTLD_PORT=6817 SLURMD_PORT=6818 DBD_PORT=6819
readonly NGPUS=4
readonly GPU_TYPE=fake # typed, as a site's gpu:a100: jobs may ask for gpu:fake:4 or gpu:4
readonly START_TIMEOUT=60 # seconds until the node must be idle
readonly STOP_TIMEOUT=20  # seconds a daemon gets to exit after SIGTERM, before SIGKILL
readonly ETC_SLURM=/etc/slurm

log() { echo "$PROG: $*" >&2; }
STARTING=0 # set while `start` brings daemons up, for a hint in error messages
die() {
    log "ERROR: $*"
    if [ "$STARTING" = 1 ]; then
        log "daemons started so far keep running for inspection; '$0 stop' stops them"
    fi
    exit 1
}

# Print the last lines of the given log files (for error messages).
log_tail() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || continue
        echo "----- last lines of $f -----" >&2
        tail -n 25 "$f" >&2
    done
}

# die, with the tails of the given logs.
die_logs() {
    local msg=$1
    shift
    log_tail "$@"
    die "$msg"
}

# Every SLURM client call goes through this: a broken cluster shows up as a silent hang otherwise.
# SL_TIMEOUT (seconds, default 10) may be set in the environment.
sl() { timeout "${SL_TIMEOUT:-10}" "$@"; }

set_paths() {
    STATE_DIR=$(realpath -m "$1")
    ETC_DIR=$STATE_DIR/etc
    LOG_DIR=$STATE_DIR/log
    RUN_DIR=$STATE_DIR/run
    DEV_DIR=$STATE_DIR/dev
    MUNGE_DIR=$STATE_DIR/munge
    MYSQL_DIR=$STATE_DIR/mysql
    MYSQL_DATA=$MYSQL_DIR/data
    SLURM_CONF_FILE=$ETC_DIR/slurm.conf
    GRES_CONF_FILE=$ETC_DIR/gres.conf
    DBD_CONF_FILE=$ETC_DIR/slurmdbd.conf
    MUNGE_SOCKET=$MUNGE_DIR/munge.socket
    MYSQL_SOCKET=$MYSQL_DIR/mysqld.sock
    LINKS_MARKER=$STATE_DIR/etc-slurm-links # /etc/slurm paths that `start` created
    export SLURM_CONF=$SLURM_CONF_FILE
}

# ---------------------------------------------------------------------------------------------
# Processes: pid files under STATE_DIR, checked against the process they point to.
# ---------------------------------------------------------------------------------------------

# Our daemons, in start order (stop goes the other way).
readonly DAEMONS=(munged mariadb slurmdbd slurmctld slurmd)

pid_file() {
    case $1 in
        munged) echo "$MUNGE_DIR/munged.pid" ;;
        mariadb) echo "$MYSQL_DIR/mariadbd.pid" ;;
        *) echo "$RUN_DIR/$1.pid" ;;
    esac
}

log_file() {
    case $1 in
        munged) echo "$MUNGE_DIR/munged.log" ;;
        mariadb) echo "$MYSQL_DIR/mariadbd.log" ;;
        *) echo "$LOG_DIR/$1.log" ;;
    esac
}

comm_ok() {
    case $1 in
        mariadb) [ "$2" = mariadbd ] || [ "$2" = mysqld ] ;;
        *) [ "$2" = "$1" ] ;;
    esac
}

# True when process $1 exists and is not a zombie (PID 1 here may be slow to reap them).
alive() {
    local st
    st=$(sed -n 's/^.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

# Print the pid of daemon $1 when it runs and was started by this script for this STATE_DIR:
# its pid file exists, the process is alive, has the daemon's name, and names STATE_DIR in its
# command line or environment (so a stale pid file never leads to killing an unrelated process).
daemon_pid() {
    local name=$1 pf pid comm
    pf=$(pid_file "$name")
    [ -r "$pf" ] || return 1
    pid=$(tr -dc '0-9' <"$pf" 2>/dev/null || true)
    [ -n "$pid" ] && alive "$pid" || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    comm_ok "$name" "$comm" || return 1
    local info
    info=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null; tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null) || true
    [[ $info == *"$STATE_DIR/"* ]] || return 1
    echo "$pid"
}

running() { daemon_pid "$1" >/dev/null; }

# Wait until command "$@" succeeds, up to $1 seconds; returns 1 on timeout.
wait_for() {
    local secs=$1 deadline
    shift
    deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.3
    done
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port on 127.0.0.1 nobody listens on (a small race until MariaDB binds it; good enough here).
free_port() {
    local p i
    for i in $(seq 1 200); do
        p=$((20000 + RANDOM % 20000))
        port_in_use "$p" || { echo "$p"; return 0; }
    done
    die "no free TCP port found on 127.0.0.1"
}

# ---------------------------------------------------------------------------------------------
# Installation
# ---------------------------------------------------------------------------------------------

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -x 'install ok installed' >/dev/null ||
            missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    log "installing ${missing[*]} (apt-get)"
    # Debian's postinst scripts would start the system-wide munge/mariadb/slurm services; a
    # policy-rc.d that answers 101 forbids that. Add a temporary one only if there is none.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        made_policy=1
    fi
    local rc=0 aptlog
    aptlog=$(mktemp /tmp/slurm_cluster-apt.XXXXXX)
    {
        DEBIAN_FRONTEND=noninteractive apt-get update &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    } >"$aptlog" 2>&1 || rc=$?
    [ $made_policy = 0 ] || rm -f "$policy"
    if [ $rc != 0 ]; then
        tail -n 30 "$aptlog" >&2
        die "apt-get failed (exit $rc); the whole log is in $aptlog"
    fi
    rm -f "$aptlog"
}

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

make_dirs() {
    mkdir -p "$STATE_DIR" "$ETC_DIR" "$LOG_DIR" "$RUN_DIR" "$DEV_DIR" \
        "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd"
    # munged refuses group/world-writable directories on the way to its files.
    chmod 755 "$STATE_DIR" "$ETC_DIR"
    mkdir -p "$MUNGE_DIR" "$MYSQL_DIR" "$MYSQL_DATA"
    chown munge:munge "$MUNGE_DIR"
    chmod 755 "$MUNGE_DIR"
    chown mysql:mysql "$MYSQL_DIR" "$MYSQL_DATA"
    chmod 755 "$MYSQL_DIR"
    chmod 750 "$MYSQL_DATA"
    # Fake GPUs: gres/gpu rejects regular files and drops GPUs without a file; /dev/null works.
    local i
    for i in $(seq 0 $((NGPUS - 1))); do
        ln -sfn /dev/null "$DEV_DIR/nvidia$i"
    done
}

write_slurm_conf() {
    local cpus mem_mb
    # CPUs: at least 8, so that a job of 4 tasks (one per fake GPU) fits even on a 2-core machine
    # (SlurmdParameters=config_overrides lets the node declare more than the hardware has).
    cpus=${SLURM_TEST_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}
    # RealMemory: a bit (10 %) under the machine's memory.
    mem_mb=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    cat >"$SLURM_CONF_FILE" <<EOF
# Generated by $PROG ($0); regenerated on every start.
ClusterName=$CLUSTER_NAME
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$STATE_DIR/slurmctld
SlurmdSpoolDir=$STATE_DIR/slurmd
SlurmctldPidFile=$(pid_file slurmctld)
SlurmdPidFile=$(pid_file slurmd)
SlurmctldLogFile=$(log_file slurmctld)
SlurmdLogFile=$(log_file slurmd)
SlurmctldDebug=info
SlurmdDebug=info
# No mail program on this machine; this silences slurmctld's startup error.
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The node may declare more (GPUs, memory) than the hardware probe finds.
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible to squeue/scontrol for 10 minutes.
MinJobAge=600
KillWait=5
SchedulerParameters=batch_sched_delay=0
JobRequeue=1
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# slurmctld's connections to slurmdbd authenticate through this munge socket.
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:$GPU_TYPE:$NGPUS State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$GRES_CONF_FILE" <<EOF
# Generated by $PROG: $NGPUS fake GPUs (symlinks to /dev/null).
AutoDetect=off
NodeName=localhost Name=gpu Type=$GPU_TYPE File=$DEV_DIR/nvidia[0-$((NGPUS - 1))]
EOF
    chmod 644 "$SLURM_CONF_FILE" "$GRES_CONF_FILE"
}

write_slurmdbd_conf() {
    local mysql_port=$1 pass
    pass=$(cat "$MYSQL_DIR/slurm.pass")
    # slurmdbd insists on mode 600 and SlurmUser's ownership (root here).
    (
        umask 077
        cat >"$DBD_CONF_FILE" <<EOF
# Generated by $PROG; regenerated on every start.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$(pid_file slurmdbd)
LogFile=$(log_file slurmdbd)
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$mysql_port
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$DBD_CONF_FILE"
}

# /etc/slurm/{slurm,gres}.conf -> our files, only where nothing is there yet (or it is already our
# link). What we create is listed in LINKS_MARKER, and only that is removed by `stop`.
link_etc_slurm() {
    local name target link
    if [ ! -d "$ETC_SLURM" ]; then
        mkdir -p "$ETC_SLURM"
        echo "dir $ETC_SLURM" >>"$LINKS_MARKER"
    fi
    for name in slurm.conf gres.conf; do
        target=$ETC_DIR/$name
        link=$ETC_SLURM/$name
        if [ -L "$link" ] && [ "$(readlink "$link")" = "$target" ]; then
            grep -qxF "link $link" "$LINKS_MARKER" 2>/dev/null || echo "link $link" >>"$LINKS_MARKER"
        elif [ -e "$link" ] || [ -L "$link" ]; then
            log "WARNING: $link exists and is not ours; left alone. srun inside jobs (and" \
                "Snakemake's slurm plugin) will read it instead of $target"
        else
            ln -s "$target" "$link"
            echo "link $link" >>"$LINKS_MARKER"
        fi
    done
}

unlink_etc_slurm() {
    [ -f "$LINKS_MARKER" ] || return 0
    local kind path
    # Links first, then the directory (if we made it and it is empty now).
    while read -r kind path; do
        if [ "$kind" = link ] && [ -L "$path" ] && [[ "$(readlink "$path")" == "$ETC_DIR/"* ]]; then
            rm -f "$path"
        fi
    done <"$LINKS_MARKER"
    while read -r kind path; do
        if [ "$kind" = dir ]; then rmdir "$path" 2>/dev/null || true; fi
    done <"$LINKS_MARKER"
    rm -f "$LINKS_MARKER"
}

# ---------------------------------------------------------------------------------------------
# Daemons
# ---------------------------------------------------------------------------------------------

start_munged() {
    local key=$MUNGE_DIR/munge.key
    if [ ! -s "$key" ]; then
        dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
    fi
    chown munge:munge "$key"
    chmod 400 "$key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    runuser -u munge -- /usr/sbin/munged --key-file="$key" --socket="$MUNGE_SOCKET" \
        --pid-file="$(pid_file munged)" --log-file="$(log_file munged)" \
        --seed-file="$MUNGE_DIR/munged.seed" 9>&- ||
        die_logs "munged failed to start" "$(log_file munged)"
    wait_for 10 test -S "$MUNGE_SOCKET" ||
        die_logs "munged did not create its socket $MUNGE_SOCKET" "$(log_file munged)"
    # A round trip through the private socket proves the key and socket work.
    timeout 10 munge -n -S "$MUNGE_SOCKET" | timeout 10 unmunge -S "$MUNGE_SOCKET" >/dev/null ||
        die_logs "munge/unmunge through $MUNGE_SOCKET failed" "$(log_file munged)"
}

mysql_root() { timeout 20 mariadb --no-defaults --socket="$MYSQL_SOCKET" -u root "$@"; }

start_mariadb() {
    local bin port pass_file=$MYSQL_DIR/slurm.pass mlog
    mlog=$(log_file mariadb)
    bin=/usr/sbin/mariadbd
    [ -x "$bin" ] || bin=/usr/sbin/mysqld
    if [ ! -d "$MYSQL_DATA/mysql" ]; then
        log "initialising MariaDB data dir $MYSQL_DATA"
        mariadb-install-db --no-defaults --user=mysql --datadir="$MYSQL_DATA" \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$MYSQL_DIR/install-db.log" 2>&1 ||
            die_logs "mariadb-install-db failed" "$MYSQL_DIR/install-db.log"
    fi
    if [ ! -s "$pass_file" ]; then
        (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$pass_file")
    fi
    port=$(free_port)
    rm -f "$MYSQL_SOCKET"
    # mariadbd does not daemonize itself: detach it from this shell and its terminal.
    setsid "$bin" --no-defaults --user=mysql --datadir="$MYSQL_DATA" --socket="$MYSQL_SOCKET" \
        --pid-file="$(pid_file mariadb)" --log-error="$mlog" \
        --bind-address=127.0.0.1 --port="$port" --skip-name-resolve \
        --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
        </dev/null >>"$mlog" 2>&1 9>&- &
    wait_for 30 timeout 5 mariadb-admin --no-defaults --socket="$MYSQL_SOCKET" -u root ping ||
        die_logs "MariaDB did not come up within 30 s" "$mlog"
    wait_for 10 running mariadb || die_logs "MariaDB runs but its pid file is missing" "$mlog"
    # slurmdbd's database user (TCP from 127.0.0.1, password in $pass_file).
    local pass
    pass=$(cat "$pass_file")
    mysql_root -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
        die_logs "could not create MariaDB user slurm" "$mlog"
    echo "$port" >"$MYSQL_DIR/port"
}

start_slurmdbd() {
    write_slurmdbd_conf "$(cat "$MYSQL_DIR/port")"
    # slurmdbd finds slurmdbd.conf next to $SLURM_CONF.
    slurmdbd 9>&- || die_logs "slurmdbd failed to start" "$(log_file slurmdbd)"
    wait_for 30 sl sacctmgr -n show cluster ||
        die_logs "slurmdbd does not answer sacctmgr within 30 s" "$(log_file slurmdbd)" \
            "$(log_file mariadb)"
    wait_for 5 running slurmdbd || die_logs "slurmdbd's pid file is missing" "$(log_file slurmdbd)"
}

# Register the cluster in slurmdbd before slurmctld connects (adding it also creates the account
# root and root's association), and make sure root has a default account (sacct, Snakemake's
# slurm plugin).
register_accounting() {
    if ! sl sacctmgr -n -P show cluster format=cluster | grep -x "$CLUSTER_NAME" >/dev/null; then
        sl sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null ||
            die_logs "sacctmgr add cluster failed" "$(log_file slurmdbd)"
    fi
    if ! sl sacctmgr -n -P show user root format=defaultaccount | grep . >/dev/null; then
        sl sacctmgr -i add user root account=root cluster="$CLUSTER_NAME" \
            defaultaccount=root >/dev/null ||
            die_logs "sacctmgr add user root failed" "$(log_file slurmdbd)"
    fi
}

start_slurmctld() {
    slurmctld -i -f "$SLURM_CONF_FILE" 9>&- ||
        die_logs "slurmctld failed to start" "$(log_file slurmctld)"
    wait_for 20 sh -c 'timeout 5 scontrol ping | grep "is UP" >/dev/null' ||
        die_logs "slurmctld does not answer scontrol ping within 20 s" "$(log_file slurmctld)"
}

start_slurmd() {
    slurmd -N localhost -f "$SLURM_CONF_FILE" 9>&- ||
        die_logs "slurmd failed to start" "$(log_file slurmd)"
}

node_state() { sl sinfo -h -N -n localhost -o %T 2>/dev/null | head -n 1; }

wait_node_idle() {
    local deadline=$((SECONDS + START_TIMEOUT)) state="" resumed=0
    while :; do
        state=$(node_state || true)
        case $state in
            idle | mixed | allocated) return 0 ;;
            *down* | *drain* | *fail*)
                # A node left down or drained by an earlier run: give it back to service once.
                if [ $resumed = 0 ] && running slurmd; then
                    sl scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
                    resumed=1
                fi
                ;;
        esac
        if [ $SECONDS -ge $deadline ]; then
            sl sinfo -N -l >&2 || true
            die_logs "node localhost not idle after ${START_TIMEOUT} s (state: '${state:-?}')" \
                "$(log_file slurmctld)" "$(log_file slurmd)"
        fi
        running slurmd || die_logs "slurmd died" "$(log_file slurmd)"
        sleep 0.3
    done
}

# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

all_running() {
    local d
    for d in "${DAEMONS[@]}"; do running "$d" || return 1; done
}

cluster_up() {
    all_running && sl scontrol ping 2>/dev/null | grep "is UP" >/dev/null
}

cmd_start() {
    if cluster_up; then
        log "already running (state in $STATE_DIR)"
        return 0
    fi
    local d p
    for d in "${DAEMONS[@]}"; do
        if running "$d"; then
            log "some daemons of an earlier start still run: stopping them first"
            cmd_stop
            break
        fi
    done
    local t0=$SECONDS
    # Unix socket paths are limited to 108 bytes.
    [ ${#MYSQL_SOCKET} -lt 100 ] || die "STATE_DIR path too long for unix sockets: $STATE_DIR"
    install_packages
    for p in $CTLD_PORT $SLURMD_PORT $DBD_PORT; do
        port_in_use "$p" && die "TCP port $p on 127.0.0.1 is in use (another SLURM?)"
    done
    STARTING=1
    make_dirs
    write_slurm_conf
    link_etc_slurm
    log "starting munged";    start_munged
    log "starting MariaDB";   start_mariadb
    log "starting slurmdbd";  start_slurmdbd
    register_accounting
    log "starting slurmctld"; start_slurmctld
    log "starting slurmd";    start_slurmd
    wait_node_idle
    log "cluster up in $((SECONDS - t0)) s (state in $STATE_DIR)"
    log "use it with: eval \"\$($0 env $STATE_DIR)\""
}

# Pids of job processes of this cluster: slurmstepd (started by our slurmd, whose environment it
# inherits) and job tasks (SLURM_JOB_ID set and our SLURM_CONF). Client shells that merely
# exported our SLURM_CONF do not count.
job_pids() {
    local f pid
    # (grep fails on processes that vanish or whose environ is unreadable: ignore that.)
    { grep -lsaF "SLURM_CONF=$SLURM_CONF_FILE" /proc/[0-9]*/environ 2>/dev/null || true; } |
        while read -r f; do
            pid=${f#/proc/}
            pid=${pid%/environ}
            if [ "$pid" = $$ ] || [ "$pid" = "$BASHPID" ]; then continue; fi
            if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ] ||
                grep -qaF SLURM_JOB_ID= "$f" 2>/dev/null; then
                echo "$pid"
            fi
        done
}

# Cancel every job of the cluster and wait until none runs any more, so no job process outlives
# slurmd.
cancel_jobs() {
    running slurmctld || return 0
    local ids
    ids=$(sl squeue -h -t all -o '%A %T' 2>/dev/null |
        awk '$2 !~ /^(COMPLETED|CANCELLED|FAILED|TIMEOUT|NODE_FAIL|PREEMPTED|BOOT_FAIL|DEADLINE|OUT_OF_MEMORY)$/ {print $1}' |
        sort -u) || true
    [ -n "$ids" ] || return 0
    log "cancelling jobs: $(echo "$ids" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    sl scancel $ids 2>/dev/null || true
    local deadline=$((SECONDS + 20))
    while [ $SECONDS -lt $deadline ]; do
        if ! sl squeue -h -o %A 2>/dev/null | grep . >/dev/null && [ -z "$(job_pids)" ]; then
            return 0
        fi
        sleep 0.5
    done
    log "WARNING: jobs still listed or running after 20 s:"
    sl squeue >&2 || true
}

# SIGTERM, then SIGKILL after STOP_TIMEOUT seconds.
stop_daemon() {
    local name=$1 pid
    pid=$(daemon_pid "$name") || { rm -f "$(pid_file "$name")"; return 0; }
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if alive "$pid"; then
        log "$name (pid $pid) still runs after ${STOP_TIMEOUT} s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        local t=$((SECONDS + 5))
        while alive "$pid" && [ $SECONDS -lt $t ]; do sleep 0.2; done
        if alive "$pid"; then log "WARNING: $name (pid $pid) does not die"; fi
    fi
    rm -f "$(pid_file "$name")"
}

cmd_stop() {
    local t0=$SECONDS
    cancel_jobs
    local d
    for d in slurmd slurmctld slurmdbd mariadb munged; do stop_daemon "$d"; done
    unlink_etc_slurm
    # Job processes that survived slurmd (should not happen after cancel_jobs). They were not
    # started by this script, so they are only reported.
    local left
    left=$(job_pids | paste -sd, -)
    if [ -n "$left" ]; then
        log "WARNING: processes of this cluster's jobs still run (not killed):"
        ps -o pid,user,args -p "$left" >&2 || true
    fi
    log "stopped in $((SECONDS - t0)) s"
}

cmd_status() {
    local d pid
    for d in "${DAEMONS[@]}"; do
        if pid=$(daemon_pid "$d"); then
            echo "$d: running (pid $pid)"
        else
            echo "$d: not running"
        fi
    done
    if cluster_up; then
        sl sinfo || true
        echo "cluster: UP (state in $STATE_DIR)"
        return 0
    fi
    echo "cluster: DOWN (state in $STATE_DIR)"
    return 1
}

cmd_env() {
    printf 'export SLURM_CONF=%q\n' "$SLURM_CONF_FILE"
    printf 'export SLURM_TEST_DIR=%q\n' "$STATE_DIR"
}

main() {
    local cmd=${1:-}
    [ $# -le 2 ] || cmd=""
    set_paths "${2:-${SLURM_TEST_DIR:-/tmp/sacglam-slurm}}"
    case $cmd in
        start | stop)
            [ "$(id -u)" = 0 ] || die "must run as root"
            mkdir -p "$STATE_DIR"
            # One start/stop at a time per STATE_DIR. Daemons are started with fd 9 closed, or
            # they would hold this lock for ever.
            exec 9>"$STATE_DIR/.lock"
            flock -w 300 9 || die "another start/stop holds $STATE_DIR/.lock"
            "cmd_$cmd"
            ;;
        status) cmd_status ;;
        env) cmd_env ;;
        *)
            echo "usage: $0 start|stop|status|env [STATE_DIR]" >&2
            echo "  STATE_DIR defaults to \${SLURM_TEST_DIR:-/tmp/sacglam-slurm}" >&2
            exit 2
            ;;
    esac
}

main "$@"
