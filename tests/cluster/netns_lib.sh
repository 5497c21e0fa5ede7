# tests/cluster/netns_lib.sh - sekalid "hosts" in network namespaces, for
# test_netns.sh and bench_cluster.sh: the namespaces, their links, and a
# private set of test servers that listens on an address of ours.
#
# Sourced after sekalid_lib.sh. Needs root (ip netns).
#
# The layout, all of it created here and removed by net_down:
#   veth NS-srv0 <-> NS-srv1, both ends in this namespace, up, with
#       SRV_ADDR (10.N.0.1/32) on NS-srv0: the servers listen there and on
#       127.0.0.1, never on an outside interface. Its own pair, so that no
#       host's link going down takes the servers' address with it.
#   for host i: namespace NS-hI, veth NS-vI (here, 10.N.I.1/24) <-> NS-pI
#       (inside, 10.N.I.2/24), a route to SRV_ADDR through 10.N.I.1.
# Cutting host i sets NS-vI down: its TCP connections see no RST and no
# FIN, only silence, as with a pulled cable or a partition.
# NS is NETNS_PREFIX [sk7] and N NETNS_NET [77]: 10.77.x.x by default.

# shellcheck shell=bash
# shellcheck disable=SC2154  # work: set by the sourcing script

ns_prefix=${NETNS_PREFIX:-sk7}
ns_net=${NETNS_NET:-77}
[[ $ns_prefix =~ ^[a-z0-9]{1,6}$ ]] || die "NETNS_PREFIX must be 1 to 6 of a-z 0-9"
[[ $ns_net =~ ^[0-9]+$ ]] && [ "$ns_net" -ge 1 ] && [ "$ns_net" -le 254 ] || die "NETNS_NET must be 1..254"
SRV_ADDR=10.$ns_net.0.1
[ "$(id -u)" = 0 ] || die "network namespaces need root"
command -v ip >/dev/null || die "no ip command: apt-get install iproute2"

host_ns() { printf '%s-h%s' "$ns_prefix" "$1"; }
host_addr() { printf '10.%s.%s.2' "$ns_net" "$1"; }
host_link() { printf '%s-v%s' "$ns_prefix" "$1"; }

# net_up N: the server address and N namespaces (an earlier run's leftovers
# of the same names are removed first).
net_up() {
    net_down
    ip link add "$ns_prefix-srv0" type veth peer name "$ns_prefix-srv1"
    ip addr add "$SRV_ADDR/32" dev "$ns_prefix-srv0"
    ip link set "$ns_prefix-srv0" up
    ip link set "$ns_prefix-srv1" up
    local i ns
    for i in $(seq 1 "$1"); do
        ns=$(host_ns "$i")
        ip netns add "$ns"
        ip link add "$(host_link "$i")" type veth peer name "$ns_prefix-p$i"
        ip link set "$ns_prefix-p$i" netns "$ns"
        ip addr add "10.$ns_net.$i.1/24" dev "$(host_link "$i")"
        ip link set "$(host_link "$i")" up
        ip -n "$ns" addr add "$(host_addr "$i")/24" dev "$ns_prefix-p$i"
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$ns_prefix-p$i" up
        ip -n "$ns" route add "$SRV_ADDR/32" via "10.$ns_net.$i.1"
    done
}

# net_down: every namespace and link of ours, whether or not net_up made it
# in this run. Deleting a namespace deletes the veth end inside it, and
# with it the pair.
net_down() {
    local ns l
    for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }'); do
        [[ $ns == "$ns_prefix"-h* ]] && ip netns delete "$ns" 2>/dev/null || true
    done
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
        [[ $l == "$ns_prefix"-v* || $l == "$ns_prefix-srv0" ]] && ip link delete "$l" 2>/dev/null || true
    done
}

# reaches I PORT: host i can open a TCP connection to SRV_ADDR:PORT (1 s).
reaches() {
    ip netns exec "$(host_ns "$1")" timeout 1 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$SRV_ADDR" "$2" 2>/dev/null
}
link_state() { ip -br link show "$(host_link "$1")" 2>/dev/null | awk '{ print $2 }'; }
cut_link() { ip link set "$(host_link "$1")" down; }
restore_link() { ip link set "$(host_link "$1")" up; }

# shellcheck disable=SC2034  # NS_*: used by the sourcing scripts
# srv_ns_up: the test's private servers (srv_up), also listening on
# SRV_ADDR, and the URLs by which the namespaces reach them.
srv_ns_up() {
    srv_up "$SRV_ADDR/16"
    NS_AMQP_URL="amqp://$SEKALI_AMQP_USER:$SEKALI_AMQP_PASSWORD@$SRV_ADDR:$SEKALI_AMQP_PORT/%2f"
    # keepalives and tcp_user_timeout: a session whose peer went silent
    # fails in seconds, not after the kernel's two hours of keepalive.
    NS_PG_CONNINFO="host=$SRV_ADDR port=$SEKALI_PG_PORT dbname=sekali user=sekali password=sekali keepalives_idle=2 keepalives_interval=1 keepalives_count=3 tcp_user_timeout=5000"
}

# run_in I CONF LOG: sekalid on host i, in the background; sets $!.
# `ip netns exec` execs sekalid after entering the namespace: $! is its pid.
run_in() {
    ip netns exec "$(host_ns "$1")" "$build/sekalid" -c "$2" 2>"$3" &
}
