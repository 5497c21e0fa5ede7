#!/usr/bin/env bash
# The benchmark behind `make bench-scale`: what a large history of retained
# idempotency keys costs, against an empty store, in the same rounds.
#   tests/bench/scale.sh BUILD_DIR    (servers from tests/servers.sh must be running)
#
# Settings (environment; defaults in brackets):
#   BENCH_SCALE_N [10000000]     retained keys of the large store (the small
#                                one holds none)
#   BENCH_SCALE_BEFORE [unset]   another source tree, built (e.g. a clone at an
#                                older commit): its sekalid and sekalictl run
#                                on its own schema (its sql/), back to back with
#                                this build's, in the same rounds
#   BENCH_JOBS [20000]           jobs per throughput run
#   BENCH_RUNS [3]               rounds
#   BENCH_WORKERS [4]            sekalid workers
#   BENCH_SCALE_EXPIRED_PCT [10] share of the retention the loaded keys reach
#                                past it: about this percent of them is expired
#   BENCH_SCALE_PURGE_ROWS [300000]  most keys one round's purge deletes
#   BENCH_SCALE_PURGE_SECONDS [20]   longest one round's purge runs
#   BENCH_SCALE_BUSY_PERCENT ["100 50"]  the purge's janitor.busy_percent,
#                                a run for each (100, the default: back to
#                                back)
#   BENCH_SCALE_RATE [1000]      jobs/s of the fixed-rate latency run
#   BENCH_LATENCY_SECONDS [5]    its length
#   BENCH_TIMEOUT [300]          seconds one run may take
#   BENCH_SCALE_READS_ONLY [0]   1: each round times the operator's reads
#                                and the console's pages only (step 4)
#   BENCH_SCALE_FULL_PAGE_WRITES [on]  the server's full_page_writes for the
#                                benchmark (ALTER SYSTEM, reset at its end):
#                                on, as production runs (each move at 100 M
#                                writes a page image), where the test
#                                servers turn it off
#   BENCH_SCALE_CACHE [warm]     what each round's large stores start from:
#                                warm: their primary keys read into the
#                                kernel's cache (pg_prewarm), as a server
#                                that has taken claims for a while holds the
#                                leaves they touch; cold: the kernel's cache
#                                dropped (root), as a server just restarted
#                                meets them; buffers: as warm, into
#                                PostgreSQL's shared buffers (as many as they
#                                hold: a server sized for its store, e.g.
#                                ALTER SYSTEM SET shared_buffers = '6GB',
#                                on huge pages as doctor asks: sysctl
#                                vm.nr_hugepages and huge_pages = on);
#                                asis: none of these (before session 27)
#
# The stores are databases of the test server, scale_NAME_N (NAME: before or
# this), kept between invocations: the keys are loaded once
# (tests/bench/scale_load.sql: random UUID keys in time order over the
# retention of 720 h, by generate_series, about two minutes for 10 M), into
# the first tree's schema, and the other tree's store is a copy of it
# (CREATE DATABASE ... TEMPLATE) migrated forward with its own sekalictl, so
# that both builds read the same rows and the migration's time at N is
# measured (an online migration of this tree runs on the live table). Drop
# them with `DROP DATABASE` when done: 10 M keys take about 3 GB each.
#
# Per round, for each N and each tree, back to back (after a warm-up run of
# a quarter of BENCH_JOBS, not counted):
#   1. throughput: BENCH_JOBS jobs with random UUID keys (BENCH_RANDOM_KEYS)
#      into the queue the retained keys are in, sekalid at the defaults,
#      timed until every effect committed (BENCH_EFFECTS: the effects are
#      counted, since counting the queue's keys would read the history);
#      PostgreSQL's CPU per job from its process tree; every run checked (one
#      effect per job, each key completed) and its keys deleted after, so
#      that N stays N; before each run, a store with the archive has its
#      keys table vacuumed (settle());
#   2. where the keys can be archived (sql/040), the same run with the
#      janitor moving each key a second after it completed (archive_after
#      1s, every 200 ms): what the moves cost the workers;
#      at N > 0, the same run while the janitor's statement
#      (sekali.purge_keys, or where the expired keys are archived
#      sekali.purge_finished_keys_after, each batch going on from the last
#      (sql/041; sql/040's purge_finished_keys in a tree without it), with
#      the default batch of 1000, one transaction a batch, on one session)
#      deletes expired keys beside it, up to
#      BENCH_SCALE_PURGE_ROWS or BENCH_SCALE_PURGE_SECONDS: its rate, and
#      the workers' jobs/s against run 1's;
#   3. latency: BENCH_SCALE_RATE jobs/s for BENCH_LATENCY_SECONDS (after a
#      second of warm-up), p50 and p99 of publish -> effect;
#   4. the time of one janitor batch with nothing expired (what every round
#      costs once the expired keys are gone; the archive's from no mark,
#      as after a start), `sekalictl status --json` (the
#      console's status page runs the same report), `verify`, `trace KEY` of
#      a retained key, `dlq list --limit 100` and `dlq groups` (the console's dead
#      letter pages run the same reports) over a dead letter for each
#      failed key (tests/bench/scale_letters.sql, loaded into a store that
#      has none); then each page of the console's API as its views ask for
#      it, from a running `sekalictl serve` (a request after a first one
#      that opened its pooled sessions): status, trace, a dead letter page
#      of 100, the letters' groups, 24 h of history, the retries and the
#      scheduled jobs.
# Where this tree has sql/040, the loader puts the completed keys older than
# an hour in sekali.finished_keys, as the janitor's moves would have.
# Bytes per key are measured once, from the relations' sizes (both tables). The summary's
# ratios are to N = 0 of the same tree, taken within a round, and their
# median over the rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C

