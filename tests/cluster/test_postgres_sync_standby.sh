#!/usr/bin/env bash
# tests/cluster/test_postgres_sync_standby.sh - PostgreSQL fails over to a
# synchronous standby mid-run (the primary stopped in immediate mode while
# the standby lags, the standby promoted): sekalid's workers reconnect
# through libpq's multi-host conninfo (target_session_attrs=read-write) and
# every key has exactly one effect: no COMMIT was reported done before the
# standby had it. The run itself is tests/cluster/postgres.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=test_postgres_sync_standby
mode=sync
# shellcheck source=tests/cluster/lib.sh
. tests/cluster/lib.sh
# shellcheck source=tests/cluster/postgres.sh
. tests/cluster/postgres.sh
echo "$summary"
[ "$doubled" = 0 ] || die "$doubled keys have more than one effect"
[ "$lost" = 0 ] || die "$lost keys have no effect: a completion acked but not on the standby"
[ "$effects" = "$keys" ] && [ "$completed" = "$keys" ] ||
    die "$effects effects and $completed completed keys for $keys keys"
