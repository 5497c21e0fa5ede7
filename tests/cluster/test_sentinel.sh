#!/usr/bin/env bash
# tests/cluster/test_sentinel.sh - locks follow a Redis Sentinel failover:
# the master is killed mid-run, the sentinels promote the replica, sekalid
# asks them for the new master and takes its locks there, every key once.
#
#   tests/cluster/test_sentinel.sh [BUILD_DIR]     (run by tests/cluster/run.sh)
#
# Starts, on 127.0.0.1, a Redis master, a replica of it and three
# redis-sentinel processes monitoring it (quorum 2, down-after 1 s), in
# SCRATCH/test_sentinel; PostgreSQL and RabbitMQ are a private set of
# tests/servers.sh's, stopped and wiped at the end (tests/cluster/sekalid_lib.sh). sekalid (2 workers, on_redis_down: wait, so that no job runs
# unlocked) consumes a stream from chaos_producer: every key once, 30 % of
# them twice, each job "sleep:20" with tests/plugins/effect.so, one effect
# row per execution. Once a third of the keys are done the master gets
# SIGKILL. Proved, each with a bounded wait:
#   - locks were taken on the old master before (its SET count > 0);
#   - the master process died;
#   - every sentinel names the replica's port as the master, and the
#     replica answers ROLE "master";
#   - locks are taken on the new master (its SET and EVALSHA counts, reset
#     at promotion, grow) and sekalid logged "locking resumed";
#   - every key has exactly one effect, and the queue drains.
# Prints one line on stdout:
#   test_sentinel: killed=redis-master pid=P failover_ms=F pause_ms=M keys=K
#             published=N effects=E duplicates=D lost=L new_master_sets=S seconds=T
# Exit 0 only if all of that holds. Settings: SENTINEL_KEYS [600],
# SENTINEL_TIMEOUT [180] seconds for the whole run; ports from
# SEKALI_CLUSTER_PORT_BASE + 10 .. + 24.
{
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
name=test_sentinel
keys=${SENTINEL_KEYS:-600}
timeout=${SENTINEL_TIMEOUT:-180}
t_start=$SECONDS
# shellcheck source=tests/cluster/sekalid_lib.sh
. tests/cluster/sekalid_lib.sh
command -v redis-sentinel >/dev/null || die "redis-sentinel is not installed: tools/install-deps.sh"

srv_up
base=$((port_base + 20))
m_port=$base r_port=$((base + 1))
s_ports=($((base + 2)) $((base + 3)) $((base + 4)))
master_name=sk-locks
queue=sentinel-$$-$RANDOM
sekalid=''

rcli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

# redis_start DIR PORT [EXTRA CONFIG LINE...]: a throw-away Redis.
redis_start() {
    local dir=$1 port=$2 line; shift 2
    mkdir -p "$dir"
    {
        printf 'bind 127.0.0.1\nport %s\ndaemonize yes\npidfile %s/redis.pid\n' "$port" "$dir"
        printf 'logfile %s/redis.log\ndir %s\nsave ""\nappendonly no\n' "$dir" "$dir"
        for line in "$@"; do printf '%s\n' "$line"; done
    } >"$dir/redis.conf"
    redis-server "$dir/redis.conf" || die "redis-server on port $port did not start (log: $dir/redis.log)"
}

sentinel_start() {
    local dir=$work/sentinel-$1 port=$1
    mkdir -p "$dir"
    # Sentinel rewrites its file with what it learns: it must be writable.
    cat >"$dir/sentinel.conf" <<EOF
bind 127.0.0.1
port $port
daemonize yes
pidfile $dir/sentinel.pid
logfile $dir/sentinel.log
dir $dir
sentinel monitor $master_name 127.0.0.1 $m_port 2
sentinel down-after-milliseconds $master_name 1000
sentinel failover-timeout $master_name 10000
sentinel parallel-syncs $master_name 1
EOF
    redis-sentinel "$dir/sentinel.conf" || die "redis-sentinel on port $port did not start"
}

pid_of() { tr -dc '0-9' <"$1" 2>/dev/null || true; }

cleanup() {
    local rc=$?
    local f p
    stop_pid "$sekalid"
    [ -z "${SEKALI_RABBITMQCTL:-}" ] || drop_queue "$queue"
    for f in "$work"/*/redis.pid "$work"/*/sentinel.pid; do
        p=$(pid_of "$f")
        [ -n "$p" ] && alive "$p" && kill -KILL "$p" 2>/dev/null
    done
    srv_down
    keep_or_wipe "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The Redis side: master, replica, three sentinels that agree on the master.
redis_start "$work/master" "$m_port"
redis_start "$work/replica" "$r_port" "replicaof 127.0.0.1 $m_port"
for p in "${s_ports[@]}"; do sentinel_start "$p"; done
replica_synced() { rcli "$r_port" info replication | grep -q '^master_link_status:up'; }
wait_for 20 "the replica's sync with the master" replica_synced
sentinels_see() {
    local p; for p in "${s_ports[@]}"; do
        [ "$(rcli "$p" sentinel get-master-addr-by-name "$master_name" | tail -n 1)" = "$1" ] || return 1
        # Each sentinel must know the replica and the other two sentinels.
        [ "$(rcli "$p" sentinel master "$master_name" | awk 'p { print; exit } $0 == "num-other-sentinels" { p = 1 }')" = 2 ] ||
            return 1
        [ "$(rcli "$p" sentinel master "$master_name" | awk 'p { print; exit } $0 == "num-slaves" { p = 1 }')" = 1 ] ||
            return 1
    done
}
wait_for 30 "three sentinels agreeing on master $m_port with 1 replica and 2 peers" sentinels_see "$m_port"
say "redis master :$m_port, replica :$r_port, sentinels ${s_ports[*]}"

conf=$work/sekali.yaml
sentinel_list=$(printf '"127.0.0.1:%s", ' "${s_ports[@]}")
write_conf "$conf" "$queue" 2 "$SEKALI_AMQP_URL" "$SEKALI_PG_CONNINFO" \
"  sentinels: [${sentinel_list%, }]
  master_name: $master_name
  timeout: 500ms" \
"    on_redis_down: wait"
schema "$conf"
seed=$((RANDOM * 32768 + RANDOM))
published=$(publish "$SEKALI_AMQP_URL" "$queue" "$keys" 30 "$seed" "sleep:20")
say "published $published messages for $keys keys (seed $seed)"

log=$work/sekalid.log
"$build/sekalid" -c "$conf" 2>"$log" &
sekalid=$!
t0=$(now_ms)

third() { alive "$sekalid" || die "sekalid exited (log: $log)"; [ "$(keys_done "$queue")" -ge $((keys / 3)) ]; }
wait_for "$timeout" "a third of the keys done before the fault" third
sets_before=$(rcli "$m_port" info commandstats | awk -F'[=,:]' '$1 == "cmdstat_set" { print $3 }')
[ "${sets_before:-0}" -gt 0 ] || die "no lock was taken on the first master (SET count ${sets_before:-0})"

# The fault: SIGKILL to the master, no shutdown, nothing saved.
m_pid=$(pid_of "$work/master/redis.pid")
[ -n "$m_pid" ] && alive "$m_pid" || die "no live master pid in $work/master/redis.pid"
kill -KILL "$m_pid"
t_kill=$(now_ms)
wait_for 5 "the death of the master (pid $m_pid)" dead "$m_pid"
done_at_kill=$(keys_done "$queue")
say "killed the master (pid $m_pid, $sets_before SETs) with $done_at_kill of $keys keys done"

# The failover: every sentinel names the replica; it says it is the master.
is_master() { [ "$(rcli "$r_port" role | head -n 1)" = master ]; }
sentinels_see_new() {
    local p; for p in "${s_ports[@]}"; do
        [ "$(rcli "$p" sentinel get-master-addr-by-name "$master_name" | tail -n 1)" = "$r_port" ] || return 1
    done
    is_master
}
wait_for 60 "the failover to the replica (:$r_port)" sentinels_see_new
t_failover=$(now_ms)
rcli "$r_port" config resetstat >/dev/null
failover_ms=$((t_failover - t_kill))
say "failover done in $failover_ms ms: :$r_port is the master"

new_master_locks() {
    local stats
    stats=$(rcli "$r_port" info commandstats)
    grep -q '^cmdstat_set:calls=[1-9]' <<<"$stats" && grep -q '^cmdstat_evalsha:calls=[1-9]' <<<"$stats"
}
wait_for 60 "locks taken and released on the new master (:$r_port)" new_master_locks
resumed() { grep -q 'locking resumed' "$log"; }
wait_for 30 "sekalid's \"locking resumed\" log line" resumed

finished() { alive "$sekalid" || die "sekalid exited (log: $log)"; all_done "$queue" "$keys"; }
wait_for "$timeout" "an effect for every one of the $keys keys" finished
wait_for 60 "the queue $queue draining (copies acked)" queue_empty "$queue"
t_end=$(now_ms)
new_sets=$(rcli "$r_port" info commandstats | awk -F'[=,:]' '$1 == "cmdstat_set" { print $3 }')
stop_pid "$sekalid"; sekalid=''

n_effects=$(effects "$queue")
n_doubled=$(doubled "$queue")
n_done=$(keys_done "$queue")
lost=$((keys - n_done))
pause=$(pause_ms "$queue" "$t_kill")
printf 'test_sentinel: killed=redis-master pid=%s failover_ms=%s pause_ms=%s keys=%s published=%s effects=%s duplicates=%s lost=%s new_master_sets=%s seconds=%s\n' \
    "$m_pid" "$failover_ms" "$pause" "$keys" "$published" "$n_effects" "$n_doubled" "$lost" \
    "$new_sets" "$(( (t_end - t0) / 1000 ))"
[ "$n_doubled" = 0 ] || die "$n_doubled keys have more than one effect (log: $log)"
[ "$lost" = 0 ] || die "$lost keys have no effect (log: $log)"
[ "$n_effects" = "$keys" ] || die "$n_effects effects for $keys keys"
say "passed in $((SECONDS - t_start)) s"
exit 0
}