build=${1:-build}
n_big=${BENCH_SCALE_N:-10000000}
before_tree=${BENCH_SCALE_BEFORE:-}
jobs=${BENCH_JOBS:-20000}
runs=${BENCH_RUNS:-3}
workers=${BENCH_WORKERS:-4}
expired_pct=${BENCH_SCALE_EXPIRED_PCT:-10}
purge_rows=${BENCH_SCALE_PURGE_ROWS:-300000}
purge_seconds=${BENCH_SCALE_PURGE_SECONDS:-20}
read -r -a busy_list <<<"${BENCH_SCALE_BUSY_PERCENT:-100 50}"
timeout=${BENCH_TIMEOUT:-300}
reads_only=${BENCH_SCALE_READS_ONLY:-0}
cache=${BENCH_SCALE_CACHE:-warm}
full_page_writes=${BENCH_SCALE_FULL_PAGE_WRITES:-on}
lat_rate=${BENCH_SCALE_RATE:-1000}
lat_seconds=${BENCH_LATENCY_SECONDS:-5}
for v in n_big jobs runs workers expired_pct purge_rows purge_seconds timeout lat_rate lat_seconds reads_only; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench: $v must be a number, got '${!v}'" >&2; exit 2; }
done
case $cache in
    warm | buffers | asis) ;;
    cold) [ -w /proc/sys/vm/drop_caches ] ||
        { echo "bench: BENCH_SCALE_CACHE=cold drops the kernel's cache: run as root" >&2; exit 2; } ;;
    *) echo "bench: BENCH_SCALE_CACHE must be warm, cold or asis, got '$cache'" >&2; exit 2 ;;
esac
case $full_page_writes in
    on | off) ;;
    *) echo "bench: BENCH_SCALE_FULL_PAGE_WRITES must be on or off, got '$full_page_writes'" >&2; exit 2 ;;
