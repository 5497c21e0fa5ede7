# tests/cluster/rabbitmq_leader.sh - the run behind test_rabbitmq_leader and
# test_rabbitmq_leader_amqps: a 3-node RabbitMQ cluster loses the node that
# leads the work queue mid-run: sekalid, given all three nodes in amqp.url,
# fails over to a live node, and every key has exactly one effect.
#
# Sourced after tests/cluster/lib.sh by a test that sets `name` and
# `amqps`: 0 connects sekalid to the nodes' plain listeners; 1 to their TLS
# listeners (amqps://, the server certificate verified against one test CA
# shared by the three nodes, a client certificate, which the nodes require).
#
# Three nodes on loopback, each a tests/servers.sh RabbitMQ with its own
# name, ports and data directory, one shared epmd and Erlang cookie, joined
# with rabbitmqctl join_cluster. The work queue is a quorum queue (declared
# by the producer as sekalid declares it: queue_type quorum, delivery_limit),
# so its messages live on all three nodes. The producer publishes every key
# once and ~30 % twice, up front (in clear text, before sekalid starts);
# sekalid (4 workers, the nodes listed 1, 2, 3) consumes. Once a third of
# the keys are done, the queue's leader (asked of the cluster) is SIGKILLed;
# the test proves its beam died, that another node took the lead and that
# sekalid's connections (each of them TLS with our client certificate, in
# the broker's own view, when amqps=1) came back on the live nodes, then
# waits for every key and an empty queue.
# Summary: killed, pause_ms (last effect before the kill to the first
# after), keys, effects, duplicates (deliveries acked as already done:
# the producer's copies plus redeliveries), doubled, lost.
# shellcheck shell=bash
# shellcheck disable=SC2154  # name, amqps: set by the sourcing test

keys=${SEKALI_CLUSTER_KEYS:-3000}
job_ms=${SEKALI_CLUSTER_JOB_MS:-10}
queue=cluster-leader
pg_port=$((port_base + 0))
epmd_port=$((port_base + 10))
conninfo="host=127.0.0.1 port=$pg_port dbname=sekali user=sekali password=sekali"

amqp_port() { echo $((port_base + 20 * $1)); }
node_name() { echo "sekali-c$1@localhost"; }
ctl() { local i=$1; shift; timeout 60 "$work/rmq$i/bin/rabbitmqctl" "$@"; }
beam_pid() { tr -dc '0-9' <"$work/rmq$1/rabbitmq/rabbit.pid" 2>/dev/null || true; }
tls_port() { echo $(( $(amqp_port "$1") + 12 )); }
# The producer's URL (always clear text) and sekalid's (TLS when amqps=1).
url() { echo "amqp://sekali:sekali@127.0.0.1:$(amqp_port "$1")/%2f"; }
sekalid_port() { if [ "$amqps" = 1 ]; then tls_port "$1"; else amqp_port "$1"; fi; }
sekalid_url() {
    local scheme=amqp
    [ "$amqps" = 1 ] && scheme=amqps
    echo "$scheme://sekali:sekali@127.0.0.1:$(sekalid_port "$1")/%2f"
}
# conns NODE: sekalid's AMQP connections as the cluster sees them (asked of
# NODE), one line each: "PORT SSL PEER_CERT_SUBJECT" (the port is the
# node's listener the connection came in on).
conns() {
    ctl "$1" -q list_connections port ssl peer_cert_subject --formatter json 2>/dev/null |
        python3 -c 'import json,sys
for c in json.load(sys.stdin): print(c["port"], str(c["ssl"]).lower(), c.get("peer_cert_subject") or "-")'
}

# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------
t_setup=$(now_ms)
start_redis
srv_start single postgres SEKALI_PG_PORT="$pg_port"
cookie=$(od -An -N12 -tx1 /dev/urandom | tr -dc '0-9a-f' | tr 'a-f' 'A-F')
for i in 1 2 3; do
    mkdir -p "$work/rmq$i/rabbitmq/home"
    printf '%s' "$cookie" >"$work/rmq$i/rabbitmq/home/.erlang.cookie"
    chmod 400 "$work/rmq$i/rabbitmq/home/.erlang.cookie"
    p=$(amqp_port "$i")
    # One CA for the cluster: node 1 makes it (tests/servers.sh), the
    # others are given its files, so one ca_file verifies every node.
    [ "$amqps" = 1 ] && [ "$i" -gt 1 ] && cp -a "$work/rmq1/tls" "$work/rmq$i/tls"
    # PG and Redis ports of these sets are never started: only kept apart.
    # RabbitMQ 4.0 refused a third node's join with its deprecated
    # features denied (failed_to_deny_deprecated_features): the single-node
    # suites prove sekali asks for none of them.
    srv_start "rmq$i" rabbitmq SEKALI_RABBITMQ_DENY_DEPRECATED=0 SEKALI_AMQP_PORT="$p" SEKALI_AMQP_DIST_PORT=$((p + 1)) \
        SEKALI_EPMD_PORT="$epmd_port" SEKALI_RABBIT_NODE="$(node_name "$i")" \
        SEKALI_PG_PORT=$((p + 15)) SEKALI_REDIS_PORT=$((p + 16)) \
        SEKALI_TLS="$amqps" SEKALI_AMQP_TLS_PORT="$(tls_port "$i")" \
        SEKALI_REDIS_TLS_PORT=$((p + 17))
