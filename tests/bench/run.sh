#!/usr/bin/env bash
# The benchmark behind `make bench`: how fast sekalid runs jobs end to end,
# compared with PostgreSQL alone running the same SQL through pgbench.
#   tests/bench/run.sh BUILD_DIR    (servers from tests/servers.sh must be running)
#
# Settings (environment; defaults in brackets). The three lists make one
# configuration per combination, each measured as below:
#   BENCH_WORKERS [4 16]    sekalid workers (and pgbench clients): a list
#   BENCH_BATCH [unset]     queues[].batch: a list, e.g. "1 default 16 64";
#                           default (or the list unset): no batch key is
#                           written, sekali's default (16 within the window)
#   BENCH_PREFETCH [unset]  queues[].prefetch: a list; unset, sekali's default
#   BENCH_BATCH_WAIT [unset]  queues[].batch_wait for every configuration
#                           with a batch (e.g. 0s); unset, sekali's default
#   BENCH_COMPARE [unset]   other sekalid binaries to run back to back with
#                           this build's, in the same runs: "NAME=PATH ..."
#                           (e.g. before=/tmp/main/build/sekalid)
#   BENCH_JOBS [20000]      jobs per throughput run (and pgbench transactions)
#   BENCH_RUNS [3]          throughput runs, each followed by a pgbench run
#   BENCH_LATENCY_SECONDS [10]  length of the fixed-rate latency run
#   BENCH_LATENCY_RATE [half 200 1000 2000]  offered rates of the latency
#                           runs, jobs/s, a list; half: half the median
#                           throughput. Fixed rates compare configurations
#                           and builds at the same load
#   BENCH_TIMEOUT [300]     seconds one run may take before it counts as failed
#   BENCH_HANDLER [c]       a list: c, the C bench handler; sql, the same INSERT
#                           through the stock SQL handler (handlers/sql.c);
#                           http, the stock HTTP handler (external mode) POSTing
#                           to a local keep-alive service making the INSERT
#                           (tests/bench/bench_http.c); "c http" runs both in
#                           every round
#   BENCH_TLS [0]           a list: 0 clear text, 1 TLS on all three links
#                           (docs/tls.md; servers started with SEKALI_TLS=1);
#                           "0 1" runs both in every round (tests/bench/tls.sh).
#                           http with 1 (+http+tls) is https:// to a second,
#                           HTTPS instance of the service (the test CA's
#                           server certificate, verified: ca_file), whose
#                           INSERTs go over TLS too; at the end each
#                           instance says how many of its requests came over
#                           TLS, and the run fails unless all of the HTTPS
#                           one's did.
#
# What it does, per configuration:
#   1. throughput, BENCH_RUNS times: publish BENCH_JOBS persistent jobs into a
#      fresh queue, start sekalid, time it until every key is completed;
#      the workers' RSS is sampled at 25% and 100% of the jobs (with their
#      PSS at 100%: shared library pages divided among the processes that
#      map them), and their peak (VmHWM, connecting included) before the stop; CPU time is counted per process group:
#      PostgreSQL, RabbitMQ and Redis (the test servers' process trees,
#      before and after the run) and sekali (sekalid and its workers);
#      with BENCH_COMPARE, each other binary runs right after this one;
#   2. after each sekalid run, pgbench with tests/bench/job.pgbench: one
#      worker's per-job SQL as one transaction, at the same concurrency
#      (interleaved, so that noise on the shared machine hits both alike),
#      with PostgreSQL's CPU per transaction counted the same way; then the
#      same with tests/bench/loop.pgbench, the hand-written loop's SQL (an
#      idempotency row with a bare primary key, the effect, COMMIT): the
#      floor for PostgreSQL's cost per job; then the hand-written loop end
#      to end (tests/bench/bench_loop.c: the same jobs consumed, a Redis
#      lock each, the loop's SQL, ack, unlock), timed and counted as
#      sekalid is: the baseline of the summary's x-e2e;
#   3. latency: sekalid running while jobs arrive at each rate of
#      BENCH_LATENCY_RATE (half the median throughput, then fixed rates)
#      for BENCH_LATENCY_SECONDS after a second of warm-up, each
#      stamped with its publish time; PostgreSQL computes p50 and p99 of
#      (clock_timestamp() at the effect's INSERT - published). The publisher
#      shares the machine: how busy the machine was meanwhile (the summary's
#      busy %) and each process's CPU per job are reported with it.
# Every run is checked: exactly one effect per job, no key doubled, every
# key completed, the queue and its dead letters empty, sekalid exiting 0 on
# SIGTERM. A failed check exits non-zero. Speed is measured, never asserted.
# The summary is one table row per configuration and binary; its ratios are
# to pgbench on the same SQL and to the first BENCH_BATCH value (batch 1 if
# the list starts with it) at the same workers, prefetch and binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C   # decimal points in printf and awk, whatever the caller's locale

