#!/usr/bin/env bash
# tests/servers.sh - private PostgreSQL, Redis and RabbitMQ servers for the
# sekali tests and demo.
#
# Everything lives in one scratch directory (default /tmp/sekali-servers) and
# listens on 127.0.0.1 only, on private ports, so the servers can never clash
# with (or be mistaken for) system services.  Nothing under /etc, systemd or
# root's home is touched; the only system change is installing missing Debian
# packages.
#
# Usage: tests/servers.sh COMMAND
#   start                       install missing packages, start all three, wait
#   stop [--wipe]               stop what we started; --wipe removes the scratch dir
#   status                      say which servers run (exit 0 only if all three do)
#   env                         print shell-sourceable settings (only this writes stdout)
#   pg-bindir                   print the PostgreSQL server binaries' directory
#   start-postgres  | stop-postgres  | restart-postgres
#   start-redis     | stop-redis     | restart-redis
#   start-rabbitmq  | stop-rabbitmq  | restart-rabbitmq
#
# Settings (environment; defaults in brackets):
#   SEKALI_SCRATCH [/tmp/sekali-servers]   SEKALI_PG_PORT [55432]
#   SEKALI_REDIS_PORT [56379]              SEKALI_AMQP_PORT [55672]
#   SEKALI_AMQP_DIST_PORT [AMQP port + 1]  Erlang distribution port of the broker
#   SEKALI_EPMD_PORT [54369]               private epmd
#   SEKALI_RABBIT_NODE [sekali-test@localhost]
#   SEKALI_AMQP_CONSUMER_TIMEOUT [3600000] ms
#   SEKALI_WAIT [30] / SEKALI_WAIT_RABBIT [240]  seconds to wait for a server
#   SEKALI_TLS [0]     1: also make a test CA (openssl, in the scratch dir's tls/)
#                       and serve TLS: RabbitMQ on SEKALI_AMQP_TLS_PORT
#                       [AMQP distribution port + 11] (client certificates
#                       required, EXTERNAL login enabled), PostgreSQL with
#                       ssl=on on its port (role sekali_tls only over hostssl),
#                       Redis on SEKALI_REDIS_TLS_PORT [Redis port + 1] with
#                       ACL users sekali_acl (sekali's commands on sekali:*
#                       keys only) and sekali_noset (the same without SET),
#                       password "aclpass".
#                       The plain listeners stay as they are.
#   SEKALI_RABBITMQ [3]  3: Debian 12's RabbitMQ 3.10; 4: Debian 13's 4.0.x
#   SEKALI_REDIS [redis] redis: Debian 12's Redis 7.0; valkey: Debian 13's Valkey 8
#   SEKALI_PG [15]       15 (or empty): Debian 12's PostgreSQL; 17: Debian 13's
#                       Debian 13's servers run from a root of their own made
#                       by tests/debian13-root.sh (root only; chroot), with
#                       the same ports, files and listeners as Debian 12's.
#                       RabbitMQ 4 denies global QoS and transient non-exclusive
#                       queues, as 4.3 does (SEKALI_RABBITMQ_DENY_DEPRECATED=0:
#                       not; the cluster test's nodes, whose join 4.0 refused).
#                       `start` gives what these ask for (unset: the default),
#                       restarting a server that runs another version or
#                       lacks the TLS listeners asked for; the other commands
#                       act on what runs.
#   SEKALI_LISTEN_EXTRA ['']  ADDRESS/PREFIX: each server also listens on this
#                       IPv4 address, which must exist (the cluster tests put
#                       it on a veth of their own), and PostgreSQL admits
#                       clients from ADDRESS/PREFIX
# Ports chosen at `start` are remembered in the scratch dir, so later commands
# (stop, env, restart-*) find the servers without the variables being set again.

set -euo pipefail

PROG=servers.sh

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$PROG" "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------

