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
# Every fault is verified: a killed pid is gone or a zombie within 2 s, the
# stopped one was in state T past lock.ttl and its lock expired meanwhile, a
# restarted server has a new pid (PostgreSQL: a new
# pg_postmaster_start_time()). The faults are listed in faults.log.
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
#   CHAOS_KILL_MIN_MS, CHAOS_KILL_MAX_MS   pause between kills [100, 200]
#   CHAOS_TIMEOUT      seconds each run may take [600] {45}
#   CHAOS_FAULTS       the faults to inject, for diagnosis: some of
#                      kill stop redis rabbitmq postgres [all of them]
#   CHAOS_LOG_LEVEL    sekalid's log level [warn] (info logs every job)
#   CHAOS_MIN_RATIO    fail if the storm/calm throughput ratio is below [0]
#   CHAOS_SEED         the producer's duplicates and shuffle [random, printed]
# Files, kept for diagnosis: $SEKALI_SCRATCH/chaos/ (calm.sekalid.log and
# storm.sekalid.log at log level warn, faults.log, servers.log).

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
fault_kinds=" ${CHAOS_FAULTS:-kill stop redis rabbitmq postgres} "
log_level=${CHAOS_LOG_LEVEL:-warn}
for f in $fault_kinds; do
    case $f in kill|stop|redis|rabbitmq|postgres) ;; *)
        echo "chaos: CHAOS_FAULTS: unknown fault '$f' (kill stop redis rabbitmq postgres)" >&2; exit 2 ;;
    esac
done
case $log_level in debug|info|warn|error) ;; *) echo "chaos: CHAOS_LOG_LEVEL: debug, info, warn or error" >&2; exit 2 ;; esac
timeout=${CHAOS_TIMEOUT:-$([ "$short" = 1 ] && echo 45 || echo 600)}
min_ratio=${CHAOS_MIN_RATIO:-0}
seed=${CHAOS_SEED:-$((RANDOM * 32768 + RANDOM))}
[ "$batch" = default ] || [[ $batch =~ ^[1-9][0-9]*$ ]] ||
    { echo "chaos: CHAOS_BATCH must be default or a positive whole number, got '$batch'" >&2; exit 2; }
for v in workers keys dup_percent job_ms lock_ttl kill_min kill_max timeout seed; do
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
work=$SEKALI_SCRATCH/chaos
rm -rf "$work"
mkdir -p "$work"
faults=$work/faults.log     # one line per fault, written by the background drivers
: >"$faults"

now_ms() { local t=${EPOCHREALTIME/./}; printf '%s' $((t / 1000)); }

# ---------------------------------------------------------------------------
# Processes: sekalid, its workers, and whether a pid really died.
# ---------------------------------------------------------------------------
sekalid='' storm_pid='' driver_pid='' stopped_file=$work/stopped

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