esac
[ ${#busy_list[@]} -gt 0 ] || { echo "bench: BENCH_SCALE_BUSY_PERCENT is empty" >&2; exit 2; }
for b in "${busy_list[@]}"; do
    [[ $b =~ ^[0-9]+$ ]] && [ "$b" -ge 1 ] && [ "$b" -le 100 ] ||
        { echo "bench: BENCH_SCALE_BUSY_PERCENT: each must be 1..100, got '$b'" >&2; exit 2; }
done
names=(this) trees=(.)
if [ -n "$before_tree" ]; then
    [ -x "$before_tree/build/sekalid" ] && [ -d "$before_tree/sql" ] ||
        { echo "bench: BENCH_SCALE_BEFORE: no $before_tree/build/sekalid or sql/" >&2; exit 2; }
    names=(before this) trees=("$before_tree" .)
fi
sizes=(0 "$n_big")

# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
export BENCH_RANDOM_KEYS=1 BENCH_EFFECTS=1
queue=scale retention_ms=$((720 * 3600 * 1000))

bin_of() { if [ "${trees[$1]}" = . ]; then echo "$build"; else echo "${trees[$1]}/build"; fi; }
sql_of() { echo "${trees[$1]}/sql"; }
db_of() { echo "scale_${names[$1]}_$2"; }
on() { local db=$1; shift; PGOPTIONS=$quiet_pg psql -X -q -t -A -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO dbname=$db" "$@"; }

# server_settings: what of the server's settings moved this benchmark's
# figures (doctor's postgres.huge_pages: the same store ran at 0.70x on
# 4 kB pages, 1.10x on huge pages; full_page_writes: docs/benchmark.md).
server_settings() { echo "shared_buffers $(sql -c 'SHOW shared_buffers'), huge_pages $(sql -c 'SHOW huge_pages'), full_page_writes $(sql -c 'SHOW full_page_writes')"; }
# archived DB: t when DB's schema has sql/040's finished_keys, where the
# loader put the keys older than an hour and where the purge finds the
# expired ones.
archived() { on "$1" -c "SELECT to_regclass('sekali.finished_keys') IS NOT NULL"; }
purge_fn() {
    if [ "$(on "$1" -c "SELECT to_regproc('sekali.purge_finished_keys_after') IS NOT NULL")" = t ]; then
        echo sekali.purge_finished_keys_after
    elif [ "$(archived "$1")" = t ]; then echo sekali.purge_finished_keys
    else echo sekali.purge_keys; fi
}

# conf DB [archiving]: sekalid's configuration for the queue in store DB. Its janitor
# keeps the keys (retention: forever) and moves none (archive_after:
# forever): the purge is measured on its own (purge_loop), a janitor's
# first round at start would purge them all, and on a store migrated
# forward it would start moving every key. With "archiving", the janitor
# moves each key a second after it completed, every 200 ms (what moving
# costs the workers, at the rate they complete keys).
conf() {
    local c=$work/scale-$1.yaml
    cat >"$c" <<YAML
amqp:
  url: "$SEKALI_AMQP_URL"
redis:
  host: 127.0.0.1
  port: $SEKALI_REDIS_PORT
postgres:
  conninfo: "$SEKALI_PG_CONNINFO dbname=$1 sslmode=disable"
log:
  level: warn
  format: json
shutdown_timeout: 20s
queues:
  - name: $queue
    handler: $out/bench_handler.so
    workers: $workers
    retention: forever
YAML
    if [ "${2:-}" = archiving ]; then
        printf 'janitor:\n  interval: 200ms\n  archive_after: 1s\n' >>"$c"
    elif [ "$(archived "$1")" = t ]; then
        printf 'janitor:\n  archive_after: forever\n' >>"$c"
    fi
    printf '%s' "$c"
}

# store V N: the database of tree V with N keys, made if missing (a copy of
# the first tree's, migrated forward with V's sekalictl, that migration timed).
store() {
    local v=$1 n=$2 db first t0
    db=$(db_of "$v" "$n") first=$(db_of 0 "$n")
    if [ "$(sql -c "SELECT count(*) FROM pg_database WHERE datname = '$db'")" = 0 ]; then
        if [ "$v" = 0 ]; then
            sql -c "CREATE DATABASE $db"
            PGOPTIONS=$quiet_pg "$(bin_of 0)/sekalictl" -c "$(conf "$db")" migrate --sql-dir "$(sql_of 0)" >/dev/null
            say "loading $n keys into $db"
            [ "$n" = 0 ] || on "$db" -v n="$n" -v queue=$queue -v retention_h=720 \
                -v expired_pct="$expired_pct" -f tests/bench/scale_load.sql \
                -c 'VACUUM (ANALYZE)' -c CHECKPOINT
        else
            sql -c "CREATE DATABASE $db TEMPLATE $first"
            on "$db" -c 'DROP TABLE sekali_bench.scale_ready'
            t0=$(date +%s.%N)
            PGOPTIONS=$quiet_pg "$(bin_of "$v")/sekalictl" -c "$(conf "$db")" migrate --sql-dir "$(sql_of "$v")" \
                >"$work/scale-$db.migrate"
            say "$db: migrated from ${names[0]}'s schema in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s:"
            sed 's/^/bench:   /' "$work/scale-$db.migrate"
        fi
        on "$db" -f tests/bench/bench.sql
        on "$db" -c "CREATE TABLE sekali_bench.scale_ready (n bigint)" -c "INSERT INTO sekali_bench.scale_ready VALUES ($n)"
    fi
    [ "$(on "$db" -c 'SELECT n FROM sekali_bench.scale_ready' 2>/dev/null)" = "$n" ] ||
        die "$db exists but was not made to the end: DROP DATABASE $db and run again"
    if [ "$n" != 0 ] && [ "$(on "$db" -c 'SELECT count(*) = 0 FROM sekali.dead_letters')" = t ]; then
        on "$db" -v queue=$queue -f tests/bench/scale_letters.sql >/dev/null
        say "$db: $(on "$db" -c 'SELECT count(*) FROM sekali.dead_letters') dead letters loaded"
    fi
}

# settle V N: before a run, the keys table of a store with the archive
# vacuumed (it holds the last hour's keys, a few hundred thousand at
# 100 M, and every run leaves its 20,000 dead), with the archive too on the
# empty store, so that no autovacuum lands inside a run (one doubled
# PostgreSQL's CPU a job of an empty store's run in session 27's first
# series). A store without the archive is not: there the keys table holds
# the whole history, and a VACUUM's index pass reads its indexes whole.
settle() {
    local db
    db=$(db_of "$1" "$2")
    [ "$(archived "$db")" = t ] || return 0
    on "$db" -c 'VACUUM (ANALYZE) sekali.idempotency_keys'
    [ "$2" != 0 ] || on "$db" -c 'VACUUM (ANALYZE) sekali.finished_keys'
}

# seconds COMMAND...: the wall time of COMMAND, whatever its exit status.
seconds() {
    local t0
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || true
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'
}

# purge_retention_ms DB FN: the retention the purge beside a run uses: the
# store's (720 h), or shorter where fewer than purge_rows keys are left
# past it (each run deletes up to purge_rows of the loaded store's 10 %
# expired, and a few series use them up): the age of the key that many
# from the oldest, so that the purge deletes as much as it did.
purge_retention_ms() {
    local table=finished_keys finished='' age
    # By the expiry index: of the old layout's keys table, the finished ones.
    [[ $2 == *finished* ]] ||
        table=idempotency_keys finished="AND status IN ('completed', 'failed', 'cancelled')"
    age=$(on "$1" -c "SELECT floor(extract(epoch FROM now() - updated_at) * 1000)::bigint
                        FROM sekali.$table WHERE queue = '$queue' $finished
                       ORDER BY updated_at OFFSET $purge_rows LIMIT 1")
    if [ -n "$age" ] && [ "$age" -lt "$retention_ms" ]; then echo "$age"; else echo "$retention_ms"; fi
}

# purge_loop DB BUSY: the janitor's statement, batch after batch on one
# session as the janitor calls it (each batch its own transaction, then a
# rest that keeps it busy BUSY percent of the time, as janitor.c's drain();
# where the archive's purge takes a mark (sql/041), each batch goes on from
# the last, as the janitor's do), until
# none is left, purge_rows keys are gone or purge_seconds have passed;
# prints "rows seconds".
purge_loop() {
    local busy=$2 fn call ms
    fn=$(purge_fn "$1")
    ms=$(purge_retention_ms "$1" "$fn")
    case $fn in
        *_after) call="SELECT deleted, last_updated_at INTO got, mark FROM $fn('$queue', $ms, 1000, mark)" ;;
        *) call="got := $fn('$queue', $ms, 1000)" ;;
    esac
    on "$1" -c "DO \$\$
        DECLARE total bigint := 0; got bigint; mark timestamptz; t0 timestamptz := clock_timestamp();
                batch_t0 timestamptz;
        BEGIN
            LOOP
                batch_t0 := clock_timestamp();
                $call;
                total := total + got;
                COMMIT;
                EXIT WHEN got < 1000 OR total >= $purge_rows
                       OR clock_timestamp() > t0 + interval '$purge_seconds s';
                PERFORM pg_sleep(extract(epoch FROM clock_timestamp() - batch_t0)
                                 * (100 - $busy) / $busy);
            END LOOP;
            RAISE WARNING 'purged % %', total, extract(epoch FROM clock_timestamp() - t0);
        END \$\$" 2>&1 | sed -n 's/.*purged \([0-9]*\) \([0-9.]*\).*/\1 \2/p'
}

# run V N PURGE [JOBS]: one throughput run of JOBS jobs (BENCH_JOBS),
# beside a purge at busy percent PURGE unless it is 0, or with the janitor
# moving keys if it is "archive"; prints "jobs/s pg_ms_per_job [purged
# purge_s]".
run() {
    local v=$1 n=$2 purge=$3 jobs=${4:-$jobs} db c result ppid=''
    db=$(db_of "$v" "$n") c=$(conf "$db")
    if [ "$purge" = archive ]; then
        c=$(conf "$db" archiving) purge=0
    fi
    settle "$v" "$n"
    on "$db" -c 'TRUNCATE sekali_bench.jobs' -c CHECKPOINT
    quiesce "${names[$v]} N=$n" >&2
    live_queue=$queue
    "$out/bench_amqp" "$SEKALI_AMQP_URL" bulk "$queue" "$jobs" >/dev/null
    if [ "$purge" != 0 ]; then
        purge_loop "$db" "$purge" >"$work/scale.purge" &
        ppid=$!
    fi
    server_cpu >"$work/scale.cpu0"
    result=$work/scale.result
    "$out/bench_sekalid" "$(bin_of "$v")/sekalid" "$c" "$work/scale-$db.log" \
        "$SEKALI_PG_CONNINFO dbname=$db" "$queue" "$jobs" "$timeout" >"$result" ||
        die "${names[$v]} N=$n (see $work/scale-$db.log)"
    server_cpu >"$work/scale.cpu1"
    [ -z "$ppid" ] || wait "$ppid"
    "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
    live_queue=''
    checked "$v" "$n" "$db" "$jobs"
    local pg
    pg=$(awk -v n="$jobs" 'FNR == NR { b[$1] = $2; next } $1 == "postgres_ms" { printf "%.3f", ($2 - b[$1]) / n }' \
        "$work/scale.cpu0" "$work/scale.cpu1")
    echo "$(field jobs_per_s "$result") $pg $([ -z "$ppid" ] || cat "$work/scale.purge")"
}

# checked V N DB: every job of the last run had its effect once and its key
# completed; then its keys are deleted, so that N stays N.
checked() {
    local effects distinct done_keys status="k.status"
    [ "$(archived "$3")" != t ] || status="coalesce(k.status, sekali.key_status(j.queue, j.key))"
    read -r effects distinct done_keys <<<"$(on "$3" -F ' ' -c "
        SELECT count(*), count(DISTINCT j.key), count(*) FILTER (WHERE $status = 'completed')
          FROM sekali_bench.jobs j LEFT JOIN sekali.idempotency_keys k
            ON k.queue = j.queue AND k.key = j.key")"
    [ "$effects" = "$4" ] && [ "$distinct" = "$4" ] && [ "$done_keys" = "$4" ] ||
        die "${names[$1]} N=$2: $effects effects, $distinct keys, $done_keys completed for $4 jobs"
    on "$3" -c "DELETE FROM sekali.idempotency_keys k USING sekali_bench.jobs j
                  WHERE k.queue = j.queue AND k.key = j.key"
    [ "$(archived "$3")" != t ] ||
        on "$3" -c "DELETE FROM sekali.finished_keys f USING sekali_bench.jobs j
                      WHERE f.queue = j.queue AND f.key_id = sekali.key_id(j.key)"
}

# latency_run V N: jobs at lat_rate for lat_seconds and one more; prints
# "p50_ms p99_ms" of publish -> effect, the first second left out.
latency_run() {
    local v=$1 n=$2 db c count driver
    db=$(db_of "$v" "$n") c=$(conf "$db") count=$((lat_rate * (lat_seconds + 1)))
    settle "$v" "$n"
    on "$db" -c 'TRUNCATE sekali_bench.jobs' -c CHECKPOINT
    quiesce "${names[$v]} N=$n latency" >&2
    live_queue=$queue
    "$out/bench_sekalid" "$(bin_of "$v")/sekalid" "$c" "$work/scale-$db-lat.log" \
        "$SEKALI_PG_CONNINFO dbname=$db" "$queue" "$count" "$((lat_seconds + timeout))" \
        >"$work/scale.lat" &
    driver=$!
    "$out/bench_amqp" "$SEKALI_AMQP_URL" rate "$queue" "$count" "$lat_rate" "$workers" \
        >"$work/scale.publish" 2>&1 || die "latency publisher (see $work/scale.publish)"
    wait "$driver" || die "${names[$v]} N=$n latency run (see $work/scale-$db-lat.log)"
    "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
    live_queue=''
    on "$db" -F ' ' -c "
        SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
               round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)
          FROM (SELECT published_us - min(published_us) OVER () AS since_us,
                       (extract(epoch FROM committed) * 1e6 - published_us) / 1e3 AS ms
                  FROM sekali_bench.jobs) l
         WHERE since_us >= 1000000"
    checked "$v" "$n" "$db" "$count"
}

# reads V N: "empty_purge_s status_s verify_s trace_s dlq_list_s dlq_groups_s"
reads() {
    local v=$1 n=$2 db c bin key
    db=$(db_of "$v" "$n") c=$(conf "$db") bin=$(bin_of "$v")
    key=$(on "$db" -c "SELECT key FROM sekali.idempotency_keys WHERE queue = '$queue' LIMIT 1")
    local fn empty_purge
    fn=$(purge_fn "$db")
    case $fn in
        # From no mark, as the janitor's first batch after a start or an hour.
        *_after) empty_purge="SELECT * FROM $fn('$queue', $((retention_ms * 4)), 1000, NULL)" ;;
        *) empty_purge="SELECT $fn('$queue', $((retention_ms * 4)), 1000)" ;;
    esac
    echo "$(seconds on "$db" -c "$empty_purge") \
$(seconds "$bin/sekalictl" -c "$c" status --json) \
$(seconds "$bin/sekalictl" -c "$c" verify) \
$(seconds "$bin/sekalictl" -c "$c" trace "${key:-absent}") \
$(seconds "$bin/sekalictl" -c "$c" dlq list $queue --limit 100) \
$(seconds "$bin/sekalictl" -c "$c" dlq groups $queue)"
}

