#!/usr/bin/env bash
# tests/cluster/bench_cluster.sh - the scale figure (`make bench-cluster`):
# throughput with 1, 2 and 3 sekalid hosts, and what a quorum queue costs
# against a classic one on one node.
#
#   tests/cluster/bench_cluster.sh [BUILD_DIR]     (root: network namespaces)
#
# The hosts are network namespaces (tests/cluster/netns_lib.sh) against one
# private set of servers (tests/servers.sh, listening on an address on our
# own veth), so every job crosses a real (virtual) link as on separate
# machines. Each sekalid runs BENCH_CLUSTER_WORKERS [2] workers, prefetch 8,
# log level warn, tests/plugins/effect.so (one row per job, in the job's
# transaction, with its Redis lock).
# Two workloads, each published in full before the hosts start:
#   short BENCH_CLUSTER_KEYS [4000] jobs whose handler does nothing but its
#         insert: what sekali, the servers and the kernel cost per job;
#   wait  BENCH_CLUSTER_WAIT_KEYS [600] jobs that each sleep 50 ms first: a
#         handler waiting on something else (an API, a disk).
# Runs: hosts 1, 2, 3 on a classic queue, for both workloads; then the short
# workload on 1 host with a quorum queue (on a one-node broker: the cost of
# the Raft log, without any replication to other nodes). Each run
# BENCH_CLUSTER_REPEATS [3] rounds of all of them; throughput = (jobs - 1) /
# (last effect's transaction time - first's), so sekalid's start-up is not
# counted. Prints the medians and each run's figure as a Markdown table on
# stdout, with each run's ratio to the same round's 1 host on a classic queue.
{
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
name=bench_cluster
keys=${BENCH_CLUSTER_KEYS:-4000}
wait_keys=${BENCH_CLUSTER_WAIT_KEYS:-600}
workers=${BENCH_CLUSTER_WORKERS:-2}
repeats=${BENCH_CLUSTER_REPEATS:-3}
for v in keys wait_keys workers repeats; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-cluster: $v must be a positive number" >&2; exit 2; }
done
# shellcheck source=tests/cluster/sekalid_lib.sh
. tests/cluster/sekalid_lib.sh
# shellcheck source=tests/cluster/netns_lib.sh
. tests/cluster/netns_lib.sh

pids=() queue='' rate=0
declare -A last
cleanup() {
    local rc=$?
    local p
    for p in "${pids[@]}"; do stop_pid "$p"; done
    [ -z "$queue" ] || [ -z "${SEKALI_RABBITMQCTL:-}" ] || drop_queue "$queue"
    srv_down
    net_down
    keep_or_wipe "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

net_up 3
srv_ns_up
for i in 1 2 3; do wait_for 10 "host $i reaching $SRV_ADDR" reaches "$i" "$SEKALI_PG_PORT"; done

# local_conf: the same servers through 127.0.0.1, for the schema.
write_conf "$work/local.yaml" bench-schema 1 "$SEKALI_AMQP_URL" "$SEKALI_PG_CONNINFO" \
"  host: 127.0.0.1
  port: $SEKALI_REDIS_PORT"
conf=$work/local.yaml
schema "$conf"

# one_run WORKLOAD HOSTS TYPE: sets rate to the jobs per second. (Not run in
# a subshell: the EXIT clean-up must see the sekalid pids it started.)
one_run() {
    local workload=$1 hosts=$2 type=$3 n body i extra
    n=$([ "$workload" = short ] && echo "$keys" || echo "$wait_keys")
    body=$([ "$workload" = short ] && echo "x" || echo "sleep:50")
    queue=bench-$workload-$hosts-$type-$$-$RANDOM
    extra="    prefetch: 8"
    [ "$type" = classic ] || extra="$extra
    queue_type: quorum"
    for i in $(seq 1 "$hosts"); do
        write_conf "$work/host$i.yaml" "$queue" "$workers" "$NS_AMQP_URL" "$NS_PG_CONNINFO" \
"  host: $SRV_ADDR
  port: $SEKALI_REDIS_PORT" "$extra"
        sed -i 's/^  level: info$/  level: warn/' "$work/host$i.yaml"
    done
    if [ "$type" = classic ]; then
        publish "$SEKALI_AMQP_URL" "$queue" "$n" 0 1 "$body" >/dev/null
    else
        publish "$SEKALI_AMQP_URL" "$queue" "$n" 0 1 "$body" quorum >/dev/null
    fi
    quiesce
    for i in $(seq 1 "$hosts"); do
        run_in "$i" "$work/host$i.yaml" "$work/$queue.host$i.log"
        pids+=("$!")
    done
    finished() { local p; for p in "${pids[@]}"; do alive "$p" || die "a sekalid exited (logs: $work)"; done
                 all_done "$queue" "$n"; }
    wait_for 600 "all $n jobs of $queue done" finished
    for p in "${pids[@]}"; do stop_pid "$p"; done
    pids=()
    [ "$(doubled "$queue")" = 0 ] || die "$queue: keys with two effects"
    # Every job took its lock: a run without Redis would measure less work.
    ! grep -h 'redis unavailable' "$work/$queue".host*.log >&2 ||
        die "$queue: a host ran without Redis locks (logs: $work)"
    rate=$(sql -c "SELECT round((count(*) - 1) / extract(epoch FROM max(created_at) - min(created_at)))
                     FROM sekali_test.effects WHERE queue = '$queue'")
    drop_queue "$queue"
    queue=''
}

# quiesce: wait (at most 5 s) for the CPUs to be less than 15 % busy for
# half a second, so a run does not start on the previous one's tail (the
# machine is shared: if it stays busy, the run goes ahead and says so).
quiesce() {
    local a b i total idle busy=100 _
    for _ in $(seq 1 10); do
        read -r -a a < <(head -n 1 /proc/stat); sleep 0.5; read -r -a b < <(head -n 1 /proc/stat)
        total=0; for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
        idle=$((b[4] - a[4] + b[5] - a[5]))
        busy=$(( total > 0 ? (total - idle) * 100 / total : 0 ))
        (( busy < 15 )) && return 0
    done
    say "note: the machine was still $busy% busy after 5 s of waiting; this run includes that load"
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }

# Rounds: each round runs every configuration once, so that load from
# elsewhere on the machine (it is shared) falls on all of them alike, and
# each ratio is taken against its own round's baseline, then the median.
specs=("short 1 classic" "short 2 classic" "short 3 classic" "short 1 quorum"
       "wait 1 classic" "wait 2 classic" "wait 3 classic")
declare -A rates ratios
for r in $(seq 1 "$repeats"); do
    for spec in "${specs[@]}"; do
        read -r w h t <<<"$spec"
        one_run "$w" "$h" "$t"
        rates[$spec]="${rates[$spec]:-} $rate"
        [ "$h" = 1 ] && [ "$t" = classic ] && last[$w]=$rate
        ratios[$spec]="${ratios[$spec]:-} $(ratio "$rate" "${last[$w]}")"
        say "round $r: $w, $h host(s), $t queue: $rate jobs/s"
    done
done

printf '\n| workload | hosts | queue | jobs/s (median of %s) | runs | ratio (median) |\n|---|---|---|---|---|---|\n' "$repeats"
for spec in "${specs[@]}"; do
    read -r w h t <<<"$spec"
    # shellcheck disable=SC2086  # lists of numbers
    printf '| %s | %s | %s | %s | %s | %s |\n' "$w" "$h" "$t" "$(median ${rates[$spec]})" \
        "$(runs=$(echo ${rates[$spec]}); echo "${runs// /, }")" "$(median ${ratios[$spec]})"  # echo: trims
done
printf '\nratio: against the same round'"'"'s 1 host on a classic queue; %s CPUs, %s workers per host\n' \
    "$(nproc)" "$workers"
exit 0
}
