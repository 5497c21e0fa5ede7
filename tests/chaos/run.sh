#!/usr/bin/env bash
# tests/chaos/run.sh - the chaos soak: sekalid, run as a user runs it, under
# a storm of worker kills and one restart of each server, must still give
# every key exactly one effect.
#
#   tests/chaos/run.sh [BUILD_DIR]     (`make chaos`; CHAOS_SHORT=1 in `make check`)
#
# Needs the servers of tests/servers.sh (started, same SEKALI_* settings) and
# a built tree (`make tests`: sekalid, the test handler, chaos_producer).
# A separate producer process (chaos_producer.c) publishes the stream up
# front: every key once, ~30 % of them twice, shuffled. The production
# sekalid consumes it with a YAML config written here (4 workers, lock.ttl
# 2000ms, max_crashes default) and the test handler tests/plugins/effect.c,
# each job a "sleep:MS" body: sleep, then insert one row per execution into
# sekali_test.effects, which has no unique constraint on the key, so a
# double shows as two rows. The same stream runs twice:
#   1. calm: no faults, the baseline throughput (same machine, same minute);
#   2. storm: a random worker SIGKILLed every 100-200 ms from start to end.
#      Once 40 % of the keys are done (the window before is the kill storm
#      alone, whose throughput is compared with the calm run's over its
#      first 40 %), in sequence: a worker caught holding a job's lock is
#      SIGSTOPped for lock.ttl + 1 s then SIGCONTed, Redis is restarted,
#      RabbitMQ is restarted, PostgreSQL is stopped in immediate mode
#      (SIGQUIT to the postmaster, as pg_ctl -m immediate) and started.
# With CHAOS_LATENCY=PG_MS:REDIS_MS[:AMQP_MS], sekalid reaches PostgreSQL
# and Redis (and, given AMQP_MS, RabbitMQ) through
# tests/bench/delay_proxy.c (0 ms in the calm run and outside the window),
# and after the stop, a fifth fault in the sequence holds every byte to
# PostgreSQL PG_MS, to Redis REDIS_MS and to RabbitMQ AMQP_MS each way for
# CHAOS_LATENCY_SECONDS (the proxy's SIGUSR1, then SIGUSR2), plus up to
# CHAOS_JITTER ms more on each delayed link (bytes stay in order).
# Every fault is verified: a killed pid is gone or a zombie within 2 s, the
# stopped one was in state T past lock.ttl and its lock expired meanwhile, a
# restarted server has a new pid (PostgreSQL: a new
# pg_postmaster_start_time()), a round trip through the proxy (redis-cli
# PING, psql's \timing of SELECT 1, RabbitMQ's answer to the AMQP protocol
# header) takes at least twice the injected delay in the latency window
# and less after it. The faults are listed in
# faults.log.
#
# With CHAOS_CONCURRENCY=N the queue gets `concurrency: N` and every key one
# of CHAOS_RESOURCES resource keys; each job (effect.c's "span:MS") records
# when its handler ran, and the soak counts the most jobs of one resource
# that ran at once: at most N in the calm run, and in the storm run outside
# what the faults allow (the stopped worker runs on past its permit; a Redis
# restart forgets every permit: rows within lock.ttl of it are left out).
#
# Prints ONE line on stdout (progress and diagnosis go to stderr):
#   chaos: keys=K published=N effects=E doubled=D lost=L ... faults: kills=...
#          restarts=... throughput: fault-free=R/s storm=R/s ratio=X ...
# doubled: keys with more than one effect; lost: keys without one once the
# storm run ended; ratio: the kill storm's throughput over the calm run's.
# A run ends when every key has its effect (end=done), or, after 15 s
# without progress once the faults are over, when RabbitMQ holds no message
# of the queue or its delay queues any more, ready or unacked (end=drained:
# nothing more can come), or at CHAOS_TIMEOUT (end=timeout: the throughput
# floor); the keys then without an effect are lost.
# Exits 1 on any doubled or lost key, or a fault that did not happen or
# cannot be verified. The ratio itself is reported, and fails the run only
# below CHAOS_MIN_RATIO (default 0: report only; the target is >= 0.5).
#
# Settings (environment; defaults in brackets, the short run's in braces):
#   CHAOS_SHORT        1: the short soak of `make check` [0]
#   CHAOS_KEYS         distinct keys published [20000] {2000}
#   CHAOS_DUP_PERCENT  % of keys published a second time [30]
#   CHAOS_JOB_MS       each job's handler time [10]
#   CHAOS_WORKERS      sekalid workers [4]
#   CHAOS_BATCH        queues[].batch: jobs per transaction; default: no
#                      key, sekali's own (16 within the window) [default]
#   CHAOS_LOCK_TTL     lock.ttl in ms [2000]
#   CHAOS_RATE_LIMIT   queues[].rate_limit, e.g. 100000/s (a limit the soak
#                      never reaches: its check and its Redis outages only);
#                      default: none
#   CHAOS_CONCURRENCY  queues[].concurrency: jobs of one resource at once;
#                      default: none (no resource keys, the key is the lock)
#   CHAOS_RESOURCES    resource keys shared by the keys, with
#                      CHAOS_CONCURRENCY [1: the limit bites all along]
#   CHAOS_LANES        queues[].lanes: every job published to the queue is
#                      forwarded to its tenant's lane (2 x LANES tenants in
#                      x-tenant) before it runs; default: none
#   CHAOS_ARCHIVE      janitor.archive_after, e.g. 1s: a janitor every 200 ms
#                      moves completed keys to sekali.finished_keys all
#                      along (sql/040), so that duplicates meet archived
#                      keys; default: none (no janitor)
#   CHAOS_LATENCY      PG_MS:REDIS_MS[:AMQP_MS] injected each way in the
#                      storm run, e.g. 150:900 or 150:900:150; default: none
#                      (no proxy; without AMQP_MS the broker is reached
#                      directly)
#   CHAOS_JITTER       up to this many ms more on each delayed link, in the
#                      latency window only, in order [0]
#   CHAOS_LATENCY_SECONDS  how long the latency window lasts [12]
#   CHAOS_KILL_MIN_MS, CHAOS_KILL_MAX_MS   pause between kills [100, 200]
#   CHAOS_TIMEOUT      seconds each run may take [600] {45}
#   CHAOS_FAULTS       the faults to inject, for diagnosis: some of
#                      kill stop redis rabbitmq postgres latency [all of
#                      them; latency only with CHAOS_LATENCY]
#   CHAOS_LOG_LEVEL    sekalid's log level [warn] (info logs every job)
#   CHAOS_MIN_RATIO    fail if the storm/calm throughput ratio is below [0]
#   CHAOS_SEED         the producer's duplicates and shuffle [random, printed]
# Files, kept for diagnosis: $SEKALI_SCRATCH/chaos/ (calm.sekalid.log and
# storm.sekalid.log at log level warn, faults.log, servers.log, and with
# CHAOS_LATENCY proxy.out and proxy.log).

