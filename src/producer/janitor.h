/* janitor.h - the retention process (see janitor.c). */
#ifndef SK_JANITOR_H
#define SK_JANITOR_H

#include "config.h"
#include "metrics.h"
#include "scoreboard.h"

/* Runs the janitor in the calling (freshly forked) process until SIGTERM
 * or SIGINT; returns the exit code. */
int sk_janitor_run(const struct sk_conf *conf, struct sk_slot *slot, struct sk_metrics *metrics);

#endif
