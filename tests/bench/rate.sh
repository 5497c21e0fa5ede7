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
#   BENCH_NAME [this]           the name of BUILD_DIR's sekalid in the summary
#   BENCH_COMPARE []            NAME=PATH ...: other sekalid binaries (an
#                               older build), run in the same rounds
#   BENCH_REDIS_DELAY [0]       ms each way a delay_proxy holds Redis's bytes
#                               (Redis alone looks far; 0: no proxy)
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
# loaded machine disturbs far less than it does jobs/s, and for Redis's
# round trips per job: the reads Redis counted during the run (INFO stats
# total_reads_processed; a pipelined write is one read) over its jobs.
# Each binary (BUILD_DIR's and BENCH_COMPARE's) runs both queues each
# round, its own ratio taken against its own run without a limit.
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
redis_delay=${BENCH_REDIS_DELAY:-0}
[[ $redis_delay =~ ^[0-9]+$ ]] || { echo "bench: BENCH_REDIS_DELAY: ms, got '$redis_delay'" >&2; exit 2; }
names=("${BENCH_NAME:-this}") binaries=("$build/sekalid")
[[ ${names[0]} =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "bench: BENCH_NAME: letters, digits, . _ -" >&2; exit 2; }
for c in ${BENCH_COMPARE:-}; do
    [[ $c =~ ^[A-Za-z0-9_.-]+=.+$ ]] || { echo "bench: BENCH_COMPARE wants NAME=PATH, got '$c'" >&2; exit 2; }
    [ -x "${c#*=}" ] || { echo "bench: BENCH_COMPARE: ${c#*=} is not an executable" >&2; exit 2; }
    names+=("${c%%=*}") binaries+=("${c#*=}")
done

# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
quiesce_tries=6 quiesce_quiet=1
run_id=bench-$(date +%s)-$$
proxy_pid='' redis_port=$SEKALI_REDIS_PORT
trap '[ -z "$proxy_pid" ] || { kill -TERM "$proxy_pid"; wait "$proxy_pid"; } 2>/dev/null; cleanup' EXIT
if [ "$redis_delay" != 0 ]; then
    "${CC:-cc}" -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -o "$out/delay_proxy" \
        tests/bench/delay_proxy.c
    "$out/delay_proxy" "0:127.0.0.1:$SEKALI_REDIS_PORT:$redis_delay" \
        >"$work/rate-proxy.out" 2>"$work/rate-proxy.log" &
    proxy_pid=$!
    for _ in $(seq 1 100); do [ -s "$work/rate-proxy.out" ] && break; sleep 0.05; done
    read -r ready redis_port <"$work/rate-proxy.out" && [ "$ready" = ready ] ||
        die "delay_proxy did not start (see $work/rate-proxy.log)"
fi

# Reads Redis has counted from every client so far.
redis_reads() {
    redis-cli -p "$SEKALI_REDIS_PORT" INFO stats | tr -d '\r' |
        awk -F: '$1 == "total_reads_processed" { print $2 }'
}

schema "$(write_conf "$run_id-check")"
sql -c "DELETE FROM sekali.idempotency_keys WHERE queue LIKE 'bench-%'" -c 'TRUNCATE sekali_bench.jobs'
summary=$work/rate-summary
: >"$summary"
declare -A rate_of cpu_of rtt_of
say "W=$workers, $jobs jobs a run, limit $limit against none, batch ${batch_list// /, }," \
    "sekalid ${names[*]}, Redis ${redis_delay} ms away, $runs rounds; files in $work"
for run in $(seq 1 "$runs"); do
    for bench_batch in $batch_list; do
        order="none limit"
        [ $((run % 2)) = 0 ] && order="limit none"
        for b in "${!binaries[@]}"; do
        for mode in $order; do
            key="${names[$b]} $bench_batch $mode"
            label="${names[$b]} batch=$bench_batch $mode"
            queue=$run_id-$b-b$bench_batch-$mode-$run
            conf=$(write_conf "$queue")
            sed -i "s|^  port: $SEKALI_REDIS_PORT\$|  port: $redis_port|" "$conf"
            [ "$mode" = none ] || printf '    rate_limit: %s\n' "$limit" >>"$conf"
            "${binaries[$b]}" -t -c "$conf" >/dev/null 2>&1 || die "sekalid refuses $conf"
            reads=$(redis_reads)
            drain_round "${binaries[$b]}" "$conf" "$queue" "$jobs" "$label round $run"
            rtt=$(awk -v a="$reads" -v b="$(redis_reads)" -v n="$jobs" \
                'BEGIN { printf "%.3f", (b - a - 1) / n }')
            rate=$(steady_rate "$queue")
            "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
            live_queue=''
            forget "$queue"
            cpu=$(awk -v n="$jobs" '$1 == "sekali_cpu_ms" { printf "%.1f", $2 * 1000 / n }' \
                "$work/$queue.result")
            rate_of[$key]+="$rate " cpu_of[$key]+="$cpu " rtt_of[$key]+="$rtt "
            say "round $run: $label: $rate jobs/s, $cpu us of sekalid CPU and $rtt Redis" \
                "round trips a job"
        done
        done
    done
done

echo
printf '%-8s %-8s %-12s %11s %11s %7s   %s\n' "sekalid" "batch" "figure" "none" "limit" \
    "ratio" "limit/none per round"
for name in "${names[@]}"; do
for bench_batch in $batch_list; do
    for figure in jobs/s cpu_us/job redis_rt/job; do
        k="$name $bench_batch"
        case $figure in
            jobs/s) n="${rate_of[$k none]}" l="${rate_of[$k limit]}" ;;
            cpu_us/job) n="${cpu_of[$k none]}" l="${cpu_of[$k limit]}" ;;
            *) n="${rtt_of[$k none]}" l="${rtt_of[$k limit]}" ;;
        esac
        per_round=$(paste -d/ <(tr ' ' '\n' <<<"${l% }") <(tr ' ' '\n' <<<"${n% }") | tr '\n' ' ')
        # shellcheck disable=SC2086  # lists of numbers
        printf '%-8s %-8s %-12s %11.3f %11.3f %7.3f   %s\n' "$name" "$bench_batch" "$figure" \
            "$(median $n)" "$(median $l)" "$(ratios "$l" "$n")" "$per_round" | tee -a "$summary"
    done
done
done
echo "(W=$workers; $jobs jobs a run; Redis ${redis_delay} ms away each way; jobs/s: steady" \
     "state; cpu_us/job: sekalid's CPU time a job; redis_rt/job: reads Redis counted a job;" \
     "medians of $runs rounds; ratio: median of the per-round limit/none, $limit never reached)"