build=${1:-build}
workers_list=${BENCH_WORKERS:-4 16}
batch_list=${BENCH_BATCH:-}
tls_list=${BENCH_TLS:-0}
handler_list=${BENCH_HANDLER:-c}
prefetch_list=${BENCH_PREFETCH:-}
compare=${BENCH_COMPARE:-}
jobs=${BENCH_JOBS:-20000}
runs=${BENCH_RUNS:-3}
latency_seconds=${BENCH_LATENCY_SECONDS:-10}
latency_rate=${BENCH_LATENCY_RATE:-half 200 1000 2000}
timeout=${BENCH_TIMEOUT:-300}
[ -n "$latency_rate" ] || { echo "bench: BENCH_LATENCY_RATE is empty" >&2; exit 2; }
for x in $latency_rate; do
    [ "$x" = half ] || [[ $x =~ ^[1-9][0-9]*$ ]] ||
        { echo "bench: BENCH_LATENCY_RATE must be positive integers or half, got '$x'" >&2; exit 2; }
done
for v in jobs runs latency_seconds timeout; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
for v in workers_list batch_list prefetch_list; do
    for x in ${!v}; do
        [ "$v" != batch_list ] || [ "$x" != default ] || continue
        [[ $x =~ ^[1-9][0-9]*$ ]] || { echo "bench: ${v%_list} must be positive integers, got '$x'" >&2; exit 2; }
        # pgbench runs jobs/workers transactions per client.
        [ "$v" != workers_list ] || (( jobs >= x )) ||
            { echo "bench: BENCH_JOBS must be at least every BENCH_WORKERS" >&2; exit 2; }
    done
done
[ -n "$workers_list" ] || { echo "bench: BENCH_WORKERS is empty" >&2; exit 2; }
for t in $tls_list; do
    [[ $t =~ ^[01]$ ]] || { echo "bench: BENCH_TLS must be a list of 0 and 1, got '$t'" >&2; exit 2; }
done
[ -n "$tls_list" ] || { echo "bench: BENCH_TLS is empty" >&2; exit 2; }
for h in $handler_list; do
    [[ $h =~ ^(c|sql|http)$ ]] || { echo "bench: BENCH_HANDLER must be a list of c, sql and http, got '$h'" >&2; exit 2; }
done
[ -n "$handler_list" ] || { echo "bench: BENCH_HANDLER is empty" >&2; exit 2; }
# The binaries: this build's first, then BENCH_COMPARE's, each NAME=PATH.
names=(this) binaries=("$build/sekalid")
for c in $compare; do
    [[ $c =~ ^[A-Za-z0-9_.-]+=.+$ ]] || { echo "bench: BENCH_COMPARE wants NAME=PATH, got '$c'" >&2; exit 2; }
    [ -x "${c#*=}" ] || { echo "bench: BENCH_COMPARE: ${c#*=} is not an executable" >&2; exit 2; }
    names+=("${c%%=*}") binaries+=("${c#*=}")
done
workers=${workers_list%% *}  # for lib.sh's first configuration check

# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
rm -f "$work"/bench-[0-9]*   # the previous invocation's files: only this one's are left to read

