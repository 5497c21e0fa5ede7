#!/usr/bin/env bash
# tests/bench/tls_calls.sh - where TLS costs: sekalid run under strace on
# the same jobs in clear text and with TLS on all three links, batch 1 and
# 16, and, per job and per link (AMQP, Redis, PostgreSQL), the system calls
# by kind, the bytes and the TLS records each way (tests/bench/tls_calls.py).
# Counts, not times: they do not depend on how busy the shared machine is
# (strace makes the run itself slow; -D: sekalid keeps the pid the driver
# signals and its workers stay its children). The servers must have been started
# with SEKALI_TLS=1.
#   tests/bench/tls_calls.sh [BUILD_DIR]
# Settings: BENCH_JOBS [2000], BENCH_WORKERS [4], BENCH_BATCH ["1 16"],
# BENCH_TLS_MODES ["0 1"] (0: clear text, 1: TLS), BENCH_KEEP_TRACES [0] (1: keep
# the strace files, in the scratch dir's bench/), BENCH_SEKALID [BUILD_DIR/sekalid]
# (another build's, e.g. to count before a change).
set -euo pipefail
cd "$(dirname "$0")/../.."
export LC_ALL=C
build=${1:-build}
workers=${BENCH_WORKERS:-4}
jobs=${BENCH_JOBS:-2000}
# shellcheck source=tests/bench/lib.sh
. tests/bench/lib.sh
[ -n "${SEKALI_TLS_DIR:-}" ] || die "start the servers with SEKALI_TLS=1"
command -v strace >/dev/null || die "strace is not installed"
sekalid=${BENCH_SEKALID:-$(cd "$build" && pwd)/sekalid}
run_id=bench-calls-$$
forget() {
    sql -c "DELETE FROM sekali.idempotency_keys WHERE queue = '$1'" \
        -c "DELETE FROM sekali_bench.jobs WHERE queue = '$1'"
}
schema "$(write_conf "$run_id-check")"

for bench_batch in ${BENCH_BATCH:-1 16}; do
    for tls in ${BENCH_TLS_MODES:-0 1}; do
        queue=$run_id-b$bench_batch-t$tls
        bench_tls=$tls
        conf=$(write_conf "$queue")
        traces=$work/$queue.trace
        rm -rf "$traces"; mkdir -p "$traces"
        wrapper=$work/$queue.sekalid
        printf '#!/bin/sh\nexec strace -D -qq -ff -yy -xx -s 65535 -o %q/t %q "$@"\n' \
            "$traces" "$sekalid" >"$wrapper"
        chmod +x "$wrapper"
        "$out/bench_amqp" "$SEKALI_AMQP_URL" bulk "$queue" "$jobs" >/dev/null
        "$out/bench_sekalid" "$wrapper" "$conf" "$work/$queue.log" "$SEKALI_PG_CONNINFO" \
            "$queue" "$jobs" 600 >"$work/$queue.result" || die "the run of $queue (see $work/$queue.log)"
        verify "$queue" "$jobs" amqp
        "$out/bench_amqp" "$SEKALI_AMQP_URL" delete "$queue"
        forget "$queue"
        echo "== batch $bench_batch, $([ "$tls" = 1 ] && echo TLS || echo 'clear text'), W=$workers, $jobs jobs"
        tests/bench/tls_calls.py "$jobs" "amqp=$SEKALI_AMQP_PORT,$SEKALI_AMQP_TLS_PORT" \
            "redis=$SEKALI_REDIS_PORT,$SEKALI_REDIS_TLS_PORT" "pg=$SEKALI_PG_PORT" -- "$traces"/t.*
        [ "${BENCH_KEEP_TRACES:-0}" = 1 ] || rm -rf "$traces" "$wrapper"
    done
done
