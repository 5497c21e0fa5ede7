#!/usr/bin/env bash
# tests/bench/dlq_store.sh - what reading dead letters costs at scale: loads
# N letters (1,000,000 by default) into sekali.dead_letters for queue
# dlqbench (20 reasons x error texts that differ only in numbers and ids,
# one in ten malformed without a key), then times each read sekalictl and
# the console make, ROUNDS times each (5 by default), interleaved, printing
# every round and the medians: the first page, a keyset page at the end,
# an offset page in the middle, a page of one reason, a page of one
# fingerprint, the groups, and one letter by id. A measurement, not a
# test: nothing is asserted.
#
#   tests/bench/dlq_store.sh [N]
#
# Needs the test servers (tests/servers.sh start) and a migrated database
# (tests/run.sh migrates it). Deletes the queue's letters when done.
set -euo pipefail
cd "$(dirname "$0")/../.."

n=${1:-1000000}
rounds=${ROUNDS:-5}
ctl=${SEKALICTL:-build/sekalictl}
say() { printf 'dlq_store: %s\n' "$*"; }
tests/servers.sh status >/dev/null 2>&1 || { say "the test servers are not running"; exit 1; }
eval "$(tests/servers.sh env)"
export PGOPTIONS="-c client_min_messages=warning"
work=$SEKALI_SCRATCH/bench-dlq-store
mkdir -p "$work"
cat >"$work/sekali.yaml" <<YAML
amqp:
  url: "$SEKALI_AMQP_URL"
postgres:
  conninfo: "$SEKALI_PG_CONNINFO"
queues:
  - name: dlqbench
    handler: unused.so
YAML
sql() { psql -X -q -At -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO" -c "$1"; }
trap 'sql "DELETE FROM sekali.dead_letters WHERE queue = '"'"'dlqbench'"'"'" || true' EXIT

sql "DELETE FROM sekali.dead_letters WHERE queue = 'dlqbench'"
t0=$(date +%s%N)
sql "INSERT INTO sekali.dead_letters (queue, key, job_id, job_type, reason, error, malformed,
         body, body_size, headers, attempts, failed_at, host, worker)
     SELECT 'dlqbench', CASE WHEN i % 10 = 0 THEN NULL ELSE 'k-' || i END, 'm-' || i, 'invoice',
            (ARRAY['failed', 'retries_exhausted', 'crashed', 'malformed', 'beyond_retention'])[i % 5 + 1]
              || CASE WHEN i % 20 < 5 THEN '' ELSE '_' || (i % 4) END,
            format('gateway %s for order %s (request %s)', 500 + i % 4, i,
                   md5(i::text)),
            CASE WHEN i % 10 = 0 THEN 'missing message_id' END,
            convert_to(repeat('x', 100), 'UTF8'), 100, '{\"x-idempotency-key\": \"k\"}', 3,
            now() - make_interval(secs => $n - i), 'bench-host', 'bench-worker'
       FROM generate_series(1, $n) i"
sql "VACUUM (ANALYZE) sekali.dead_letters"
t1=$(date +%s%N)
say "loaded $n letters in $(((t1 - t0) / 1000000)) ms (insert, vacuum, analyze)"
last=$(sql "SELECT max(id) FROM sekali.dead_letters WHERE queue = 'dlqbench'")
reason=$(sql "SELECT reason FROM sekali.dead_letters WHERE queue = 'dlqbench' LIMIT 1")
fp=$(sql "SELECT fingerprint FROM sekali.dead_letters WHERE queue = 'dlqbench' LIMIT 1")

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
reads=(first after offset reason fingerprint groups show)
declare -A times
for ((r = 1; r <= rounds; r++)); do
    for what in "${reads[@]}"; do
        case $what in
        first)       args=(dlq list dlqbench --limit 100 --json) ;;
        after)       args=(dlq list dlqbench --after $((last - 150)) --limit 100 --json) ;;
        offset)      args=(dlq list dlqbench --offset $((n / 2)) --limit 100 --json) ;;
        reason)      args=(dlq list dlqbench --reason "$reason" --limit 100 --json) ;;
        fingerprint) args=(dlq list dlqbench --fingerprint "$fp" --limit 100 --json) ;;
        groups)      args=(dlq groups dlqbench --json) ;;
        show)        args=(dlq show dlqbench --id $((last - 5)) --json) ;;
        esac
        t0=$(date +%s%N)
        "$ctl" -c "$work/sekali.yaml" "${args[@]}" >"$work/out.json"
        t1=$(date +%s%N)
        ms=$(((t1 - t0) / 1000000))
        python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/out.json"
        times[$what]+="$ms "
        say "round $r $what: $ms ms"
    done
done
for what in "${reads[@]}"; do
    # shellcheck disable=SC2086  # one time a word
    say "median of $rounds, $n letters: $what $(printf '%s\n' ${times[$what]} | median) ms"
done