# Every queue of this invocation is named after the run id, so that no run
# sees another's keys, and no test suite's queue is touched (they are not
# named bench-*). Two invocations at once are not supported: each starts by
# dropping the rows any earlier one left behind.
run_id=bench-$(date +%s)-$$
# The HTTP service, clear and HTTPS side by side when both are measured:
# the variants of a round alternate without restarting it.
if [[ " $handler_list " == *" http "* ]]; then
    [[ " $tls_list " != *" 0 "* ]] || start_http_service 0
    [[ " $tls_list " != *" 1 "* ]] || start_http_service 1
fi

# Before each run: no dead rows or stale statistics left by the previous run,
# and no checkpoint of its dirty pages landing in the middle of this one.
settle() {
    sql -c 'VACUUM ANALYZE sekali.idempotency_keys, sekali_bench.jobs, sekali_bench.loop_keys' \
        -c 'CHECKPOINT'
}

# Drops a finished run's rows, so that runs do not grow the tables the
# later runs are measured on.
forget() {
    sql -c "DELETE FROM sekali.idempotency_keys WHERE queue = '$1'" \
        -c "DELETE FROM sekali_bench.jobs WHERE queue = '$1'" \
        -c "DELETE FROM sekali_bench.loop_keys WHERE queue = '$1'"
}

# verify_loop QUEUE EXPECTED: the hand-written loop's run left one key row
# and one effect per job.
verify_loop() {
    local keys effects distinct
    read -r keys effects distinct <<<"$(sql -F ' ' -c "
        SELECT (SELECT count(*) FROM sekali_bench.loop_keys WHERE queue = '$1'),
               (SELECT count(*) FROM sekali_bench.jobs WHERE queue = '$1'),
               (SELECT count(DISTINCT key) FROM sekali_bench.jobs WHERE queue = '$1')")"
    [ "$keys" -eq "$2" ] && [ "$effects" -eq "$2" ] && [ "$distinct" -eq "$2" ] ||
        die "$1: $keys keys, $effects effects ($distinct distinct) for $2 loop transactions"
}

# ---------------------------------------------------------------------------
# Schema, and a clean slate: rows from interrupted earlier invocations
# would otherwise make every run scan them.
# ---------------------------------------------------------------------------
schema "$(write_conf "$run_id-check")"
sql -c "DELETE FROM sekali.idempotency_keys WHERE queue LIKE 'bench-%'" -c 'TRUNCATE sekali_bench.jobs' \
    -c 'TRUNCATE sekali_bench.loop_keys'

summary=$work/bench-summary latency_summary=$work/bench-latency
: >"$summary"
: >"$latency_summary"

# cpu_split BEFORE AFTER SEKALI_MS JOBS: "pg rmq redis sekali total" in ms
# per job, from two server_cpu outputs and sekali's own CPU.
cpu_split() {
    awk -v s="$3" -v n="$4" '
        FNR == NR { before[$1] = $2; next }
        { after[$1] = $2 }
        END {
            pg = after["postgres_ms"] - before["postgres_ms"]
            rmq = after["rabbitmq_ms"] - before["rabbitmq_ms"]
            rd = after["redis_ms"] - before["redis_ms"]
            printf "%.3f %.3f %.3f %.3f %.3f\n", pg / n, rmq / n, rd / n, s / n, (pg + rmq + rd + s) / n
        }' "$1" "$2"
}

# build_name: the summary's name of binary v, with "+sql" or "+http" for
# those handlers and "+tls" when bench_tls is 1.
build_name() {
    printf '%s%s%s' "${names[$v]}" "$([ "$bench_handler" = c ] || echo "+$bench_handler")" \
        "$([ "$bench_tls" = 1 ] && echo +tls)"
}