# The whole script is one compound command, read before it runs: editing
# the file while a soak runs cannot change what the running soak does.
{
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
short=${CHAOS_SHORT:-0}
workers=${CHAOS_WORKERS:-4}
batch=${CHAOS_BATCH:-default}
rate_limit=${CHAOS_RATE_LIMIT:-}
[ -z "$rate_limit" ] || [[ $rate_limit =~ ^[0-9]+/[0-9a-z]+$ ]] ||
    { echo "chaos: CHAOS_RATE_LIMIT must be a rate such as 100000/s, got '$rate_limit'" >&2; exit 2; }
keys=${CHAOS_KEYS:-$([ "$short" = 1 ] && echo 2000 || echo 20000)}
dup_percent=${CHAOS_DUP_PERCENT:-30}
job_ms=${CHAOS_JOB_MS:-10}
lock_ttl=${CHAOS_LOCK_TTL:-2000}
kill_min=${CHAOS_KILL_MIN_MS:-100}
kill_max=${CHAOS_KILL_MAX_MS:-200}
latency=${CHAOS_LATENCY:-}
latency_s=${CHAOS_LATENCY_SECONDS:-12}
jitter=${CHAOS_JITTER:-0}
[ -z "$latency" ] || { [[ $latency =~ ^[0-9]+:[0-9]+(:[0-9]+)?$ ]] && [[ ! $latency =~ ^0:0(:0)?$ ]]; } ||
    { echo "chaos: CHAOS_LATENCY must be PG_MS:REDIS_MS[:AMQP_MS] such as 150:900:150, got '$latency'" >&2
      exit 2; }
# lat_amqp empty: the broker is reached directly, as before the third field.
IFS=: read -r lat_pg lat_redis lat_amqp <<<"$latency"
[ "$jitter" = 0 ] || [ -n "$latency" ] ||
    { echo "chaos: CHAOS_JITTER needs CHAOS_LATENCY" >&2; exit 2; }
concurrency=${CHAOS_CONCURRENCY:-}
resources=${CHAOS_RESOURCES:-$([ -n "$concurrency" ] && echo 1 || echo 0)}
[ -z "$concurrency" ] || [[ $concurrency =~ ^[1-9][0-9]*$ ]] ||
    { echo "chaos: CHAOS_CONCURRENCY must be a positive whole number, got '$concurrency'" >&2; exit 2; }
lanes=${CHAOS_LANES:-}
archive=${CHAOS_ARCHIVE:-}
[ -z "$archive" ] || [[ $archive =~ ^[0-9]+(ms|s|m|h)$ ]] ||
    { echo "chaos: CHAOS_ARCHIVE must be a duration such as 1s, got '$archive'" >&2; exit 2; }
[ -z "$lanes" ] || [[ $lanes =~ ^[0-9]+$ ]] ||
    { echo "chaos: CHAOS_LANES must be a whole number (2..32), got '$lanes'" >&2; exit 2; }
fault_kinds=" ${CHAOS_FAULTS:-kill stop redis rabbitmq postgres${latency:+ latency}} "
log_level=${CHAOS_LOG_LEVEL:-warn}
for f in $fault_kinds; do
    case $f in kill|stop|redis|rabbitmq|postgres|latency) ;; *)
        echo "chaos: CHAOS_FAULTS: unknown fault '$f' (kill stop redis rabbitmq postgres latency)" >&2; exit 2 ;;
    esac
done
[[ $fault_kinds != *" latency "* ]] || [ -n "$latency" ] ||
    { echo "chaos: CHAOS_FAULTS: latency needs CHAOS_LATENCY" >&2; exit 2; }
case $log_level in debug|info|warn|error) ;; *) echo "chaos: CHAOS_LOG_LEVEL: debug, info, warn or error" >&2; exit 2 ;; esac
timeout=${CHAOS_TIMEOUT:-$([ "$short" = 1 ] && echo 45 || echo 600)}
min_ratio=${CHAOS_MIN_RATIO:-0}
seed=${CHAOS_SEED:-$((RANDOM * 32768 + RANDOM))}
[ "$batch" = default ] || [[ $batch =~ ^[1-9][0-9]*$ ]] ||
    { echo "chaos: CHAOS_BATCH must be default or a positive whole number, got '$batch'" >&2; exit 2; }
for v in workers keys dup_percent job_ms lock_ttl kill_min kill_max timeout seed latency_s resources jitter; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "chaos: $v must be a whole number, got '${!v}'" >&2; exit 2; }
done
(( kill_min > 0 && kill_max >= kill_min && keys >= 10 && workers > 0 &&
   dup_percent <= 100 )) ||
    { echo "chaos: need 0 < CHAOS_KILL_MIN_MS <= CHAOS_KILL_MAX_MS, CHAOS_KEYS >= 10," \
           "CHAOS_WORKERS > 0, CHAOS_DUP_PERCENT <= 100" >&2; exit 2; }
[[ $min_ratio =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "chaos: CHAOS_MIN_RATIO must be a number" >&2; exit 2; }
window_pct=40   # the kill storm runs alone until this share of the keys is done

# The bench's set-up and helpers (sql, schema, quiesce, its queue tool
# bench_amqp and its EXIT clean-up); its messages are ours, on stderr, so
# that stdout holds only the result line.
# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
say() { printf 'chaos: %s\n' "$*" >&2; }
die() { printf 'chaos: FAILED: %s\n' "$*" >&2; exit 1; }

producer=$build/chaos/chaos_producer
handler=$(cd "$build" 2>/dev/null && pwd)/tests/plugins/effect.so   # the config needs it absolute
[ -x "$producer" ] && [ -f "$handler" ] || die "no $producer or $handler: make tests"
proxy=$build/tests/delay_proxy
[ -z "$latency" ] || [ -x "$proxy" ] || die "no $proxy: make tests"
work=$SEKALI_SCRATCH/chaos
rm -rf "$work"
mkdir -p "$work"
faults=$work/faults.log     # one line per fault, written by the background drivers
: >"$faults"

now_ms() { local t=${EPOCHREALTIME/./}; printf '%s' $((t / 1000)); }

# ---------------------------------------------------------------------------
# Processes: sekalid, its workers, and whether a pid really died.
# ---------------------------------------------------------------------------
sekalid='' storm_pid='' driver_pid='' stopped_file=$work/stopped proxy_pid='' proxy_pg='' proxy_redis=''
proxy_amqp=''

# The supervisor's children: with no outbox relay and no janitor, its
# workers (the kernel's list, so a worker being restarted is not in it).
workers_of() { cat "/proc/$1/task/$1/children" 2>/dev/null || true; }

# state PID: the one-letter state of PID, or "" if it is gone.
state() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    printf '%s' "${stat%% *}"
}