SCRATCH=${SEKALI_SCRATCH:-/tmp/sekali-servers}
case $SCRATCH in /*) ;; *) SCRATCH=$PWD/$SCRATCH ;; esac   # we cd around later
SCRATCH=${SCRATCH%/}
[ -n "$SCRATCH" ] || die "SEKALI_SCRATCH must not be /"
SETTINGS_FILE=$SCRATCH/settings.env
MARKER=$SCRATCH/.sekali-servers     # proves a dir is ours before `stop --wipe`

# Values remembered by the last `start` are the defaults; explicit environment
# variables still win.
SAVED_PG_PORT='' SAVED_REDIS_PORT='' SAVED_AMQP_PORT='' SAVED_AMQP_DIST_PORT=''
SAVED_EPMD_PORT='' SAVED_RABBIT_NODE='' SAVED_LISTEN_EXTRA='' SAVED_TLS='' SAVED_AMQP_TLS_PORT='' SAVED_REDIS_TLS_PORT=''
if [ -f "$SETTINGS_FILE" ]; then
    # shellcheck disable=SC1090
    . "$SETTINGS_FILE"
fi

PG_PORT=${SEKALI_PG_PORT:-${SAVED_PG_PORT:-55432}}
REDIS_PORT=${SEKALI_REDIS_PORT:-${SAVED_REDIS_PORT:-56379}}
AMQP_PORT=${SEKALI_AMQP_PORT:-${SAVED_AMQP_PORT:-55672}}
# RabbitMQ's default distribution port is AMQP port + 20000, which is > 65535
# for our private AMQP port, so it must always be set explicitly.
AMQP_DIST_PORT=${SEKALI_AMQP_DIST_PORT:-${SAVED_AMQP_DIST_PORT:-$((AMQP_PORT + 1))}}
EPMD_PORT=${SEKALI_EPMD_PORT:-${SAVED_EPMD_PORT:-54369}}
RABBIT_NODE=${SEKALI_RABBIT_NODE:-${SAVED_RABBIT_NODE:-sekali-test@localhost}}
CONSUMER_TIMEOUT=${SEKALI_AMQP_CONSUMER_TIMEOUT:-3600000}
LISTEN_EXTRA=${SEKALI_LISTEN_EXTRA:-$SAVED_LISTEN_EXTRA}
TLS=${SEKALI_TLS:-${SAVED_TLS:-0}}
AMQP_TLS_PORT=${SEKALI_AMQP_TLS_PORT:-${SAVED_AMQP_TLS_PORT:-$((AMQP_DIST_PORT + 11))}}
REDIS_TLS_PORT=${SEKALI_REDIS_TLS_PORT:-${SAVED_REDIS_TLS_PORT:-$((REDIS_PORT + 1))}}
EXTRA_ADDR='' EXTRA_NET=''
if [ -n "$LISTEN_EXTRA" ]; then
    [[ $LISTEN_EXTRA =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)\.([0-9]+)/([0-9]+)$ ]] &&
        [ "${BASH_REMATCH[5]}" -le 32 ] ||
        die "SEKALI_LISTEN_EXTRA=$LISTEN_EXTRA is not an IPv4 ADDRESS/PREFIX"
    EXTRA_ADDR=${LISTEN_EXTRA%/*}
    # The network, host bits cleared: pg_hba.conf wants it so.
    extra_bits=$(( (BASH_REMATCH[1] << 24 | BASH_REMATCH[2] << 16 | BASH_REMATCH[3] << 8 | BASH_REMATCH[4]) &
                   (0xffffffff << (32 - BASH_REMATCH[5])) & 0xffffffff ))
    EXTRA_NET=$((extra_bits >> 24)).$((extra_bits >> 16 & 255)).$((extra_bits >> 8 & 255)).$((extra_bits & 255))/${BASH_REMATCH[5]}
fi
WAIT=${SEKALI_WAIT:-30}
# A broker recovering hundreds of test queues after an unclean stop, on a
# loaded 2-core machine, took over 60 s to boot; rabbit_wait stops waiting
# as soon as the VM dies, so the bound only ends a hung start.
WAIT_RABBIT=${SEKALI_WAIT_RABBIT:-240}

for p in PG_PORT REDIS_PORT AMQP_PORT AMQP_DIST_PORT EPMD_PORT AMQP_TLS_PORT REDIS_TLS_PORT; do
    [[ ${!p} =~ ^[0-9]+$ ]] && [ "${!p}" -ge 1 ] && [ "${!p}" -le 65535 ] ||
        die "$p=${!p} is not a valid port"
done

DB_USER=sekali DB_PASS=sekali DB_NAME=sekali
AMQP_USER=sekali AMQP_PASS=sekali

BIN=$SCRATCH/bin
PG=$SCRATCH/postgres
PGDATA=$PG/data
PGRUN=$PG/run                       # unix socket dir
PGLOG=$PG/log/postgresql.log
REDIS=$SCRATCH/redis
REDIS_PID=$REDIS/redis.pid
REDIS_LOG=$REDIS/redis.log
RMQ=$SCRATCH/rabbitmq
RMQ_PID=$RMQ/rabbit.pid             # beam pid, written by RabbitMQ itself
RMQ_LOG=$RMQ/log/rabbit.log
RMQ_STARTUP_LOG=$RMQ/log/startup.log
EPMD_PID=$RMQ/epmd.pid
EPMD_LOG=$RMQ/log/epmd.log
TLSDIR=$SCRATCH/tls

RMQ_SBIN=/usr/lib/rabbitmq/bin      # the real scripts, not the Debian su-wrappers

IS_ROOT=0; [ "$(id -u)" = 0 ] && IS_ROOT=1

# Which server versions: what a server was started as is kept beside its
# files ("version tls"), so that `start` can tell what runs from what is
# asked for, and the other commands act on what runs.
ROOT_SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/debian13-root.sh
STARTED=.sekali-started
started_as() { cat "$1/$STARTED" 2>/dev/null || true; }
started_version() { local s; s=$(started_as "$1"); printf '%s' "${s%% *}"; }
pick_version() {    # VAR_VALUE DEFAULT ALLOWED... (the value "" means the default)
    local v=${1:-$2}; shift 2
    local a; for a in "$@"; do [ "$v" = "$a" ] && { printf '%s' "$v"; return; }; done
    die "unsupported server version '$v' (known: $*)"
}
if [ "${1:-}" = start ]; then
    WANT_PG=${SEKALI_PG:-} WANT_REDIS=${SEKALI_REDIS:-} WANT_RMQ=${SEKALI_RABBITMQ:-}
else
    WANT_PG=${SEKALI_PG:-$(started_version "$PG")}
    WANT_REDIS=${SEKALI_REDIS:-$(started_version "$REDIS")}
    WANT_RMQ=${SEKALI_RABBITMQ:-$(started_version "$RMQ")}
fi
WANT_PG=$(pick_version "$WANT_PG" 15 15 17)
WANT_REDIS=$(pick_version "$WANT_REDIS" redis redis valkey)
WANT_RMQ=$(pick_version "$WANT_RMQ" 3 3 4)

# Run a command inside the Debian 13 root, the scratch dir at its own path
# (IN_ROOT: the same as a command prefix, for setsid and the wrappers).
IN_ROOT=(env "SEKALI_DEBIAN13_ROOT=$("$ROOT_SCRIPT" path)" "SEKALI_ROOT_BIND=$SCRATCH" "$ROOT_SCRIPT" run)
in_root() { SEKALI_ROOT_CWD=${ROOT_CWD:-/} "${IN_ROOT[@]}" "$@"; }
need_root_image() {
    [ "$WANT_PG$WANT_REDIS$WANT_RMQ" != 15redis3 ] || return 0
    [ "$IS_ROOT" = 1 ] || die "Debian 13's servers (SEKALI_PG/SEKALI_REDIS/SEKALI_RABBITMQ) run in a chroot: run as root"
    "$ROOT_SCRIPT" ensure
}

# The commands of one server's version: use_pg/use_redis/use_rabbitmq VERSION.
use_pg() {
    PG_VERSION=$1
    if [ "$1" = 17 ]; then PG_IN_ROOT=1 PG_BINDIR=/usr/lib/postgresql/17/bin
    else PG_IN_ROOT=0 PG_BINDIR=$(pg_bindir); fi
}
use_redis() {
    REDIS_VERSION=$1
    if [ "$1" = valkey ]; then REDIS_SERVER=("${IN_ROOT[@]}" /usr/bin/valkey-server) REDIS_COMM=valkey-server
    else REDIS_SERVER=(redis-server) REDIS_COMM=redis-server; fi
}
use_rabbitmq() {
    RMQ_VERSION=$1
    if [ "$1" = 4 ]; then RMQ_RUN=(env "SEKALI_ROOT_CWD=$RMQ" "${IN_ROOT[@]}"); else RMQ_RUN=(); fi
}

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

# Newest installed PostgreSQL server binaries (Debian: /usr/lib/postgresql/N/bin).
pg_bindir() {
    local d best=''
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] || continue
        if [ -z "$best" ] || [ "$(basename "$(dirname "$d")")" -gt "$(basename "$(dirname "$best")")" ] 2>/dev/null; then
            best=$d
        fi
    done
    printf '%s' "$best"
}

# PostgreSQL refuses to run as root; as root run its tools as `postgres`
# (the Debian 13 root's own postgres user for its PostgreSQL).
as_pg() {
    if [ "$PG_IN_ROOT" = 1 ]; then ROOT_CWD=$SCRATCH in_root runuser -u postgres -- "$@"
    elif [ "$IS_ROOT" = 1 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# Is something accepting TCP connections on 127.0.0.1:$1 ?
tcp_open() {
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# Does $1 name a live process whose command name starts with $2 (guards
# against pid reuse)?  Zombies count as dead: in containers whose pid 1 does
# not reap orphans, a stopped daemon lingers as a zombie forever.
pid_is() {
    local pid=$1 stat
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    # /proc/PID/stat: "PID (COMM) STATE ..."
    [[ ${stat#*\(} == "$2"* ]] || return 1
    [[ ${stat##*\) } != Z* ]]
}

read_pid() { [ -f "$1" ] && tr -dc '0-9' <"$1" || true; }

# Print the last lines of a log so a failure is diagnosable from CI output.
show_log() {
    [ -f "$1" ] || return 0
    say "---- last lines of $1 ----"
    tail -n 25 "$1" | sed "s/^/$PROG:   /" >&2 || true
}

# wait_for SECONDS DESCRIPTION LOGFILE COMMAND...: poll COMMAND until it
# succeeds; on timeout name the server, point at its log and fail.
wait_for() {
    local secs=$1 what=$2 log=$3; shift 3
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            show_log "$log"
            die "$what did not answer within ${secs}s (log: $log)"
        fi
        sleep 0.2
    done
}

# Fail early, with a clear message, if a port we need belongs to someone else.
require_free_port() {
    if tcp_open "$1"; then
        die "$2: port 127.0.0.1:$1 is already in use by another process (set $3 to choose another port)"
    fi
}

squote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# A single lock so concurrent `start`/`stop` calls do not race each other.
# Every daemon is launched with `9>&-`: an inherited fd 9 would keep the lock
# held for the daemon's whole life and deadlock the next call.
take_lock() {
    mkdir -p "$SCRATCH"
    exec 9>"$SCRATCH/.lock"
    if ! flock -n 9; then
        say "waiting for another servers.sh holding $SCRATCH/.lock"
        flock -w 300 9 || die "could not lock $SCRATCH/.lock within 300s"
    fi
}

# ---------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------

missing_binaries() {
    local b missing=()
    [ -n "$(pg_bindir)" ] || missing+=(initdb/pg_ctl)
    for b in psql pg_isready redis-server redis-cli epmd runuser flock timeout; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    [ -x "$RMQ_SBIN/rabbitmq-server" ] && [ -x "$RMQ_SBIN/rabbitmqctl" ] || missing+=(rabbitmq-server)
    if [ "$IS_ROOT" = 1 ]; then
        getent passwd postgres >/dev/null || missing+=(postgres-user)
    fi
    printf '%s\n' "${missing[@]}"
}

install_packages() {
    local missing
    missing=$(missing_binaries)
    [ -n "$missing" ] || return 0
    say "missing: ${missing//$'\n'/ } - installing Debian packages"
    [ "$IS_ROOT" = 1 ] || die "need root to apt-get install postgresql redis-server rabbitmq-server"
    # Keep the package scripts from starting the *system* services we do not
    # use (they would only eat memory): a temporary policy-rc.d denies
    # service starts for invoke-rc.d/deb-systemd-invoke.  Only if the admin has
    # no policy-rc.d of their own.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [ ! -e "$policy" ] && [ "${SEKALI_APT_ALLOW_SERVICE_START:-0}" != 1 ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        postgresql redis-server rabbitmq-server
    if [ "$own_policy" = 1 ]; then rm -f "$policy"; trap - EXIT; fi
    missing=$(missing_binaries)
    [ -z "$missing" ] || die "still missing after apt-get install: ${missing//$'\n'/ }"
}

# ---------------------------------------------------------------------------
# Scratch dir and wrappers
# ---------------------------------------------------------------------------

# Every default port here lies in Linux's ephemeral range (32768-60999), so
# any client socket of a busy test run can be given one as its local port,
# and a server restarted then cannot listen on it (RabbitMQ died with
# could_not_start_listener that way under load). Reserving the ports keeps
# the kernel from handing them out; it changes nothing else, and where the
# setting cannot be written (an unprivileged run) all goes on as before.
reserve_ports() {
    local file=/proc/sys/net/ipv4/ip_local_reserved_ports current wanted
    [ -w "$file" ] || return 0
    current=$(<"$file")
    wanted="$PG_PORT,$REDIS_PORT,$REDIS_TLS_PORT,$AMQP_PORT,$AMQP_DIST_PORT-$((AMQP_DIST_PORT + 11)),$EPMD_PORT"
    # And the cluster suites' range (tests/cluster/lib.sh), which run after
    # `make check` in CI: reserved only when they start, it could already
    # be held by a long-lived client socket of the suites before them (a
    # CI run lost three cluster tests to eaddrinuse on 127.0.0.1:47100).
    local base=${SEKALI_CLUSTER_PORT_BASE:-47000}
    wanted+=",$base-$((base + 199))"
    echo "${current:+$current,}$wanted" >"$file" 2>/dev/null || true
}

prepare_scratch() {
    mkdir -p "$SCRATCH" "$BIN"
    # postgres must be able to traverse into the scratch dir.
    chmod 755 "$SCRATCH"
    touch "$MARKER"
    cat >"$SETTINGS_FILE" <<EOF
# written by tests/servers.sh start; defaults for later commands
SAVED_PG_PORT=$PG_PORT
SAVED_REDIS_PORT=$REDIS_PORT
SAVED_AMQP_PORT=$AMQP_PORT
SAVED_AMQP_DIST_PORT=$AMQP_DIST_PORT
SAVED_EPMD_PORT=$EPMD_PORT
SAVED_RABBIT_NODE=$(squote "$RABBIT_NODE")
SAVED_LISTEN_EXTRA=$(squote "$LISTEN_EXTRA")
SAVED_TLS=$TLS
SAVED_AMQP_TLS_PORT=$AMQP_TLS_PORT
SAVED_REDIS_TLS_PORT=$REDIS_TLS_PORT
EOF
    write_wrappers
}

# The environment every RabbitMQ/Erlang command needs to find *our* node:
# private epmd, private cookie (HOME), and all files in the scratch dir (so
# /etc/rabbitmq and /var/lib/rabbitmq are never read or written).
rabbit_env_lines() {
    local v
    for v in \
        "HOME=$RMQ/home" \
        "RABBITMQ_NODENAME=$RABBIT_NODE" \
        "RABBITMQ_CONF_ENV_FILE=$RMQ/rabbitmq-env.conf" \
        "RABBITMQ_CONFIG_FILE=$RMQ/rabbitmq.conf" \
        "RABBITMQ_CONFIG_FILES=$RMQ/conf.d" \
        "RABBITMQ_ADVANCED_CONFIG_FILE=$RMQ/advanced.config" \
        "RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ/enabled_plugins" \
        "RABBITMQ_MNESIA_BASE=$RMQ/mnesia" \
        "RABBITMQ_LOG_BASE=$RMQ/log" \
        "RABBITMQ_LOGS=$RMQ_LOG" \
        "RABBITMQ_PID_FILE=$RMQ_PID" \
        "RABBITMQ_MOTD_FILE=$RMQ/motd" \
        "RABBITMQ_DIST_PORT=$AMQP_DIST_PORT" \
        "RABBITMQ_CTL_DIST_PORT_MIN=$((AMQP_DIST_PORT + 1))" \
        "RABBITMQ_CTL_DIST_PORT_MAX=$((AMQP_DIST_PORT + 10))" \
        "RABBITMQ_CTL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}" \
        "ERL_EPMD_PORT=$EPMD_PORT" \
        "ERL_EPMD_ADDRESS=127.0.0.1" \
        "ERL_CRASH_DUMP=$RMQ/log/erl_crash.dump"; do
        printf 'export %s=%s\n' "${v%%=*}" "$(squote "${v#*=}")"
    done
}

write_wrappers() {
    # psql connecting as sekali over TCP with the password (what the daemon does).
    cat >"$BIN/psql" <<EOF
#!/bin/sh
# generated by tests/servers.sh: psql as $DB_USER on the private PostgreSQL
export PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=$DB_USER PGPASSWORD=$DB_PASS PGDATABASE=$DB_NAME
exec psql "\$@"
EOF
    cat >"$BIN/redis-cli" <<EOF
#!/bin/sh
# generated by tests/servers.sh: redis-cli on the private Redis
exec redis-cli -h 127.0.0.1 -p $REDIS_PORT "\$@"
EOF
    local tool
    for tool in rabbitmqctl rabbitmq-diagnostics; do
        {
            echo '#!/bin/sh'
            echo "# generated by tests/servers.sh: $tool against the private node $RABBIT_NODE"
            rabbit_env_lines
            echo "cd $(squote "$RMQ")"
            local a run=''
            for a in "${RMQ_RUN[@]}"; do run+="$(squote "$a") "; done
            echo "exec $run$RMQ_SBIN/$tool \"\$@\""
        } >"$BIN/$tool"
    done
    chmod 755 "$BIN"/*
}

# ---------------------------------------------------------------------------
# Test CA (SEKALI_TLS=1)
# ---------------------------------------------------------------------------

# One test CA signs the servers' certificate (localhost and 127.0.0.1), a
# client certificate (CN sekali: RabbitMQ's EXTERNAL login takes the CN as
# the user) and an expired server certificate; a second CA that signs
# nothing we serve is the "wrong CA". Made once per scratch dir; keys
# are 0600.
make_test_ca() {
    [ "$TLS" = 1 ] || return 0
    [ -s "$TLSDIR/server.crt" ] && [ -s "$TLSDIR/expired.crt" ] && return 0
    command -v openssl >/dev/null || die "SEKALI_TLS=1 needs openssl"
    say "tls: making a test CA in $TLSDIR"
    rm -rf "$TLSDIR"; mkdir -p "$TLSDIR/db"
    (
        cd "$TLSDIR"
        umask 077
        q() { "$@" >>"$TLSDIR/openssl.log" 2>&1 || die "tls: $* failed (log: $TLSDIR/openssl.log)"; }
        q openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 \
            -subj "/CN=sekali test CA" -addext basicConstraints=critical,CA:true \
            -addext keyUsage=critical,keyCertSign,cRLSign
        q openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.crt \
            -days 30 -subj "/CN=some other CA" -addext basicConstraints=critical,CA:true
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        q openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost"
        q openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -days 30 -extfile server.ext -out server.crt
        q openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=sekali"
        q openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -days 30 -extfile client.ext -out client.crt
        # Expired: `openssl ca` is the one 3.0 tool that takes both dates.
        : >db/index.txt; echo 1000 >db/serial
        printf '%s\n' '[ca]' 'default_ca = test' '[test]' "database = $TLSDIR/db/index.txt" \
            "serial = $TLSDIR/db/serial" "new_certs_dir = $TLSDIR/db" 'default_md = sha256' \
            'policy = any' '[any]' 'commonName = supplied' '[ext]' \
            'subjectAltName = DNS:localhost,IP:127.0.0.1' 'extendedKeyUsage = serverAuth' >ca.cnf
        q openssl req -newkey rsa:2048 -nodes -keyout expired.key -out expired.csr -subj "/CN=localhost"
        q openssl ca -batch -config ca.cnf -cert ca.crt -keyfile ca.key -in expired.csr \
            -startdate 20200101000000Z -enddate 20200102000000Z -extensions ext -out expired.crt
        chmod 644 ./*.crt
    )
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

pg_running() {
    [ -n "$PG_BINDIR" ] && [ -f "$PGDATA/PG_VERSION" ] &&
        as_pg "$PG_BINDIR/pg_ctl" status -D "$PGDATA" >/dev/null 2>&1
}

# As root, the server's files must belong to postgres (by number: the
# Debian 13 root's postgres need not have the host's uid).
pg_own() {
    [ "$IS_ROOT" = 1 ] || return 0
    if [ "$PG_IN_ROOT" = 1 ]; then
        chown -R "$(in_root id -u postgres):$(in_root id -g postgres)" "$1"
    else chown -R postgres:postgres "$1"; fi
}

# Admin psql as the postgres superuser over the private unix socket.
pg_admin() {
    as_pg psql -h "$PGRUN" -p "$PG_PORT" -U postgres -d postgres \
        -X -A -t -q -v ON_ERROR_STOP=1 "$@"
}

# A real query as sekali, over TCP, with password auth.
pg_query_ok() {
    [ "$(PGPASSWORD=$DB_PASS PGCONNECT_TIMEOUT=3 psql -X -A -t \
        "host=127.0.0.1 port=$PG_PORT dbname=$DB_NAME user=$DB_USER" \
        -c 'SELECT 42' 2>/dev/null)" = 42 ]
}

pg_init() {
    local bindir=$PG_BINDIR
    say "postgres: initdb in $PGDATA"
    rm -rf "$PGDATA"
    mkdir -p "$PGDATA" "$PGRUN" "$(dirname "$PGLOG")"
    pg_own "$PG"
    chmod 700 "$PGDATA"
    # trust on the socket is safe: the socket dir and socket are 0700.
    as_pg "$bindir/initdb" -D "$PGDATA" -U postgres -E UTF8 --locale=C \
        --auth-local=trust --auth-host=scram-sha-256 >"$PG/log/initdb.log" 2>&1 ||
        { show_log "$PG/log/initdb.log"; die "postgres: initdb failed"; }
    echo "include 'sekali.conf'" | as_pg tee -a "$PGDATA/postgresql.conf" >/dev/null
}

pg_configure() {
    # Regenerated on every start so a changed port takes effect.
    as_pg tee "$PGDATA/sekali.conf" >/dev/null <<EOF
# written by tests/servers.sh
listen_addresses = '127.0.0.1${EXTRA_ADDR:+,$EXTRA_ADDR}'
port = $PG_PORT
unix_socket_directories = '$PGRUN'
unix_socket_permissions = 0700
max_connections = 200
shared_buffers = 128MB
# test speed over durability
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    local tls_hba=''
    if [ "$TLS" = 1 ]; then
        # The server's own copies: PostgreSQL wants its key owned by it.
        mkdir -p "$PG/tls"
        cp "$TLSDIR/server.crt" "$TLSDIR/server.key" "$TLSDIR/ca.crt" "$PG/tls/"
        chmod 600 "$PG/tls/server.key"
        pg_own "$PG/tls"
        printf '%s\n' 'ssl = on' "ssl_cert_file = '$PG/tls/server.crt'" \
            "ssl_key_file = '$PG/tls/server.key'" "ssl_ca_file = '$PG/tls/ca.crt'" |
            as_pg tee -a "$PGDATA/sekali.conf" >/dev/null
        # sekali_tls may only come in over TLS: a test's proof that the
        # link it configured cannot have been clear text.
        tls_hba=$(printf '%s\n' 'hostssl   all  sekali_tls 127.0.0.1/32   scram-sha-256' \
                                 'hostnossl all  sekali_tls all            reject')
    fi
    as_pg tee "$PGDATA/pg_hba.conf" >/dev/null <<EOF
# written by tests/servers.sh
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  trust
$tls_hba
host    all       all   127.0.0.1/32   scram-sha-256
${EXTRA_NET:+host    all       all   $EXTRA_NET   scram-sha-256}
EOF
}

# Create role and database if missing (idempotent).
pg_bootstrap() {
    if [ "$(pg_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'")" != 1 ]; then
        say "postgres: creating role $DB_USER"
        pg_admin -c "CREATE ROLE $DB_USER LOGIN SUPERUSER PASSWORD '$DB_PASS'"
    fi
    if [ "$(pg_admin -c "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]; then
        say "postgres: creating database $DB_NAME"
        pg_admin -c "CREATE DATABASE $DB_NAME OWNER $DB_USER"
    fi
    if [ "$TLS" = 1 ] && [ "$(pg_admin -c "SELECT 1 FROM pg_roles WHERE rolname = 'sekali_tls'")" != 1 ]; then
        pg_admin -c "CREATE ROLE sekali_tls LOGIN SUPERUSER PASSWORD '$DB_PASS'"
    fi
}

start_postgres() {
    local want="$WANT_PG tls=$TLS" was
    was=$(started_as "$PG"); was=${was:-15 tls=0}   # (one started before the record)
    use_pg "${was%% *}"
    if [ -n "$was" ] && [ "$was" != "$want" ] && pg_running; then
        say "postgres: running as '$was', asked for '$want': restarting"
        stop_postgres
    fi
    use_pg "$WANT_PG"
    local bindir=$PG_BINDIR
    [ -n "$bindir" ] || die "postgres: no initdb/pg_ctl under /usr/lib/postgresql/*/bin"
    if pg_running && pg_query_ok; then
        say "postgres: already running on 127.0.0.1:$PG_PORT"
        echo "$want" >"$PG/$STARTED"
        return 0
    fi
    if pg_running; then
        # Ours but not answering as sekali (e.g. still starting): let the
        # waits below decide instead of starting a second one.
        say "postgres: running but not answering yet, waiting"
    else
        require_free_port "$PG_PORT" postgres SEKALI_PG_PORT
        as_pg test -x "$SCRATCH" ||
            die "postgres: user postgres cannot enter $SCRATCH (a parent dir is not world-executable); choose another SEKALI_SCRATCH"
        # Another major version's data directory cannot be opened: the
        # test data is throw-away, so make a new one.
        if [ "$(cat "$PGDATA/PG_VERSION" 2>/dev/null)" != "$(pg_major)" ]; then pg_init; fi
        mkdir -p "$PGRUN" "$(dirname "$PGLOG")"
        pg_own "$PG"
        pg_configure
        say "postgres: starting on 127.0.0.1:$PG_PORT ($bindir)"
        as_pg "$bindir/pg_ctl" start -D "$PGDATA" -l "$PGLOG" -w -t "$WAIT" -s 9>&- ||
            { show_log "$PGLOG"; die "postgres: pg_ctl start failed (log: $PGLOG)"; }
    fi
    wait_for "$WAIT" "postgres (pg_isready)" "$PGLOG" pg_isready -q -h 127.0.0.1 -p "$PG_PORT"
    pg_bootstrap
    wait_for "$WAIT" "postgres (query as $DB_USER)" "$PGLOG" pg_query_ok
    echo "$want" >"$PG/$STARTED"
    say "postgres: ready (PostgreSQL $(pg_major))"
}

