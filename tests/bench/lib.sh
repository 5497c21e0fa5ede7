# tests/bench/lib.sh - what the two halves of `make bench` share: set-up,
# the helpers they build, and the checks and statistics both report with.
#
# Sourced (never run) by tests/bench/run.sh and tests/bench/enqueue.sh,
# from the repository's root, after `set -euo pipefail` and with `build`
# (the build directory) and `workers` (sekalid workers per queue) set.
# Leaves behind: the test servers' settings (SEKALI_*), `pgbench`, `work`
# (the scratch directory for run files), `out` (the built helpers) and an
# EXIT trap that stops a run in progress (see cleanup below).

# shellcheck shell=bash
# shellcheck disable=SC2154  # build and workers: set by the sourcing script

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
    "$cc" "${cflags[@]}" -iquote src/adapters $(pkg-config --cflags librabbitmq) \
        -o "$out/bench_amqp" tests/bench/bench_amqp.c $(pkg-config --libs librabbitmq)
    "$cc" "${cflags[@]}" $(pkg-config --cflags libpq) \
        -o "$out/bench_sekalid" tests/bench/bench_sekalid.c $(pkg-config --libs libpq)
    "$cc" "${cflags[@]}" -o "$out/bench_cpu" tests/bench/bench_cpu.c
    "$cc" "${cflags[@]}" -iquote src/adapters $(pkg-config --cflags librabbitmq hiredis libpq) \
        -o "$out/bench_loop" tests/bench/bench_loop.c $(pkg-config --libs librabbitmq hiredis libpq)
    "$cc" "${cflags[@]}" $(pkg-config --cflags libpq libmicrohttpd gnutls) -pthread \
        -o "$out/bench_http" tests/bench/bench_http.c $(pkg-config --libs libpq libmicrohttpd gnutls)
}

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

