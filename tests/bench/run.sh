#!/usr/bin/env bash
# The benchmark behind `make bench`: how fast sekalid runs jobs end to end,
# compared with PostgreSQL alone running the same SQL through pgbench.
#   tests/bench/run.sh BUILD_DIR    (servers from tests/servers.sh must be running)
#
# Settings (environment; defaults in brackets):
#   BENCH_JOBS [20000]      jobs per throughput run (and pgbench transactions)
#   BENCH_WORKERS [4]       sekalid workers, and pgbench clients
#   BENCH_RUNS [3]          throughput runs, each followed by a pgbench run
#   BENCH_LATENCY_SECONDS [10]  length of the fixed-rate latency run
#   BENCH_LATENCY_RATE [half the median throughput]  its jobs/s, to compare
#                           two builds at the same load
#   BENCH_TIMEOUT [300]     seconds one run may take before it counts as failed
#
# What it does:
#   1. throughput, BENCH_RUNS times: publish BENCH_JOBS persistent jobs into a
#      fresh queue, start sekalid, time it until every key is completed;
#      the workers' RSS is sampled at 25% and 100% of the jobs, and their
#      peak (VmHWM) before the stop;
#   2. after each sekalid run, pgbench with tests/bench/job.pgbench: one
#      worker's per-job SQL as one transaction, at the same concurrency
#      (interleaved, so that noise on the shared machine hits both alike);
#   3. latency: sekalid running while jobs arrive at half the median
#      throughput for BENCH_LATENCY_SECONDS after a second of warm-up, each
#      stamped with its publish time; PostgreSQL computes p50 and p99 of
#      (clock_timestamp() at the effect's INSERT - published).
# Every run is checked: exactly one effect per job, no key doubled, every
# key completed, the queue and its dead letters empty, sekalid exiting 0 on
# SIGTERM. A failed check exits non-zero. Speed is measured, never asserted.
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C   # decimal points in printf and awk, whatever the caller's locale

build=${1:-build}
jobs=${BENCH_JOBS:-20000}
workers=${BENCH_WORKERS:-4}
runs=${BENCH_RUNS:-3}
latency_seconds=${BENCH_LATENCY_SECONDS:-10}
latency_rate=${BENCH_LATENCY_RATE:-half}
timeout=${BENCH_TIMEOUT:-300}
[ "$latency_rate" = half ] || [[ $latency_rate =~ ^[1-9][0-9]*$ ]] ||
    { echo "bench: BENCH_LATENCY_RATE must be a positive integer" >&2; exit 2; }
for v in jobs workers runs latency_seconds timeout; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
# pgbench runs jobs/workers transactions per client.
(( jobs >= workers )) || { echo "bench: BENCH_JOBS must be at least BENCH_WORKERS" >&2; exit 2; }

say() { printf 'bench: %s\n' "$*"; }
die() { printf 'bench: FAILED: %s\n' "$*" >&2; exit 1; }

tests/servers.sh status >/dev/null 2>&1 || die "the test servers are not running: tests/servers.sh start"
eval "$(tests/servers.sh env)"
if [ ! -x "$build/sekalid" ] || [ ! -x "$build/sekalictl" ]; then
    die "no $build/sekalid or $build/sekalictl: make all"
fi

