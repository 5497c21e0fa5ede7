#!/usr/bin/env bash
# TLS on all three links against clear text: tests/bench/run.sh twice, W=4,
# batch 1 and 16, first in clear text, then with BENCH_TLS=1 (amqps:// with
# a client certificate, Redis's tls-port as an ACL user, PostgreSQL with
# sslmode=verify-full; docs/tls.md). The servers must have been started
# with SEKALI_TLS=1. The other BENCH_* settings pass through (BENCH_JOBS,
# BENCH_RUNS); BENCH_WORKERS and BENCH_BATCH default to 4 and "1 16".
#   tests/bench/tls.sh BUILD_DIR
# Prints both summaries and, per batch, the ratio of TLS jobs/s to clear
# text's (the medians of each summary). Speed is measured, never asserted.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
eval "$(tests/servers.sh env)"
[ -n "${SEKALI_TLS_DIR:-}" ] || { echo "bench/tls.sh: start the servers with SEKALI_TLS=1" >&2; exit 2; }
export BENCH_WORKERS=${BENCH_WORKERS:-4} BENCH_BATCH=${BENCH_BATCH:-1 16}
export BENCH_LATENCY_SECONDS=${BENCH_LATENCY_SECONDS:-2}
out=$SEKALI_SCRATCH/bench-tls
mkdir -p "$out"
BENCH_TLS=0 tests/bench/run.sh "$build" | tee "$out/plain.txt"
BENCH_TLS=1 tests/bench/run.sh "$build" | tee "$out/tls.txt"
echo "== clear text"; sed -n "/^W /,\$p" "$out/plain.txt"
echo "== TLS"; sed -n "/^W /,\$p" "$out/tls.txt"
