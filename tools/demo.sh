#!/usr/bin/env bash
# The demo behind `make demo`: sekalid with the example invoice handler takes
# 100 orders, each published three times (the way a retrying producer would),
# and the counts at the end show one invoice per order.
#   tools/demo.sh BUILD_DIR      (servers from tests/servers.sh must be running)
# DEMO_HANDLER=sql (`make demo HANDLER=sql`) runs the same demo through the
# stock SQL handler and examples/invoice_function.sql instead of the C one.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
orders=${DEMO_ORDERS:-100}
copies=3
handler=${DEMO_HANDLER:-invoice}
case "$handler" in
    invoice) handler_yaml="    handler: $PWD/$build/handlers/invoice.so
    config:
      table: invoices" ;;
    sql) handler_yaml="    handler: sql
    config:
      statement: \"SELECT create_invoice(:body::jsonb, :job_id)\"" ;;
    *) echo "demo: HANDLER must be invoice or sql, not $handler" >&2; exit 2 ;;
esac
# A bare handler name is looked up here: the build's, not an installed one.
export SEKALI_HANDLER_DIR="$PWD/$build/handlers"

eval "$(tests/servers.sh env)"
export PGOPTIONS="-c client_min_messages=warning"
work="$SEKALI_SCRATCH/demo"
mkdir -p "$work"
conf="$work/sekali.yaml"
cat > "$conf" <<YAML
amqp:
  url: "$SEKALI_AMQP_URL"
redis:
  host: 127.0.0.1
  port: $SEKALI_REDIS_PORT
postgres:
  conninfo: "$SEKALI_PG_CONNINFO"
log:
  level: info
  format: json
outbox:
  relays: 1
queues:
  - name: invoices
    workers: 4
    prefetch: 8
$handler_yaml
YAML

say() { printf 'demo: %s\n' "$*"; }
sql() { psql -X -q -t -A -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO" -c "$1"; }

# The applied files only: the plan migrate says first is for operators.
"$build/sekalictl" -c "$conf" migrate --sql-dir sql |
    sed -n 's/^\(applied \|schema is up to date\)/demo: migrate: \1/p'
psql -X -q -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO" -f examples/invoice.sql
[ "$handler" = sql ] && psql -X -q -v ON_ERROR_STOP=1 "$SEKALI_PG_CONNINFO" -f examples/invoice_function.sql
say "handler: $handler"
# A fresh start, so the counts below are this run's alone.
sql "TRUNCATE invoices; DELETE FROM sekali.idempotency_keys WHERE queue = 'invoices'"

"$build/sekalid" -t -c "$conf"
"$build/sekalid" -c "$conf" 2> "$work/sekalid.log" &
sekalid=$!
trap 'kill -TERM $sekalid 2>/dev/null || true' EXIT
say "sekalid running (pid $sekalid, log $work/sekalid.log)"

say "enqueueing $orders orders x $copies copies through sekali.enqueue (the outbox), each copy a separate job"
publishers=()
for copy in $(seq 1 $copies); do
    for i in $(seq 1 "$orders"); do
        printf '{"order_id": "A-%d", "amount_cents": %d}' "$i" $((1000 + i)) |
            "$build/sekalictl" -c "$conf" enqueue invoices create_invoice --key "order-A-$i" - \
            > /dev/null &
        publishers+=($!)
        # A few publishers at a time, like several producer instances retrying.
        if (( ${#publishers[@]} == 8 )); then
            wait "${publishers[@]}"
            publishers=()
        fi
    done
done
[ ${#publishers[@]} -eq 0 ] || wait "${publishers[@]}"

expected_dups=$((orders * (copies - 1)))
for _ in $(seq 1 600); do
    done_keys=$(sql "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = 'invoices' AND status = 'completed'")
    dups=$(sql "SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys WHERE queue = 'invoices'")
    [ "$done_keys" -eq "$orders" ] && [ "$dups" -eq "$expected_dups" ] && break
    sleep 0.1
done

kill -TERM $sekalid
wait $sekalid && status=0 || status=$?
trap - EXIT

invoices=$(sql "SELECT count(*) FROM invoices")
distinct=$(sql "SELECT count(DISTINCT order_id) FROM invoices")
doubled=$(sql "SELECT count(*) FROM (SELECT order_id FROM invoices GROUP BY 1 HAVING count(*) > 1) d")
dups=$(sql "SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys WHERE queue = 'invoices'")
cat <<REPORT

  messages published          $((orders * copies))  ($orders orders x $copies copies)
  invoices created            $invoices
  orders invoiced             $distinct
  orders invoiced twice       $doubled
  duplicates suppressed       $dups
  sekalid exit status         $status

REPORT
if [ "$invoices" -eq "$orders" ] && [ "$doubled" -eq 0 ] && [ "$dups" -eq "$expected_dups" ] && [ $status -eq 0 ]; then
    say "every order was invoiced exactly once."
    say "the servers keep running; stop them with: tests/servers.sh stop"
else
    say "UNEXPECTED COUNTS: see $work/sekalid.log" >&2
    exit 1
fi