done
for i in 2 3; do
    { ctl "$i" -q stop_app && ctl "$i" -q join_cluster "$(node_name 1)" &&
        ctl "$i" -q start_app; } >>"$work/servers.log" 2>&1 ||
        die "node $i could not join $(node_name 1) (log: $work/servers.log)"
done
running=$(ctl 1 -q cluster_status --formatter json |
          python3 -c 'import json,sys; print(len(json.load(sys.stdin)["running_nodes"]))')
[ "$running" = 3 ] || die "the cluster runs $running nodes, not 3"
say "3-node cluster up in $(( ($(now_ms) - t_setup) / 1000 )) s"

urls="[\"$(sekalid_url 1)\", \"$(sekalid_url 2)\", \"$(sekalid_url 3)\"]"
if [ "$amqps" = 1 ]; then
    tls=$work/rmq1/tls
    # verify is on by default; written out, since this test is its proof.
    urls="$urls
  tls:
    ca_file: $tls/ca.crt
    cert_file: $tls/client.crt
    key_file: $tls/client.key
    server_name: localhost
    verify: true"
fi
conf=$work/sekali.yaml
write_conf "$conf" "$urls" "$conninfo" "$queue" "    queue_type: quorum
    delivery_limit: 20"
schema "$conf" "$conninfo"

# ---------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------
published=$("$producer" "$(url 1)" "$queue" "$keys" 30 "${SEKALI_CLUSTER_SEED:-42}" \
            "sleep:$job_ms" quorum:20) || die "the producer failed"
