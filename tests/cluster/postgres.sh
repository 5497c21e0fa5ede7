# tests/cluster/postgres.sh - the PostgreSQL failover run that
# test_postgres_sync_standby.sh and test_postgres_async_standby.sh share:
# a primary with one streaming standby, libpq's multi-host conninfo in
# sekalid, the primary stopped in immediate mode mid-run while the standby
# lags, the standby promoted.
#
# Sourced by those tests after lib.sh, with `mode` set to sync or async:
#   sync:  synchronous_standby_names = 'standby', synchronous_commit = on
#          (sekalid raises its sessions to on itself): a COMMIT returns
#          only once the standby has the WAL.
#   async: synchronous_standby_names = '': a COMMIT returns once the
#          primary alone has it.
# The fault: the primary's walsender is SIGSTOPped, so that the standby
# gets no more WAL (a slow network or standby, made certain); then, once the
# primary has gone on past the standby (async: keys committed since; sync:
# COMMITs waiting on the standby, seen in pg_stat_activity), the primary is
# stopped with pg_ctl -m immediate and the standby promoted. sekalid's conninfo names both hosts with target_session_attrs =
# read-write, so its workers reconnect to whichever is primary.
# Sets: keys, effects, doubled, lost, completed, duplicates, pause,
# at_risk (keys committed on the old primary after the standby stopped
# taking WAL), lost_outside (lost keys that were not at risk), killed.
# shellcheck shell=bash
# shellcheck disable=SC2154  # mode, name, work, port_base: set by the test and lib.sh

keys=${SEKALI_CLUSTER_KEYS:-2000}
job_ms=${SEKALI_CLUSTER_JOB_MS:-3}
queue=cluster-pg-$mode
p1=$((port_base + 120)) p2=$((port_base + 121))
amqp=$((port_base + 100))
url="amqp://sekali:sekali@127.0.0.1:$amqp/%2f"
conninfo="host=127.0.0.1,127.0.0.1 port=$p1,$p2 dbname=sekali user=sekali password=sekali target_session_attrs=read-write connect_timeout=2"
one() { echo "host=127.0.0.1 port=$1 dbname=${2:-sekali} user=sekali password=sekali connect_timeout=2"; }
pgbin=$(tests/servers.sh pg-bindir) || die "no PostgreSQL server binaries"
as_pg() { runuser -u postgres -- "$@"; }

# pg_node DIR PORT [STANDBY_NAMES]: the server's own settings. The primary
# waits for the standby only once it streams (before, every COMMIT would
# hang), and the standby, once promoted, runs alone: it waits for nobody.
pg_node() {
    as_pg tee "$1/data/sekali.conf" >/dev/null <<CONF
listen_addresses = '127.0.0.1'
port = $2
unix_socket_directories = '$1/run'
max_connections = 100
shared_buffers = 64MB
wal_level = replica
max_wal_senders = 5
hot_standby = on
synchronous_commit = on
synchronous_standby_names = '${3:-}'
fsync = off
CONF
}

pg_start() {
    as_pg "$pgbin/pg_ctl" start -D "$1/data" -l "$1/log" -w -t 60 -s ||
        { tail -n 20 "$1/log" >&2; die "pg_ctl start $1 failed"; }
}

t_setup=$(now_ms)
start_redis
srv_start single rabbitmq SEKALI_AMQP_PORT="$amqp" SEKALI_AMQP_DIST_PORT=$((amqp + 1)) \
    SEKALI_EPMD_PORT=$((amqp + 15)) SEKALI_RABBIT_NODE="sekali-pg@localhost" \
    SEKALI_PG_PORT=$((amqp + 16)) SEKALI_REDIS_PORT=$((amqp + 17))
ctl() { timeout 60 "$work/single/bin/rabbitmqctl" "$@"; }

# The primary.
mkdir -p "$work/pg1/data" "$work/pg1/run" "$work/pg2/run"
chown -R postgres:postgres "$work/pg1" "$work/pg2"
chmod 700 "$work/pg1/data"
as_pg "$pgbin/initdb" -D "$work/pg1/data" -U postgres -E UTF8 --locale=C --auth-local=trust \
    --auth-host=scram-sha-256 >"$work/initdb.log" 2>&1 || { cat "$work/initdb.log" >&2; die "initdb failed"; }
