# tests/cluster/sekalid_lib.sh - what test_sentinel.sh, test_netns.sh and
# bench_cluster.sh share: a private set of test servers, the schema, the
# producer, a sekalid configuration and the counts every run reports.
#
# Sourced (never run) from the repository's root, after `set -euo pipefail`,
# with `build` (the build directory) and `name` (the test's name, for
# messages) set. Messages go to stderr; the caller's result line to stdout.
# Leaves behind `work`, the test's own directory (wiped first).
#
# Settings, as for the other cluster tests (tests/cluster/run.sh):
#   SEKALI_CLUSTER_PORT_BASE [47000]  ports from here to +99
#   SEKALI_CLUSTER_SCRATCH [/tmp/sekali-cluster]  work = SCRATCH/NAME
#   SEKALI_CLUSTER_KEEP [0]  1: keep work after a pass too

# shellcheck shell=bash
# shellcheck disable=SC2154  # build and name: set by the sourcing script

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

port_base=${SEKALI_CLUSTER_PORT_BASE:-47000}
[[ $port_base =~ ^[0-9]+$ ]] && (( port_base >= 1024 && port_base + 100 <= 65535 )) ||
    die "SEKALI_CLUSTER_PORT_BASE must be a port from 1024 to 65435"
work=${SEKALI_CLUSTER_SCRATCH:-/tmp/sekali-cluster}/$name
case $work in /tmp/*|/var/tmp/*) ;; *) die "SEKALI_CLUSTER_SCRATCH must lie under /tmp or /var/tmp" ;; esac
rm -rf "$work"
mkdir -p "$work"
chmod 755 "$work" "$(dirname "$work")"

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 50 ms; after
# SECONDS fails the test, saying WHAT did not happen.
wait_for() {
    local secs=$1 what=$2 deadline=$(( $(now_ms) + $1 * 1000 )); shift 2
    until "$@" >/dev/null 2>&1; do
        (( $(now_ms) < deadline )) || die "$what did not happen within ${secs}s"
        sleep 0.05
    done
}

# A pid is dead once it is gone or a zombie.
dead() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    [[ $stat == [ZX]* ]]
}
alive() { ! dead "$1"; }

producer=$build/chaos/chaos_producer
handler=$(cd "$build" 2>/dev/null && pwd)/tests/plugins/effect.so   # absolute: the config needs it
[ -x "$build/sekalid" ] && [ -x "$build/sekalictl" ] && [ -x "$producer" ] && [ -f "$handler" ] ||
    die "no $build/sekalid, sekalictl, $producer or $handler: make all tests"

# srv_up [ADDRESS/PREFIX]: a private set of tests/servers.sh servers for
# this test, in $work/servers, on ports port_base + 10 .. + 15, also
# listening on ADDRESS if given (see SEKALI_LISTEN_EXTRA there); exports its
# settings (SEKALI_*). srv_down stops and wipes it; call it at exit.
srv_started=0
srv_up() {
    export SEKALI_SCRATCH=$work/servers
    export SEKALI_PG_PORT=$((port_base + 10)) SEKALI_REDIS_PORT=$((port_base + 11))
    export SEKALI_AMQP_PORT=$((port_base + 12)) SEKALI_AMQP_DIST_PORT=$((port_base + 13))
    export SEKALI_EPMD_PORT=$((port_base + 15)) SEKALI_RABBIT_NODE=sekali-$name-$port_base@localhost
    export SEKALI_LISTEN_EXTRA=${1:-}
    say "starting private servers in $SEKALI_SCRATCH${1:+, also listening on ${1%/*}}"
    srv_started=1
    tests/servers.sh start >"$work/servers.log" 2>&1 ||
        { tail -n 20 "$work/servers.log" >&2; die "tests/servers.sh start failed (log: $work/servers.log)"; }
    eval "$(tests/servers.sh env)"
}
# keep_or_wipe RC: at exit, the test's directory goes unless the test failed
# or SEKALI_CLUSTER_KEEP=1.
keep_or_wipe() {
    if [ "$1" = 0 ] && [ "${SEKALI_CLUSTER_KEEP:-0}" != 1 ]; then
        rm -rf "$work"
    else
        say "files kept in $work"
    fi
}
srv_down() {
    [ "$srv_started" = 1 ] || return 0
    tests/servers.sh stop --wipe >>"$work/servers.log" 2>&1 || say "tests/servers.sh stop failed"
}

quiet_pg='-c client_min_messages=warning'
sql() { PGOPTIONS=$quiet_pg psql -X -q -t -A -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO" "$@"; }

# schema CONF: sekali's migrations and the effect table; CONF checked by -t.
schema() {
    PGOPTIONS=$quiet_pg "$build/sekalictl" -c "$1" migrate --sql-dir sql >/dev/null
    sql -f tests/data/effects.sql
    "$build/sekalid" -t -c "$1" >/dev/null 2>&1 || "$build/sekalid" -t -c "$1"
}

# drop_queue QUEUE: QUEUE and the queues sekalid made for it (delay, dead
# letters) deleted, its effects and keys forgotten: runs leave nothing.
drop_queue() {
    local q
    for q in $("$SEKALI_RABBITMQCTL" -q list_queues name 2>/dev/null | grep -F "$1" || true); do
        [ "$q" = "$1" ] || [[ $q == "$1".* ]] || continue
        "$SEKALI_RABBITMQCTL" -q delete_queue "$q" >/dev/null 2>&1 || true
    done
    sql -c "DELETE FROM sekali_test.effects WHERE queue = '$1';
            DELETE FROM sekali.idempotency_keys WHERE queue = '$1'" >/dev/null 2>&1 || true
}

# publish URL QUEUE KEYS DUP_PERCENT SEED BODY: every key once, DUP_PERCENT %
# twice, shuffled; prints the number of messages.
publish() {
    local out
    out=$("$producer" "$@") || die "the producer failed"
    out=${out#published=}
    printf '%s' "${out%% *}"
}

# Counts for QUEUE: distinct keys with an effect, effect rows, keys with more
# than one effect.
keys_done() { sql -c "SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects WHERE queue = '$1'"; }
effects() { sql -c "SELECT count(*) FROM sekali_test.effects WHERE queue = '$1'"; }
doubled() {
    sql -c "SELECT count(*) FROM (SELECT 1 FROM sekali_test.effects WHERE queue = '$1'
                                   GROUP BY idempotency_key HAVING count(*) > 1) d"
}
all_done() { [ "$(keys_done "$1")" -ge "$2" ]; }

# pause_ms QUEUE SINCE_MS: the longest time without a new effect from
# SINCE_MS (epoch ms, the fault) on: the first effect after it counts from
# SINCE_MS, each later one from the one before.
pause_ms() {
    sql -c "SELECT coalesce(max(gap), 0)::bigint FROM (
              SELECT extract(epoch FROM created_at) * 1000
                     - coalesce(lag(extract(epoch FROM created_at) * 1000) OVER (ORDER BY created_at),
                                $2) AS gap
                FROM sekali_test.effects
               WHERE queue = '$1' AND created_at >= to_timestamp($2 / 1000.0)) g"
}

# write_conf FILE QUEUE WORKERS AMQP_URL PG_CONNINFO REDIS_YAML [EXTRA_QUEUE_YAML]
# REDIS_YAML: the redis section's lines, each indented two spaces.
write_conf() {
    cat >"$1" <<YAML
amqp:
  url: "$4"
  heartbeat: 2s
  connect_timeout: 2s
redis:
$6
postgres:
  conninfo: "$5"
lock:
  ttl: 2s
log:
  level: info
  format: json
shutdown_timeout: 10s
outbox:
  relays: 0
janitor:
  interval: 0s
queues:
  - name: $2
    handler: $handler
    workers: $3
${7:-}
YAML
}

# stop_pid PID: SIGTERM, a bounded wait, then SIGKILL to it and its children.
stop_pid() {
    local pid=$1 _ kids
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 200); do dead "$pid" && break; sleep 0.1; done
    if alive "$pid"; then
        say "pid $pid did not stop within 20 s of SIGTERM; killing it"
        kids=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null || true)
        kill -KILL "$pid" 2>/dev/null || true
        # shellcheck disable=SC2086  # a list of pids
        [ -z "$kids" ] || kill -KILL $kids 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

# in_queue QUEUE: messages of QUEUE and its delay queues, ready or unacked.
in_queue() {
    "$SEKALI_RABBITMQCTL" -q list_queues name messages 2>/dev/null |
        awk -v q="$1" '$1 == q || index($1, q ".delay.") == 1 { n += $2; seen = 1 }
                       END { if (!seen) exit 1; print n + 0 }'
}
queue_empty() { [ "$(in_queue "$1" || echo x)" = 0 ]; }