# Every configuration of W workers: each batch and prefetch value with every
# binary (an empty value: the key is not written). A round runs each of
# them once, back to back, then pgbench; BENCH_RUNS rounds. So the machine's
# drift over minutes falls on every configuration of a round alike, and
# each ratio (to the first batch value, to pgbench, to this build) is taken
# within a round, then its median over the rounds.
bench_workers() {
    workers=$1
    local pg_clients=$workers pg_threads=$((workers < 2 ? workers : 2))
    local pg_per_client=$((jobs / workers))
    local pg_jobs=$((pg_per_client * workers))
    local k run queue conf result rate hwm rss pss growth tps label cpu b p v svc0 svc
    local -a pgbench_tps pg_cpu loop_tps loop_cpu e2e_tps e2e_cpu e2e_pg v_batch v_prefetch v_handler v_tls v_bin
    local -A v_rates v_cpu v_hwm v_rss v_pss
    # The variants, in the order of the lists: batch, prefetch, handler,
    # TLS, binary.
    local t h
    for b in ${batch_list:-''}; do
        for p in ${prefetch_list:-''}; do
            for h in $handler_list; do
                for t in $tls_list; do
                    for v in "${!names[@]}"; do
                        v_batch+=("$b") v_prefetch+=("$p") v_handler+=("$h") v_tls+=("$t")
                        v_bin+=("$v")
                    done
                done
            done
        done
    done
    say "== W=$workers: batch ${batch_list:-(unset)}, prefetch ${prefetch_list:-(default)}," \
        "binaries ${names[*]}: $jobs jobs, $runs rounds; scratch files in $work"
    for run in $(seq 1 "$runs"); do
        for k in "${!v_bin[@]}"; do
            bench_batch=${v_batch[$k]} bench_prefetch=${v_prefetch[$k]} bench_tls=${v_tls[$k]}
            bench_handler=${v_handler[$k]} v=${v_bin[$k]}
            label="$(build_name) batch=${bench_batch:--} prefetch=${bench_prefetch:-default}"
            # --- sekali ---------------------------------------------------
            queue=$run_id-${names[$v]}-w$workers-b${bench_batch:-0}-p${bench_prefetch:-0}-$bench_handler-t$bench_tls-$run
            conf=$(write_conf "$queue")
            "${binaries[$v]}" -t -c "$conf" >/dev/null 2>&1 || "${binaries[$v]}" -t -c "$conf" ||
                die "${names[$v]} refuses the configuration $conf"
            settle
            quiesce "$label run $run"
            live_queue=$queue
            "$out/bench_amqp" "$SEKALI_AMQP_URL" bulk "$queue" "$jobs" >"$work/$queue.publish"
            result=$work/$queue.result
            server_cpu >"$work/$queue.cpu0"
            svc0=$([ "$bench_handler" != http ] || http_cpu)
            "$out/bench_sekalid" "${binaries[$v]}" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
                "$queue" "$jobs" "$timeout" >"$result" || die "$label run $run (see $work/$queue.log)"
            server_cpu >"$work/$queue.cpu1"
            svc=''
            [ "$bench_handler" != http ] ||
                svc=", the HTTP service $(awk -v a="$svc0" -v b="$(http_cpu)" -v n="$jobs" \
                    'BEGIN { printf "%.3f", (b - a) / n }') (not in the total)"
            verify "$queue" "$jobs" amqp
            log_problems "$work/$queue.log"
            rate=$(field jobs_per_s "$result")
            hwm=$(field max_hwm_kib "$result")
            rss=$(field max_rss_kib "$result")
            pss=$(field max_pss_kib "$result")
            growth=$(field rss_growth_kib "$result")
            cpu=$(cpu_split "$work/$queue.cpu0" "$work/$queue.cpu1" "$(field sekali_cpu_ms "$result")" "$jobs")
            [ "$(field same_workers "$result")" = 1 ] ||
                say "note: a worker was restarted during run $run; its RSS growth is not comparable"
            v_rates[$k]+="$rate "
            v_cpu[$k]+="$cpu;"
            if (( hwm > ${v_hwm[$k]:-0} )); then v_hwm[$k]=$hwm; fi
            if (( rss > ${v_rss[$k]:-0} )); then v_rss[$k]=$rss; fi
            if (( pss > ${v_pss[$k]:-0} )); then v_pss[$k]=$pss; fi
            say "$label run $run: $rate jobs/s, $(field elapsed_s "$result") s" \
                "(first effect after $(field first_effect_s "$result") s), RSS $rss KiB (PSS $pss," \
                "peak $hwm KiB), RSS growth 25%->100% $growth KiB; CPU ms/job pg rmq redis sekali total: $cpu$svc"
            "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
            live_queue=''
            forget "$queue"
        done

        # --- pgbench on the same SQL ------------------------------------
        queue=$run_id-pgbench-w$workers-$run
        settle
        quiesce "pgbench run $run"
        server_cpu >"$work/$queue.cpu0"
        # With sekali's durability: it raises its sessions to synchronous_commit
        # on where the server (as the test servers) defaults to off.
        PGOPTIONS="-c synchronous_commit=on" \
        "$pgbench" -n -M prepared -c "$pg_clients" -j "$pg_threads" -t "$pg_per_client" \
            -f tests/bench/job.pgbench -D "queue=$queue" "$SEKALI_PG_CONNINFO" \
            >"$work/$queue.log" 2>&1 || die "pgbench run $run (see $work/$queue.log)"
        server_cpu >"$work/$queue.cpu1"
        tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$work/$queue.log")
        [ -n "$tps" ] || die "no tps in $work/$queue.log"
        verify "$queue" "$pg_jobs"
        pgbench_tps+=("$tps")
        pg_cpu+=("$(cpu_split "$work/$queue.cpu0" "$work/$queue.cpu1" 0 "$pg_jobs" | cut -d' ' -f1)")
        say "pgbench run $run: $tps tps ($pg_jobs transactions), PostgreSQL ${pg_cpu[-1]} ms CPU/tx"
        forget "$queue"

        # --- pgbench on the hand-written loop's SQL ------------------------
        queue=$run_id-loop-w$workers-$run
        settle
        quiesce "loop run $run"
        server_cpu >"$work/$queue.cpu0"
        PGOPTIONS="-c synchronous_commit=on" \
        "$pgbench" -n -M prepared -c "$pg_clients" -j "$pg_threads" -t "$pg_per_client" \
            -f tests/bench/loop.pgbench -D "queue=$queue" "$SEKALI_PG_CONNINFO" \
            >"$work/$queue.log" 2>&1 || die "loop run $run (see $work/$queue.log)"
        server_cpu >"$work/$queue.cpu1"
        tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$work/$queue.log")
        [ -n "$tps" ] || die "no tps in $work/$queue.log"
        verify_loop "$queue" "$pg_jobs"
        loop_tps+=("$tps")
        loop_cpu+=("$(cpu_split "$work/$queue.cpu0" "$work/$queue.cpu1" 0 "$pg_jobs" | cut -d' ' -f1)")
        say "loop run $run: $tps tps ($pg_jobs transactions), PostgreSQL ${loop_cpu[-1]} ms CPU/tx"
        forget "$queue"

        # --- the hand-written loop end to end (tests/bench/bench_loop.c) ---
        # The same jobs from RabbitMQ, a Redis lock each, the loop's SQL,
        # ack, unlock: measured as sekalid is, by bench_sekalid.
        queue=$run_id-e2e-w$workers-$run
        settle
        quiesce "e2e loop run $run"
        live_queue=$queue
        "$out/bench_amqp" "$SEKALI_AMQP_URL" bulk "$queue" "$jobs" >"$work/$queue.publish"
        result=$work/$queue.result
        server_cpu >"$work/$queue.cpu0"
        # Its prefetch is sekali's at batch 1 (10), whatever BENCH_PREFETCH
        # says: one loop run a round is the baseline of every variant.
        BENCH_LOOP=1 BENCH_LOOP_QUEUE=$queue BENCH_LOOP_WORKERS=$workers \
        "$out/bench_sekalid" "$out/bench_loop" - "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
            "$queue" "$jobs" "$timeout" >"$result" || die "e2e loop run $run (see $work/$queue.log)"
        server_cpu >"$work/$queue.cpu1"
        verify_loop "$queue" "$jobs"
        e2e_tps+=("$(field jobs_per_s "$result")")
        cpu=$(cpu_split "$work/$queue.cpu0" "$work/$queue.cpu1" "$(field sekali_cpu_ms "$result")" "$jobs")
        e2e_cpu+=("$(cut -d' ' -f5 <<<"$cpu")") e2e_pg+=("$(cut -d' ' -f1 <<<"$cpu")")
        say "e2e loop run $run: ${e2e_tps[-1]} jobs/s; CPU ms/job pg rmq redis loop total: $cpu"
        "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
        live_queue=''
        forget "$queue"
    done
    local pgbench_median pg_cpu_median
    pgbench_median=$(median "${pgbench_tps[@]}")
    pg_cpu_median=$(median "${pg_cpu[@]}")
    local loop_cpu_median e2e_median e2e_cpu_median
    loop_cpu_median=$(median "${loop_cpu[@]}")
    e2e_median=$(median "${e2e_tps[@]}")
    e2e_cpu_median=$(median "${e2e_cpu[@]}")

    for k in "${!v_bin[@]}"; do
        bench_batch=${v_batch[$k]} bench_prefetch=${v_prefetch[$k]} bench_tls=${v_tls[$k]}
        bench_handler=${v_handler[$k]} v=${v_bin[$k]}
        label="$(build_name) batch=${bench_batch:--} prefetch=${bench_prefetch:-default}"
        local median_rate x_batch x_pgbench x_this x_loop x_e2e pg_x_loop pg_x_e2e j
        # shellcheck disable=SC2086  # a list of numbers
        median_rate=$(median ${v_rates[$k]})
        # The ratios, round by round: to the first batch value of the same
        # prefetch, handler, TLS and binary, to pgbench, to this build in
        # this configuration (with the first BENCH_HANDLER and BENCH_TLS
        # values: the C handler in "c http", clear text in "0 1").
        for j in "${!v_bin[@]}"; do
            [ "${v_prefetch[$j]}" = "$bench_prefetch" ] && [ "${v_tls[$j]}" = "$bench_tls" ] &&
                [ "${v_handler[$j]}" = "$bench_handler" ] && [ "${v_bin[$j]}" = "$v" ] && break
        done
        x_batch=$(ratios "${v_rates[$k]}" "${v_rates[$j]}")
        x_pgbench=$(ratios "${v_rates[$k]}" "${pgbench_tps[*]}")
        for j in "${!v_bin[@]}"; do
            [ "${v_batch[$j]}" = "$bench_batch" ] && [ "${v_prefetch[$j]}" = "$bench_prefetch" ] &&
                [ "${v_tls[$j]}" = "${tls_list%% *}" ] &&
                [ "${v_handler[$j]}" = "${handler_list%% *}" ] && [ "${v_bin[$j]}" = 0 ] && break
        done
        x_this=$(ratios "${v_rates[$k]}" "${v_rates[$j]}")
        x_loop=$(ratios "${v_rates[$k]}" "${loop_tps[*]}")
        x_e2e=$(ratios "${v_rates[$k]}" "${e2e_tps[*]}")
        # PostgreSQL's CPU per job over the loop's, round by round.
        pg_x_loop=$(ratios "$(tr ';' '\n' <<<"${v_cpu[$k]}" | awk 'NF { printf "%s ", $1 }')" \
                    "${loop_cpu[*]}")
        pg_x_e2e=$(ratios "$(tr ';' '\n' <<<"${v_cpu[$k]}" | awk 'NF { printf "%s ", $1 }')" \
                   "${e2e_pg[*]}")
        local split='' i
        for i in 1 2 3 4 5; do
            split+="$(tr ';' '\n' <<<"${v_cpu[$k]}" | awk -v i="$i" 'NF { print $i }' | sort -g |
                awk '{ x[NR] = $1 } END { printf "%.3f", (NR % 2) ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2 }') "
        done
        # --- latency: open loop at half this binary's median throughput ---
        local lrate count driver_rc p50 p99 pmax measured stat0 stat1 busy publisher_cpu
        local first_rate='' first_p50 first_p99 first_busy
        for lrate in $latency_rate; do
            if [ "$lrate" = half ]; then
                lrate=$(awk -v m="$median_rate" 'BEGIN { r = int(m / 2); print r < 1 ? 1 : r }')
            fi
            count=$((lrate * (latency_seconds + 1)))
            queue=$run_id-${names[$v]}-w$workers-b${bench_batch:-0}-p${bench_prefetch:-0}-$bench_handler-t$bench_tls-latency$lrate
            conf=$(write_conf "$queue")
            settle
            quiesce "the latency run of $label"
            live_queue=$queue
            result=$work/$queue.result
            "$out/bench_sekalid" "${binaries[$v]}" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
                "$queue" "$count" "$((latency_seconds + timeout))" >"$result" &
            driver=$!
            # bench_amqp waits until all workers consume, then keeps to the schedule
            # whatever the consumers do (open loop). The publisher and the broker's
            # side of publishing run on the measured machine too: how busy it was
            # while jobs arrived, and what each process spent per job, say whether
            # this rate left it any room (a saturated machine queues jobs).
            stat0=$(head -n 1 /proc/stat)
            server_cpu >"$work/$queue.cpu0"
            publisher_cpu=$( { TIMEFORMAT='%U %S'; time "$out/bench_amqp" "$SEKALI_AMQP_URL" rate \
                "$queue" "$count" "$lrate" "$workers" >"$work/$queue.publish" 2>&1; } 2>&1 ) ||
                die "latency publisher (see $work/$queue.publish and $work/$queue.log)"
            server_cpu >"$work/$queue.cpu1"
            stat1=$(head -n 1 /proc/stat)
            busy=$(awk -v a="$stat0" -v b="$stat1" 'BEGIN {
                split(a, x, " "); split(b, y, " "); total = 0
                for (i = 2; i <= 9; i++) total += y[i] - x[i]
                idle = y[5] - x[5] + y[6] - x[6]
                printf "%.0f", (total > 0 ? 100 * (total - idle) / total : 0) }')
            driver_rc=0
            wait "$driver" || driver_rc=$?
            [ "$driver_rc" = 0 ] || die "latency run (see $work/$queue.log)"
            driver=''
            verify "$queue" "$count" amqp
            log_problems "$work/$queue.log"
            read -r measured p50 p99 pmax <<<"$(latency "$queue")"
            say "$label latency run: $count jobs at $lrate jobs/s, $measured after the first second:" \
                "p50 $p50 ms, p99 $p99 ms, max $pmax ms (publish: $(cat "$work/$queue.publish"))"
            say "$label latency run: the machine $busy% busy while jobs arrived; CPU ms/job pg rmq" \
                "redis sekali total: $(cpu_split "$work/$queue.cpu0" "$work/$queue.cpu1" \
                "$(field sekali_cpu_ms "$result")" "$count"), publisher $(awk -v c="$count" \
                '{ printf "%.3f", ($1 + $2) * 1000 / c }' <<<"$publisher_cpu")"
            "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
            live_queue=''
            forget "$queue"
            printf '%s %s %s %s %s %s %s %s %s\n' "$workers" "${bench_batch:--}" "${bench_prefetch:-default}" \
                "$(build_name)" "$lrate" "$p50" "$p99" "$pmax" "$busy" >>"$latency_summary"
            if [ -z "$first_rate" ]; then
                first_rate=$lrate first_p50=$p50 first_p99=$p99 first_busy=$busy
            fi
        done
        # shellcheck disable=SC2086
        printf '%s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s %s\n' "$workers" "${bench_batch:--}" \
            "${bench_prefetch:-default}" "$(build_name)" "$median_rate" "$pgbench_median" \
            "$first_rate" "$first_p50" "$first_p99" "${v_hwm[$k]}" "$pg_cpu_median" "$split" \
            "${v_rss[$k]}" "${v_pss[$k]}" "$first_busy" "$x_batch" "$x_pgbench" "$x_this" \
            "$x_loop" "$loop_cpu_median" "$pg_x_loop" "$x_e2e" "$e2e_median" "$e2e_cpu_median" "$pg_x_e2e" >>"$summary"
        say "$label: $(printf '%.0f' "$median_rate") jobs/s (median of $runs: ${v_rates[$k]% })," \
            "pgbench $(printf '%.0f' "$pgbench_median") tps (median of $runs: ${pgbench_tps[*]})"
    done
}

