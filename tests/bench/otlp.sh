#!/usr/bin/env bash
# Span export against none: tests/bench/run.sh with this build's sekalid
# ("this", no tracing:) and the same binary exporting every job run's span
# to a local receiver ("otlp", tracing.otlp_endpoint; otlp_receiver.py),
# back to back in every round (BENCH_COMPARE), so that the shared machine's
# drift falls on both alike; otlp's x-this is the median over the rounds of
# its jobs/s over this's in the same round, and the CPU columns (ms per
# job, per process tree) carry the export thread's work. The other BENCH_*
# settings pass through; BENCH_WORKERS defaults to 4, BENCH_JOBS to 10000.
#   tests/bench/otlp.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(realpath "${1:-build}")
eval "$(tests/servers.sh env)"
work=${SEKALI_SCRATCH:-/tmp/sekali}/bench-otlp
mkdir -p "$work"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 tests/bench/otlp_receiver.py "$port" > "$work/receiver.log" 2>&1 &
receiver=$!
trap 'kill "$receiver" 2>/dev/null || true' EXIT
# The wrapper sekalid: the bench's config, plus tracing: (run.sh calls
# `sekalid [-t] -c CONF`).
cat > "$work/sekalid-otlp" <<WRAP
#!/bin/sh
t=
[ "\$1" = -t ] && { t=-t; shift; }
new=\$(dirname "\$2")/otlp-\$(basename "\$2")
{ cat "\$2"; printf 'tracing:\n  otlp_endpoint: http://127.0.0.1:$port/v1/traces\n'; } > "\$new"
exec "$build/sekalid" \$t -c "\$new"
WRAP
chmod +x "$work/sekalid-otlp"
export BENCH_WORKERS=${BENCH_WORKERS:-4} BENCH_JOBS=${BENCH_JOBS:-10000}
export BENCH_COMPARE="otlp=$work/sekalid-otlp"
tests/bench/run.sh "$build"
echo "bench/otlp.sh: the receiver's last count: $(tail -1 "$work/receiver.log")"
