/* ticks.h - which of a schedule's ticks to enqueue now: the ticks due
 * since the last one enqueued, sorted into on time and missed, and the
 * missed ones kept, reduced or dropped by the schedule's `missed` policy.
 *
 * Pure arithmetic on Unix seconds, so that what happens after downtime is
 * table-tested without servers (tests/unit/check_cron.c). */
#ifndef SK_TICKS_H
#define SK_TICKS_H

#include <stddef.h>
#include <stdint.h>

#include "cron.h"

/* What to do with ticks that passed while no scheduler ran. */
enum sk_missed {
    SK_MISSED_SKIP = 0,   /* none of them: go on with the next on-time tick */
    SK_MISSED_ONCE,       /* the latest of them, once */
    SK_MISSED_ALL,        /* each of them, up to SK_TICKS_CATCHUP_MAX, the newest */
};

/* The most missed ticks `all` enqueues after one outage; older ones are
 * dropped (and counted). */
#define SK_TICKS_CATCHUP_MAX 1000
/* Ticks further back than this are never looked at: a schedule that was
 * down for longer catches up on its last week at most. */
#define SK_TICKS_LOOKBACK_S (7 * 86400)

struct sk_ticks {
    int64_t *at;        /* the caller's array of `cap` ticks to enqueue, oldest first */
    size_t   cap;
    size_t   n;         /* filled */
    size_t   dropped;   /* due ticks not enqueued: missed and skipped, or past the bounds */
    int64_t  latest;    /* the newest due tick (the schedule's new last tick), or `last` */
};

/* The ticks of c due in (last, now]: a tick is on time when now is at most
 * grace_s after it, missed otherwise. Every on-time tick is enqueued; the
 * missed ones as `missed` says. If more are to be enqueued than t->cap, the
 * newest are kept. Sets every field of t but at and cap. Single-threaded
 * callers only (sk_cron_next()). */
void sk_ticks_due(const struct sk_cron *c, int64_t last, int64_t now, uint32_t grace_s,
                  enum sk_missed missed, struct sk_ticks *t);

/* t as an ISO 8601 UTC time, "2026-12-01T03:00:00Z", into buf (>= 21 bytes). */
void sk_ticks_iso(int64_t t, char *buf, size_t size);

#endif
