# tests/cluster/lib.sh - what the cluster tests share: settings, bounded
# waits, servers started through tests/servers.sh, sekalid, the producer,
# and the checks behind every summary line.
#
# Sourced (never run) by tests/cluster/test_*.sh from the repository's root,
# after `set -euo pipefail`, with `name` (the test's name) set and the build
# directory as $1. Leaves behind: build, work (this test's directory, wiped
# at exit unless SEKALI_CLUSTER_KEEP=1), port_base and an EXIT trap that
# stops sekalid and every server started through srv_start.
#
# Settings (environment):
#   SEKALI_CLUSTER_PORT_BASE [47000]  each test uses ports from here to +199
#   SEKALI_CLUSTER_SCRATCH [/tmp/sekali-cluster]
#   SEKALI_CLUSTER_KEEP [0]           1: keep the test's files for diagnosis
# shellcheck shell=bash
# shellcheck disable=SC2154  # name: set by the sourcing test

build=${1:-build}
port_base=${SEKALI_CLUSTER_PORT_BASE:-47000}
[[ $port_base =~ ^[0-9]+$ ]] && (( port_base >= 1024 && port_base + 200 <= 65535 )) ||
    { echo "$name: SEKALI_CLUSTER_PORT_BASE must be a port from 1024 to 65335" >&2; exit 2; }
scratch=${SEKALI_CLUSTER_SCRATCH:-/tmp/sekali-cluster}
work=$scratch/$name
producer=$build/chaos/chaos_producer
handler=$(cd "$build" && pwd)/tests/plugins/effect.so
sekalid_pid=''
stops=()     # commands that stop what was started, run at exit in reverse

say() { printf '%s: %s\n' "$name" "$*" >&2; }
# A failure is the run's result, so its line goes to stdout too, where
# tests/cluster/run.sh takes each test's summary from (stderr alone: also
# from inside a command substitution, which would swallow the stdout copy).
die() {
    printf '%s: FAILED: %s\n' "$name" "$*" >&2
    printf '%s: FAILED: %s\n' "$name" "$*"
    exit 1
}
now_ms() { local t=${EPOCHREALTIME/./}; printf '%s' $((t / 1000)); }

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 100 ms; dies naming
# WHAT if it has not succeeded within SECONDS.
wait_for() {
    local secs=$1 what=$2 deadline; shift 2
    deadline=$(( $(now_ms) + secs * 1000 ))
    until "$@" >/dev/null 2>&1; do
        (( $(now_ms) < deadline )) || die "$what: not within ${secs}s"
        sleep 0.1
    done
}

