#!/usr/bin/env bash
# tests/cluster/test_netns.sh - three sekalid hosts share a queue; one host's
# link is cut while it holds jobs and locks, and restored later. The broker
# gives its jobs to the other two, its late commits find their keys done
# (or are fenced out), every key has exactly one effect, and the cut host
# comes back to work by itself.
#
#   tests/cluster/test_netns.sh [BUILD_DIR]     (run by tests/cluster/run.sh; root)
#
# The hosts are network namespaces (tests/cluster/netns_lib.sh); the servers
# are a private set of tests/servers.sh that listens on 127.0.0.1 and on an
# address on a veth of ours, stopped and wiped at the end. Each host runs
# sekalid with 2 workers, prefetch 4, amqp.heartbeat 2s, lock.ttl 2s,
# postgres.idle_in_transaction_timeout 3s, log level debug (so that its
# log says which keys it held). The stream: every key once, 30 % twice, each
# job "sleep:150" (tests/plugins/effect.so: one effect row per execution).
#
# Once 15 % of the keys are done, the test waits until host 2 holds
# deliveries (the broker counts unacked messages on its channels) and an
# open claim (a PostgreSQL session from its address, idle in transaction:
# a row lock and a Redis lock, its handler running), then sets its link
# down. Proved, each with a bounded wait:
#   - the link is down and host 2 cannot open a connection to the servers;
#   - the broker closes host 2's connection (missed heartbeats) and
#     PostgreSQL ends its open transactions;
#   - every key host 2 held (received, no outcome before the cut) gets its
#     effect from another host while the link is still down;
#   - what host 2 logged for those keys from the cut on (its late commits:
#     outcome unknown, fenced out, duplicate...) is reported, and none of
#     it made a second effect;
#   - host 2 makes new effects after the restore, on its own;
#   - every key has exactly one effect, and the queue drains.
# Prints one line on stdout:
#   test_netns: cut=host2-link held_unacked=U held_keys=H redone_by_others=O open_claims=C cut_ms=X
#          broker_dropped_ms=B pause_ms=P recovered_ms=R keys=K published=N
#          effects=E duplicates=D lost=L late=OUTCOME:N,... seconds=T
# Settings: NETNS_KEYS [1200], NETNS_TIMEOUT [240] s, NETNS_PREFIX/NET.
{
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
name=test_netns
keys=${NETNS_KEYS:-1200}
timeout=${NETNS_TIMEOUT:-240}
t_start=$SECONDS
# shellcheck source=tests/cluster/sekalid_lib.sh
. tests/cluster/sekalid_lib.sh
# shellcheck source=tests/cluster/netns_lib.sh
. tests/cluster/netns_lib.sh
command -v python3 >/dev/null || die "python3 is needed to read the logs"

hosts=3 victim=2
queue=netns-$$-$RANDOM
pids=()

cleanup() {
    local rc=$?
    local p
    for p in "${pids[@]}"; do stop_pid "$p"; done
    [ -z "${SEKALI_RABBITMQCTL:-}" ] || drop_queue "$queue"
    srv_down
    net_down
    keep_or_wipe "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

net_up "$hosts"
srv_ns_up
for i in $(seq 1 "$hosts"); do
    wait_for 10 "host $i reaching PostgreSQL on $SRV_ADDR:$SEKALI_PG_PORT" reaches "$i" "$SEKALI_PG_PORT"
done

conf_of() { printf '%s/host%s.yaml' "$work" "$1"; }
for i in $(seq 1 "$hosts"); do
    write_conf "$(conf_of "$i")" "$queue" 2 "$NS_AMQP_URL" "$NS_PG_CONNINFO" \
"  host: $SRV_ADDR
  port: $SEKALI_REDIS_PORT
  timeout: 500ms" "    prefetch: 4"
    sed -i -e 's/^  level: info$/  level: debug/' \
           -e 's/^  conninfo: .*$/&\n  idle_in_transaction_timeout: 3s/' "$(conf_of "$i")"
done
conf=$(conf_of 1)
# From this namespace, the schema goes in through 127.0.0.1.
sed "s|^  conninfo: .*|  conninfo: \"$SEKALI_PG_CONNINFO\"|; s|^  url: .*|  url: \"$SEKALI_AMQP_URL\"|" \
    "$conf" >"$work/local.yaml"
conf=$work/local.yaml
schema "$conf"
seed=$((RANDOM * 32768 + RANDOM))
published=$(publish "$SEKALI_AMQP_URL" "$queue" "$keys" 30 "$seed" "sleep:150")
say "published $published messages for $keys keys (seed $seed)"

for i in $(seq 1 "$hosts"); do
    run_in "$i" "$(conf_of "$i")" "$work/host$i.log"
    pids+=("$!")
done
t0=$(now_ms)
running() { local p; for p in "${pids[@]}"; do alive "$p" || die "a sekalid exited (logs: $work/host*.log)"; done; }

share() { running; [ "$(keys_done "$queue")" -ge $((keys * 15 / 100)) ]; }
wait_for "$timeout" "15 % of the keys done" share

v_addr=$(host_addr "$victim")
# unacked_of ADDR: messages delivered to ADDR's channels and not acked.
unacked_of() {
    "$SEKALI_RABBITMQCTL" -q list_channels name messages_unacknowledged 2>/dev/null |
        awk -v a="$1:" 'index($1, a) == 1 { n += $NF } END { print n + 0 }'
}
claims_of() {
    sql -c "SELECT count(*) FROM pg_stat_activity WHERE client_addr = '$1' AND state = 'idle in transaction'"
}
locks() { redis-cli -h 127.0.0.1 -p "$SEKALI_REDIS_PORT" --scan --pattern "sekali:lock:$queue:*" | wc -l; }
holding() {
    running
    [ "$(unacked_of "$v_addr")" -gt 0 ] && [ "$(claims_of "$v_addr")" -gt 0 ] && [ "$(locks)" -gt 0 ]
}
wait_for 60 "host $victim holding deliveries and an open claim, with locks in Redis" holding

# The fault.
cut_link "$victim"
t_cut=$(now_ms)
locks_at_cut=$(locks)
open_claims=$(claims_of "$v_addr")
held_unacked=$(unacked_of "$v_addr")
[ "$(link_state "$victim")" = DOWN ] || die "the link of host $victim is not down: $(link_state "$victim")"
if reaches "$victim" "$SEKALI_PG_PORT"; then die "host $victim still reaches the servers with its link down"; fi
say "cut host $victim ($v_addr): $held_unacked unacked, $open_claims open claims, $locks_at_cut locks in Redis," \
    "$(keys_done "$queue") of $keys keys done"

broker_gone() { [ "$("$SEKALI_RABBITMQCTL" -q list_connections peer_host 2>/dev/null | grep -cxF "$v_addr")" = 0 ]; }
wait_for 30 "the broker closing host $victim's connections" broker_gone
t_dropped=$(now_ms)
claims_gone() { [ "$(claims_of "$v_addr")" = 0 ]; }
wait_for 30 "PostgreSQL ending host $victim's open transactions" claims_gone
say "broker dropped host $victim after $((t_dropped - t_cut)) ms; its claims are gone"

# The keys host 2 held at the cut: received, without an outcome line, in its
# log up to the cut (debug: "received"; info: the outcome).
held_keys() {
    python3 - "$work/host$victim.log" "$t_cut" <<'PY'
import json, sys, datetime
path, cut = sys.argv[1], int(sys.argv[2])
state = {}
for line in open(path, errors="replace"):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    k = r.get("idempotency_key")
    if not k:
        continue
    ts = datetime.datetime.strptime(r["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp() * 1000
    if ts > cut:
        continue
    if r.get("level") == "debug":
        if r.get("msg") == "received":
            state[k] = "held"
    else:
        state[k] = "done"
print(" ".join(sorted(k for k, v in state.items() if v == "held")))
PY
}
read -r -a held <<<"$(held_keys)"
[ "${#held[@]}" -gt 0 ] || die "host $victim's log shows no key held at the cut (log: $work/host$victim.log)"
held_list=$(printf "'%s'," "${held[@]}")
held_list=${held_list%,}
held_done() {
    running
    [ "$(sql -c "SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects
                 WHERE queue = '$queue' AND idempotency_key IN ($held_list)")" = "${#held[@]}" ]
}
wait_for 60 "an effect for each of the ${#held[@]} keys host $victim held, with its link down" held_done
say "the ${#held[@]} keys host $victim held are done by the others: ${held[*]}"

# A little longer cut, so that its locks expire and its reconnects back off.
sleep_until=$(( t_cut + 8000 ))
while (( $(now_ms) < sleep_until )); do running; sleep 0.2; done
[ "$(keys_done "$queue")" -lt "$keys" ] || die "every key was done before the restore: raise NETNS_KEYS"
restore_link "$victim"
t_restore=$(now_ms)
wait_for 10 "host $victim reaching the servers again" reaches "$victim" "$SEKALI_PG_PORT"
say "restored host $victim after $((t_restore - t_cut)) ms"

# Recovery: an effect by one of host 2's workers after the restore.
victim_pids() {
    python3 -c 'import json,sys
print(",".join(sorted({str(json.loads(l)["pid"]) for l in open(sys.argv[1], errors="replace") if l.startswith("{")})))' \
        "$work/host$victim.log"
}
recovered() {
    running
    [ "$(sql -c "SELECT count(*) FROM sekali_test.effects WHERE queue = '$queue'
                 AND pid IN ($(victim_pids)) AND created_at > to_timestamp($t_restore / 1000.0)")" -gt 0 ]
}
wait_for 60 "host $victim making effects again after the restore" recovered
t_recovered=$(sql -c "SELECT (extract(epoch FROM min(created_at)) * 1000)::bigint FROM sekali_test.effects
                      WHERE queue = '$queue' AND pid IN ($(victim_pids))
                        AND created_at > to_timestamp($t_restore / 1000.0)")
say "host $victim made its first effect $((t_recovered - t_restore)) ms after the restore"

finished() { running; all_done "$queue" "$keys"; }
wait_for "$timeout" "an effect for every one of the $keys keys" finished
wait_for 60 "the queue $queue draining" queue_empty "$queue"
t_end=$(now_ms)
for p in "${pids[@]}"; do stop_pid "$p"; done
pids=()

# What host 2 logged for the held keys from the cut on: outcome:count.
late=$(python3 - "$work/host$victim.log" "$t_cut" "${held[@]}" <<'PY'
import json, sys, datetime, collections
path, cut, keys = sys.argv[1], int(sys.argv[2]), set(sys.argv[3:])
seen = collections.Counter()
for line in open(path, errors="replace"):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("idempotency_key") not in keys or r.get("level") == "debug":
        continue
    ts = datetime.datetime.strptime(r["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp() * 1000
    if ts >= cut:
        seen[r["msg"].split(":")[0].replace(" ", "_")] += 1
print(",".join("%s:%d" % kv for kv in sorted(seen.items())) or "none")
PY
)
# Held keys whose one effect another host made (the rest committed on host
# 2 before the cut, their acks lost).
by_others=$(sql -c "SELECT count(*) FROM sekali_test.effects WHERE queue = '$queue'
                    AND idempotency_key IN ($held_list) AND pid NOT IN ($(victim_pids))")
n_effects=$(effects "$queue")
n_doubled=$(doubled "$queue")
n_done=$(keys_done "$queue")
lost=$((keys - n_done))
pause=$(pause_ms "$queue" "$t_cut")
printf 'test_netns: cut=host%s-link held_unacked=%s held_keys=%s redone_by_others=%s open_claims=%s locks_at_cut=%s cut_ms=%s broker_dropped_ms=%s pause_ms=%s recovered_ms=%s keys=%s published=%s effects=%s duplicates=%s lost=%s late=%s seconds=%s\n' \
    "$victim" "$held_unacked" "${#held[@]}" "$by_others" "$open_claims" "$locks_at_cut" "$((t_restore - t_cut))" \
    "$((t_dropped - t_cut))" "$pause" "$((t_recovered - t_restore))" "$keys" "$published" \
    "$n_effects" "$n_doubled" "$lost" "$late" "$(( (t_end - t0) / 1000 ))"
[ "$n_doubled" = 0 ] || die "$n_doubled keys have more than one effect (logs: $work)"
[ "$lost" = 0 ] || die "$lost keys have no effect (logs: $work)"
[ "$n_effects" = "$keys" ] || die "$n_effects effects for $keys keys"
say "passed in $((SECONDS - t_start)) s"
exit 0
}