# dead PID: true once PID is gone or a zombie (killed, not yet reaped).
dead() { local s; s=$(state "$1"); [ -z "$s" ] || [ "$s" = Z ] || [ "$s" = X ]; }
stopped() { [ "$(state "$1")" = T ]; }
# start_time PID: when PID started (clock ticks since boot), "" if gone;
# gone PID START: PID is dead, or the pid now names a newer process.
start_time() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null || true; }
gone() { dead "$1" || [ "$(start_time "$1")" != "$2" ]; }
resumed() { local s; s=$(state "$1"); [ -n "$s" ] && [ "$s" != T ]; }

# nap MS: sleep MS milliseconds.
nap() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }

# since: ms since the storm run started, stamped on each fault line so that
# a fault that came after the last effect can be told apart.
since() { printf '@%s' $(( $(now_ms) - run_t0 )); }

# wait_until MS COMMAND...: polls COMMAND every 10 ms for at most MS.
wait_until() {
    local deadline=$(( $(now_ms) + $1 )); shift
    until "$@"; do
        (( $(now_ms) < deadline )) || return 1
        sleep 0.01
    done
}

# With CHAOS_LATENCY: one delay proxy for the whole soak, in front of
# PostgreSQL and Redis (and RabbitMQ, given a third delay), at 0 ms until
# the latency fault switches it. -v: it names each connection's ports,
# which lock_taker needs to find a worker behind it. The jitter is the
# switched state's only (a 7th field), so the calm run has none.
proxy_start() {
    local ready maps=()
    maps+=("0:127.0.0.1:$SEKALI_PG_PORT:0:0:$lat_pg:$(link_jitter "$lat_pg")")
    maps+=("0:127.0.0.1:$SEKALI_REDIS_PORT:0:0:$lat_redis:$(link_jitter "$lat_redis")")
    [ -z "$lat_amqp" ] || maps+=("0:127.0.0.1:$SEKALI_AMQP_PORT:0:0:$lat_amqp:$(link_jitter "$lat_amqp")")
    "$proxy" -v "${maps[@]}" >"$work/proxy.out" 2>"$work/proxy.log" &
    proxy_pid=$!
    wait_until 5000 test -s "$work/proxy.out" || die "delay_proxy did not start (see $work/proxy.log)"
    read -r ready proxy_pg proxy_redis proxy_amqp <"$work/proxy.out" && [ "$ready" = ready ] ||
        die "delay_proxy did not start (see $work/proxy.log)"
    [ -z "$lat_amqp" ] || [ -n "$proxy_amqp" ] || die "delay_proxy gave no AMQP port (see $work/proxy.log)"
}

# link_jitter MS: the jitter of a link delayed MS in the window (none on a
# link left at 0 ms, so that its round trip still says it was not slowed).
link_jitter() { if (( $1 > 0 )); then printf '%s' "$jitter"; else printf 0; fi; }