# The major version PG_BINDIR runs (Debian: /usr/lib/postgresql/N/bin).
pg_major() { basename "$(dirname "$PG_BINDIR")"; }

stop_postgres() {
    local bindir=$PG_BINDIR
    if ! pg_running; then
        rm -f "$PG/$STARTED"
        return 0
    fi
    say "postgres: stopping"
    as_pg "$bindir/pg_ctl" stop -D "$PGDATA" -m fast -w -t "$WAIT" -s ||
        as_pg "$bindir/pg_ctl" stop -D "$PGDATA" -m immediate -w -t "$WAIT" -s ||
        die "postgres: could not stop (log: $PGLOG)"
    rm -f "$PG/$STARTED"
}

# ---------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------

redis_pid() {
    local pid; pid=$(read_pid "$REDIS_PID")
    pid_is "$pid" "$REDIS_COMM" && printf '%s' "$pid"
}

redis_ping() { [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }

start_redis() {
    local want="$WANT_REDIS tls=$TLS" was
    was=$(started_as "$REDIS"); was=${was:-redis tls=0}
    use_redis "${was%% *}"
    if [ "$was" != "$want" ] && redis_pid >/dev/null; then
        say "redis: running as '$was', asked for '$want': restarting"
        stop_redis
    fi
    use_redis "$WANT_REDIS"
    if redis_pid >/dev/null; then
        if redis_ping; then
            say "redis: already running on 127.0.0.1:$REDIS_PORT"
            echo "$want" >"$REDIS/$STARTED"
            return 0
        fi
        say "redis: running but not answering yet, waiting"
    else
        require_free_port "$REDIS_PORT" redis SEKALI_REDIS_PORT
        mkdir -p "$REDIS"
        rm -f "$REDIS_PID"
        # No persistence: tests want a clean, fast, throw-away store.
        cat >"$REDIS/redis.conf" <<EOF
# written by tests/servers.sh
bind 127.0.0.1${EXTRA_ADDR:+ $EXTRA_ADDR}
${EXTRA_ADDR:+# without a password, protected mode admits loopback clients only
protected-mode no}
port $REDIS_PORT
daemonize yes
pidfile $REDIS_PID
logfile $REDIS_LOG
dir $REDIS
save ""
appendonly no
EOF
        if [ "$TLS" = 1 ]; then
            # The commands sekali sends (lock.c), and those its scripts call.
            local cmds='+ping +auth +select +role +set +get +del +pexpire +evalsha +script|load'
            cat >>"$REDIS/redis.conf" <<EOF
tls-port $REDIS_TLS_PORT
tls-cert-file $TLSDIR/server.crt
tls-key-file $TLSDIR/server.key
tls-ca-cert-file $TLSDIR/ca.crt
tls-auth-clients optional
user sekali_acl on >aclpass ~sekali:* resetchannels -@all $cmds
user sekali_noset on >aclpass ~sekali:* resetchannels -@all ${cmds/ +set/}
EOF
        fi
        say "redis: starting $REDIS_COMM on 127.0.0.1:$REDIS_PORT"
        (cd "$REDIS" && "${REDIS_SERVER[@]}" "$REDIS/redis.conf") 9>&- ||
            { show_log "$REDIS_LOG"; die "redis: $REDIS_COMM failed to start (log: $REDIS_LOG)"; }
    fi
    wait_for "$WAIT" "redis (ping)" "$REDIS_LOG" redis_ping
    echo "$want" >"$REDIS/$STARTED"
    say "redis: ready ($REDIS_COMM)"
}

stop_redis() {
    local pid; pid=$(redis_pid) || { rm -f "$REDIS/$STARTED"; return 0; }
    say "redis: stopping"
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
    wait_pid_gone "$pid" "$REDIS_COMM" "$WAIT" || kill -KILL "$pid" 2>/dev/null || true
    rm -f "$REDIS_PID" "$REDIS/$STARTED"
}

# wait_pid_gone PID COMM SECONDS
wait_pid_gone() {
    local deadline=$((SECONDS + $3))
    while pid_is "$1" "$2"; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
}

# ---------------------------------------------------------------------------
# RabbitMQ (+ its private epmd)
# ---------------------------------------------------------------------------

# Run a command with our RabbitMQ environment, from inside the scratch dir
# (Erlang may drop files into cwd).  Runs as the invoking user (root here):
# RabbitMQ itself does not mind, and everything it touches is in the scratch
# dir; the Debian /usr/sbin wrappers are avoided because they su to the
# `rabbitmq` user and cd to /var/lib/rabbitmq.
rmq_env() {
    (
        eval "$(rabbit_env_lines)"
        cd "$RMQ"
        exec "${RMQ_RUN[@]}" "$@"
    )
}

rmqctl() { rmq_env "$RMQ_SBIN/rabbitmqctl" "$@"; }

epmd_pid() {
    local pid; pid=$(read_pid "$EPMD_PID")
    pid_is "$pid" epmd && printf '%s' "$pid"
}

epmd_ok() { ERL_EPMD_PORT=$EPMD_PORT epmd -port "$EPMD_PORT" -names >/dev/null 2>&1; }

start_epmd() {
    if epmd_ok; then
        return 0            # ours from an earlier start (port is private)
    fi
    require_free_port "$EPMD_PORT" epmd SEKALI_EPMD_PORT
    # Start it ourselves (not via `erl`'s implicit `epmd -daemon`) so we know
    # its pid and can stop exactly it; new session so a test harness killing
    # our process group does not take it down.
    say "epmd: starting on 127.0.0.1:$EPMD_PORT"
    setsid "${RMQ_RUN[@]}" epmd -port "$EPMD_PORT" -address 127.0.0.1 </dev/null >>"$EPMD_LOG" 2>&1 9>&- &
    echo $! >"$EPMD_PID"
    wait_for 10 "epmd" "$EPMD_LOG" epmd_ok
}

stop_epmd() {
    local pid
    if pid=$(epmd_pid); then
        kill -TERM "$pid" 2>/dev/null || true
        wait_pid_gone "$pid" epmd 5 || kill -KILL "$pid" 2>/dev/null || true
    fi
    # If our epmd had died, `erl` would have spawned a replacement on our
    # private port; that one is ours too.
    if epmd_ok; then
        epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1 || true
    fi
    rm -f "$EPMD_PID"
}

rabbit_pid() {
    local pid; pid=$(read_pid "$RMQ_PID")
    pid_is "$pid" beam && printf '%s' "$pid"
}

# Speak AMQP: send the 0-9-1 protocol header and expect the first byte of a
# method frame (Connection.Start) back.  Proves the listener is the broker and
# it accepts clients, not just that the port is open.
amqp_handshake_ok() {
    [ "$(timeout 5 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "AMQP\x00\x00\x09\x01" >&3
        head -c 1 <&3 | od -An -tx1' _ "$AMQP_PORT" 2>/dev/null | tr -d ' \n')" = 01 ]
}

rabbit_write_config() {
    mkdir -p "$RMQ/home" "$RMQ/conf.d" "$RMQ/log" "$RMQ/mnesia"
    : >"$RMQ/rabbitmq-env.conf"     # keeps /etc/rabbitmq/rabbitmq-env.conf out
    echo '[].' >"$RMQ/enabled_plugins"  # no management plugin: faster boot
    if [ "$TLS" = 1 ]; then echo '[rabbitmq_auth_mechanism_ssl].' >"$RMQ/enabled_plugins"; fi
    echo '[].' >"$RMQ/advanced.config"
    # Private Erlang cookie (HOME is in the scratch dir): root's ~ untouched.
    if [ ! -s "$RMQ/home/.erlang.cookie" ]; then
        LC_ALL=C tr -dc 'A-Z' </dev/urandom 2>/dev/null | head -c 20 >"$RMQ/home/.erlang.cookie" || true
        [ -s "$RMQ/home/.erlang.cookie" ] || echo SEKALITESTCOOKIE >"$RMQ/home/.erlang.cookie"
    fi
    chmod 400 "$RMQ/home/.erlang.cookie"
    # default_user* only take effect when the node's database is created,
    # i.e. on first boot; the user then persists in mnesia.
    cat >"$RMQ/rabbitmq.conf" <<EOF
# written by tests/servers.sh
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
${EXTRA_ADDR:+listeners.tcp.extra = $EXTRA_ADDR:$AMQP_PORT}
distribution.listener.interface = 127.0.0.1
distribution.listener.port_range.min = $AMQP_DIST_PORT
distribution.listener.port_range.max = $AMQP_DIST_PORT
default_vhost = /
default_user = $AMQP_USER
default_pass = $AMQP_PASS
default_user_tags.administrator = true
default_permissions.configure = .*
default_permissions.read = .*
default_permissions.write = .*
consumer_timeout = $CONSUMER_TIMEOUT
log.file.level = info
log.console = false
EOF
    if [ "$RMQ_VERSION" = 4 ] && [ "${SEKALI_RABBITMQ_DENY_DEPRECATED:-1}" = 1 ]; then
        # What RabbitMQ 4.3 refuses, refused here already (4.0 only warns):
        # a suite that asked for one of them fails on 4.0 as it would there.
        printf 'deprecated_features.permit.%s = false\n' global_qos transient_nonexcl_queues \
            >>"$RMQ/rabbitmq.conf"
    fi
    if [ "$TLS" = 1 ]; then
        cat >>"$RMQ/rabbitmq.conf" <<EOF
listeners.ssl.default = 127.0.0.1:$AMQP_TLS_PORT
ssl_options.cacertfile = $TLSDIR/ca.crt
ssl_options.certfile = $TLSDIR/server.crt
ssl_options.keyfile = $TLSDIR/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
EOF
    fi
}

start_rabbitmq() {
    local pid want="$WANT_RMQ tls=$TLS" was
    mkdir -p "$RMQ/log"
    was=$(started_as "$RMQ"); was=${was:-3 tls=0}
    use_rabbitmq "${was%% *}"
    if [ "$was" != "$want" ] && rabbit_pid >/dev/null; then
        say "rabbitmq: running as '$was', asked for '$want': restarting"
        stop_rabbitmq
    fi
    use_rabbitmq "$WANT_RMQ"
    if pid=$(rabbit_pid); then
        if amqp_handshake_ok; then
            say "rabbitmq: already running on 127.0.0.1:$AMQP_PORT (node $RABBIT_NODE)"
            rabbit_queue_policy
            echo "$want" >"$RMQ/$STARTED"
            return 0
        fi
        say "rabbitmq: running but not answering yet, waiting"
        rabbit_wait ||
            die "rabbitmq exited during startup (logs: $RMQ_LOG, $RMQ_STARTUP_LOG)"
    else
        require_free_port "$AMQP_PORT" rabbitmq SEKALI_AMQP_PORT
        require_free_port "$AMQP_DIST_PORT" "rabbitmq (erlang distribution)" SEKALI_AMQP_DIST_PORT
        # A node's database does not survive a change of major version
        # (4.x upgrades only from 3.13): the test broker's is throw-away.
        if [ "$(cat "$RMQ/mnesia/.sekali-version" 2>/dev/null || echo 3)" != "$RMQ_VERSION" ]; then
            rm -rf "$RMQ/mnesia"
        fi
        rabbit_write_config
        echo "$RMQ_VERSION" >"$RMQ/mnesia/.sekali-version"
        write_wrappers
        rabbit_launch
        # RabbitMQ 4.0 can fail its boot when it checks a denied deprecated
        # feature before its queue table is loaded ("Mnesia function failed
        # 99 times", then failed_to_deny_deprecated_features): a race on a
        # loaded machine, which the next boot of the same node wins. Seen
        # once in check_outages' restart; one more boot, not a longer wait.
        if ! rabbit_wait; then
            grep -q failed_to_deny_deprecated_features "$RMQ_STARTUP_LOG" ||
                die "rabbitmq exited during startup (logs: $RMQ_LOG, $RMQ_STARTUP_LOG)"
            say "rabbitmq: boot lost 4.0's deprecated-feature race; booting once more"
            rabbit_launch
            rabbit_wait ||
                die "rabbitmq exited during startup (logs: $RMQ_LOG, $RMQ_STARTUP_LOG)"
        fi
    fi
    rabbit_queue_policy
    echo "$want" >"$RMQ/$STARTED"
    say "rabbitmq: ready ($(rabbit_version))"
}

# Starts the node in the background (its boot errors land in startup.log);
# setsid so that it survives the caller's process group being killed.
rabbit_launch() {
    start_epmd
    rm -f "$RMQ_PID"
    say "rabbitmq: starting node $RABBIT_NODE on 127.0.0.1:$AMQP_PORT"
    : >"$RMQ_STARTUP_LOG"
    (
        eval "$(rabbit_env_lines)"
        cd "$RMQ"
        exec setsid "${RMQ_RUN[@]}" "$RMQ_SBIN/rabbitmq-server"
    ) </dev/null >>"$RMQ_STARTUP_LOG" 2>&1 9>&- &
    echo $! >"$RMQ/rabbitmq-server.pid"
}

rabbit_version() { rmqctl -q eval 'rabbit_misc:version().' 2>/dev/null | tr -d '"' || echo '?'; }

# Classic queues as RabbitMQ 3.12 and later run them whatever the policy:
# version 2 (a leaner index and message store) and lazy (messages go to
# disk, not into the queue process's heap, which the VM would otherwise
# keep garbage-collecting while a backlog drains). On this broker (3.10)
# that takes a policy, as it does in production on 3.10 and 3.11
# (docs/operations.md, "RabbitMQ's classic queues"). Priority 0, so that a test's own policy overrides it.
rabbit_queue_policy() {
    [ "$RMQ_VERSION" != 4 ] || return 0    # 4.x: always so, and 4.3 refuses the keys
    rmqctl -q set_policy --apply-to queues --priority 0 sekali-classic-queues '.*' \
        '{"queue-version": 2, "queue-mode": "lazy"}' >/dev/null ||
        die "rabbitmq: could not set the classic-queue policy"
}

# Kill a half-started broker: setsid made the launcher a process group
# leader, and the VM lives in that group.
rabbit_kill_launch() {
    local launcher=$1 pid
    pid=$(rabbit_pid) || pid=''
    if [ -n "$launcher" ] && pid_is "$launcher" ''; then
        kill -TERM -- "-$launcher" 2>/dev/null || true
    fi
    [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null || true
    sleep 2
    if [ -n "$launcher" ] && pid_is "$launcher" ''; then
        kill -KILL -- "-$launcher" 2>/dev/null || true
    fi
    if [ -n "$pid" ] && pid_is "$pid" beam; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$RMQ_PID" "$RMQ/rabbitmq-server.pid"
    stop_epmd
}

# Wait for boot: await_startup needs the node to be reachable first, so retry
# it; return 1 early if the VM died (its logs shown, the launch cleaned up)
# instead of sitting out the timeout.
rabbit_wait() {
    local deadline=$((SECONDS + WAIT_RABBIT)) launcher left
    launcher=$(read_pid "$RMQ/rabbitmq-server.pid")
    while :; do
        left=$((deadline - SECONDS))
        if [ "$left" -le 0 ]; then
            show_log "$RMQ_STARTUP_LOG"; show_log "$RMQ_LOG"
            rabbit_kill_launch "$launcher"
            die "rabbitmq did not start within ${WAIT_RABBIT}s (logs: $RMQ_LOG, $RMQ_STARTUP_LOG)"
        fi
        # (any name: right after `&` the launcher may not have exec'd yet)
        if ! rabbit_pid >/dev/null && ! pid_is "$launcher" ''; then
            show_log "$RMQ_STARTUP_LOG"; show_log "$RMQ_LOG"
            rabbit_kill_launch "$launcher"
            return 1
        fi
        if rabbit_pid >/dev/null &&
           rmqctl -q await_startup -t "$left" >/dev/null 2>&1 &&
           amqp_handshake_ok; then
            return 0
        fi
        sleep 0.5
    done
}

stop_rabbitmq() {
    local pid launcher
    launcher=$(read_pid "$RMQ/rabbitmq-server.pid")
    if pid=$(rabbit_pid); then
        say "rabbitmq: stopping node $RABBIT_NODE"
        write_wrappers      # the tools of the version that runs
        # `stop PIDFILE` returns only once the VM process has exited.
        if ! timeout "$WAIT_RABBIT" "$BIN/rabbitmqctl" -q stop "$RMQ_PID" >/dev/null 2>&1; then
            say "rabbitmq: rabbitmqctl stop failed, sending SIGTERM to $pid"
            kill -TERM "$pid" 2>/dev/null || true
            wait_pid_gone "$pid" beam 20 || kill -KILL "$pid" 2>/dev/null || true
        fi
        wait_pid_gone "$pid" beam 10 || true
    fi
    # The sh launcher exits with the VM; make sure (only if it is still the
    # sh, then with its whole group in case a VM is left without a pid file).
    if [ -n "$launcher" ] && pid_is "$launcher" rabbitmq-server; then
        kill -TERM -- "-$launcher" 2>/dev/null || true
    fi
    rm -f "$RMQ_PID" "$RMQ/rabbitmq-server.pid" "$RMQ/$STARTED"
    stop_epmd
}

# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------

cmd_start() {
    local t0=$SECONDS
    install_packages
    need_root_image
    take_lock
    prepare_scratch
    reserve_ports
    make_test_ca
    cd "$SCRATCH"
    # Redis and PostgreSQL are quick; RabbitMQ is the slow one.  Sequential
    # keeps errors readable; RabbitMQ's boot dominates anyway.
    start_redis
    start_postgres
    start_rabbitmq
    say "all servers ready in $((SECONDS - t0))s; use: eval \"\$($0 env)\""
}

cmd_stop() {
    local wipe=0
    [ "${1:-}" = --wipe ] && wipe=1
    if [ ! -d "$SCRATCH" ]; then
        return 0
    fi
    [ -f "$MARKER" ] || die "$SCRATCH does not look like ours (no $MARKER); not touching it"
    take_lock
    cd "$SCRATCH"
    stop_rabbitmq
    stop_redis
    stop_postgres
    if [ "$wipe" = 1 ]; then
        say "removing $SCRATCH"
        cd /
        rm -rf -- "$SCRATCH"
    fi
    say "stopped"
}

cmd_single() {
    local action=$1 server=$2
    case $action in start|restart) install_packages; need_root_image ;; esac
    take_lock
    [ -f "$MARKER" ] || prepare_scratch
    reserve_ports
    # A server started alone with SEKALI_TLS=1 needs the CA as much as one
    # started by `start` (a CA already in tls/, e.g. a cluster's shared one,
    # is kept).
    case $action in start|restart) make_test_ca ;; esac
    cd "$SCRATCH"
    case $action in
        stop) "stop_$server" ;;
        start) "start_$server" ;;
        restart) "stop_$server"; "start_$server" ;;
    esac
}