# console_pages V N: the console's API pages, each a GET to one running
# `sekalictl serve` (open reads, on loopback), timed by curl; prints the
# seconds of each, in the order of console_paths.
console_paths=(status "trace?queue=$queue&key=KEY" "dlq/list?queue=$queue&limit=100"
               "dlq/groups?queue=$queue" "history?queue=$queue&hours=24"
               "retries?queue=$queue" "scheduled?queue=$queue")
console_pages() {
    local v=$1 n=$2 db c key port=$((SEKALI_AMQP_PORT + 57)) pid path code t i times=''
    db=$(db_of "$v" "$n") c=$work/scale-console.yaml
    key=$(on "$db" -c "SELECT key FROM sekali.idempotency_keys WHERE queue = '$queue' LIMIT 1")
    { cat "$(conf "$db")"; printf 'console:\n  listen: "127.0.0.1:%s"\n  open_reads: true\n' "$port"; } >"$c"
    "$(bin_of "$v")/sekalictl" -c "$c" serve >"$work/scale-console.log" 2>&1 &
    pid=$!
    for i in $(seq 1 100); do
        curl -sf -o /dev/null "http://127.0.0.1:$port/api/status" && break
        kill -0 "$pid" 2>/dev/null || die "sekalictl serve exited (see $work/scale-console.log)"
        sleep 0.1
    done
    [ "$i" -lt 100 ] || die "the console never answered on 127.0.0.1:$port"
    for path in "${console_paths[@]}"; do
        read -r code t <<<"$(curl -s -o "$work/scale-console.page" -w '%{http_code} %{time_total}' \
            "http://127.0.0.1:$port/api/${path/KEY/${key:-absent}}")"
        [ "$code" = 200 ] || die "console /api/$path answered $code: $(head -c 300 "$work/scale-console.page")"
        times+="$t "
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "$times"
}

