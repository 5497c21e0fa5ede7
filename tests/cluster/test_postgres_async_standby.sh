#!/usr/bin/env bash
# tests/cluster/test_postgres_async_standby.sh - what an asynchronous
# standby loses. The same failover as the synchronous test, but a COMMIT
# returns once the primary has it: sekalid acks the message, and when the
# primary dies before its WAL reached the standby, the promoted standby has
# neither the effect nor the completion, and the broker no longer has the
# message. The test passes when it shows exactly that: keys lost, every one
# of them committed on the old primary after the standby stopped taking WAL
# (at risk), none doubled. sekali needs synchronous replication
# (synchronous_standby_names, synchronous_commit = on or stronger) for no
# loss; see docs/operations.md, "PostgreSQL failover".
set -euo pipefail
cd "$(dirname "$0")/../.."
name=test_postgres_async_standby
mode=async
# shellcheck source=tests/cluster/lib.sh
. tests/cluster/lib.sh
# shellcheck source=tests/cluster/postgres.sh
. tests/cluster/postgres.sh
echo "$summary lost_outside_risk=$lost_outside"
[ "$doubled" = 0 ] || die "$doubled keys have more than one effect"
[ "$lost_outside" = 0 ] || die "$lost_outside lost keys were not committed past the standby: a bug, not replication"
[ "$lost" -gt 0 ] || die "no key lost: the asynchronous loss did not show (at risk: $at_risk)"
say "as expected: $lost keys acked on the old primary never reached the standby and are lost"
