#!/usr/bin/env bash
# The distance benchmark behind `make bench-distance`: jobs/s and latency
# when PostgreSQL, Redis and RabbitMQ are far away, as they are from a
# worker in another zone or region.
#   tests/bench/distance.sh BUILD_DIR    (servers from tests/servers.sh running)
#
# Every link of sekalid goes through tests/bench/delay_proxy.c, which holds
# each byte DELAY ms in each direction (so a round trip costs 2 x DELAY);
# the 0 ms runs go through it too, so that the ratios measure distance, not
# the proxy. The publisher and the checks talk to the servers directly.
#
# Settings (environment; defaults in brackets):
#   BENCH_DELAYS [0 2 20 150]   ms each way; the first is the ratios' base
#   BENCH_JITTER [0]            up to this many ms more, each way, per chunk
#                               (order kept: see delay_proxy.c)
#   BENCH_BATCH [default 1]     queues[].batch; default: the key not written
#   BENCH_WORKERS [16]          sekalid workers
#   BENCH_NAME [this]           the name of BUILD_DIR's sekalid in the table
#   BENCH_COMPARE [unset]       other sekalid binaries, "NAME=PATH ...", run
#                               in the same rounds (e.g. before=/tmp/x/sekalid)
#   BENCH_RUNS [3]              rounds
#   BENCH_SECONDS [8]           about how long a throughput run should last:
#                               its job count is its rate in the previous
#                               round times this (a guess by delay in the first)
#   BENCH_JOBS [unset]          every throughput run's job count instead: a far
#                               run's steady state needs more jobs than a
#                               first-round guess gives a fast build
#   BENCH_LATENCY_SECONDS [4]   length of the fixed-rate latency run
#   BENCH_TIMEOUT [240]         seconds one run may take before it fails
#
# Per round, per delay, batch and binary (interleaved, so the machine's
# drift falls on every configuration of a round alike):
#   1. throughput: N jobs published, then sekalid started through the proxy
#      and run until all are completed; the rate is the steady state's: the
#      jobs between the 10th and 90th percentile of the effects' commit times
#      over that span, so that start-up (connecting over the distance) and
#      the last stragglers do not decide it;
#   2. latency: jobs published at half that rate for BENCH_LATENCY_SECONDS
#      (after a second of warm-up), p50 and p99 of publish -> effect.
# Every run is checked as in run.sh: one effect per job, every key
# completed, the queue empty, sekalid exiting 0. The summary's x0 is the
# median over the rounds of this configuration's rate over the first
# delay's (same batch, same binary, same round).
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C

build=${1:-build}
delays=${BENCH_DELAYS:-0 2 20 150}
jitter=${BENCH_JITTER:-0}
batch_list=${BENCH_BATCH:-default 1}
workers=${BENCH_WORKERS:-16}
compare=${BENCH_COMPARE:-}
runs=${BENCH_RUNS:-3}
seconds=${BENCH_SECONDS:-8}
latency_seconds=${BENCH_LATENCY_SECONDS:-4}
timeout=${BENCH_TIMEOUT:-240}
fixed_jobs=${BENCH_JOBS:-}
[ -z "$fixed_jobs" ] || [[ $fixed_jobs =~ ^[1-9][0-9]*$ ]] ||
    { echo "bench: BENCH_JOBS must be a positive integer, got '$fixed_jobs'" >&2; exit 2; }