# cache_state: the memory each round starts from (BENCH_SCALE_CACHE). A
# 20,000-job run touches 20,000 of the 100 M-key primary key's 500,000
# leaves: without this, each round measured how much of the index earlier
# work had left in the kernel's cache, and series of one tree disagreed by
# more than the layouts differ (docs/benchmark.md, session 26).
cache_state() {
    local n v db t0
    local mode=read where="the kernel's cache"
    case $cache in
        asis) return ;;
        cold) sync; echo 3 >/proc/sys/vm/drop_caches; say "$cache: the kernel's cache dropped"; return ;;
        buffers) mode=buffer where="shared buffers ($(server_settings))" ;;
    esac
    for n in "${sizes[@]}"; do
        [ "$n" != 0 ] || continue
        for v in "${!names[@]}"; do
            db=$(db_of "$v" "$n") t0=$(date +%s.%N)
            on "$db" -c 'CREATE EXTENSION IF NOT EXISTS pg_prewarm' -c "
                SELECT pg_prewarm(i.indexrelid, '$mode') FROM pg_index i
                 WHERE i.indisprimary AND i.indrelid IN ('sekali.idempotency_keys'::regclass,
                                                         to_regclass('sekali.finished_keys'))" >/dev/null
            say "$cache: $db's primary keys read into $where in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
        done
    done
}