# dead PID: gone, or a zombie not yet reaped.
dead() {
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    s=${s##*) }
    [[ $s == Z* || $s == X* ]]
}

# The ports lie in Linux's ephemeral range: reserved, no client socket of a
# busy run is given one (as tests/servers.sh does for its own).
reserved=/proc/sys/net/ipv4/ip_local_reserved_ports
if [ -w "$reserved" ]; then
    r=$(<"$reserved")
    echo "${r:+$r,}$port_base-$((port_base + 199))" >"$reserved" 2>/dev/null || true
fi

# The scratch dir is ours only with our marker in it: nothing else is wiped.
[ ! -e "$work" ] || [ -e "$work/.sekali-cluster" ] ||
    die "$work exists and is not ours (no .sekali-cluster): not touching it"
rm -rf "$work"
mkdir -p "$work"
chmod 755 "$scratch" "$work"
touch "$work/.sekali-cluster"

cluster_cleanup() {
    local rc=$? i
    trap - EXIT
    stop_sekalid
    for (( i = ${#stops[@]} - 1; i >= 0; i-- )); do
        eval "${stops[i]}" >>"$work/servers.log" 2>&1 || say "clean-up step failed: ${stops[i]}"
    done
    if [ "$rc" != 0 ] || [ "${SEKALI_CLUSTER_KEEP:-0}" = 1 ]; then
        say "files kept in $work"
    else
        rm -rf "$work"
    fi
    exit "$rc"
}
trap cluster_cleanup EXIT
trap 'exit 130' INT TERM

# srv SCRATCH ACTION [VAR=VALUE ...]: tests/servers.sh ACTION for the server
# set in $work/SCRATCH, with the settings given.
srv() {
    local dir=$work/$1 action=$2; shift 2
    env SEKALI_SCRATCH="$dir" "$@" tests/servers.sh "$action" >>"$work/servers.log" 2>&1
}

# srv_start SCRATCH SERVER [VAR=VALUE ...]: starts SERVER (postgres, redis,
# rabbitmq) of that set, and stops it at exit.
srv_start() {
    local set=$1 server=$2; shift 2
    srv "$set" "start-$server" "$@" || { tail -n 30 "$work/servers.log" >&2;
                                         die "could not start $server ($set)"; }
    stops+=("srv $set stop-$server $(printf '%q ' "$@")")
}

# The single Redis (and a PostgreSQL, when the test does not bring its own).
redis_port=$((port_base + 1))
start_redis() { srv_start single redis SEKALI_REDIS_PORT="$redis_port"; }

# sql CONNINFO ARGS...: psql, unaligned, tuples only.
sql() {
    local ci=$1; shift
    PGOPTIONS='-c client_min_messages=warning' PGCONNECT_TIMEOUT=3 \
        psql -X -q -t -A -v ON_ERROR_STOP=1 "$ci" "$@"
}

# write_conf FILE AMQP_URL_YAML CONNINFO QUEUE [QUEUE_EXTRA_YAML]: a sekalid
# config with the effect handler; AMQP_URL_YAML is what follows "url:".
write_conf() {
    cat >"$1" <<YAML
amqp:
  url: $2
  heartbeat: 2s
  connect_timeout: 1s
redis:
  host: 127.0.0.1
  port: $redis_port
postgres:
  conninfo: "$3"
lock:
  ttl: 5s
log:
  level: ${SEKALI_CLUSTER_LOG_LEVEL:-warn}
  format: json
shutdown_timeout: 10s
outbox:
  relays: 0
janitor:
  interval: 0s
queues:
  - name: $4
    handler: $handler
    workers: ${SEKALI_CLUSTER_WORKERS:-4}
${5:-}
YAML
}

# schema CONF CONNINFO: sekali's migrations and the effect table.
schema() {
    PGOPTIONS='-c client_min_messages=warning' "$build/sekalictl" -c "$1" migrate --sql-dir sql \
        >/dev/null || die "sekalictl migrate failed"
    sql "$2" -f tests/data/effects.sql >/dev/null || die "tests/data/effects.sql failed"
    "$build/sekalid" -t -c "$1" 2>/dev/null || "$build/sekalid" -t -c "$1" || die "bad config $1"
}

start_sekalid() {
    "$build/sekalid" -c "$1" 2>>"$work/sekalid.log" &
    sekalid_pid=$!
}

stop_sekalid() {
    [ -n "$sekalid_pid" ] || return 0
    kill -TERM "$sekalid_pid" 2>/dev/null || true
    local i
    for i in $(seq 1 300); do kill -0 "$sekalid_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$sekalid_pid" 2>/dev/null; then
        say "sekalid did not stop within 30 s of SIGTERM; killing it"
        pkill -KILL -P "$sekalid_pid" 2>/dev/null || true
        kill -KILL "$sekalid_pid" 2>/dev/null || true
    fi
    wait "$sekalid_pid" 2>/dev/null || true
    sekalid_pid=''
}

# done_keys CONNINFO QUEUE: keys with at least one effect.
done_keys() {
    sql "$1" -c "SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects
                 WHERE queue = '$2'"
}

# pause_around CONNINFO QUEUE MS: how long consumption stopped after the
# fault at epoch time MS: the longest gap, in ms, between one effect and
# the next among those from the last one before MS on (a worker may still
# finish the deliveries it had buffered before it notices the fault, so the
# first effect after MS is not yet the end of the pause).
pause_around() {
    sql "$1" -c "SELECT coalesce(round(max(gap) * 1000)::bigint, -1) FROM (
        SELECT extract(epoch FROM created_at - lag(created_at) OVER (ORDER BY created_at)) AS gap,
               created_at
          FROM sekali_test.effects WHERE queue = '$2') g
        WHERE created_at >= to_timestamp($3 / 1000.0)"
}

# tally CONNINFO QUEUE KEYS: sets effects, doubled (keys with more than one
# effect), lost (keys without one), completed (keys sekali marks completed)
# and duplicates (deliveries sekali recognised as done and acked unrun).
tally() {
    local row
    row=$(sql "$1" -F ' ' -c "
        SELECT (SELECT count(*) FROM sekali_test.effects WHERE queue = '$2'),
               (SELECT count(*) FROM (SELECT 1 FROM sekali_test.effects WHERE queue = '$2'
                                       GROUP BY idempotency_key HAVING count(*) > 1) d),
               (SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects WHERE queue = '$2'),
               (SELECT count(*) FROM sekali.idempotency_keys
                 WHERE queue = '$2' AND status = 'completed'),
               (SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys
                 WHERE queue = '$2')") || die "cannot count the effects"
    local distinct
    read -r effects doubled distinct completed duplicates <<<"$row"
    lost=$(( $3 - distinct ))
}