echo "include 'sekali.conf'" | as_pg tee -a "$work/pg1/data/postgresql.conf" >/dev/null
as_pg tee "$work/pg1/data/pg_hba.conf" >/dev/null <<HBA
local all         all                 trust
host  all         all   127.0.0.1/32  scram-sha-256
host  replication all   127.0.0.1/32  trust
HBA
pg_node "$work/pg1" "$p1"
pg_start "$work/pg1"
stops+=("as_pg $pgbin/pg_ctl stop -D $work/pg1/data -m immediate -s || true")
as_pg psql -X -q -h "$work/pg1/run" -p "$p1" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE sekali LOGIN SUPERUSER PASSWORD 'sekali'" -c "CREATE DATABASE sekali OWNER sekali" \
    >/dev/null || die "could not create role and database"

# The standby: a base backup of the primary that streams from it, by the
# name synchronous_standby_names knows.
as_pg "$pgbin/pg_basebackup" -h 127.0.0.1 -p "$p1" -U postgres -D "$work/pg2/data" -X stream \
    >"$work/basebackup.log" 2>&1 || { cat "$work/basebackup.log" >&2; die "pg_basebackup failed"; }
as_pg touch "$work/pg2/data/standby.signal"
echo "primary_conninfo = 'host=127.0.0.1 port=$p1 user=postgres application_name=standby'" |
    as_pg tee -a "$work/pg2/data/postgresql.auto.conf" >/dev/null
pg_node "$work/pg2" "$p2"
pg_start "$work/pg2"
stops+=("as_pg $pgbin/pg_ctl stop -D $work/pg2/data -m immediate -s || true")
want=$([ "$mode" = sync ] && echo sync || echo async)
streaming() {
    [ "$(sql "$(one "$p1")" -c "SELECT sync_state FROM pg_stat_replication
                                WHERE application_name = 'standby' AND state = 'streaming'")" = "$want" ]
}
if [ "$mode" = sync ]; then
    pg_node "$work/pg1" "$p1" standby
    as_pg "$pgbin/pg_ctl" reload -D "$work/pg1/data" -s || die "pg_ctl reload failed"
fi
wait_for 60 "the standby streaming from the primary as $want" streaming
say "primary :$p1 and $want standby :$p2 up in $(( ($(now_ms) - t_setup) / 1000 )) s"

conf=$work/sekali.yaml
write_conf "$conf" "\"$url\"" "$conninfo" "$queue"
schema "$conf" "$conninfo"

published=$("$producer" "$url" "$queue" "$keys" 30 "${SEKALI_CLUSTER_SEED:-42}" "sleep:$job_ms") ||
    die "the producer failed"
