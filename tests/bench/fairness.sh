#!/usr/bin/env bash
# The fairness benchmark behind `make bench-fairness` (issue 43): how long a
# light tenant's single job waits behind a heavy tenant's backlog, without
# lanes and with them (queues[].lanes, docs/rate-limits.md), and what the
# lanes' hop costs one tenant's jobs.
#   tests/bench/fairness.sh BUILD_DIR    (servers from tests/servers.sh running)
#
# Settings (environment; defaults in brackets):
#   BENCH_LANES [0 8]      the lanes compared (0: none)
#   BENCH_HEAVY [20000]    the heavy tenant's jobs, published first
#   BENCH_LIGHT [10]       light tenants, one job each, published after
#   BENCH_WORKERS [4]      sekalid workers
#   BENCH_RUNS [3]         rounds
#   BENCH_WORK_US [0]      each job's work: the handler sleeps this long
#   BENCH_TIMEOUT [300]    seconds one run may take before it fails
#
# Per round each setting runs once, in an order alternating between rounds:
# the heavy tenant's jobs (x-tenant: heavy) published to the queue itself,
# then one job each of tenants light-1 .. light-N, then sekalid started and
# run until every job is done and checked as run.sh checks (one effect per
# job, every key completed, the queue empty). The light jobs' wait is
# publish to effect (the body's publish time to the effect's
# clock_timestamp()); the heavy tenant's rate is the steady state's
# (lib.sh's steady_rate), with lanes all of it in one lane after a hop.
# "heavy before" counts the heavy jobs whose effect came before the median
# light one's (a light tenant sharing the heavy lane waits for all of it): sekalid's start, which every run waits for alike, does not
# move it. Which light tenants share the heavy one's lane is said (FNV-1a of the
# tenant mod lanes): they wait with it, as documented. Medians over the
# rounds; the ratio is the median of the per-round lanes/none.
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C

build=${1:-build}
lanes_list=${BENCH_LANES:-0 8}
heavy=${BENCH_HEAVY:-20000}
light=${BENCH_LIGHT:-10}
workers=${BENCH_WORKERS:-4}
runs=${BENCH_RUNS:-3}
timeout=${BENCH_TIMEOUT:-300}
work_us=${BENCH_WORK_US:-0}
[[ $work_us =~ ^[0-9]+$ ]] || { echo "bench: BENCH_WORK_US: microseconds, got '$work_us'" >&2; exit 2; }
for v in heavy light workers runs timeout; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done

# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
quiesce_tries=6 quiesce_quiet=1
run_id=bench-$(date +%s)-$$
trap cleanup EXIT

# lane TENANT LANES: docs/rate-limits.md's function, in awk's doubles
# would lose bits: python3's integers.
lane() {
    python3 -c 'import sys
h = 0xcbf29ce484222325
for b in sys.argv[1].encode():
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
print(h % int(sys.argv[2]) if sys.argv[1] else 0)' "$1" "$2"
}

schema "$(write_conf "$run_id-check")"
sql -c "DELETE FROM sekali.idempotency_keys WHERE queue LIKE 'bench-%'" -c 'TRUNCATE sekali_bench.jobs'
summary=$work/fairness-summary
: >"$summary"
declare -A p50_of p99_of rate_of before_of
total=$((heavy + light))
say "W=$workers, $heavy heavy jobs then $light light tenants' one each, lanes ${lanes_list// /, }," \
    "$work_us us of work a job, $runs rounds; files in $work"
for lanes in $lanes_list; do
    [ "$lanes" = 0 ] && continue
    shared=''
    for k in $(seq 1 "$light"); do
        [ "$(lane "light-$k" "$lanes")" = "$(lane heavy "$lanes")" ] && shared+=" light-$k"
    done
    say "lanes $lanes: sharing the heavy tenant's lane:${shared:- none}"
done
for run in $(seq 1 "$runs"); do
    order=$lanes_list
    [ $((run % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$lanes_list" | tac | tr '\n' ' ')
    for lanes in $order; do
        queue=$run_id-l$lanes-$run
        conf=$(write_conf "$queue")
        [ "$lanes" = 0 ] || printf '    lanes: %s\n' "$lanes" >>"$conf"
        [ "$work_us" = 0 ] || printf '    config:\n      work_us: %s\n' "$work_us" >>"$conf"
        "$build/sekalid" -t -c "$conf" >/dev/null 2>&1 || die "sekalid refuses $conf"
        quiesce "lanes $lanes round $run"
        live_queue=$queue
        BENCH_TENANT=heavy BENCH_TAG=heavy \
            "$out/bench_amqp" "$SEKALI_AMQP_URL" bulk "$queue" "$heavy" >"$work/$queue.publish"
        for k in $(seq 1 "$light"); do
            BENCH_TENANT=light-$k BENCH_TAG=light-$k \
                "$out/bench_amqp" "$SEKALI_AMQP_URL" bulk "$queue" 1 >>"$work/$queue.publish"
        done
        "$out/bench_sekalid" "$build/sekalid" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
            "$queue" "$total" "$timeout" >"$work/$queue.result" ||
            die "lanes $lanes round $run (see $work/$queue.log)"
        verify "$queue" "$total" amqp
        log_problems "$work/$queue.log"
        read -r p50 p99 < <(sql -F ' ' -c "
            SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
                   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)
              FROM (SELECT (extract(epoch FROM committed) * 1e6 - published_us) / 1e3 AS ms
                      FROM sekali_bench.jobs
                     WHERE queue = '$queue' AND key LIKE '$queue-light-%') w")
        # Robust to sekalid's start, which both settings wait for alike:
        # how many heavy jobs had their effect before the median light one.
        before=$(sql -c "
            SELECT count(*) FROM sekali_bench.jobs
             WHERE queue = '$queue' AND key LIKE '$queue-heavy-%'
               AND committed < (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY committed)
                                  FROM sekali_bench.jobs
                                 WHERE queue = '$queue' AND key LIKE '$queue-light-%')")
        rate=$(steady_rate "$queue")
        BENCH_LANES=$lanes "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
        live_queue=''
        forget "$queue"
        p50_of[$lanes]+="$p50 " p99_of[$lanes]+="$p99 " rate_of[$lanes]+="$rate "
        before_of[$lanes]+="$before "
        say "round $run: lanes $lanes: light wait p50 $p50 ms, p99 $p99 ms; heavy $rate jobs/s;" \
            "$before heavy jobs done before the median light one"
    done
done

echo
base=${lanes_list%% *}
printf '%-6s %13s %13s %14s %13s %9s\n' "lanes" "light p50 ms" "light p99 ms" \
    "heavy before" "heavy jobs/s" "jobs/s vs $base" | tee -a "$summary"
for lanes in $lanes_list; do
    # shellcheck disable=SC2086  # lists of numbers
    printf '%-6s %13.1f %13.1f %14.0f %13.1f %9.3f\n' "$lanes" "$(median ${p50_of[$lanes]})" \
        "$(median ${p99_of[$lanes]})" "$(median ${before_of[$lanes]})" \
        "$(median ${rate_of[$lanes]})" \
        "$(ratios "${rate_of[$lanes]}" "${rate_of[$base]}")" | tee -a "$summary"
done
echo "(W=$workers; $heavy heavy jobs then $light light ones, $work_us us a job; medians of $runs rounds;" \
     "jobs/s: the steady state; ratio: median of the per-round lanes/$base)"