for v in workers runs seconds latency_seconds timeout; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
for d in $delays $jitter; do
    [[ $d =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "bench: delays and jitter are ms, got '$d'" >&2; exit 2; }
done
for b in $batch_list; do
    [ "$b" = default ] || [[ $b =~ ^[1-9][0-9]*$ ]] ||
        { echo "bench: BENCH_BATCH: default or a positive integer, got '$b'" >&2; exit 2; }
done
names=("${BENCH_NAME:-this}") binaries=("$build/sekalid")
[[ ${names[0]} =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "bench: BENCH_NAME: letters, digits, . _ -" >&2; exit 2; }
for c in $compare; do
    [[ $c =~ ^[A-Za-z0-9_.-]+=.+$ ]] || { echo "bench: BENCH_COMPARE wants NAME=PATH, got '$c'" >&2; exit 2; }
    [ -x "${c#*=}" ] || { echo "bench: BENCH_COMPARE: ${c#*=} is not an executable" >&2; exit 2; }
    names+=("${c%%=*}") binaries+=("${c#*=}")
done

# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
# shellcheck disable=SC2046
"${CC:-cc}" -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
    -o "$out/delay_proxy" tests/bench/delay_proxy.c
rm -f "$work"/distance-*
# lib.sh's quiesce waits up to 10 s for an idle machine; on a shared one that
# stays busy, that is most of a distance run's time for no gain: the rounds
# are interleaved, so what the load does falls on every configuration alike.
quiesce_tries=6 quiesce_quiet=1
run_id=bench-$(date +%s)-$$

proxy_pid=''
proxy_stop() {
    [ -z "$proxy_pid" ] && return 0
    kill -TERM "$proxy_pid" 2>/dev/null || true
    wait "$proxy_pid" 2>/dev/null || true
    proxy_pid=''
}
trap 'proxy_stop; cleanup' EXIT

# proxy_start DELAY: a delay_proxy in front of the three servers; sets
# proxy_pg, proxy_redis, proxy_amqp (its ports).
proxy_start() {
    local ready
    proxy_stop
    rm -f "$work/distance-proxy.out"
    "$out/delay_proxy" "0:127.0.0.1:$SEKALI_PG_PORT:$1:$jitter" \
        "0:127.0.0.1:$SEKALI_REDIS_PORT:$1:$jitter" "0:127.0.0.1:$SEKALI_AMQP_PORT:$1:$jitter" \
        >"$work/distance-proxy.out" 2>"$work/distance-proxy.log" &
    proxy_pid=$!
    for _ in $(seq 1 100); do [ -s "$work/distance-proxy.out" ] && break; sleep 0.05; done
    read -r ready proxy_pg proxy_redis proxy_amqp <"$work/distance-proxy.out" &&
        [ "$ready" = ready ] || die "delay_proxy did not start (see $work/distance-proxy.log)"
}

# far_conf QUEUE: write_conf's configuration, every link through the proxy.
far_conf() {
    local conf
    conf=$(write_conf "$1")
    sed -i -e "s|@127.0.0.1:$SEKALI_AMQP_PORT/|@127.0.0.1:$proxy_amqp/|" \
        -e "s|^  port: $SEKALI_REDIS_PORT\$|  port: $proxy_redis|" \
        -e "s|port=$SEKALI_PG_PORT |port=$proxy_pg |" "$conf"
    grep -q "127.0.0.1:$proxy_amqp/" "$conf" && grep -q "port: $proxy_redis" "$conf" &&
        grep -q "port=$proxy_pg " "$conf" || die "$conf: not every link goes through the proxy"
    printf '%s' "$conf"
}

# The first round's job counts: enough for a few seconds on the slowest
# builds measured so far (batch 1 at 150 ms runs about 10 jobs/s).
first_jobs() {
    awk -v d="$1" -v s="$seconds" 'BEGIN { r = d < 1 ? 800 : d < 5 ? 500 : d < 50 ? 150 : 15
                                            n = int(r * s); print (n < 100 ? 100 : n) }'
}

schema "$(write_conf "$run_id-check")"
sql -c "DELETE FROM sekali.idempotency_keys WHERE queue LIKE 'bench-%'" -c 'TRUNCATE sekali_bench.jobs'
summary=$work/distance-summary
: >"$summary"
declare -A rate_of p50_of p99_of last_rate
say "W=$workers, delays ${delays// /, } ms each way (jitter $jitter ms), batch ${batch_list// /, }," \
    "builds ${names[*]}, $runs rounds; files in $work"
for run in $(seq 1 "$runs"); do
    for d in $delays; do
        proxy_start "$d"
        for bench_batch in $batch_list; do
            for v in "${!names[@]}"; do
                key="$d ${bench_batch} ${names[$v]}"
                label="${names[$v]} batch=$bench_batch delay=${d}ms"
                jobs=${last_rate[$key]:-}
                if [ -n "$fixed_jobs" ]; then jobs=$fixed_jobs
                elif [ -z "$jobs" ]; then jobs=$(first_jobs "$d")
                else jobs=$(awk -v r="$jobs" -v s="$seconds" 'BEGIN { n = int(r * s); print (n < 100 ? 100 : (n > 30000 ? 30000 : n)) }'); fi
                queue=$run_id-${names[$v]}-b$bench_batch-d${d//./_}-$run
                conf=$(far_conf "$queue")
                "${binaries[$v]}" -t -c "$conf" >/dev/null 2>&1 || die "${names[$v]} refuses $conf"
                drain_round "${binaries[$v]}" "$conf" "$queue" "$jobs" "$label round $run"
                rate=$(steady_rate "$queue")
                last_rate[$key]=$rate
                forget "$queue"
                # --- latency at half that rate -----------------------------
                lrate=$(awk -v r="$rate" 'BEGIN { x = int(r / 2); print x < 1 ? 1 : x }')
                count=$((lrate * (latency_seconds + 1)))
                queue=$queue-lat
                conf=$(far_conf "$queue")
                live_queue=$queue
                "$out/bench_sekalid" "${binaries[$v]}" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
                    "$queue" "$count" "$((latency_seconds + timeout))" >"$work/$queue.result" &
                driver=$!
                "$out/bench_amqp" "$SEKALI_AMQP_URL" rate "$queue" "$count" "$lrate" "$workers" \
                    >"$work/$queue.publish" 2>&1 || die "latency publisher (see $work/$queue.publish)"
                wait "$driver" || die "$label latency run (see $work/$queue.log)"
                driver=''
                verify "$queue" "$count" amqp
                log_problems "$work/$queue.log"
                read -r measured p50 p99 _ <<<"$(latency "$queue")"
                "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
                live_queue=''
                forget "$queue"
                rate_of[$key]+="$rate " p50_of[$key]+="$p50 " p99_of[$key]+="$p99 "
                say "round $run: $label: $rate jobs/s ($jobs jobs); at $lrate jobs/s p50 $p50 ms," \
                    "p99 $p99 ms ($measured measured)"
            done
        done
    done
done
proxy_stop

base=${delays%% *}
echo
printf '%-6s %-8s %-10s %9s %6s %9s %9s   %s\n' "delay" "batch" "build" "jobs/s" "x0" "p50 ms" "p99 ms" "jobs/s per round"
for bench_batch in $batch_list; do
    for v in "${!names[@]}"; do
        for d in $delays; do
            key="$d $bench_batch ${names[$v]}"
            # shellcheck disable=SC2086  # lists of numbers
            printf '%-6s %-8s %-10s %9.1f %6.2f %9.1f %9.1f   %s\n' "${d}ms" "$bench_batch" "${names[$v]}" \
                "$(median ${rate_of[$key]})" "$(ratios "${rate_of[$key]}" "${rate_of[$base $bench_batch ${names[$v]}]}")" \
                "$(median ${p50_of[$key]})" "$(median ${p99_of[$key]})" "${rate_of[$key]% }" | tee -a "$summary"
        done
    done
done
echo "(W=$workers; delay: each way, on every link; jobs/s: steady state, median of $runs rounds;" \
     "x0: median of the per-round ratios to ${base}ms; p50/p99: publish -> effect at half the rate)"