# One SQL statement (or a script on stdin), unaligned, tuples only; without
# the NOTICEs of idempotent DDL ("schema already exists, skipping").
quiet_pg='-c client_min_messages=warning'
sql() { PGOPTIONS=$quiet_pg psql -X -q -t -A -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO" "$@"; }

# tls_conf CONF: rewrites CONF's three links to TLS, as docs/tls.md
# configures them, on tests/servers.sh's TLS listeners (SEKALI_TLS=1):
# amqps:// with a client certificate, Redis's tls-port as the ACL user
# sekali_acl, PostgreSQL as sekali_tls with sslmode=verify-full
# (tls_pg_conninfo, which the HTTPS service's INSERTs use too).
tls_pg_conninfo() {
    local d=${SEKALI_TLS_DIR:?BENCH_TLS=1 needs servers started with SEKALI_TLS=1}
    printf 'host=127.0.0.1 port=%s dbname=sekali user=sekali_tls password=sekali sslmode=verify-full sslrootcert=%s' \
        "$SEKALI_PG_PORT" "$d/ca.crt"
}
tls_conf() {
    local d=${SEKALI_TLS_DIR:?BENCH_TLS=1 needs servers started with SEKALI_TLS=1}
    printf 'aclpass\n' >"$work/redis.password"
    sed -i -e "s|^  url: .*|  url: \"amqps://sekali:sekali@127.0.0.1:$SEKALI_AMQP_TLS_PORT/%2f\"\n  tls:\n    ca_file: $d/ca.crt\n    cert_file: $d/client.crt\n    key_file: $d/client.key|" \
        -e "s|^  port: $SEKALI_REDIS_PORT\$|  port: $SEKALI_REDIS_TLS_PORT\n  username: sekali_acl\n  password_file: $work/redis.password\n  tls:\n    ca_file: $d/ca.crt|" \
        -e "s|^  conninfo: .*|  conninfo: \"$(tls_pg_conninfo)\"|" \
        "$1"
}

# write_conf QUEUE [RELAYS]: a sekalid configuration consuming QUEUE with the
# bench handler, and RELAYS outbox relays (none by default). Log level warn:
# at info every job logs a line, and the benchmark would measure the logging.
# The queue's prefetch and batch are written only when bench_prefetch and
# bench_batch are set (BENCH_PREFETCH, BENCH_BATCH): otherwise sekali's
# defaults are what is measured, and a build that does not know `batch`
# yet still runs. Clear text is clear text on every link: libpq's default
# (sslmode=prefer) would take TLS from servers started with SEKALI_TLS=1.
# With bench_tls=1 (one of BENCH_TLS's values) every link
# is TLS (tls_conf).
# bench_handler (one of BENCH_HANDLER's values) picks the handler: c, the
# C bench handler; sql, the same INSERT through the stock SQL handler
# (handlers/sql.c): what a job costs without a line of C; http, the stock
# HTTP handler (handlers/http.c, external mode) POSTing each job to
# tests/bench/bench_http.c, a local keep-alive service that makes the same
# INSERT (start_http_service, below, must have run); with bench_tls=1 over
# https:// to the HTTPS instance, verified against the test CA (ca_file).
bench_prefetch='' bench_batch='' bench_tls=0 bench_handler=c http_port='' https_port=''
handler_yaml() {
    case "$bench_handler" in
        c) printf '    handler: %s\n' "$out/bench_handler.so" ;;
        sql) printf '    handler: %s\n    config:\n      statement: "%s"\n' \
                 "$(cd "$build" && pwd)/handlers/sql.so" \
                 "INSERT INTO sekali_bench.jobs (queue, key, published_us, committed) VALUES (:queue, :idempotency_key, :body::bigint, clock_timestamp())" ;;
        http) printf '    handler: %s\n    mode: external\n    config:\n' "$(cd "$build" && pwd)/handlers/http.so"
              if [ "$bench_tls" = 1 ]; then
                  printf '      url: "https://127.0.0.1:%s/%s"\n      ca_file: %s\n' \
                      "${https_port:?start_http_service 1 first}" "$1" "$SEKALI_TLS_DIR/ca.crt"
              else
                  printf '      url: "http://127.0.0.1:%s/%s"\n' "${http_port:?start_http_service 0 first}" "$1"
              fi ;;
        *) die "BENCH_HANDLER: c, sql or http, not '$bench_handler'" ;;
    esac
}
write_conf() {
    local conf=$work/$1.yaml
    cat >"$conf" <<YAML
amqp:
  url: "$SEKALI_AMQP_URL"
redis:
  host: 127.0.0.1
  port: $SEKALI_REDIS_PORT
postgres:
  conninfo: "$SEKALI_PG_CONNINFO sslmode=disable"
log:
  level: warn
  format: json
shutdown_timeout: 20s
outbox:
  relays: ${2:-0}
queues:
  - name: $1
$(handler_yaml "$1")
    workers: $workers
YAML
    [ "$bench_tls" != 1 ] || tls_conf "$conf"
    [ -z "$bench_prefetch" ] || printf '    prefetch: %s\n' "$bench_prefetch" >>"$conf"
    [ -z "$bench_batch" ] || [ "$bench_batch" = default ] ||
        printf '    batch: %s\n' "$bench_batch" >>"$conf"
    [ -z "$bench_batch" ] || [ -z "${BENCH_BATCH_WAIT:-}" ] ||
        printf '    batch_wait: %s\n' "$BENCH_BATCH_WAIT" >>"$conf"
    printf '%s' "$conf"
}

# server_cpu: "postgres_ms N", "rabbitmq_ms N", "redis_ms N": CPU time so
# far of the test servers' process trees (tests/bench/bench_cpu.c). Their
# pids come from the files tests/servers.sh keeps under SEKALI_SCRATCH.
server_cpu() {
    local pg rmq redis
    pg=$(head -n 1 "$SEKALI_SCRATCH/postgres/data/postmaster.pid" 2>/dev/null || echo 0)
    rmq=$(tr -dc '0-9' <"$SEKALI_SCRATCH/rabbitmq/rabbit.pid" 2>/dev/null || echo 0)
    redis=$(tr -dc '0-9' <"$SEKALI_SCRATCH/redis/redis.pid" 2>/dev/null || echo 0)
    "$out/bench_cpu" "postgres=${pg:-0}" "rabbitmq=${rmq:-0}" "redis=${redis:-0}"
}

