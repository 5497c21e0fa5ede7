#!/usr/bin/env bash
# TLS on all three links against clear text: tests/bench/run.sh with
# BENCH_TLS="0 1", W=4, batch 1 and 16: every round runs each batch in
# clear text and then with TLS (amqps:// with a client certificate, Redis's
# tls-port as an ACL user, PostgreSQL with sslmode=verify-full;
# docs/tls.md), back to back, so that the shared machine's drift falls on
# both alike, and each +tls row's x-this is the median over the rounds of
# its jobs/s over clear text's in the same round. The servers must have
# been started with SEKALI_TLS=1. The other BENCH_* settings pass through
# (BENCH_JOBS, BENCH_RUNS); BENCH_WORKERS and BENCH_BATCH default to 4 and
# "1 16". Speed is measured, never asserted; the CPU columns (ms per job,
# from /proc, per process tree) do not depend on how busy the machine is.
#   tests/bench/tls.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
eval "$(tests/servers.sh env)"
[ -n "${SEKALI_TLS_DIR:-}" ] || { echo "bench/tls.sh: start the servers with SEKALI_TLS=1" >&2; exit 2; }
export BENCH_WORKERS=${BENCH_WORKERS:-4} BENCH_BATCH=${BENCH_BATCH:-1 16} BENCH_TLS="0 1"
export BENCH_LATENCY_SECONDS=${BENCH_LATENCY_SECONDS:-2}
exec tests/bench/run.sh "$build"
