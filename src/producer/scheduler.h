/* scheduler.h - the scheduler process: enqueues the ticks of the
 * configured schedules (see scheduler.c). */
#ifndef SK_SCHEDULER_H
#define SK_SCHEDULER_H

#include "config.h"
#include "metrics.h"
#include "scoreboard.h"

/* Runs the scheduler in the calling (freshly forked, single-threaded)
 * process until SIGTERM or SIGINT, counting into metrics (created for
 * conf's schedules); returns the exit code. The supervisor starts one per
 * generation when conf has schedules. */
int sk_scheduler_run(const struct sk_conf *conf, struct sk_slot *slot,
                     struct sk_metrics *metrics);

#endif
