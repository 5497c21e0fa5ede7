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

# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
rm -f "$work"/bench-[0-9]*   # the previous invocation's files: only this one's are left to read

# Every queue of this invocation is named after the run id, so that no run
# sees another's keys, and no test suite's queue is touched (they are not
# named bench-*). Two invocations at once are not supported: each starts by
# dropping the rows any earlier one left behind.
run_id=bench-$(date +%s)-$$

# Before each run: no dead rows or stale statistics left by the previous run,
# and no checkpoint of its dirty pages landing in the middle of this one.
settle() { sql -c 'VACUUM ANALYZE sekali.idempotency_keys, sekali_bench.jobs' -c 'CHECKPOINT'; }

# Drops a finished run's rows, so that runs do not grow the tables the
# later runs are measured on.
forget() {
    sql -c "DELETE FROM sekali.idempotency_keys WHERE queue = '$1'" \
        -c "DELETE FROM sekali_bench.jobs WHERE queue = '$1'"
}

# ---------------------------------------------------------------------------
# Schema, and a clean slate: rows from interrupted earlier invocations
# would otherwise make every run scan them.
# ---------------------------------------------------------------------------
schema "$(write_conf "$run_id-check")"
sql -c "DELETE FROM sekali.idempotency_keys WHERE queue LIKE 'bench-%'" -c 'TRUNCATE sekali_bench.jobs'

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
    # With sekali's durability: it raises its sessions to synchronous_commit
    # on where the server (as the test servers) defaults to off.
    PGOPTIONS="-c synchronous_commit=on" \
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
read -r measured p50 p99 pmax <<<"$(latency "$queue")"
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