cmd_status() {
    local all=0 pid
    if pg_running && pg_query_ok; then
        say "postgres: running on 127.0.0.1:$PG_PORT ($PGDATA)"
    else say "postgres: not running"; all=3; fi
    if pid=$(redis_pid) && redis_ping; then
        say "redis: running on 127.0.0.1:$REDIS_PORT (pid $pid)"
    else say "redis: not running"; all=3; fi
    if pid=$(rabbit_pid) && amqp_handshake_ok; then
        say "rabbitmq: running on 127.0.0.1:$AMQP_PORT (node $RABBIT_NODE, pid $pid)"
    else say "rabbitmq: not running"; all=3; fi
    return $all
}

cmd_env() {
    e() { printf 'export %s=%s\n' "$1" "$(squote "$2")"; }
    e SEKALI_SCRATCH "$SCRATCH"
    e SEKALI_BIN "$BIN"
    e SEKALI_PG_PORT "$PG_PORT"
    e SEKALI_PG_CONNINFO "host=127.0.0.1 port=$PG_PORT dbname=$DB_NAME user=$DB_USER password=$DB_PASS"
    e SEKALI_PG_URL "postgresql://$DB_USER:$DB_PASS@127.0.0.1:$PG_PORT/$DB_NAME"
    e SEKALI_REDIS_HOST 127.0.0.1
    e SEKALI_REDIS_PORT "$REDIS_PORT"
    e SEKALI_REDIS_URL "redis://127.0.0.1:$REDIS_PORT/0"
    e SEKALI_AMQP_HOST 127.0.0.1
    e SEKALI_AMQP_PORT "$AMQP_PORT"
    e SEKALI_AMQP_USER "$AMQP_USER"
    e SEKALI_AMQP_PASSWORD "$AMQP_PASS"
    e SEKALI_AMQP_VHOST /
    # %2f = vhost "/".  A bare trailing slash ("...:55672/") means the
    # *empty* vhost to URI parsers such as librabbitmq's amqp_parse_url.
    e SEKALI_AMQP_URL "amqp://$AMQP_USER:$AMQP_PASS@127.0.0.1:$AMQP_PORT/%2f"
    e SEKALI_AMQP_DIST_PORT "$AMQP_DIST_PORT"
    e SEKALI_EPMD_PORT "$EPMD_PORT"
    e SEKALI_RABBIT_NODE "$RABBIT_NODE"
    e SEKALI_RABBITMQCTL "$BIN/rabbitmqctl"
    # The versions that run, so that a suite's own servers.sh calls (a
    # restart) keep them, and a suite can tell which it meets.
    e SEKALI_PG "$WANT_PG"
    e SEKALI_REDIS "$WANT_REDIS"
    e SEKALI_RABBITMQ "$WANT_RMQ"
    if [ "$TLS" = 1 ]; then
        e SEKALI_TLS_DIR "$TLSDIR"
        e SEKALI_AMQP_TLS_PORT "$AMQP_TLS_PORT"
        e SEKALI_REDIS_TLS_PORT "$REDIS_TLS_PORT"
    fi
}

usage() {
    sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

use_pg "$WANT_PG"; use_redis "$WANT_REDIS"; use_rabbitmq "$WANT_RMQ"

case ${1:-} in
    start)  cmd_start ;;
    stop)   shift; cmd_stop "$@" ;;
    status) cmd_status ;;
    env)    cmd_env ;;
    pg-bindir) d=$(pg_bindir); [ -n "$d" ] || die "no initdb/pg_ctl under /usr/lib/postgresql/*/bin"
            echo "$d" ;;
    start-postgres|stop-postgres|restart-postgres| \
    start-redis|stop-redis|restart-redis| \
    start-rabbitmq|stop-rabbitmq|restart-rabbitmq)
            cmd_single "${1%%-*}" "${1#*-}" ;;
    -h|--help|help) usage ;;
    *) usage ;;
esac