say "$published"
copies=${published##*copies=}

start_sekalid "$conf"
at_least() { [ "$(done_keys "$conninfo" "$queue")" -ge "$1" ]; }
wait_for 120 "a third of the keys done before the fault" at_least $((keys / 3))

# The fault.
# The primary's walsender, not the standby's walreceiver: WAL already in
# the socket would still reach a walreceiver resumed before the promotion.
sender=$(sql "$(one "$p1")" -c "SELECT pid FROM pg_stat_replication WHERE application_name = 'standby'")
[ -n "$sender" ] || die "the primary has no walsender for the standby"
stall_ms=$(now_ms)
stall_keys=$(sql "$(one "$p1")" -c "SELECT string_agg(DISTINCT idempotency_key, ' ')
                                     FROM sekali_test.effects WHERE queue = '$queue'")
kill -STOP "$sender"
stops+=("kill -CONT $sender 2>/dev/null || true")
say "the primary's walsender (pid $sender) stopped"
if [ "$mode" = sync ]; then
    waiting() {
        [ "$(sql "$(one "$p1")" -c "SELECT count(*) FROM pg_stat_activity
                                    WHERE wait_event = 'SyncRep'")" -ge 1 ]
    }
    wait_for 30 "a COMMIT waiting for the stopped standby" waiting
else
    base=$(done_keys "$(one "$p1")" "$queue")
    ahead() { [ "$(done_keys "$(one "$p1")" "$queue")" -ge $((base + 50)) ]; }
    wait_for 30 "50 keys committed on the primary past the stopped standby" ahead
fi
pm=$(as_pg head -n 1 "$work/pg1/data/postmaster.pid")
kill_ms=$(now_ms)
# Immediate mode: the postmaster SIGQUITs every child. The stopped
# walsender is resumed only once its SIGQUIT is pending, so that it exits
# before it can send another byte (a stopped process would be SIGKILLed
# only after 5 s, which the pause would count).
as_pg "$pgbin/pg_ctl" stop -D "$work/pg1/data" -m immediate -W -s ||
    die "pg_ctl stop -m immediate failed"
quit_pending() {
    local v
    for v in $(awk '/^(ShdPnd|SigPnd):/ { print $2 }' "/proc/$sender/status" 2>/dev/null); do
        (( 0x$v & 4 )) && return 0
    done
    return 1
}
wait_for 10 "SIGQUIT pending on the stopped walsender (pid $sender)" quit_pending
kill -CONT "$sender"
wait_for 10 "the primary's postmaster (pid $pm) dead" dead "$pm"
dead "$sender" || die "the walsender (pid $sender) outlived its primary"
as_pg "$pgbin/pg_ctl" promote -D "$work/pg2/data" -w -t 60 -s || die "pg_ctl promote failed"
promoted() { [ "$(sql "$(one "$p2")" -c "SELECT pg_is_in_recovery()")" = f ]; }
wait_for 60 "the standby promoted" promoted
killed="postgres-primary(pid $pm,immediate,standby $mode,stalled $(( kill_ms - stall_ms ))ms)"
say "primary stopped (immediate, postmaster $pm), standby promoted"

# The run ends when every key is done, or (keys lost) when the queue holds
# nothing more and nothing moved for 10 s.
depth() {
    ctl -q list_queues name messages --formatter json |
        python3 -c "import json,sys; print(sum(q.get('messages') or 0 for q in json.load(sys.stdin) if q['name'] == '$queue'))"
}
end=$(( $(now_ms) + 120000 )) last=-1 still_since=$(now_ms)
while :; do
    n=$(done_keys "$conninfo" "$queue" 2>/dev/null || echo "$last")
    [ "$n" -ge "$keys" ] && break
    [ "$n" = "$last" ] || still_since=$(now_ms)
    last=$n
    if (( $(now_ms) - still_since >= 10000 )) && [ "$(depth)" = 0 ]; then
        say "the queue is empty and $n of $keys keys have an effect"
        break
    fi
    (( $(now_ms) < end )) || die "only $n of $keys keys done 120 s after the failover"
    sleep 0.2
done
drained() { [ "$(depth)" = 0 ]; }
wait_for 60 "the queue drained of its copies" drained
stop_sekalid
# At risk: keys the old primary committed after the walsender stopped. Its
# data survived the immediate stop; started alone, with sekalid gone, it
# tells which (then stops again: two primaries must not serve).
pg_start "$work/pg1"
risk_list=$(sql "$(one "$p1")" -c "SELECT DISTINCT idempotency_key FROM sekali_test.effects
                                    WHERE queue = '$queue'" | sort |
            comm -13 <(tr ' ' '\n' <<<"$stall_keys" | grep -v '^$' | sort) -)
as_pg "$pgbin/pg_ctl" stop -D "$work/pg1/data" -m immediate -s || die "pg_ctl stop failed"
at_risk=$(printf '%s\n' "$risk_list" | grep -c . || true)
pause=$(pause_around "$conninfo" "$queue" "$kill_ms")
tally "$conninfo" "$queue" "$keys"
# Which lost keys were at risk: a lost key that was not is a bug.
lost_list=$(comm -23 <(seq -f "$queue-%g" 1 "$keys" | sort) \
                     <(sql "$conninfo" -c "SELECT DISTINCT idempotency_key FROM sekali_test.effects
                                           WHERE queue = '$queue'" | sort))
lost_outside=$(comm -23 <(printf '%s\n' "$lost_list" | grep -v '^$' | sort) \
                        <(printf '%s\n' "$risk_list" | grep -v '^$' | sort) | grep -c . || true)
summary="$name: killed=$killed pause_ms=$pause keys=$keys effects=$effects"
summary+=" duplicates=$duplicates(copies published=$copies) doubled=$doubled"
summary+=" lost=$lost at_risk=$at_risk"
