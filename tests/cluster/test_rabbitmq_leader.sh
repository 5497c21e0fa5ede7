#!/usr/bin/env bash
# tests/cluster/test_rabbitmq_leader.sh - a 3-node RabbitMQ cluster loses the
# node that leads the work queue mid-run: sekalid, given all three nodes in
# amqp.url, fails over to a live node, and every key has exactly one effect.
# The run itself is tests/cluster/rabbitmq_leader.sh.
#
#   tests/cluster/test_rabbitmq_leader.sh [BUILD_DIR]     (through tests/cluster/run.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
name=test_rabbitmq_leader
amqps=0
# shellcheck source=tests/cluster/lib.sh
. tests/cluster/lib.sh
# shellcheck source=tests/cluster/rabbitmq_leader.sh
. tests/cluster/rabbitmq_leader.sh
