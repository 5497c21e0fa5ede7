#!/usr/bin/env bash
# The producer side of `make bench`: how fast jobs are enqueued through the
# transactional outbox (sekali.enqueue()), compared with a raw INSERT of the
# same row, and how long an enqueued job takes to its effect, compared with
# a job published to RabbitMQ directly.
#   tests/bench/enqueue.sh BUILD_DIR    (servers from tests/servers.sh must be running)
#
# Settings (environment; defaults in brackets):
#   BENCH_WORKERS [4]           pgbench clients, and sekalid workers
#   BENCH_RUNS [3]              rounds; each measures every figure below once
#   BENCH_ENQUEUE_SECONDS [5]   length of each enqueue-rate run
#   BENCH_ENQUEUE_BATCH [100]   jobs per transaction in the batched runs
#   BENCH_LATENCY_SECONDS [10]  length of each latency run
#   BENCH_LATENCY_RATE [200]    jobs/s of the latency runs; a fixed load, well
#                               below what one relay publishes (measured at
#                               about 450/s on the shared 2-core machine), so
#                               that the percentiles show the path, not a queue
#   BENCH_RELAYS [1]            outbox relays of the latency runs
#   BENCH_TIMEOUT [300]         seconds one run may take before it counts as failed
#
# What it does, BENCH_RUNS rounds of (interleaved, so that noise on the
# shared machine hits the baselines and what is compared with them alike):
#   1. enqueue rate: pgbench -M prepared, BENCH_WORKERS clients, for
#      BENCH_ENQUEUE_SECONDS each, with no sekalid running (a relay would
#      compete for the CPUs and the rows):
#      insert         the baseline, insert.pgbench: a raw INSERT of the row
#                     sekali.enqueue() writes, into sekali_bench.outbox_raw
#                     (sekali.outbox's columns and indexes), one per transaction;
#      enqueue        enqueue.pgbench: sekali.enqueue(), one per transaction;
#      dedupe         enqueue_dedupe.pgbench: the same with a dedupe key (a
#                     second INSERT, into sekali.job_dedupe), one per transaction;
#      insert-batch   insert's INSERT, BENCH_ENQUEUE_BATCH per transaction;
#      enqueue-batch  enqueue's call, BENCH_ENQUEUE_BATCH per transaction;
#      the batched runs pipeline each transaction (one round trip for all its
#      statements, as batching drivers send them), so that they show what
#      the server does per job rather than loopback round trips. enqueue and
#      dedupe are reported as ratios to insert, enqueue-batch to
#      insert-batch, of the same round.
#   2. latency, direct: as in run.sh, jobs published to RabbitMQ at
#      BENCH_LATENCY_RATE for BENCH_LATENCY_SECONDS after a second of
#      warm-up, each stamped with its publish time; the baseline;
#   3. latency, outbox: sekalid with BENCH_RELAYS relays, and pgbench -R
#      calling sekali.enqueue() (enqueue.pgbench) at the same rate for the
#      same time, each job's body stamped with clock_timestamp() in the
#      enqueueing statement. PostgreSQL computes p50 and p99 of (the
#      effect's clock_timestamp() - the stamp), leaving out the first
#      second; the server's one clock serves both ends. The stamp is taken
#      just before the producer's INSERT and COMMIT, so the figure includes
#      them, as the direct one includes the publish. Also shown per run: how
#      long after the stamp the relay's batch that published the job began
#      (published_at is now() of the relay's transaction).
#      Both latency runs use the same configuration (relays included, idle
#      in the direct run). pgbench -R schedules arrivals as a Poisson
#      process, bench_amqp at a fixed interval: the outbox gets the
#      burstier load of the two.
# Between runs, the finished run's rows are deleted and the tables vacuumed,
# so that no run is measured on a table the earlier ones grew.
# Every run is checked: an enqueue run's rows all there, none doubled and
# none published (which would mean a relay competed), every dedupe key
# taken; a latency run as in run.sh (one effect per job, no key doubled, the
# queue empty, sekalid exiting 0) and, for the outbox, every row published
# without error. A failed check exits non-zero. Speed is measured, never
# asserted.
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C   # decimal points in printf and awk, whatever the caller's locale

build=${1:-build}
workers=${BENCH_WORKERS:-4}
runs=${BENCH_RUNS:-3}
enqueue_seconds=${BENCH_ENQUEUE_SECONDS:-5}
batch=${BENCH_ENQUEUE_BATCH:-100}
latency_seconds=${BENCH_LATENCY_SECONDS:-10}
rate=${BENCH_LATENCY_RATE:-200}
relays=${BENCH_RELAYS:-1}
timeout=${BENCH_TIMEOUT:-300}
for v in workers runs enqueue_seconds batch latency_seconds rate relays timeout; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done

# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
rm -f "$work"/bench-enqueue-*   # the previous invocation's files: only this one's are left to read

# Queues are named after the run id, as in run.sh; bench-enqueue-* keeps
# this script's rows and files apart from run.sh's.
run_id=bench-enqueue-$(date +%s)-$$

# Before each run: no dead rows or stale statistics left by the previous run,
# and no checkpoint of its dirty pages landing in the middle of this one.
settle() {
    sql -c 'VACUUM ANALYZE sekali.outbox, sekali.job_dedupe, sekali_bench.outbox_raw,
                           sekali.idempotency_keys, sekali_bench.jobs' -c 'CHECKPOINT'
}

# Drops a finished run's rows, so that runs do not grow the tables the
# later runs are measured on. outbox_raw holds only this script's rows.
forget() {
    sql -c "DELETE FROM sekali.outbox WHERE queue = '$1'" \
        -c "DELETE FROM sekali.job_dedupe WHERE queue = '$1'" \
        -c "DELETE FROM sekali.idempotency_keys WHERE queue = '$1'" \
        -c "DELETE FROM sekali_bench.jobs WHERE queue = '$1'" \
        -c 'TRUNCATE sekali_bench.outbox_raw'
}

# pgbench_value LABEL LOG: a figure from pgbench's report.
pgbench_value() {
    sed -n "s/^$1 \([0-9.]*\).*/\1/p" "$2"
}

# check_enqueued QUEUE TABLE EXPECTED DEDUPE: EXPECTED rows of QUEUE in
# TABLE (sekali.outbox or the baseline's copy of it), no key twice, none
# published or failed (nothing may have relayed them), and with DEDUPE=1
# a dedupe key held by each of them.
check_enqueued() {
    local queue=$1 table=$2 expected=$3 dedupe=$4 counts rows keys relayed held
    counts=$(sql -F ' ' -c "
        SELECT count(*), count(DISTINCT idempotency_key),
               count(*) FILTER (WHERE published_at IS NOT NULL OR publish_error IS NOT NULL),
               (SELECT count(*) FROM sekali.job_dedupe d JOIN $table o USING (job_id)
                 WHERE d.queue = '$queue' AND d.released_at IS NULL)
          FROM $table WHERE queue = '$queue'")
    read -r rows keys relayed held <<<"$counts"
    [ "$rows" -eq "$expected" ] || die "$queue: $rows rows in $table, expected $expected"
    [ "$keys" -eq "$rows" ] || die "$queue: $((rows - keys)) keys doubled in $table"
    [ "$relayed" -eq 0 ] ||
        die "$queue: $relayed rows were relayed during an enqueue-rate run:" \
            "is a sekalid with outbox relays using this database?"
    [ "$held" -eq $((dedupe * rows)) ] ||
        die "$queue: $held of $rows jobs hold their dedupe key, expected $((dedupe * rows))"
}

# rate_run VARIANT ROUND: one enqueue-rate run of VARIANT (see the top);
# sets `jobs_per_s`.
rate_run() {
    local variant=$1 round=$2 script per=1 table=sekali.outbox dedupe=0 log tps processed
    case $variant in
        insert)        script=tests/bench/insert.pgbench table=sekali_bench.outbox_raw ;;
        enqueue)       script=tests/bench/enqueue.pgbench ;;
        dedupe)        script=tests/bench/enqueue_dedupe.pgbench dedupe=1 ;;
        insert-batch)  script=$insert_batch per=$batch table=sekali_bench.outbox_raw ;;
        enqueue-batch) script=$enqueue_batch per=$batch ;;
    esac
    local queue=$run_id-$variant-$round
    log=$work/$queue.log
    settle
    quiesce "$variant run $round"
    "$pgbench" -n -M prepared -c "$workers" -j "$pg_threads" -T "$enqueue_seconds" \
        -f "$script" -D "queue=$queue" "$SEKALI_PG_CONNINFO" >"$log" 2>&1 ||
        die "$variant run $round (see $log)"
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$log")
    processed=$(pgbench_value 'number of transactions actually processed:' "$log")
    if [ -z "$tps" ] || [ -z "$processed" ]; then die "no tps in $log"; fi
    check_enqueued "$queue" "$table" $((processed * per)) "$dedupe"
    forget "$queue"
    jobs_per_s=$(awk -v t="$tps" -v n="$per" 'BEGIN { printf "%.0f", t * n }')
    say "$variant run $round: $jobs_per_s jobs/s ($processed transactions of $per in $enqueue_seconds s)"
}