# schema CONF: sekali's migrations and the bench tables, and CONF checked by
# sekalid -t (quietly, unless it fails).
schema() {
    PGOPTIONS=$quiet_pg "$build/sekalictl" -c "$1" migrate --sql-dir sql >/dev/null
    sql -f tests/bench/bench.sql
    "$build/sekalid" -t -c "$1" 2>/dev/null || "$build/sekalid" -t -c "$1"
}

# quiesce RUN: the servers and the test suites share this machine with us.
# (quiesce_tries: half-second looks, 20 unless set; quiesce_quiet=1: no note.)
# Waits (at most 10 s) until the CPUs were less than 10% busy for half a
# second, so that a compile or a test suite that is just finishing, or the
# previous run's autovacuum, does not land in this run; if the machine stays
# busy, the run goes ahead and says so, since its figures then include that.
quiesce() {
    local a b total idle busy=0 i try tries=${quiesce_tries:-20}
    for try in $(seq 1 "$tries"); do
        read -r -a a < <(head -n 1 /proc/stat)
        sleep 0.5
        read -r -a b < <(head -n 1 /proc/stat)
        # cpu user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
        total=0
        for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
        idle=$((b[4] - a[4] + b[5] - a[5]))
        busy=$(( total > 0 ? (total - idle) * 100 / total : 0 ))
        (( busy < 10 )) && return 0
        [ "$try" -lt "$tries" ] || break
    done
    [ "${quiesce_quiet:-0}" = 1 ] && return 0
    say "note: the machine was still $busy% busy after $((tries / 2)) s of waiting before $1;" \
        "its figures include that load"
}

