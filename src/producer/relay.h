/* relay.h - the outbox relay process (see relay.c). */
#ifndef SK_RELAY_H
#define SK_RELAY_H

#include "config.h"
#include "metrics.h"
#include "scoreboard.h"

/* Runs a relay in the calling (freshly forked) process until SIGTERM or
 * SIGINT; returns the exit code. slot is its place in the scoreboard; the
 * relay counts what it publishes, and samples the outbox's backlog, into
 * metrics. */
int sk_relay_run(const struct sk_conf *conf, struct sk_slot *slot, struct sk_metrics *metrics);

#endif