# The server's full_page_writes for the benchmark, and back to the test
# servers' own (tests/servers.sh) at its end, however it ends.
set_full_page_writes() {
    sql -c "ALTER SYSTEM SET full_page_writes = $1" >/dev/null && sql -c 'SELECT pg_reload_conf()' >/dev/null
}
scale_cleanup() {
    cleanup
    if sql -c 'ALTER SYSTEM RESET full_page_writes' >/dev/null 2>&1; then
        sql -c 'SELECT pg_reload_conf()' >/dev/null 2>&1 || true
    fi
}
trap scale_cleanup EXIT
set_full_page_writes "$full_page_writes"

for n in "${sizes[@]}"; do
    for v in "${!names[@]}"; do store "$v" "$n"; done
done
declare -A rate cpu prate purged purge_s reads_of pages_of p50 p99 arate
for round in $(seq 1 "$runs"); do
    cache_state
    for n in "${sizes[@]}"; do
        for v in "${!names[@]}"; do
            if [ "$reads_only" = 1 ]; then
                last=$(reads "$v" "$n") pages=$(console_pages "$v" "$n")
                reads_of[$v,$n]+="$last;" pages_of[$v,$n]+="$pages;"
                say "round $round ${names[$v]} N=$n: empty purge batch, status, verify, trace, dlq list, dlq groups: $last s; console ${console_paths[*]}: $pages s"
                continue
            fi
            # The run alone and one beside each purge; each goes first in
            # turn, since the first run on a store that sat finds its pages
            # out of cache (at 100 M a round's first ran at half the rate
            # of the next), and that must not fall on one of them only.
            # A round's first run on a store came out slower than its
            # others, whichever mode it was (at N = 0 and at 100 M, 0.5-0.8x
            # in session 27's first warm series): one of a quarter of the
            # jobs goes first and is not counted.
            run "$v" "$n" 0 $((jobs / 4 > 0 ? jobs / 4 : 1)) >/dev/null
            modes=(0)
            [ "$(archived "$(db_of "$v" "$n")")" != t ] || modes+=(archive)
            [ "$n" = 0 ] || modes+=("${busy_list[@]}")
            k=$(((round - 1) % ${#modes[@]}))
            line="round $round ${names[$v]} N=$n:"
            for m in "${modes[@]:k}" "${modes[@]:0:k}"; do
                if [ "$m" = 0 ]; then
                    read -r r c <<<"$(run "$v" "$n" 0)"
                    rate[$v,$n]+="$r " cpu[$v,$n]+="$c "
                    line+=" $r jobs/s, PostgreSQL $c ms/job;"
                elif [ "$m" = archive ]; then
                    read -r r c <<<"$(run "$v" "$n" archive)"
                    arate[$v,$n]+="$r "
                    line+=" moving keys (archive_after 1s): $r jobs/s;"
                else
                    read -r r c p s <<<"$(run "$v" "$n" "$m")"
                    prate[$v,$n,$m]+="$r " purged[$v,$n,$m]+="$p " purge_s[$v,$n,$m]+="$s "
                    line+=" purging at $m %: $r jobs/s, $p keys purged in $s s;"
                fi
            done
            read -r a b <<<"$(latency_run "$v" "$n")"
            p50[$v,$n]+="$a " p99[$v,$n]+="$b "
            line+=" at $lat_rate jobs/s p50 $a ms, p99 $b ms"
            last=$(reads "$v" "$n") pages=$(console_pages "$v" "$n")
            reads_of[$v,$n]+="$last;" pages_of[$v,$n]+="$pages;"
            say "$line; empty purge batch, status, verify, trace, dlq list, dlq groups: $last s; console ${console_paths[*]}: $pages s"
        done
    done
done

# ratio A B: the median over the rounds of A[i] / B[i] (space-separated lists).
ratio() {
    # shellcheck disable=SC2046  # one value per word
    median $(awk -v a="$1" -v b="$2" 'BEGIN {
        n = split(a, x, " "); split(b, y, " ")
        for (i = 1; i <= n; i++) printf "%.4f\n", (y[i] > 0 ? x[i] / y[i] : 0) }')
}

# column K of the ';'-separated reads: its median.
read_median() {
    # shellcheck disable=SC2046  # one value per word
    median $(tr ';' '\n' <<<"$1" | awk -v k="$2" 'NF { print $k }')
}
bytes_per_key() {
    on "$1" -c "SELECT CASE WHEN sum(c.reltuples) > 0
                  THEN round(sum(pg_total_relation_size(c.oid)) / sum(c.reltuples)) ELSE 0 END
                  || ' ' || round(sum(pg_relation_size(c.oid)) / greatest(sum(c.reltuples), 1))
             FROM pg_class c WHERE c.oid IN ('sekali.idempotency_keys'::regclass,
                                             to_regclass('sekali.finished_keys'))"
}

if [ "$reads_only" = 1 ]; then
    say "== summary: the operator's reads only, medians of $runs rounds (seconds)"
    rfmt='%-7s %10s %8s %8s %8s %8s %8s %8s %12s\n'
    # shellcheck disable=SC2059
    printf "$rfmt" tree N purge0_s status_s verify_s trace_s dlq_list dlq_grp bytes/key \
        >"$work/scale-summary"
    for n in "${sizes[@]}"; do
        for v in "${!names[@]}"; do
            # shellcheck disable=SC2059
            printf "$rfmt" "${names[$v]}" "$n" "$(read_median "${reads_of[$v,$n]}" 1)" \
                "$(read_median "${reads_of[$v,$n]}" 2)" "$(read_median "${reads_of[$v,$n]}" 3)" \
                "$(read_median "${reads_of[$v,$n]}" 4)" "$(read_median "${reads_of[$v,$n]}" 5)" \
                "$(read_median "${reads_of[$v,$n]}" 6)" \
                "$(bytes_per_key "$(db_of "$v" "$n")" | tr ' ' /)" >>"$work/scale-summary"
        done
    done
else
    say "== summary: $jobs jobs a run, W=$workers, cache $cache, $(server_settings), medians of $runs rounds; ratios to N=0 of the same tree in the same round (the purge's columns: busy_percent ${busy_list[0]}; each is below)"
    fmt='%-7s %10s %9s %6s %9s %9s %8s %6s %8s %6s %12s %9s %8s %8s %8s %8s %8s %8s %12s\n'
    # shellcheck disable=SC2059  # one format for the header and the rows
    printf "$fmt" tree N jobs/s x_N0 pg_ms/job x_N0 p50_ms x_N0 p99_ms x_N0 purge_keys/s x_nopurge \
        purge0_s status_s verify_s trace_s dlq_list dlq_grp bytes/key >"$work/scale-summary"
    for n in "${sizes[@]}"; do
        for v in "${!names[@]}"; do
            # shellcheck disable=SC2086  # lists of numbers
            {
                r=$(median ${rate[$v,$n]}) c=$(median ${cpu[$v,$n]})
                pr=- px=-
                if [ "$n" != 0 ]; then
                    pr=$(ratio "${purged[$v,$n,${busy_list[0]}]}" "${purge_s[$v,$n,${busy_list[0]}]}")
                    px=$(ratio "${prate[$v,$n,${busy_list[0]}]}" "${rate[$v,$n]}")
                fi
                # shellcheck disable=SC2059
                printf "$fmt" "${names[$v]}" "$n" "$r" \
                    "$(ratio "${rate[$v,$n]}" "${rate[$v,0]}")" "$c" "$(ratio "${cpu[$v,$n]}" "${cpu[$v,0]}")" \
                    "$(median ${p50[$v,$n]})" "$(ratio "${p50[$v,$n]}" "${p50[$v,0]}")" \
                    "$(median ${p99[$v,$n]})" "$(ratio "${p99[$v,$n]}" "${p99[$v,0]}")" \
                    "$pr" "$px" "$(read_median "${reads_of[$v,$n]}" 1)" "$(read_median "${reads_of[$v,$n]}" 2)" \
                    "$(read_median "${reads_of[$v,$n]}" 3)" "$(read_median "${reads_of[$v,$n]}" 4)" \
                    "$(read_median "${reads_of[$v,$n]}" 5)" "$(read_median "${reads_of[$v,$n]}" 6)" \
                    "$(bytes_per_key "$(db_of "$v" "$n")" | tr ' ' /)"
            } >>"$work/scale-summary"
        done
    done
    # The janitor moving each key a second after it completed: the
    # workers' jobs/s against the same round's run alone.
    afmt='%-7s %10s %14s %9s\n'
    # shellcheck disable=SC2059
    printf "$afmt" tree N moving_jobs/s x_alone >>"$work/scale-summary"
    for n in "${sizes[@]}"; do
        for v in "${!names[@]}"; do
            [ -n "${arate[$v,$n]:-}" ] || continue
            # shellcheck disable=SC2059,SC2086
            printf "$afmt" "${names[$v]}" "$n" "$(median ${arate[$v,$n]})" \
                "$(ratio "${arate[$v,$n]}" "${rate[$v,$n]}")" >>"$work/scale-summary"
        done
    done
    # The purges, one row per busy percent: keys a second, and the workers'
    # jobs/s beside them against the same round's run alone.
    pfmt='%-7s %10s %6s %12s %9s\n'
    # shellcheck disable=SC2059
    printf "$pfmt" tree N busy% purge_keys/s x_nopurge >>"$work/scale-summary"
    for v in "${!names[@]}"; do
        for b in "${busy_list[@]}"; do
            # shellcheck disable=SC2059
            printf "$pfmt" "${names[$v]}" "$n_big" "$b" \
                "$(ratio "${purged[$v,$n_big,$b]}" "${purge_s[$v,$n_big,$b]}")" \
                "$(ratio "${prate[$v,$n_big,$b]}" "${rate[$v,$n_big]}")" >>"$work/scale-summary"
        done
    done
fi
# The console's pages, each a median of the rounds, in seconds.
printf '%-7s %10s' tree N >>"$work/scale-summary"
printf ' %s' "${console_paths[@]%%\?*}" >>"$work/scale-summary"
echo >>"$work/scale-summary"
for n in "${sizes[@]}"; do
    for v in "${!names[@]}"; do
        printf '%-7s %10s' "${names[$v]}" "$n" >>"$work/scale-summary"
        for i in "${!console_paths[@]}"; do
            printf ' %s' "$(read_median "${pages_of[$v,$n]}" $((i + 1)))" >>"$work/scale-summary"
        done
        echo >>"$work/scale-summary"
    done
done
sed 's/^/bench: /' "$work/scale-summary"
say "bytes/key: the table with its indexes and TOAST / its heap alone, per retained key"