for w in $workers_list; do
    bench_workers "$w"
done
stop_http_services

# ---------------------------------------------------------------------------
# Summary: one row per configuration and binary. x-batch: jobs/s over the
# first batch value's at the same W, prefetch and binary; x-pgbench: over
# pgbench's tps; x-this: over this build's in the same configuration; each
# the median of the ratios within a round (a +tls row's x-this: over this
# build's in clear text, when BENCH_TLS starts with 0). CPU: ms per job (PostgreSQL per
# transaction for pgbench).
# ---------------------------------------------------------------------------
echo
awk -v runs="$runs" '
    BEGIN {
        printf "%-3s %-5s %-8s %-13s %8s %7s %9s %7s %22s %14s  %-34s %8s %7s %6s %7s %7s %6s %7s %7s %7s\n", "W", "batch",
               "prefetch", "build", "jobs/s", "x-batch", "x-pgbench", "x-this", "p50/p99 ms @rate busy",
               "RSS/PSS/peak", "CPU ms/job: pg rmq redis sekali = total", "pgb-pg", "pgb tps",
               "x-loop", "pg/loop", "loop-pg", "x-e2e", "e2e j/s", "e2e cpu", "pg/e2e"
    }
    {
        split($0, f, " ")
        printf "%-3s %-5s %-8s %-13s %8.0f %7.2f %9.2f %7.2f %22s %14s  %-34s %8.3f %7.0f %6.2f %7.2f %7.3f %6.2f %7.0f %7.3f %7.2f\n",
               f[1], f[2], f[3], f[4], f[5], f[20], f[21], f[22], f[8] "/" f[9] " @" f[7] " " f[19] "%",
               sprintf("%.1f/%.1f/%.1fM", f[17] / 1024, f[18] / 1024, f[10] / 1024),
               f[12] " " f[13] " " f[14] " " f[15] " = " f[16], f[11], f[6], f[23], f[25], f[24],
               f[26], f[27], f[28], f[29]
    }
    END {
        printf "(jobs/s and pgbench tps: medians of %d rounds; x-batch, x-pgbench, x-this, x-loop (over the hand-written loop'"'"'s SQL through pgbench, tests/bench/loop.pgbench) and pg/loop (PostgreSQL CPU per job over the loop'"'"'s): medians of the ratios within each round; loop-pg: the loop'"'"'s PostgreSQL ms CPU/tx; x-e2e: over the hand-written loop end to end (tests/bench/bench_loop.c: consume, lock, the loop'"'"'s SQL, ack, unlock), e2e j/s and e2e cpu its jobs/s and whole-machine ms CPU/job; pg/e2e: PostgreSQL CPU per job over the end-to-end loop'"'"'s; RSS and PSS per worker when every job is done, the largest of the rounds; peak: VmHWM)\n", runs
    }' "$summary"

# One row per latency run: each configuration and binary at each offered
# rate of BENCH_LATENCY_RATE, publish -> commit.
echo
awk '
    BEGIN { printf "%-3s %-5s %-8s %-13s %8s %8s %8s %8s %5s\n", "W", "batch", "prefetch", "build",
                   "jobs/s", "p50 ms", "p99 ms", "max ms", "busy" }
    { printf "%-3s %-5s %-8s %-13s %8s %8s %8s %8s %4s%%\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }
    END { print "(latency: one run per offered rate, after a second of warm-up; busy: the whole machine while jobs arrived)" }
' "$latency_summary"