# drain_round BINARY CONF QUEUE JOBS LABEL: one closed-loop round, once the
# machine is quiet: JOBS jobs published to QUEUE in bulk, BINARY run on
# CONF until they are done (files $work/QUEUE.*), each checked to have run
# once. The caller reads the rate (steady_rate) and forgets the queue.
drain_round() {
    local binary=$1 conf=$2 queue=$3 jobs=$4 label=$5
    quiesce "$label"
    live_queue=$queue
    "$out/bench_amqp" "$SEKALI_AMQP_URL" bulk "$queue" "$jobs" >"$work/$queue.publish"
    "$out/bench_sekalid" "$binary" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
        "$queue" "$jobs" "$timeout" >"$work/$queue.result" ||
        die "$label (see $work/$queue.log)"
    verify "$queue" "$jobs" amqp
    log_problems "$work/$queue.log"
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

# latency QUEUE: "measured p50 p99 max" of QUEUE's jobs, in ms, from the
# time stamped in each job's body (published_us) to its effect's
# clock_timestamp() (committed). The first second is left out: it is each
# worker's first jobs (PostgreSQL compiling the plpgsql functions, the
# handler preparing its INSERT), and a steady state is what the
# percentiles are about.
latency() {
    sql -F ' ' -c "
        SELECT count(*),
               round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
               round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
               round(max(ms)::numeric, 1)
          FROM (SELECT published_us - min(published_us) OVER () AS since_us,
                       (extract(epoch FROM committed) * 1e6 - published_us) / 1e3 AS ms
                  FROM sekali_bench.jobs WHERE queue = '$1') latencies
         WHERE since_us >= 1000000"
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

# steady_rate QUEUE: jobs/s between the 10th and 90th percentile of the
# effects' commit times (distance.sh, rate.sh).
steady_rate() {
    sql -c "
        WITH t AS (SELECT extract(epoch FROM committed) AS s FROM sekali_bench.jobs WHERE queue = '$1'),
             p AS (SELECT percentile_cont(0.1) WITHIN GROUP (ORDER BY s) AS lo,
                          percentile_cont(0.9) WITHIN GROUP (ORDER BY s) AS hi FROM t)
        SELECT round(((SELECT count(*) FROM t, p WHERE s BETWEEN lo AND hi)
                      / greatest(hi - lo, 0.001))::numeric, 1) FROM p"
}

# forget QUEUE: a finished run's keys and effects, so the next starts alike.
forget() {
    sql -c "DELETE FROM sekali.idempotency_keys WHERE queue = '$1'" \
        -c "DELETE FROM sekali_bench.jobs WHERE queue = '$1'"
}

# field NAME FILE: the value of a "name value" line written by bench_sekalid.
field() { awk -v k="$1" '$1 == k { print $2; exit }' "$2"; }

# median VALUES...: the middle value (the mean of the two middle ones).
median() {
    printf '%s\n' "$@" | sort -g |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# ratios A B: the median of A[i] / B[i], for two space-separated lists of
# numbers of the same length (one per round).
ratios() {
    local -a a b
    read -r -a a <<<"$1"
    read -r -a b <<<"$2"
    local i quotients=()
    for i in "${!a[@]}"; do
        quotients+=("$(awk -v x="${a[$i]}" -v y="${b[$i]:-0}" 'BEGIN { printf "%.4f", (y > 0 ? x / y : 0) }')")
    done
    median "${quotients[@]}"
}

# start_http_service TLS: tests/bench/bench_http.c on a free loopback port,
# stopped at exit. TLS 0: clear text (http_port, http_pid), its INSERTs over
# clear text like the C handler's clear-text rows; TLS 1: HTTPS with the
# test CA's server certificate (https_port, https_pid), its INSERTs over
# TLS like the C handler's TLS rows. Both can run at once, so that the
# variants of a round alternate without a restart, and each instance's CPU
# time is one mode's. http_cpu prints bench_tls's instance's CPU time so
# far, in ms.
start_http_service() {
    local name=http conninfo="$SEKALI_PG_CONNINFO sslmode=disable" pid port i
    local -a tls=()
    if [ "$1" = 1 ]; then
        name=https conninfo=$(tls_pg_conninfo) tls=("$SEKALI_TLS_DIR")
    fi
    rm -f "$work/$name.port"
    "$out/bench_http" "$conninfo" "$work/$name.port" "${tls[@]}" \
        >"$work/$name.out" 2>"$work/$name.log" &
    pid=$!
    for i in $(seq 1 100); do [ -s "$work/$name.port" ] && break; sleep 0.05; done
    port=$(cat "$work/$name.port" 2>/dev/null) || die "bench_http did not start (see $work/$name.log)"
    printf -v "${name}_pid" '%s' "$pid"
    printf -v "${name}_port" '%s' "$port"
}
http_cpu() {
    local pid=$http_pid
    [ "$bench_tls" != 1 ] || pid=$https_pid
    awk '{ printf "%.0f", ($14 + $15) * 1000 / '"$(getconf CLK_TCK)"' }' "/proc/$pid/stat"
}

# stop_http_services: stops the instances and checks from the service's
# side what they served: every request of the HTTPS instance (and none of
# the clear one's) over a TLS session. Prints what each one counted.
stop_http_services() {
    local name pid line requests failed conns tls protocol
    for name in http https; do
        pid=${name}_pid
        [ -n "${!pid}" ] || continue
        kill -TERM "${!pid}"
        wait "${!pid}" || die "bench_http ($name) exited non-zero (see $work/$name.log)"
        printf -v "$pid" '%s' ''
        line=$(cat "$work/$name.out")
        read -r _ requests _ failed _ conns _ tls protocol <<<"$line"
        say "the $name service: $requests requests ($failed failed) on $conns connections," \
            "$tls of them over TLS${protocol:+ ($protocol)}"
        if [ "$name" = https ]; then
            [ "$requests" -gt 0 ] && [ "$tls" = "$requests" ] ||
                die "the HTTPS service: $tls of $requests requests over TLS ($line)"
        else
            [ "$tls" = 0 ] || die "the clear-text service: $tls requests over TLS ($line)"
        fi
    done
}

# If we exit early: stop a latency run's background driver (sekalid
# follows it), and delete the queue in use, which may still hold thousands
# of persistent jobs that nothing will consume. Its rows stay for a look;
# the next invocation drops them.
driver='' live_queue='' http_pid='' https_pid=''
cleanup() {
    [ -z "$driver" ] || kill -TERM "$driver" 2>/dev/null || true
    [ -z "$http_pid" ] || kill -TERM "$http_pid" 2>/dev/null || true
    [ -z "$https_pid" ] || kill -TERM "$https_pid" 2>/dev/null || true
    [ -z "$live_queue" ] || "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$live_queue" 2>/dev/null || true
}
trap cleanup EXIT
