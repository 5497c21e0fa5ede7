#!/usr/bin/env bash
# tests/cluster/run.sh - the cluster suites (`make check-cluster`): every
# tests/cluster/test_*.sh, or those named, one after the other.
#
#   tests/cluster/run.sh [BUILD_DIR] [TEST ...]     TEST: a name such as test_rabbitmq_leader
#
# Each test is self-contained: it starts the servers it needs (on loopback,
# ports from SEKALI_CLUSTER_PORT_BASE, files under SEKALI_CLUSTER_SCRATCH),
# runs, stops and wipes them, and exits 0 on pass. Its last line on stdout
# is its summary ("<name>: killed=... pause_ms=... keys=... effects=...
# duplicates=... lost=...", or "<name>: FAILED: why"); diagnosis goes to
# stderr. A test that runs past
# SEKALI_CLUSTER_TIMEOUT seconds [600] is stopped and fails.
# Ends with the summaries again and one line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
build=build
if [ $# -gt 0 ] && [ -d "$1" ]; then build=$1; shift; fi
limit=${SEKALI_CLUSTER_TIMEOUT:-600}

tests=()
if [ $# -gt 0 ]; then
    for t in "$@"; do
        t=${t%.sh}; t=${t#tests/cluster/}
        [ -f "tests/cluster/$t.sh" ] || { echo "cluster: no tests/cluster/$t.sh" >&2; exit 2; }
        tests+=("tests/cluster/$t.sh")
    done
else
    for t in tests/cluster/test_*.sh; do [ -e "$t" ] && tests+=("$t"); done
fi
[ ${#tests[@]} -gt 0 ] || { echo "cluster: no tests/cluster/test_*.sh" >&2; exit 2; }
for bin in sekalid sekalictl chaos/chaos_producer tests/plugins/effect.so; do
    [ -e "$build/$bin" ] || { echo "cluster: no $build/$bin: make tests" >&2; exit 2; }
done

passed=0 failed=0 summaries=() t0=$SECONDS
for t in "${tests[@]}"; do
    name=$(basename "$t" .sh)
    echo "== cluster/$name"
    start=$SECONDS
    out=$(mktemp)
    # Its own session, so that a test stopped at the time limit takes its
    # servers' launchers with it; the test's EXIT trap stops the servers.
    timeout -s TERM -k 30 "$limit" setsid bash "$t" "$build" | tee "$out"
    rc=${PIPESTATUS[0]}
    line=$(grep "^$name: " "$out" | tail -n 1 || true)
    rm -f "$out"
    [ "$rc" = 124 ] && line="$name: TIMEOUT after ${limit}s (SEKALI_CLUSTER_TIMEOUT)"
    [ -n "$line" ] || line="$name: no summary line"
    if [ "$rc" = 0 ]; then
        passed=$((passed + 1)); summaries+=("PASS $line ($((SECONDS - start)) s)")
    else
        failed=$((failed + 1)); summaries+=("FAIL(rc=$rc) $line ($((SECONDS - start)) s)")
    fi
done
echo "== cluster suites in $((SECONDS - t0)) s"
printf '%s\n' "${summaries[@]}"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