# wait_ready QUEUE: until sekalid's workers consume QUEUE and its relays are
# connected, so that the latency run's jobs do not wait for a start-up.
wait_ready() {
    local depth connected try
    for try in $(seq 1 300); do
        depth=$("$out/bench_amqp" "$SEKALI_AMQP_URL" depth "$1" 2>/dev/null || true)
        connected=$(sql -c "SELECT count(*) FROM pg_stat_activity
                             WHERE application_name = 'sekali outbox relay'")
        if [[ $depth == *" consumers=$workers" ]] && [ "$connected" -ge "$relays" ]; then
            return 0
        fi
        [ "$try" -lt 300 ] || break
        sleep 0.1
    done
    die "$1: sekalid not consuming with $relays relays after 30 s (see $work/$1.log)"
}

# latency_run PATH ROUND: one latency run, PATH direct or outbox; sets
# `p50` and `p99`.
latency_run() {
    local path=$1 round=$2 measured pmax result conf
    local queue=$run_id-latency-$path-$round
    conf=$(write_conf "$queue" "$relays")
    settle
    quiesce "latency run $round ($path)"
    live_queue=$queue
    result=$work/$queue.result
    "$out/bench_sekalid" "$build/sekalid" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
        "$queue" "$latency_count" "$((latency_seconds + timeout))" >"$result" &
    driver=$!
    if [ "$path" = direct ]; then
        # bench_amqp waits until all workers consume, then keeps to the
        # schedule whatever the consumers do (open loop).
        "$out/bench_amqp" "$SEKALI_AMQP_URL" rate "$queue" "$latency_count" "$rate" "$workers" \
            >"$work/$queue.publish" || die "latency publisher (see $work/$queue.log)"
    else
        wait_ready "$queue"
        # -R keeps to its schedule however long a transaction takes (it
        # reports the lag), so this too is an open loop.
        "$pgbench" -n -M prepared -c "$workers" -j "$pg_threads" -R "$rate" -t "$latency_per_client" \
            -f tests/bench/enqueue.pgbench -D "queue=$queue" "$SEKALI_PG_CONNINFO" \
            >"$work/$queue.publish" 2>&1 || die "latency producer (see $work/$queue.publish)"
    fi
    wait "$driver" || die "latency run $round, $path (see $work/$queue.log)"
    driver=''
    verify "$queue" "$latency_count" amqp
    log_problems "$work/$queue.log"
    read -r measured p50 p99 pmax <<<"$(latency "$queue")"
    if [ "$path" = direct ]; then
        say "latency run $round, direct: p50 $p50 ms, p99 $p99 ms, max $pmax ms of $measured jobs" \
            "(publish: $(cat "$work/$queue.publish"))"
    else
        local counts rows published failed relay50 relay99 lag
        counts=$(sql -F ' ' -c "
            SELECT count(*), count(published_at), count(publish_error)
              FROM sekali.outbox WHERE queue = '$queue'")
        read -r rows published failed <<<"$counts"
        if [ "$rows" -ne "$latency_count" ] || [ "$published" -ne "$rows" ] || [ "$failed" -ne 0 ]; then
            die "$queue: $published of $rows outbox rows published ($failed failed), expected $latency_count"
        fi
        read -r relay50 relay99 <<<"$(sql -F ' ' -c "
            SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
                   round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)
              FROM (SELECT j.published_us - min(j.published_us) OVER () AS since_us,
                           (extract(epoch FROM o.published_at) * 1e6 - j.published_us) / 1e3 AS ms
                      FROM sekali.outbox o
                      JOIN sekali_bench.jobs j ON j.queue = o.queue AND j.key = o.idempotency_key
                     WHERE o.queue = '$queue') lags
             WHERE since_us >= 1000000")"
        lag=$(pgbench_value 'rate limit schedule lag: avg' "$work/$queue.publish")
        say "latency run $round, outbox: p50 $p50 ms, p99 $p99 ms, max $pmax ms of $measured jobs;" \
            "the relay's batch began p50 $relay50 ms, p99 $relay99 ms after the enqueue" \
            "(producer's schedule lag: avg ${lag:-?} ms)"
    fi
    "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
    live_queue=''
    forget "$queue"
}

# ---------------------------------------------------------------------------
# Schema, and a clean slate: rows from interrupted earlier invocations would
# otherwise make every run scan them, and their unpublished outbox rows
# would be published by the latency runs' relays.
# ---------------------------------------------------------------------------
schema "$(write_conf "$run_id-check" "$relays")"
for t in sekali.outbox sekali.job_dedupe sekali.idempotency_keys sekali_bench.jobs; do
    sql -c "DELETE FROM $t WHERE queue LIKE 'bench-enqueue-%'"
done
running=$(sql -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sekali outbox relay'")
[ "$running" -eq 0 ] ||
    die "outbox relays of another sekalid use this database ($running connected): they would compete with the" \
        "enqueue runs and publish their rows; stop that sekalid first"
# Rows that failed to publish do not matter: since sql/005 the relay's index
# leaves them out.
waiting=$(sql -c "SELECT count(*) FROM sekali.outbox WHERE published_at IS NULL
                    AND publish_error IS NULL")
[ "$waiting" -eq 0 ] ||
    die "$waiting unpublished rows of other queues in sekali.outbox: the latency runs' relays would" \
        "publish them (SELECT queue, count(*) FROM sekali.outbox WHERE published_at IS NULL GROUP BY 1)"

pg_threads=$((workers < 2 ? workers : 2))
latency_per_client=$(( (rate * (latency_seconds + 1) + workers - 1) / workers ))
latency_count=$((latency_per_client * workers))

# The batched scripts: the one-job script's statements BENCH_ENQUEUE_BATCH
# times in one pipelined transaction.
batch_script() {
    local file=$work/$run_id-$1-batch.pgbench i
    {
        printf '\\startpipeline\nBEGIN;\n'
        for i in $(seq 1 "$batch"); do grep -v -e '^--' -e '^$' "tests/bench/$1.pgbench"; done
        printf 'COMMIT;\n\\endpipeline\n'
    } >"$file"
    printf '%s' "$file"
}
insert_batch=$(batch_script insert)
enqueue_batch=$(batch_script enqueue)

relays_text="$relays outbox relay"
(( relays == 1 )) || relays_text+=s
say "enqueue: $workers clients, $enqueue_seconds s runs, $batch jobs per batch;" \
    "latency: $rate jobs/s for $latency_seconds s, $relays_text; $runs rounds;" \
    "scratch files in $work"

# ratio A B DIGITS: A / B, rounded.
ratio() { awk -v a="$1" -v b="$2" -v d="$3" 'BEGIN { if (b > 0) printf "%." d "f", a / b; else print "inf" }'; }

variants=(insert enqueue dedupe insert-batch enqueue-batch)
declare -A baseline=([enqueue]=insert [dedupe]=insert [enqueue-batch]=insert-batch)
declare -A rates=() ratios=()
direct50=() direct99=() outbox50=() outbox99=() ratio50=() ratio99=()
for round in $(seq 1 "$runs"); do
    declare -A this=()
    for v in "${variants[@]}"; do
        rate_run "$v" "$round"
        this[$v]=$jobs_per_s
        rates[$v]+="$jobs_per_s "
        if [ -n "${baseline[$v]:-}" ]; then
            ratios[$v]+="$(ratio "$jobs_per_s" "${this[${baseline[$v]}]}" 2) "
        fi
    done

    latency_run direct "$round"
    direct50+=("$p50") direct99+=("$p99")
    latency_run outbox "$round"
    outbox50+=("$p50") outbox99+=("$p99")
    ratio50+=("$(ratio "$p50" "${direct50[-1]}" 1)")
    ratio99+=("$(ratio "$p99" "${direct99[-1]}" 1)")
done

# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------
# line VARIANT LABEL: a variant's median rate, and its ratio to its baseline.
line() {
    local v=$1 label=$2 text
    # shellcheck disable=SC2086  # the per-round figures, one word each
    text="$label: $(printf '%.0f' "$(median ${rates[$v]})") jobs/s (median of $runs: ${rates[$v]% })"
    if [ -n "${ratios[$v]:-}" ]; then
        # shellcheck disable=SC2086
        text+=" -> ratio to the raw INSERT $(printf '%.2f' "$(median ${ratios[$v]})") (rounds: ${ratios[$v]% })"
    fi
    printf '%s\n' "$text"
}
# ms VALUES...: their median, to 0.1.
ms() { printf '%.1f' "$(median "$@")"; }
cat <<SUMMARY

enqueue, $workers clients, $enqueue_seconds s runs, ratios to the raw INSERT of the same round:
$(line insert "raw INSERT, 1 per transaction")
$(line enqueue "sekali.enqueue(), 1 per transaction")
$(line dedupe "sekali.enqueue() with a dedupe key, 1 per transaction")
$(line insert-batch "raw INSERT, $batch per transaction")
$(line enqueue-batch "sekali.enqueue(), $batch per transaction")
latency at $rate jobs/s, $relays_text, median of $runs:
outbox to effect: p50 $(ms "${outbox50[@]}") ms, p99 $(ms "${outbox99[@]}") ms (p50s: ${outbox50[*]}; p99s: ${outbox99[*]})
direct publish to effect: p50 $(ms "${direct50[@]}") ms, p99 $(ms "${direct99[@]}") ms (p50s: ${direct50[*]}; p99s: ${direct99[*]})
ratio outbox/direct: p50 $(ms "${ratio50[@]}"), p99 $(ms "${ratio99[@]}") (rounds: p50 ${ratio50[*]}; p99 ${ratio99[*]})
SUMMARY