# The test servers run PostgreSQL with synchronous_commit off (speed), with
# which an immediate shutdown loses the last commits that were already
# reported done. sekalid raises its own sessions to `on` (src/adapters/store.c), so
# the soak runs against that server as it is: a job acked and then lost in
# the PostgreSQL restart would show as lost here.
write_conf() {
    cat >"$work/$1.yaml" <<YAML
amqp:
  url: "$SEKALI_AMQP_URL"
redis:
  host: 127.0.0.1
  port: $SEKALI_REDIS_PORT
postgres:
  conninfo: "$SEKALI_PG_CONNINFO"
lock:
  ttl: ${lock_ttl}ms
log:
  level: $log_level
  format: json
shutdown_timeout: 10s
outbox:
  relays: 0
janitor:
  interval: 0s
queues:
  - name: $1
    handler: $handler
    workers: $workers
YAML
    [ "$batch" = default ] || printf '    batch: %s\n' "$batch" >>"$work/$1.yaml"
    [ -z "$rate_limit" ] || printf '    rate_limit: %s\n' "$rate_limit" >>"$work/$1.yaml"
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
# held.)
locks() {
    redis-cli -h 127.0.0.1 -p "$SEKALI_REDIS_PORT" eval \
        "local r = {} for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
             local t = redis.call('GET', k) if t then r[#r + 1] = k .. ' ' .. t end
         end return r" 0 "sekali:lock:$queue:*" 2>/dev/null || true
}

# A worker SIGSTOPped while it holds a job's lock, for lock.ttl + 1 s, then
# SIGCONTed. A held lock is one that has the same token half a second
# apart and was not taken by a worker that took another lock meanwhile
# (the token's first half is its process's: lock.c), so a live worker's
# slow batch, on a loaded machine, is not mistaken for the stopped one.
# Tried until it is caught or the run is over: on a loaded machine the
# tries take longer, and so does the run.
stop_worker() {
    local attempt=0
    # A lock still held after lock.ttl proves only that another worker
    # held it, and the stop is tried again.
    while run_going; do
        attempt=$((attempt + 1))
        stop_worker_once && return 0
    done
    echo "unverified stop: the run ended first ($attempt stops caught only other workers' locks)" >>"$faults"
}

# Whether the storm run still has keys to do (one_run writes the count).
run_going() { (( $(cat "$work/progress" 2>/dev/null || echo 0) < keys )); }

# held_lock BEFORE AFTER: a "key token" line held all along by a process that
# took no new lock in between (the stopped one), if any.
held_lock() {
    local live
    live=$(comm -13 <(sort <<<"$1") <(sort <<<"$2") | awk 'NF == 2 { print substr($2, 1, 16) }')
    comm -12 <(sort <<<"$1") <(sort <<<"$2") |
        awk -v live="$live" 'NF == 2 && index(live, substr($2, 1, 16)) == 0' | head -n 1 || true
}

# One stop; false when the lock it watched was another worker's.
stop_worker_once() {
    local try=0 victim before after held='' t0 stopped_ms
    while [ -z "$held" ] && run_going; do
        try=$((try + 1))
        read -r -a pids <<<"$(workers_of "$sekalid")"
        [ ${#pids[@]} -gt 0 ] || { sleep 0.2; continue; }
        victim=${pids[RANDOM % ${#pids[@]}]}
        echo "$victim" >"$stopped_file"
        kill -STOP "$victim" 2>/dev/null || { : >"$stopped_file"; continue; }
        t0=$(now_ms)
        wait_until 1000 stopped "$victim" || { : >"$stopped_file"; continue; }
        before=$(locks); sleep 0.5; after=$(locks)
        held=$(held_lock "$before" "$after")
        [ -n "$held" ] && break
        kill -CONT "$victim" 2>/dev/null; : >"$stopped_file"
        sleep 0.1
    done
    if [ -z "$held" ]; then
        echo "unverified stop: no worker caught holding a lock in $try tries before the run ended" >>"$faults"
        return 0
    fi
    local rest=$(( lock_ttl + 1000 - ($(now_ms) - t0) ))
    (( rest <= 0 )) || nap "$rest"
    local still expired_lock key=${held%% *} token=${held#* }
    still=$(state "$victim")
    expired_lock=$(redis-cli -h 127.0.0.1 -p "$SEKALI_REDIS_PORT" get "$key" 2>/dev/null)
    stopped_ms=$(( $(now_ms) - t0 ))
    kill -CONT "$victim" 2>/dev/null || true
    : >"$stopped_file"
    if [ "$still" != T ]; then
        echo "unverified stop $victim: state '$still' after ${stopped_ms} ms, not T" >>"$faults"
    elif [ "$expired_lock" = "$token" ]; then
        say "stop $victim: lock $key still held after ${stopped_ms} ms: another worker's, stopping another"
        return 1
    elif ! wait_until 2000 resumed "$victim"; then
        echo "unverified stop $victim: still stopped after SIGCONT" >>"$faults"
    else
        echo "stop $victim ${stopped_ms}ms lock $key expired $(since)" >>"$faults"
    fi
}

pid_file() { tr -dc '0-9' <"$1" 2>/dev/null || true; }

restart_redis() {
    local before after
    before=$(pid_file "$SEKALI_SCRATCH/redis/redis.pid")
    tests/servers.sh restart-redis >>"$work/servers.log" 2>&1 || true
    after=$(pid_file "$SEKALI_SCRATCH/redis/redis.pid")
    if [ -n "$before" ] && [ -n "$after" ] && [ "$before" != "$after" ] && dead "$before" && ! dead "$after"; then
        echo "restart redis pid $before->$after $(since)" >>"$faults"
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

# The sequence: each fault once the storm run has done its share of the
# keys (or, if it stalls, once its share of CHAOS_TIMEOUT has passed), each
# after the one before has finished. $work/sequence marks the end of the
# window in which the kill storm runs alone.
fault_sequence() {
    trap 'exit 0' TERM
    local t0=$1 step pct n
    for step in "$window_pct stop_worker stop" "50 restart_redis redis" "55 restart_rabbitmq rabbitmq" \
                "60 restart_postgres postgres"; do
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
    "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue" >/dev/null 2>&1 || true
    sql -c "DELETE FROM sekali_test.effects WHERE queue = '$queue';
            DELETE FROM sekali.idempotency_keys WHERE queue = '$queue'"
    published=$("$producer" "$SEKALI_AMQP_URL" "$queue" "$keys" "$dup_percent" "$seed" "sleep:$job_ms") ||
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

seconds() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }
rate() { awk -v k="$1" -v ms="$2" 'BEGIN { printf "%.1f", (ms > 0) ? k * 1000 / ms : 0 }'; }

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
conf=$(write_conf chaos-check)
schema "$conf"
sql -f tests/data/effects.sql
say "seed $seed: $keys keys, $dup_percent% published twice, ${job_ms}ms jobs," \
    "$workers workers, lock.ttl ${lock_ttl}ms${rate_limit:+, rate_limit $rate_limit}"

one_run calm
[ "$done" = 1 ] || die "the fault-free run ended with keys missing (log: $work/calm.sekalid.log)"
calm_ms=$run_ms calm_window_ms=$window_ms calm_window_keys=$window_keys
calm_doubled=$(doubled_keys)
"$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue" >/dev/null 2>&1 || true
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
depth=$("$out/bench_amqp" "$SEKALI_AMQP_URL" depth "$queue" 2>/dev/null || echo "ready=? dead=?")
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
late=$(awk -v end="$storm_ms" '/^(stop|restart) / { t = $NF; sub(/^@/, "", t); if (t + 0 > end) n++ }
                               END { print n + 0 }' "$faults")
crash_loops=$(grep -c 'crash-looping' "$work/storm.sekalid.log" || true)

calm_rate=$(rate "$calm_window_keys" "$calm_window_ms")
storm_rate=$(rate "$window_keys" "$window_ms")
ratio=$(awk -v a="$storm_rate" -v b="$calm_rate" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')

printf 'chaos: keys=%s published=%s effects=%s doubled=%s lost=%s failed=%s dead=%s left=%s' \
    "$keys" "$published" "$effects" "$doubled" "$lost" "$failed_keys" "$dead_letters" "$left"
printf ' faults: kills=%s misses=%s stops=%s restarts=redis:%s,rabbitmq:%s,postgres:%s late=%s unverified=%s' \
    "$kills" "$misses" "$stops" "$r_redis" "$r_rabbit" "$r_pg" "$late" "$unverified"
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
# want KIND COUNT: COUNT is right for KIND (once if chosen, else none).
want() { if [[ $fault_kinds == *" $1 "* ]]; then [ "$2" -eq 1 ]; else [ "$2" -eq 0 ]; fi; }
if ! want stop "$stops" || ! want redis "$r_redis" || ! want rabbitmq "$r_rabbit" || ! want postgres "$r_pg" ||
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
