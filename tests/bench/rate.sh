#!/usr/bin/env bash
# The rate-limit benchmark behind `make bench-rate`: what a rate limit
# costs a job when it never holds one back, i.e. the limiter's check alone
# (one Redis script per batch, docs/rate-limits.md).
#   tests/bench/rate.sh BUILD_DIR    (servers from tests/servers.sh running)
#
# Settings (environment; defaults in brackets):
#   BENCH_LIMIT [1000000/s]     the limit measured: far above any rate this
#                               machine reaches, so no job ever waits
#   BENCH_BATCH [default 1]     queues[].batch; default: the key not written
#   BENCH_WORKERS [4]           sekalid workers
#   BENCH_RUNS [5]              rounds
#   BENCH_JOBS [4000]           jobs per run
#   BENCH_TIMEOUT [240]         seconds one run may take before it fails
#
# Per round and batch, the queue without a limit and with BENCH_LIMIT run
# one after the other (their order alternating between rounds), so the
# machine's drift falls on both alike: N jobs published, then sekalid
# started and run until all are completed; the rate is the steady state's
# (lib.sh's steady_rate). Every run is checked as in run.sh (one effect per
# job, every key completed, the queue empty, sekalid exiting 0). At the
# default limit no job can wait: its burst is a million starts. The
# summary's ratio is
# the median over the rounds of limited / unlimited, same round; the same
# for sekalid's CPU time per job (bench_sekalid's sekali_cpu_ms), which a
# loaded machine disturbs far less than it does jobs/s.
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C

build=${1:-build}
limit=${BENCH_LIMIT:-1000000/s}
batch_list=${BENCH_BATCH:-default 1}
workers=${BENCH_WORKERS:-4}
runs=${BENCH_RUNS:-5}
jobs=${BENCH_JOBS:-4000}
timeout=${BENCH_TIMEOUT:-240}
for v in workers runs jobs timeout; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ $limit =~ ^[0-9]+/[0-9a-z]+$ ]] || { echo "bench: BENCH_LIMIT: a rate such as 1000000/s" >&2; exit 2; }

# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
quiesce_tries=6 quiesce_quiet=1
run_id=bench-$(date +%s)-$$
trap cleanup EXIT

schema "$(write_conf "$run_id-check")"
sql -c "DELETE FROM sekali.idempotency_keys WHERE queue LIKE 'bench-%'" -c 'TRUNCATE sekali_bench.jobs'
summary=$work/rate-summary
: >"$summary"
declare -A rate_of cpu_of
say "W=$workers, $jobs jobs a run, limit $limit against none, batch ${batch_list// /, }," \
    "$runs rounds; files in $work"
for run in $(seq 1 "$runs"); do
    for bench_batch in $batch_list; do
        order="none limit"
        [ $((run % 2)) = 0 ] && order="limit none"
        for mode in $order; do
            key="$bench_batch $mode"
            label="batch=$bench_batch $mode"
            queue=$run_id-b$bench_batch-$mode-$run
            conf=$(write_conf "$queue")
            [ "$mode" = none ] || printf '    rate_limit: %s\n' "$limit" >>"$conf"
            "$build/sekalid" -t -c "$conf" >/dev/null 2>&1 || die "sekalid refuses $conf"
            drain_round "$build/sekalid" "$conf" "$queue" "$jobs" "$label round $run"
            rate=$(steady_rate "$queue")
            "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
            live_queue=''
            forget "$queue"
            cpu=$(awk -v n="$jobs" '$1 == "sekali_cpu_ms" { printf "%.1f", $2 * 1000 / n }' \
                "$work/$queue.result")
            rate_of[$key]+="$rate " cpu_of[$key]+="$cpu "
            say "round $run: $label: $rate jobs/s, $cpu us of sekalid CPU a job"
        done
    done
done

echo
printf '%-8s %-8s %11s %11s %7s   %s\n' "batch" "figure" "none" "limit" "ratio" \
    "limit/none per round"
for bench_batch in $batch_list; do
    for figure in jobs/s cpu_us/job; do
        if [ "$figure" = jobs/s ]; then n="${rate_of[$bench_batch none]}" l="${rate_of[$bench_batch limit]}"
        else n="${cpu_of[$bench_batch none]}" l="${cpu_of[$bench_batch limit]}"; fi
        per_round=$(paste -d/ <(tr ' ' '\n' <<<"${l% }") <(tr ' ' '\n' <<<"${n% }") | tr '\n' ' ')
        # shellcheck disable=SC2086  # lists of numbers
        printf '%-8s %-8s %11.1f %11.1f %7.3f   %s\n' "$bench_batch" "$figure" "$(median $n)" \
            "$(median $l)" "$(ratios "$l" "$n")" "$per_round" | tee -a "$summary"
    done
done
echo "(W=$workers; $jobs jobs a run; jobs/s: steady state; cpu_us/job: sekalid's CPU time a job;" \
     "medians of $runs rounds; ratio: median of the per-round limit/none, $limit never reached)"