pgbench=$(command -v pgbench || true)
if [ -z "$pgbench" ]; then
    for p in /usr/lib/postgresql/*/bin/pgbench; do [ -x "$p" ] && pgbench=$p; done
fi
[ -n "$pgbench" ] || die "pgbench not found: apt-get install postgresql-client"

work=$SEKALI_SCRATCH/bench
mkdir -p "$work" "$build/bench"
rm -f "$work"/bench-*   # the previous invocation's files: only this one's are left to read
out=$(cd "$build/bench" && pwd)

# ---------------------------------------------------------------------------
# Build: the handler exactly as the Makefile builds handlers (public header
# only, -fPIC -shared), the two helpers like the daemon's own objects.
# ---------------------------------------------------------------------------
cc=${CC:-cc}
cflags=(-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes
        -fno-strict-aliasing)
# pkg-config prints flags meant to be split into words.
# shellcheck disable=SC2046
{
    "$cc" "${cflags[@]}" -fPIC -shared -Iinclude $(pkg-config --cflags libpq) \
        -o "$out/bench_handler.so" tests/bench/bench_handler.c $(pkg-config --libs libpq)
    "$cc" "${cflags[@]}" $(pkg-config --cflags librabbitmq) \
        -o "$out/bench_amqp" tests/bench/bench_amqp.c $(pkg-config --libs librabbitmq)
    "$cc" "${cflags[@]}" $(pkg-config --cflags libpq) \
        -o "$out/bench_sekalid" tests/bench/bench_sekalid.c $(pkg-config --libs libpq)
}

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

# One SQL statement (or a script on stdin), unaligned, tuples only; without
# the NOTICEs of idempotent DDL ("schema already exists, skipping").
quiet_pg='-c client_min_messages=warning'
sql() { PGOPTIONS=$quiet_pg psql -X -q -t -A -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO" "$@"; }

# Every queue of this invocation is named after the run id, so that no run
# sees another's keys, and no test suite's queue is touched (they are not
# named bench-*). Two invocations at once are not supported: each starts by
# dropping the rows any earlier one left behind.
run_id=bench-$(date +%s)-$$

# write_conf QUEUE: a sekalid configuration consuming QUEUE with the bench
# handler. Log level warn: at info every job logs a line, and the benchmark
# would measure the logging.
write_conf() {
    local conf=$work/$1.yaml
    cat >"$conf" <<YAML
amqp:
  url: "$SEKALI_AMQP_URL"
redis:
  host: 127.0.0.1
  port: $SEKALI_REDIS_PORT
postgres:
  conninfo: "$SEKALI_PG_CONNINFO"
log:
  level: warn
  format: json
shutdown_timeout: 20s
queues:
  - name: $1
    handler: $out/bench_handler.so
    workers: $workers
    prefetch: 8
YAML
    printf '%s' "$conf"
}

# Before each run: no dead rows or stale statistics left by the previous run,
# and no checkpoint of its dirty pages landing in the middle of this one.
settle() { sql -c 'VACUUM ANALYZE sekali.idempotency_keys, sekali_bench.jobs' -c 'CHECKPOINT'; }

# quiesce RUN: the servers and the test suites share this machine with us.
# Waits (at most 10 s) until the CPUs were less than 10% busy for half a
# second, so that a compile or a test suite that is just finishing, or the
# previous run's autovacuum, does not land in this run; if the machine stays
# busy, the run goes ahead and says so, since its figures then include that.
quiesce() {
    local a b total idle busy=0 i try
    for try in $(seq 1 20); do
        read -r -a a < <(head -n 1 /proc/stat)
        sleep 0.5
        read -r -a b < <(head -n 1 /proc/stat)
        # cpu user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
        total=0
        for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
        idle=$((b[4] - a[4] + b[5] - a[5]))
        busy=$(( total > 0 ? (total - idle) * 100 / total : 0 ))
        (( busy < 10 )) && return 0
        [ "$try" -lt 20 ] || break
    done
    say "note: the machine was still $busy% busy after 10 s of waiting before $1;" \
        "its figures include that load"
}

# Drops a finished run's rows, so that runs do not grow the tables the
# later runs are measured on.
forget() {
    sql -c "DELETE FROM sekali.idempotency_keys WHERE queue = '$1'" \
        -c "DELETE FROM sekali_bench.jobs WHERE queue = '$1'"
}

# verify QUEUE EXPECTED [amqp]: every key completed once, one effect per key,
# and (with amqp) nothing left in the queue or its dead letters.
verify() {
    local queue=$1 expected=$2 counts keys completed dups effects distinct
    counts=$(sql -F ' ' -c "
        SELECT (SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '$queue'),
               (SELECT count(*) FROM sekali.idempotency_keys
                 WHERE queue = '$queue' AND status = 'completed'),
               (SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys
                 WHERE queue = '$queue'),
               (SELECT count(*) FROM sekali_bench.jobs WHERE queue = '$queue'),
               (SELECT count(DISTINCT key) FROM sekali_bench.jobs WHERE queue = '$queue')")
    read -r keys completed dups effects distinct <<<"$counts"
    if [ "$keys" -ne "$expected" ] || [ "$completed" -ne "$expected" ]; then
        die "$queue: $completed of $keys keys completed, expected $expected"
    fi
    [ "$effects" -eq "$expected" ] ||
        die "$queue: $effects effects for $expected jobs ($distinct distinct keys)"
    [ "$distinct" -eq "$expected" ] || die "$queue: $((effects - distinct)) keys doubled"
    # Duplicate deliveries are harmless by design, but none should happen
    # without faults; say so rather than fail.
    [ "$dups" -eq 0 ] || say "$queue: note: $dups duplicate deliveries suppressed"
    if [ "${3:-}" = amqp ]; then
        local depth
        depth=$("$out/bench_amqp" "$SEKALI_AMQP_URL" depth "$queue")
        [[ $depth == "ready=0 dead=0 consumers=0" ]] ||
            die "$queue: not empty after sekalid stopped: $depth"
    fi
}

# Warnings and errors in a sekalid log (level warn hides the routine lines).
log_problems() {
    local n
    n=$(grep -c -E '"level":"(warn|error)"' "$1" || true)
    if [ "$n" -gt 0 ]; then
        say "note: $n warnings/errors in $1, first ones:"
        grep -m 3 -E '"level":"(warn|error)"' "$1" | sed 's/^/bench:   /'
    fi
}

# field NAME FILE: the value of a "name value" line written by bench_sekalid.
field() { awk -v k="$1" '$1 == k { print $2; exit }' "$2"; }

# median VALUES...: the middle value (the mean of the two middle ones).
median() {
    printf '%s\n' "$@" | sort -g |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# If we exit early: stop the latency run's background driver (sekalid
# follows it), and delete the queue in use, which may still hold thousands
# of persistent jobs that nothing will consume. Its rows stay for a look;
# the next invocation drops them.
driver='' live_queue=''
cleanup() {
    [ -z "$driver" ] || kill -TERM "$driver" 2>/dev/null || true
    [ -z "$live_queue" ] || "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$live_queue" 2>/dev/null || true
}
trap cleanup EXIT

# ---------------------------------------------------------------------------
# Schema, and a clean slate: rows from interrupted earlier invocations
# would otherwise make every run scan them.
# ---------------------------------------------------------------------------
conf=$(write_conf "$run_id-check")
PGOPTIONS=$quiet_pg "$build/sekalictl" -c "$conf" migrate --sql-dir sql >/dev/null
sql -f tests/bench/bench.sql
sql -c "DELETE FROM sekali.idempotency_keys WHERE queue LIKE 'bench-%'" -c 'TRUNCATE sekali_bench.jobs'
"$build/sekalid" -t -c "$conf" 2>/dev/null || "$build/sekalid" -t -c "$conf"

say "$jobs jobs, $workers workers, $runs runs; scratch files in $work"
pg_clients=$workers
pg_threads=$((workers < 2 ? workers : 2))
pg_per_client=$((jobs / workers))
pg_jobs=$((pg_per_client * workers))

sekali_rates=() pgbench_tps=() max_hwm=0 max_growth=0
for run in $(seq 1 "$runs"); do
    # --- sekali ---------------------------------------------------------
    queue=$run_id-sekali-$run
    conf=$(write_conf "$queue")
    settle
    quiesce "sekali run $run"
    live_queue=$queue
    "$out/bench_amqp" "$SEKALI_AMQP_URL" bulk "$queue" "$jobs" >"$work/$queue.publish"
    published=$(cat "$work/$queue.publish")
    result=$work/$queue.result
    "$out/bench_sekalid" "$build/sekalid" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
        "$queue" "$jobs" "$timeout" >"$result" || die "sekali run $run (see $work/$queue.log)"
    verify "$queue" "$jobs" amqp
    log_problems "$work/$queue.log"
    rate=$(field jobs_per_s "$result")
    hwm=$(field max_hwm_kib "$result")
    growth=$(field rss_growth_kib "$result")
    [ "$(field same_workers "$result")" = 1 ] ||
        say "note: a worker was restarted during run $run; its RSS growth is not comparable"
    sekali_rates+=("$rate")
    if (( hwm > max_hwm )); then max_hwm=$hwm; fi
    if (( ${growth#-} > ${max_growth#-} )); then max_growth=$growth; fi
    say "sekali run $run: $rate jobs/s, $(field elapsed_s "$result") s" \
        "(first effect after $(field first_effect_s "$result") s; poll saw the end at" \
        "$(field detected_s "$result") s), peak RSS $hwm KiB, RSS growth 25%->100% $growth KiB"
    say "  publishing took: $published"
    "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
    live_queue=''
    forget "$queue"

    # --- pgbench on the same SQL ----------------------------------------
    queue=$run_id-pgbench-$run
    settle
    quiesce "pgbench run $run"
    "$pgbench" -n -M prepared -c "$pg_clients" -j "$pg_threads" -t "$pg_per_client" \
        -f tests/bench/job.pgbench -D "queue=$queue" "$SEKALI_PG_CONNINFO" \
        >"$work/$queue.log" 2>&1 || die "pgbench run $run (see $work/$queue.log)"
    # Connecting 4 clients takes milliseconds; sekali's time includes its
    # start-up, which is about as small next to a run of several seconds.
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$work/$queue.log")
    [ -n "$tps" ] || die "no tps in $work/$queue.log"
    verify "$queue" "$pg_jobs"
    pgbench_tps+=("$tps")
    say "pgbench run $run: $tps tps ($pg_jobs transactions)"
    forget "$queue"
done

sekali_median=$(median "${sekali_rates[@]}")
pgbench_median=$(median "${pgbench_tps[@]}")

# ---------------------------------------------------------------------------
# Latency: open loop at half the median throughput, so queueing delay stays
# small and the percentiles show the pipeline itself. The first second is
# published and checked but not measured: it is each worker's first jobs
# (PostgreSQL compiling the plpgsql functions, the handler preparing its
# INSERT), and a steady state is what the percentiles are about.
# ---------------------------------------------------------------------------
rate=$latency_rate
if [ "$rate" = half ]; then
    rate=$(awk -v m="$sekali_median" 'BEGIN { r = int(m / 2); print r < 1 ? 1 : r }')
fi
count=$((rate * (latency_seconds + 1)))
queue=$run_id-latency
conf=$(write_conf "$queue")
settle
quiesce "the latency run"
live_queue=$queue
result=$work/$queue.result
"$out/bench_sekalid" "$build/sekalid" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
    "$queue" "$count" "$((latency_seconds + timeout))" >"$result" &
driver=$!
# bench_amqp waits until all workers consume, then keeps to the schedule
# whatever the consumers do (open loop).
"$out/bench_amqp" "$SEKALI_AMQP_URL" rate "$queue" "$count" "$rate" "$workers" \
    >"$work/$queue.publish" || die "latency publisher (see $work/$queue.log)"
wait "$driver" || die "latency run (see $work/$queue.log)"
driver=''
verify "$queue" "$count" amqp
log_problems "$work/$queue.log"
percentiles=$(sql -F ' ' -c "
    SELECT count(*),
           round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
           round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
           round(max(ms)::numeric, 1)
      FROM (SELECT published_us - min(published_us) OVER () AS since_us,
                   (extract(epoch FROM committed) * 1e6 - published_us) / 1e3 AS ms
              FROM sekali_bench.jobs WHERE queue = '$queue') latencies
     WHERE since_us >= 1000000")
read -r measured p50 p99 pmax <<<"$percentiles"
say "latency run: $count jobs at $rate jobs/s, $measured after the first second:" \
    "p50 $p50 ms, p99 $p99 ms, max $pmax ms (publish: $(cat "$work/$queue.publish"))"
"$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
live_queue=''
forget "$queue"

# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------
ratio=$(awk -v s="$sekali_median" -v p="$pgbench_median" 'BEGIN { printf "%.2f", s / p }')
hwm_mib=$(awk -v k="$max_hwm" 'BEGIN { printf "%.1f", k / 1024 }')
cat <<SUMMARY

sekali: $jobs jobs, $workers workers: $(printf '%.0f' "$sekali_median") jobs/s (median of $runs: $(printf '%.0f ' "${sekali_rates[@]}" | sed 's/ $//'))
latency at $rate jobs/s: p50 $p50 ms, p99 $p99 ms
peak RSS per worker: $hwm_mib MiB (growth 25%->100%: $max_growth KiB)
pgbench same SQL, $pg_clients clients: $(printf '%.0f' "$pgbench_median") tps (median of $runs: $(printf '%.0f ' "${pgbench_tps[@]}" | sed 's/ $//')) -> ratio sekali/pgbench $ratio
SUMMARY