say "$published"
copies=${published##*copies=}
members=$(ctl 1 -q list_queues name type members --formatter json |
          python3 -c "import json,sys; print(' '.join(q['type'] + ':' + str(len(q['members'])) for q in json.load(sys.stdin) if q['name'] == '$queue'))")
[ "$members" = "quorum:3" ] || die "the work queue is not a quorum queue on 3 nodes: '$members'"

# The leader is asked before sekalid starts (nothing moves it but a fault):
# each rabbitmqctl call takes seconds, and after a third of the keys only
# one more may come before the kill, or the run is over before the fault.
leader=$(ctl 1 -q list_queues name leader --formatter json |
         python3 -c "import json,sys; print([q['leader'] for q in json.load(sys.stdin) if q['name'] == '$queue'][0])")
victim=''
for i in 1 2 3; do [ "$leader" = "$(node_name "$i")" ] && victim=$i; done
[ -n "$victim" ] || die "the queue's leader '$leader' is none of the three nodes"
pid=$(beam_pid "$victim")
[ -n "$pid" ] || die "no beam pid for node $victim"

start_sekalid "$conf"
third=$(( keys / 3 ))
wait_for 120 "a third of the keys done before the fault" \
    bash -c '[ "$(psql -X -t -A "$0" -c "SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects WHERE queue = '"'$queue'"'")" -ge '"$third"' ]' "$conninfo"

# sekalid's connections to the victim: they must fail over, not just the
# queue's leadership (each process stays on the first node that works).
# (The producer is gone by now: every connection is sekalid's.)
before_conns=$(conns "$victim")
on_victim=$(grep -c "^$(sekalid_port "$victim") " <<<"$before_conns" || true)
[ "$on_victim" -gt 0 ] || die "no sekalid connection on the leader, node $victim: nothing would fail over"
n_conns=$(wc -l <<<"$before_conns")
if [ "$amqps" = 1 ]; then
    tls_conns=$(grep -c " true CN=sekali" <<<"$before_conns" || true)
    [ "$tls_conns" = "$n_conns" ] ||
        die "only $tls_conns of sekalid's $n_conns connections are TLS with its certificate: $before_conns"
fi
before=$(done_keys "$conninfo" "$queue")
kill_ms=$(now_ms)
kill -KILL "$pid"
wait_for 10 "node $victim's beam (pid $pid) dead after SIGKILL" dead "$pid"
[ "$before" -lt "$keys" ] ||
    die "every key was done before the kill: nothing was left to fail over (SEKALI_CLUSTER_JOB_MS=$job_ms)"
say "killed node $victim ($leader, the queue's leader, beam pid $pid, $on_victim sekalid connections) at $before of $keys keys"
other=$(( victim % 3 + 1 ))
new_leader() {
    local l
    l=$(ctl "$other" -q list_queues name leader --formatter json 2>/dev/null |
        python3 -c "import json,sys; print([q['leader'] for q in json.load(sys.stdin) if q['name'] == '$queue'][0])")
    [ -n "$l" ] && [ "$l" != "$leader" ] && echo "$l"
}
wait_for 60 "a new leader for $queue after $leader was killed" new_leader
say "new leader: $(new_leader)"
# sekalid's connections back, none to the dead node, and (amqps) each still
# TLS with the client certificate on a live node's TLS listener. Each
# worker's consumer comes back at once; its publishing connection only when
# it next has a retry or a dead letter to send, so the count to wait for is
# the workers', not that of the connections before the kill.
live_ports="$(sekalid_port $(( victim % 3 + 1 ))) $(sekalid_port $(( (victim + 1) % 3 + 1 )))"
workers=${SEKALI_CLUSTER_WORKERS:-4}
moved() {
    local c n=0 port ssl subject
    c=$(conns "$other") || return 1
    while read -r port ssl subject; do
        [[ " $live_ports " == *" $port "* ]] || return 1
        if [ "$amqps" = 1 ]; then [ "$ssl $subject" = "true CN=sekali" ] || return 1; fi
        n=$((n + 1))
    done <<<"$c"
    [ "$n" -ge "$workers" ]
}
wait_for 60 "sekalid's $workers consumers back on the live nodes ($live_ports), none elsewhere" moved
after_conns=$(conns "$other")
say "sekalid's connections after the failover (port ssl certificate): $(tr '\n' ';' <<<"$after_conns")"

wait_for 120 "every key done after the failover" \
    bash -c '[ "$(psql -X -t -A "$0" -c "SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects WHERE queue = '"'$queue'"'")" -ge '"$keys"' ]' "$conninfo"
depth() {
    ctl "$other" -q list_queues name messages --formatter json |
        python3 -c "import json,sys; print(sum(q['messages'] for q in json.load(sys.stdin) if q['name'] == '$queue'))"
}
queue_empty() { [ "$(depth)" = 0 ]; }
wait_for 60 "the queue drained of its copies" queue_empty
stop_sekalid

pause=$(pause_around "$conninfo" "$queue" "$kill_ms")
tally "$conninfo" "$queue" "$keys"
dead_letters=$(ctl "$other" -q list_queues name messages --formatter json |
    python3 -c "import json,sys; print(sum(q.get('messages') or 0 for q in json.load(sys.stdin) if q['name'] == '$queue.dead'))")
reconnects=$(grep -c "lost the broker connection" "$work/sekalid.log" || true)
# Retries went on through the failover: the delay queues of a quorum work
# queue are quorum queues, so none lived on the dead node alone.
delay_types=$(ctl "$other" -q list_queues name type --formatter json |
    python3 -c "import json,sys; print(' '.join(sorted(set(q['type'] for q in json.load(sys.stdin) if q['name'].startswith('$queue.delay.')))) or 'none')")
home_down=$(grep -c "is down or inaccessible" "$work/sekalid.log" || true)
failover_dups=$(( duplicates - copies ))
tls_moved=$(grep -c " true CN=sekali" <<<"$after_conns" || true)
echo "$name: killed=rabbitmq-leader($leader,pid $pid) pause_ms=$pause keys=$keys effects=$effects" \
     "duplicates=$duplicates(copies=$copies,redelivered=$failover_dups) doubled=$doubled lost=$lost" \
     "dead_letters=$dead_letters reconnects=$reconnects delay_queues=$delay_types" \
     "connections=$n_conns(tls_after=$tls_moved)"
[ "$doubled" = 0 ] || die "$doubled keys have more than one effect"
[ "$lost" = 0 ] || die "$lost keys have no effect"
[ "$effects" = "$keys" ] && [ "$completed" = "$keys" ] ||
    die "$effects effects and $completed completed keys for $keys keys"
[ "$dead_letters" = 0 ] || die "$dead_letters messages dead-lettered"
[ "$delay_types" = quorum ] || [ "$delay_types" = none ] ||
    die "the work queue's delay queues are $delay_types, not quorum"
[ "$home_down" = 0 ] ||
    die "$home_down retries refused because a queue's home node was down (log: $work/sekalid.log)"