# far_amqp_url: sekalid's AMQP URL, through the proxy if it has the broker.
far_amqp_url() {
    local u=$SEKALI_AMQP_URL
    [ -z "$proxy_amqp" ] || u=${u/:$SEKALI_AMQP_PORT\//:$proxy_amqp/}
    [ -z "$proxy_amqp" ] || [[ $u == *":$proxy_amqp/"* ]] || die "cannot point '$u' at the proxy"
    printf '%s' "$u"
}

# far_conninfo: sekalid's PostgreSQL conninfo, through the proxy if there is one.
far_conninfo() {
    local c=$SEKALI_PG_CONNINFO
    [ -z "$proxy_pg" ] || c=${c/port=$SEKALI_PG_PORT /port=$proxy_pg }
    [ -z "$proxy_pg" ] || [[ $c == *"port=$proxy_pg "* ]] || die "cannot point '$c' at the proxy"
    printf '%s' "$c"
}

# The test servers run PostgreSQL with synchronous_commit off (speed), with
# which an immediate shutdown loses the last commits that were already
# reported done. sekalid raises its own sessions to `on` (src/adapters/store.c), so
# the soak runs against that server as it is: a job acked and then lost in
# the PostgreSQL restart would show as lost here.
write_conf() {
    cat >"$work/$1.yaml" <<YAML
amqp:
  url: "$(far_amqp_url)"
redis:
  host: 127.0.0.1
  port: ${proxy_redis:-$SEKALI_REDIS_PORT}
postgres:
  conninfo: "$(far_conninfo)"
lock:
  ttl: ${lock_ttl}ms
log:
  level: $log_level
  format: json
shutdown_timeout: 10s
outbox:
  relays: 0
janitor:
$(if [ -n "$archive" ]; then printf '  interval: 200ms\n  archive_after: %s' "$archive"
  else printf '  interval: 0s'; fi)
queues:
  - name: $1
    handler: $handler
    workers: $workers
YAML
    [ "$batch" = default ] || printf '    batch: %s\n' "$batch" >>"$work/$1.yaml"
    [ -z "$rate_limit" ] || printf '    rate_limit: %s\n' "$rate_limit" >>"$work/$1.yaml"
    [ -z "$concurrency" ] || printf '    concurrency: %s\n' "$concurrency" >>"$work/$1.yaml"
    [ -z "$lanes" ] || printf '    lanes: %s\n' "$lanes" >>"$work/$1.yaml"
    printf '%s' "$work/$1.yaml"
}

# stop_sekalid: SIGTERM and a bounded wait for a clean exit.
stop_sekalid() {
    [ -n "$sekalid" ] || return 0
    kill -TERM "$sekalid" 2>/dev/null || true
    local i
    for i in $(seq 1 300); do
        kill -0 "$sekalid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$sekalid" 2>/dev/null; then
        say "sekalid $sekalid did not stop within 30 s of SIGTERM; killing it and its workers"
        local left
        left=$(workers_of "$sekalid")
        kill -KILL "$sekalid" 2>/dev/null || true
        # shellcheck disable=SC2086  # a list of pids
        [ -z "$left" ] || kill -KILL $left 2>/dev/null || true
    fi
    wait "$sekalid" 2>/dev/null || true
    sekalid=''
}

# On any exit: the fault drivers stop, a stopped worker resumes, sekalid
# stops, the queue in use is deleted (lib.sh's cleanup); and if a server
# restart was cut short, the servers are brought back up.
chaos_cleanup() {
    for p in "$storm_pid" "$driver_pid"; do
        [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
    done
    [ -n "$storm_pid" ] && wait "$storm_pid" 2>/dev/null
    [ -n "$driver_pid" ] && wait "$driver_pid" 2>/dev/null
    [ -s "$stopped_file" ] && kill -CONT "$(<"$stopped_file")" 2>/dev/null
    stop_sekalid
    if [ -n "$proxy_pid" ]; then kill -TERM "$proxy_pid" 2>/dev/null; wait "$proxy_pid" 2>/dev/null; fi
    # Whatever happened (an interruption, a restart that failed), the suites
    # after the soak need every server up: start starts only what is down.
    tests/servers.sh start >>"$work/servers.log" 2>&1 || say "tests/servers.sh start failed: see $work/servers.log"
    cleanup
}
trap chaos_cleanup EXIT
trap 'exit 130' INT TERM   # so that the EXIT clean-up runs then too

# ---------------------------------------------------------------------------
# Faults. Each writes one line to $faults: "KIND detail", or "unverified
# KIND detail" when it cannot prove the fault happened.
# ---------------------------------------------------------------------------

# The kill storm: until TERMed, a random worker (not the stopped one) gets
# SIGKILL every kill_min..kill_max ms; a round that finds no live worker
# (all of them being restarted) is a miss.
storm() {
    trap 'exit 0' TERM
    local pids victim stopped start
    while :; do
        stopped=''
        [ -s "$stopped_file" ] && stopped=$(<"$stopped_file")
        read -r -a pids <<<"$(workers_of "$sekalid")"
        local live=()
        for p in "${pids[@]}"; do [ "$p" = "$stopped" ] || live+=("$p"); done
        if [ ${#live[@]} -eq 0 ]; then
            echo "miss" >>"$faults"
        else
            victim=${live[RANDOM % ${#live[@]}]}
            start=$(start_time "$victim")
            # The stopped worker may have been chosen just before its pid
            # was written down: a worker in state T is left alone; one
            # that is gone before the signal was not our kill.
            if stopped "$victim" || [ -z "$start" ] || ! kill -KILL "$victim" 2>/dev/null; then
                echo "miss" >>"$faults"
            elif wait_until 2000 gone "$victim" "$start"; then
                echo "kill $victim" >>"$faults"
            else
                echo "unverified kill $victim (still $(state "$victim") 2 s after SIGKILL)" >>"$faults"
            fi
        fi
        nap $(( kill_min + RANDOM % (kill_max - kill_min + 1) ))
    done
}

# locks: the locks of $queue that Redis holds now, as "key token" lines, in
# one script: a snapshot at one instant, and one process. (A redis-cli per
# key took seconds on a loaded machine, longer than lock.ttl, so the
# stopped worker's locks expired between two snapshots and were never seen
# held.) With `concurrency` above 1 a key is a semaphore, a sorted set of
# its holders' tokens scored with their expiry on Redis's clock (lock.c):
# its holders are the tokens not yet past it.
sem_now="local tm = redis.call('TIME') local now = tm[1] * 1000 + math.floor(tm[2] / 1000)"
locks() {
    redis-cli -h 127.0.0.1 -p "$SEKALI_REDIS_PORT" eval \
        "$sem_now local r = {} for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
             if redis.call('TYPE', k).ok == 'zset' then
                 for _, t in ipairs(redis.call('ZRANGEBYSCORE', k, '(' .. now, '+inf')) do
                     r[#r + 1] = k .. ' ' .. t end
             else
                 local t = redis.call('GET', k) if t then r[#r + 1] = k .. ' ' .. t end
             end
         end return r" 0 "sekali:lock:$queue:*" 2>/dev/null || true
}

# still_held KEY TOKEN: 1 if TOKEN still holds the lock or a permit of KEY.
still_held() {
    redis-cli -h 127.0.0.1 -p "$SEKALI_REDIS_PORT" eval \
        "$sem_now if redis.call('TYPE', KEYS[1]).ok == 'zset' then
             local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
             if s and tonumber(s) > now then return 1 end return 0 end
         if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end return 0" 1 "$1" "$2" 2>/dev/null
}

# A worker SIGSTOPped while it holds a job's lock, for lock.ttl + 1 s, then
# SIGCONTed. The stop waits for its event rather than guessing: Redis's
# MONITOR shows a worker's connection taking a lock (the client's port and
# the token, whose first half is its process's: lock.c), the port names the
# worker, and that worker is stopped. Its lock is then known by its token,
# so neither a worker still connecting (the kill storm keeps most of them
# starting on a loaded machine) nor a live worker's slow batch is taken for
# the stopped one. Tried until it is caught or the run is over.
stop_worker() {
    local attempt=0
    asked_ms=$(now_ms)
    while run_going; do
        attempt=$((attempt + 1))
        stop_worker_once && return 0
    done
    echo "unverified stop: the run ended first ($attempt stops tried, none caught a held lock)" >>"$faults"
}

# Whether the storm run still has keys to do (one_run writes the count).
run_going() { (( $(cat "$work/progress" 2>/dev/null || echo 0) < keys )); }

# lock_taker: "PID PREFIX" of a worker of sekalid seen taking a lock of
# $queue within 5 s, or nothing: a SET NX of a lock key (or, with
# `concurrency` above 1, the ZADD that admits a holder to its semaphore),
# sent by the client (sk_lock_acquire) or by its script (sk_lock_swap_many), whose commands
# follow its EVALSHA in MONITOR's output as "lua" lines. A SET carries a
# token of the taker's own (a release may carry a dead worker's).
lock_taker() {
    local seen port pid
    seen=$(timeout 5 redis-cli -h 127.0.0.1 -p "$SEKALI_REDIS_PORT" monitor 2>/dev/null |
        awk -v q="\"sekali:lock:$queue:" '
            $3 != "lua]" { port = $3; if (!sub(/^127\.0\.0\.1:/, "", port) || !sub(/\]$/, "", port)) port = "" }
            toupper($4) == "\"SET\"" && index($5, q) == 1 && toupper($7) == "\"NX\"" && port != "" {
                t = $6; gsub(/"/, "", t); print port, substr(t, 1, 16); exit }
            toupper($4) == "\"ZADD\"" && index($5, q) == 1 && toupper($6) != "\"XX\"" && port != "" {
                t = $7; gsub(/"/, "", t); print port, substr(t, 1, 16); exit }') || true
    [ -n "$seen" ] || return 0
    port=${seen%% *}
    local dport=$SEKALI_REDIS_PORT
    if [ -n "$proxy_redis" ]; then
        # Redis sees the proxy's port: the proxy says whose connection it is.
        port=$(awk -v l="$proxy_redis" -v u="$port" '$1 == "conn" && $2 == l && $4 == u { c = $3 }
                                                     END { print c }' "$work/proxy.out")
        dport=$proxy_redis
        [ -n "$port" ] || return 0
    fi
    pid=$(ss -Htnp state established "( sport = :$port and dport = :$dport )" 2>/dev/null |
          grep -o 'pid=[0-9]*' | head -n 1) || true
    pid=${pid#pid=}
    [ -n "$pid" ] && [[ " $(workers_of "$sekalid") " == *" $pid "* ]] && printf '%s %s' "$pid" "${seen#* }"
    return 0
}

# One stop; false when the lock it caught did not expire (then another is tried).
stop_worker_once() {
    local try=0 victim='' prefix taker held='' t0 stopped_ms
    while [ -z "$held" ] && run_going; do
        try=$((try + 1))
        taker=$(lock_taker)
        [ -n "$taker" ] || continue
        victim=${taker%% *} prefix=${taker#* }
        echo "$victim" >"$stopped_file"
        kill -STOP "$victim" 2>/dev/null || { : >"$stopped_file"; continue; }
        t0=$(now_ms)
        wait_until 1000 stopped "$victim" || { kill -CONT "$victim" 2>/dev/null; : >"$stopped_file"; continue; }
        # Stopped: its locks are the ones with its token, held as they were.
        held=$(locks | awk -v p="$prefix" 'NF == 2 && substr($2, 1, 16) == p' | head -n 1) || true
        [ -n "$held" ] && break
        say "stop $victim: it held no lock once stopped (between jobs); trying again"
        kill -CONT "$victim" 2>/dev/null; : >"$stopped_file"
    done
    if [ -z "$held" ]; then
        echo "unverified stop: no worker caught holding a lock in $try tries before the run ended" >>"$faults"
        return 0
    fi
    local rest=$(( lock_ttl + 1000 - ($(now_ms) - t0) ))
    (( rest <= 0 )) || nap "$rest"
    local still held_on key=${held%% *} token=${held#* }
    still=$(state "$victim")
    held_on=$(still_held "$key" "$token")
    stopped_ms=$(( $(now_ms) - t0 ))
    kill -CONT "$victim" 2>/dev/null || true
    : >"$stopped_file"
    if [ "$still" != T ]; then
        echo "unverified stop $victim: state '$still' after ${stopped_ms} ms, not T" >>"$faults"
    elif [ "$held_on" = 1 ]; then
        say "stop $victim: lock $key still held by its token after ${stopped_ms} ms; stopping another"
        return 1
    elif ! wait_until 2000 resumed "$victim"; then
        echo "unverified stop $victim: still stopped after SIGCONT" >>"$faults"
    else
        echo "stop $victim ${stopped_ms}ms lock $key expired, caught on try $try" \
             "$(( t0 - asked_ms ))ms after asked $(since)" >>"$faults"
    fi
}

pid_file() { tr -dc '0-9' <"$1" 2>/dev/null || true; }

restart_redis() {
    local before after began
    began=$(since)
    before=$(pid_file "$SEKALI_SCRATCH/redis/redis.pid")
    tests/servers.sh restart-redis >>"$work/servers.log" 2>&1 || true
    after=$(pid_file "$SEKALI_SCRATCH/redis/redis.pid")
    if [ -n "$before" ] && [ -n "$after" ] && [ "$before" != "$after" ] && dead "$before" && ! dead "$after"; then
        echo "restart redis pid $before->$after from $began $(since)" >>"$faults"
    else
        echo "unverified restart redis (pid '$before' -> '$after')" >>"$faults"
    fi
}

restart_rabbitmq() {
    local before after
    before=$(pid_file "$SEKALI_SCRATCH/rabbitmq/rabbit.pid")
    tests/servers.sh restart-rabbitmq >>"$work/servers.log" 2>&1 || true
    after=$(pid_file "$SEKALI_SCRATCH/rabbitmq/rabbit.pid")
    if [ -n "$before" ] && [ -n "$after" ] && [ "$before" != "$after" ] && dead "$before" && ! dead "$after"; then
        echo "restart rabbitmq pid $before->$after $(since)" >>"$faults"
    else
        echo "unverified restart rabbitmq (pid '$before' -> '$after')" >>"$faults"
    fi
}

# Immediate mode: SIGQUIT to the postmaster, which ends every backend at
# once without a checkpoint (pg_ctl stop -m immediate sends the same); the
# next start recovers from the WAL.
restart_postgres() {
    local data before after pm started=''
    data=$(sql -c 'SHOW data_directory' 2>/dev/null || true)
    before=$(sql -c 'SELECT pg_postmaster_start_time()' 2>/dev/null || true)
    pm=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
    if [ -n "$pm" ] && kill -QUIT "$pm" 2>/dev/null && wait_until 30000 dead "$pm"; then
        tests/servers.sh start-postgres >>"$work/servers.log" 2>&1 || true
        after=$(sql -c 'SELECT pg_postmaster_start_time()' 2>/dev/null || true)
        [ -n "$after" ] && [ "$after" != "$before" ] && started=yes
    fi
    if [ -n "$started" ]; then
        echo "restart postgres pid $pm immediate, started '$after' $(since)" >>"$faults"
    else
        echo "unverified restart postgres (postmaster '$pm', start time '$before' -> '${after:-}')" >>"$faults"
        tests/servers.sh start-postgres >>"$work/servers.log" 2>&1 || true
    fi
}

# round_trip_pg, round_trip_redis, round_trip_amqp: one round trip through
# the proxy, in ms (psql's \timing of SELECT 1, after connecting;
# redis-cli's whole PING, a process start included; the AMQP 0-9-1
# protocol header sent on a new connection until the first byte of
# RabbitMQ's connection.start, a method frame, comes back: the cheapest
# answer the broker gives, and the proxy holds both ways of it), or 999999
# if it failed.
round_trip_pg() {
    local t
    t=$(timeout 30 psql -X -q -At "$(far_conninfo)" -c '\timing on' -c 'SELECT 1' 2>/dev/null |
        awk '/^Time:/ { printf "%d", $2 }') || true
    printf '%s' "${t:-999999}"
}
round_trip_redis() {
    local t0
    t0=$(now_ms)
    if timeout 30 redis-cli -h 127.0.0.1 -p "$proxy_redis" ping 2>/dev/null | grep -q PONG; then
        printf '%s' $(( $(now_ms) - t0 ))
    else
        printf '999999'
    fi
}
round_trip_amqp() {
    local t0
    [ -n "$proxy_amqp" ] || { printf 0; return 0; }
    t0=$(now_ms)
    # shellcheck disable=SC2016 # $1 is the inner shell's
    if timeout 30 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "AMQP\x00\x00\x09\x01" >&3 &&
                           [ "$(head -c 1 <&3 | od -An -tu1 | tr -d " ")" = 1 ]' _ "$proxy_amqp" 2>/dev/null; then
        printf '%s' $(( $(now_ms) - t0 ))
    else
        printf '999999'
    fi
}

# slow_enough MS PG_RT REDIS_RT AMQP_RT: every round trip at least twice
# the delay each way that was injected (a link given 0 ms, or none, is not
# looked at). Jitter only adds, so it changes neither bound.
slow_enough() {
    { (( lat_pg == 0 )) || (( $2 >= 2 * lat_pg )); } && { (( lat_redis == 0 )) || (( $3 >= 2 * lat_redis )); } &&
        { (( ${lat_amqp:-0} == 0 )) || (( $4 >= 2 * lat_amqp )); }
}
fast_again() {
    { (( lat_pg == 0 )) || (( $2 < 2 * lat_pg )); } && { (( lat_redis == 0 )) || (( $3 < 2 * lat_redis )); } &&
        { (( ${lat_amqp:-0} == 0 )) || (( $4 < 2 * lat_amqp )); }
}

# The latency window: the proxy holds every byte read from now on lat_pg ms
# (PostgreSQL), lat_redis ms (Redis) and lat_amqp ms (RabbitMQ, if it is
# behind the proxy) each way, plus up to the jitter, for latency_s seconds.
# Verified by a round trip through the proxy to each, once inside the
# window (at least the injected round trip) and after it (less, tried a
# few times: the machine is loaded).
inject_latency() {
    local t0 in_pg in_redis in_amqp out_pg=999999 out_redis=999999 out_amqp=999999 rest _
    t0=$(now_ms)
    kill -USR1 "$proxy_pid" || { echo "unverified latency: no proxy to switch" >>"$faults"; return 0; }
    in_pg=$(round_trip_pg) in_redis=$(round_trip_redis) in_amqp=$(round_trip_amqp)
    rest=$(( latency_s * 1000 - ($(now_ms) - t0) ))
    (( rest <= 0 )) || nap "$rest"
    kill -USR2 "$proxy_pid"
    local window=$(( $(now_ms) - t0 ))
    for _ in 1 2 3 4 5; do
        out_pg=$(round_trip_pg) out_redis=$(round_trip_redis) out_amqp=$(round_trip_amqp)
        fast_again 0 "$out_pg" "$out_redis" "$out_amqp" && break
    done
    local what="latency pg ${lat_pg}ms redis ${lat_redis}ms"
    [ -z "$lat_amqp" ] || what+=" amqp ${lat_amqp}ms"
    what+=" jitter ${jitter}ms for ${window}ms: round trip pg ${in_pg}->${out_pg}ms redis ${in_redis}->${out_redis}ms"
    [ -z "$lat_amqp" ] || what+=" amqp ${in_amqp}->${out_amqp}ms"
    if ! slow_enough 0 "$in_pg" "$in_redis" "$in_amqp"; then
        echo "unverified $what (not slow inside the window)" >>"$faults"
    elif ! fast_again 0 "$out_pg" "$out_redis" "$out_amqp"; then
        echo "unverified $what (still slow after it)" >>"$faults"
    else
        echo "$what $(since)" >>"$faults"
    fi
}

# The sequence: each fault once the storm run has done its share of the
# keys (or, if it stalls, once its share of CHAOS_TIMEOUT has passed), each
# after the one before has finished. $work/sequence marks the end of the
# window in which the kill storm runs alone.
fault_sequence() {
    trap 'exit 0' TERM
    local t0=$1 step pct n
    for step in "$window_pct stop_worker stop" "45 inject_latency latency" "50 restart_redis redis" \
                "55 restart_rabbitmq rabbitmq" "60 restart_postgres postgres"; do
        [[ $fault_kinds == *" ${step##* } "* ]] || continue
        pct=${step%% *}
        while :; do
            n=$(cat "$work/progress" 2>/dev/null || echo 0)
            (( n * 100 >= keys * pct )) && break
            (( $(now_ms) - t0 >= timeout * 10 * pct / 2 )) && break
            sleep 0.05
        done
        [ -e "$work/sequence" ] || printf '%s %s\n' $(( $(now_ms) - t0 )) "$n" >"$work/sequence"
        step=${step#* }
        ${step% *}
    done
}

# ---------------------------------------------------------------------------
# One run: publish the whole stream, start sekalid, wait until every key has
# its effect, then until the copies are consumed; stop sekalid. Sets run_ms
# (sekalid's start to the last key's effect), done (1 if every key has its
# effect), window_ms and window_keys (how far the kill storm alone got; in
# the calm run, the time to window_pct of the keys).
# ---------------------------------------------------------------------------
run_ms=0 done=0 run_t0=0 published=0 window_ms=0 window_keys=0 drained=0

# in_flight: messages of $queue and its delay queues (not its dead letters),
# ready or delivered and not yet acked, as the broker counts them.
in_flight() {
    "$SEKALI_RABBITMQCTL" -q list_queues name messages 2>/dev/null |
        awk -v q="$queue" '$1 == q || index($1, q ".delay.") == 1 { n += $2; seen = 1 }
                           END { if (!seen) exit 1; print n + 0 }'
}

count_keys() {
    sql -c "SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects WHERE queue = '$queue'"
}
one_run() {
    local kind=$1 conf log t0 n=0 last_n=-1 elapsed last_say=0 last_change=0
    queue=chaos-$kind-$seed
    live_queue=$queue
    conf=$(write_conf "$queue")
    log=$work/$kind.sekalid.log
    rm -f "$work/progress" "$work/sequence"
    BENCH_LANES=${lanes:-0} "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue" >/dev/null 2>&1 || true
    sql -c "DELETE FROM sekali_test.effects WHERE queue = '$queue';
            DELETE FROM sekali.idempotency_keys WHERE queue = '$queue';
            DELETE FROM sekali.finished_keys WHERE queue = '$queue'"
    local body=sleep:$job_ms extra=()
    (( resources == 0 )) || { body=span:$job_ms extra=("resources:$resources"); }
    [ -z "$lanes" ] || extra+=("tenants:$((2 * lanes))")
    published=$("$producer" "$SEKALI_AMQP_URL" "$queue" "$keys" "$dup_percent" "$seed" "$body" \
                "${extra[@]}") ||
        die "$kind: the producer failed"
    say "$kind: $published ($workers workers, batch $batch)"
    published=${published#published=}; published=${published%% *}

    quiesce "the $kind run"
    "$build/sekalid" -c "$conf" 2>>"$log" &
    sekalid=$!
    t0=$(now_ms) run_t0=$t0 window_ms=0 window_keys=0 done=0 drained=0
    if [ "$kind" = storm ]; then
        if [[ $fault_kinds == *" kill "* ]]; then storm & storm_pid=$!; fi
        fault_sequence "$t0" & driver_pid=$!
    fi

    while :; do
        elapsed=$(( $(now_ms) - t0 ))
        (( elapsed < timeout * 1000 )) || break
        kill -0 "$sekalid" 2>/dev/null || die "$kind: sekalid exited (log: $log)"
        # PostgreSQL may be restarting: a failed count is skipped.
        n=$(count_keys 2>/dev/null) || n=$last_n
        echo "$n" >"$work/progress"
        if [ "$kind" = calm ] && (( window_ms == 0 && n * 100 >= keys * window_pct )); then
            window_ms=$elapsed window_keys=$n
        fi
        if [ "$kind" = storm ] && [ ! -e "$work/sequence" ] && (( n >= 0 )); then
            window_ms=$elapsed window_keys=$n
        fi
        if (( n >= keys )); then done=1; break; fi
        # No progress for 15 s with the fault sequence over: if the broker
        # holds nothing for this queue any more, nothing is coming.
        [ "$n" = "$last_n" ] || last_change=$elapsed
        if (( elapsed - last_change >= 15000 )) && { [ "$kind" = calm ] || [ -z "$driver_pid" ] ||
                                                  ! kill -0 "$driver_pid" 2>/dev/null; }; then
            if [ "$(in_flight || echo unknown)" = 0 ]; then
                drained=1
                say "$kind: DRAINED: the queue is empty, but only $n of $keys keys have an effect;" \
                    "the others are lost (log: $log)"
                break
            fi
            last_change=$elapsed   # look again in 15 s
        fi
        if (( elapsed - last_say >= 10000 )); then
            say "$kind: $n of $keys keys done after $((elapsed / 1000)) s"
            last_say=$elapsed
        fi
        last_n=$n
        sleep 0.2
    done
    run_ms=$(( $(now_ms) - t0 ))
    if [ "$kind" = storm ]; then
        kill -TERM "$storm_pid" 2>/dev/null || true; wait "$storm_pid" 2>/dev/null || true; storm_pid=''
        # A run that ended before its last restart still gets it (reported
        # as late): the line must always say what each fault did.
        say "storm: waiting for the fault sequence to finish"
        echo "$keys" >"$work/progress"
        wait "$driver_pid" 2>/dev/null || true; driver_pid=''
    fi
    if [ "$done" = 0 ] && [ "$drained" = 0 ]; then
        say "$kind: TIMEOUT: only $n of $keys keys had an effect after $timeout s" \
            "(CHAOS_TIMEOUT); the others count as lost (log: $log)"
    else
        # The copies left are duplicates, acked without running: let them
        # go (bounded), so that what remains in the queue is a real leftover.
        # Unacked ones count too: a copy a worker still holds goes back to
        # the queue when sekalid stops, and would be reported as left.
        local held='' until_ms=$(( $(now_ms) + 30000 ))
        while (( $(now_ms) < until_ms )); do
            held=$(in_flight || echo unknown)
            [ "$held" = 0 ] && break
            sleep 0.2
        done
        [ "$held" = 0 ] || say "$kind: $held message(s) still in the queue or held unacked" \
                                "30 s after the last effect"
    fi
    stop_sekalid
}

# doubled_keys: keys of $queue with more than one effect.
doubled_keys() {
    sql -c "SELECT count(*) FROM (SELECT 1 FROM sekali_test.effects WHERE queue = '$queue'
                                   GROUP BY idempotency_key HAVING count(*) > 1) d"
}

# at_once [EXCLUDE]: the most jobs of one resource of $queue whose handlers
# ran at the same time (effect.c's "span:MS" rows), leaving out the rows
# EXCLUDE (an SQL condition) names.
at_once() {
    sql <<SQL
WITH runs AS (SELECT * FROM sekali_test.effects
              WHERE queue = '$queue' AND started_us IS NOT NULL AND NOT (${1:-false}))
SELECT coalesce(max(n), 0) FROM (
    SELECT sum(d) OVER (PARTITION BY resource ORDER BY t, d) AS n FROM (
        SELECT resource, started_us AS t, 1 AS d FROM runs
        UNION ALL SELECT resource, ended_us, -1 FROM runs) e) r;
SQL
}

seconds() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }
rate() { awk -v k="$1" -v ms="$2" 'BEGIN { printf "%.1f", (ms > 0) ? k * 1000 / ms : 0 }'; }

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
[ -z "$latency" ] || proxy_start
conf=$(write_conf chaos-check)
schema "$conf"
sql -f tests/data/effects.sql
settings="$workers workers, lock.ttl ${lock_ttl}ms${rate_limit:+, rate_limit $rate_limit}${lanes:+, $lanes lanes}${archive:+, archive_after $archive}"
(( resources == 0 )) || settings+=", concurrency ${concurrency:-1} over $resources resource key(s)"
[ -z "$latency" ] || settings+=", ${lat_pg}ms to PostgreSQL, ${lat_redis}ms to Redis${lat_amqp:+, ${lat_amqp}ms to RabbitMQ}"
[ -z "$latency" ] || settings+=" (jitter ${jitter}ms) for ${latency_s} s"
say "seed $seed: $keys keys, $dup_percent% published twice, ${job_ms}ms jobs, $settings"

one_run calm
[ "$done" = 1 ] || die "the fault-free run ended with keys missing (log: $work/calm.sekalid.log)"
calm_ms=$run_ms calm_window_ms=$window_ms calm_window_keys=$window_keys
calm_doubled=$(doubled_keys)
calm_at_once=0
(( resources == 0 )) || calm_at_once=$(at_once)
BENCH_LANES=${lanes:-0} "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue" >/dev/null 2>&1 || true
say "calm: $keys keys in $(seconds "$calm_ms") s, doubled $calm_doubled"

one_run storm
storm_ms=$run_ms
ending=timeout
[ "$drained" = 0 ] || ending=drained
[ "$done" = 0 ] || ending='done'
read -r effects distinct < <(sql -F ' ' -c "
    SELECT count(*), count(DISTINCT idempotency_key) FROM sekali_test.effects WHERE queue = '$queue'")
doubled=$(doubled_keys)
lost=$((keys - distinct))
failed_keys=$(sql -c "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '$queue' AND status = 'failed'")
# With lanes, what they still hold counts as left (BENCH_LANES: bench_amqp).
depth=$(BENCH_LANES=${lanes:-0} "$out/bench_amqp" "$SEKALI_AMQP_URL" depth "$queue" 2>/dev/null ||
        echo "ready=? dead=?")
dead_letters=${depth#*dead=}; dead_letters=${dead_letters%% *}
left=${depth#ready=}; left=${left%% *}

kills=$(grep -c '^kill ' "$faults" || true)
misses=$(grep -c '^miss' "$faults" || true)
stops=$(grep -c '^stop ' "$faults" || true)
r_redis=$(grep -c '^restart redis' "$faults" || true)
r_rabbit=$(grep -c '^restart rabbitmq' "$faults" || true)
r_pg=$(grep -c '^restart postgres' "$faults" || true)
unverified=$(grep -c '^unverified' "$faults" || true)
# Stops and restarts that came after the last key's effect hit an idle queue.
late=$(awk -v end="$storm_ms" '/^(stop|restart|latency) / { t = $NF; sub(/^@/, "", t); if (t + 0 > end) n++ }
                               END { print n + 0 }' "$faults")
crash_loops=$(grep -c 'crash-looping' "$work/storm.sekalid.log" || true)
# With CHAOS_ARCHIVE: the keys the janitor moved and that are still
# archived, and the archived keys a duplicate brought back (counted by
# effects.sql's trigger, since the janitor archives them again).
archived=0 adopted=0
if [ -n "$archive" ]; then
    archived=$(sql -c "SELECT count(*) FROM sekali.finished_keys WHERE queue = '$queue'")
    adopted=$(sql -c "SELECT coalesce(sum(n), 0) FROM sekali_test.finished_key_deletes
                      WHERE queue = '$queue'")
fi
latencies=$(grep -c '^latency ' "$faults" || true)

# The storm's jobs of one resource at once, leaving out what the faults
# allow: the stopped worker's (it ran on past its permit's expiry) and those
# that ran between a Redis restart's start and lock.ttl after its end
# (Redis keeps no data across a restart here: every permit was forgotten
# while their holders still ran, as docs/rate-limits.md says of a failover).
storm_at_once=0 storm_at_once_all=0
if (( resources > 0 )); then
    exclude=false
    for p in $(awk '/^stop / { print $2 }' "$faults"); do exclude+=" OR pid = $p"; done
    while read -r from to; do
        exclude+=" OR (ended_us >= $(( (run_t0 + from) * 1000 )) AND"
        exclude+=" started_us <= $(( (run_t0 + to + lock_ttl) * 1000 )))"
    done < <(awk '/^restart redis .* from @/ { f = $(NF - 1); t = $NF; sub(/^@/, "", f); sub(/^@/, "", t)
                                               print f, t }' "$faults")
    storm_at_once=$(at_once "$exclude")
    storm_at_once_all=$(at_once)
fi

calm_rate=$(rate "$calm_window_keys" "$calm_window_ms")
storm_rate=$(rate "$window_keys" "$window_ms")
ratio=$(awk -v a="$storm_rate" -v b="$calm_rate" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')

printf 'chaos: keys=%s published=%s effects=%s doubled=%s lost=%s failed=%s dead=%s left=%s' \
    "$keys" "$published" "$effects" "$doubled" "$lost" "$failed_keys" "$dead_letters" "$left"
printf ' faults: kills=%s misses=%s stops=%s restarts=redis:%s,rabbitmq:%s,postgres:%s' \
    "$kills" "$misses" "$stops" "$r_redis" "$r_rabbit" "$r_pg"
[ -z "$latency" ] || printf ' latency=%s@%sms jitter=%sms' "$latencies" "$latency" "$jitter"
printf ' late=%s unverified=%s' "$late" "$unverified"
[ -z "$archive" ] || printf ' archive: after=%s archived=%s adopted=%s' "$archive" "$archived" "$adopted"
(( resources == 0 )) ||
    printf ' at-once: limit=%s resources=%s calm=%s storm=%s storm-all=%s' "${concurrency:-1}" \
        "$resources" "$calm_at_once" "$storm_at_once" "$storm_at_once_all"
printf ' crash-loop-logs=%s throughput: fault-free=%s/s storm=%s/s ratio=%s whole=%s/s' \
    "$crash_loops" "$calm_rate" "$storm_rate" "$ratio" "$(rate "$distinct" "$storm_ms")"
printf ' seconds: calm=%s storm=%s end=%s seed=%s\n' "$(seconds "$calm_ms")" "$(seconds "$storm_ms")" \
    "$ending" "$seed"

status=0
[ "$calm_doubled" -eq 0 ] || { say "the fault-free run doubled $calm_doubled keys"; status=1; }
[ "$doubled" -eq 0 ] || { say "$doubled keys have more than one effect"; status=1; }
[ "$lost" -eq 0 ] || { say "$lost keys have no effect (failed $failed_keys, dead letters $dead_letters)"; status=1; }
if [ "$unverified" -gt 0 ]; then
    say "faults that could not be verified:"; grep '^unverified' "$faults" | sed 's/^/chaos:   /' >&2
    status=1
fi
[ -z "$archive" ] || (( archived > 0 && adopted > 0 )) ||
    { say "CHAOS_ARCHIVE: no key was archived ($archived) or none met by a duplicate ($adopted)"; status=1; }
# want KIND COUNT: COUNT is right for KIND (once if chosen, else none).
want() { if [[ $fault_kinds == *" $1 "* ]]; then [ "$2" -eq 1 ]; else [ "$2" -eq 0 ]; fi; }
if (( resources > 0 )); then
    limit=${concurrency:-1}
    (( calm_at_once <= limit && storm_at_once <= limit )) ||
        { say "more than $limit jobs of one resource ran at once (calm $calm_at_once, storm $storm_at_once)"; status=1; }
    (( calm_at_once == limit )) ||
        say "note: the calm run never had $limit jobs of one resource at once: the limit did not bite"
fi
if ! want stop "$stops" || ! want redis "$r_redis" || ! want rabbitmq "$r_rabbit" || ! want postgres "$r_pg" ||
   ! want latency "$latencies" ||
   ! { [[ $fault_kinds != *" kill "* ]] || [ "$kills" -gt 0 ]; }; then
    say "not every fault happened (see $faults)"; status=1
fi
[ "$late" -eq 0 ] || say "note: $late of the stop and restarts came after the last effect"
if awk -v r="$ratio" -v m="$min_ratio" 'BEGIN { exit !(r < m) }'; then
    say "throughput ratio $ratio is below CHAOS_MIN_RATIO=$min_ratio"; status=1
fi
[ "$status" = 0 ] || say "logs: $work"
exit "$status"
}
