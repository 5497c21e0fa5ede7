#!/usr/bin/env bash
# tests/cluster/test_rabbitmq_leader_amqps.sh - test_rabbitmq_leader with
# amqps:// nodes: the nodes serve TLS (one test CA, client certificates
# required), sekalid verifies each node's certificate and presents its own.
# Beyond the plain test it proves, in the broker's view, that every sekalid
# connection was TLS with the client certificate before the kill and is
# again, on a live node's TLS listener, after the failover. The run itself
# is tests/cluster/rabbitmq_leader.sh.
#
#   tests/cluster/test_rabbitmq_leader_amqps.sh [BUILD_DIR]     (through tests/cluster/run.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
name=test_rabbitmq_leader_amqps
amqps=1
# shellcheck source=tests/cluster/lib.sh
. tests/cluster/lib.sh
# shellcheck source=tests/cluster/rabbitmq_leader.sh
. tests/cluster/rabbitmq_leader.sh
