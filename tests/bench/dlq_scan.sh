#!/usr/bin/env bash
# tests/bench/dlq_scan.sh - what a dead-letter scan costs: fills
# dlqbench.dead with N letters (bench_amqp's jobs, published there
# directly) and times `sekalictl dlq groups` (the whole queue) and
# `dlq list --limit 100` (one page) with each sekalictl given, ROUNDS times
# each, printing every round and the medians. A measurement, not a test:
# nothing is asserted.
#
#   tests/bench/dlq_scan.sh [N...]                      N: 10000 100000 by default
#   DLQ_COMPARE="before=/old/sekalictl after=build/sekalictl" tests/bench/dlq_scan.sh
#
# Needs the test servers (tests/servers.sh start) and a migrated database
# (tests/run.sh migrates it). Leaves the queue deleted.
set -euo pipefail
cd "$(dirname "$0")/../.."

rounds=${ROUNDS:-3}
compare=${DLQ_COMPARE:-"after=build/sekalictl"}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(10000 100000)

say() { printf 'dlq_scan: %s\n' "$*"; }
tests/servers.sh status >/dev/null 2>&1 || { say "the test servers are not running"; exit 1; }
eval "$(tests/servers.sh env)"
work=$SEKALI_SCRATCH/bench-dlq
mkdir -p "$work"
# shellcheck disable=SC2046  # pkg-config prints flags meant to be split
cc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror $(pkg-config --cflags librabbitmq) \
    -o "$work/bench_amqp" tests/bench/bench_amqp.c $(pkg-config --libs librabbitmq)
cat >"$work/sekali.yaml" <<YAML
amqp:
  url: "$SEKALI_AMQP_URL"
postgres:
  conninfo: "$SEKALI_PG_CONNINFO"
queues:
  - name: dlqbench
    handler: unused.so
YAML
trap '"$work/bench_amqp" "$SEKALI_AMQP_URL" delete dlqbench.dead >/dev/null 2>&1 || true' EXIT

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

for n in "${sizes[@]}"; do
    "$work/bench_amqp" "$SEKALI_AMQP_URL" delete dlqbench.dead >/dev/null 2>&1 || true
    "$work/bench_amqp" "$SEKALI_AMQP_URL" bulk dlqbench.dead "$n" >/dev/null
    for what in groups page; do
        for pair in $compare; do
            name=${pair%%=*} ctl=${pair#*=}
            : >"$work/times"
            for ((r = 1; r <= rounds; r++)); do
                case $what in
                groups) args=(dlq groups dlqbench --json) ;;
                page)   args=(dlq list dlqbench --limit 100 --json) ;;
                esac
                t0=$(date +%s%N)
                "$ctl" -c "$work/sekali.yaml" "${args[@]}" >"$work/out.json"
                t1=$(date +%s%N)
                ms=$(((t1 - t0) / 1000000))
                scanned=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["scanned"])' "$work/out.json")
                depth=$("$work/bench_amqp" "$SEKALI_AMQP_URL" depth dlqbench.dead | awk '{ print $1 }')
                say "n=$n $what $name round $r: ${ms} ms, scanned $scanned, depth after $depth"
                echo "$ms" >>"$work/times"
            done
            say "n=$n $what $name median: $(median <"$work/times") ms"
        done
    done
done
