/* ctl_delays.h - the retries waiting in a queue's delay queues
 * (ctl_delays.c). */
#ifndef SK_CTL_DELAYS_H
#define SK_CTL_DELAYS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "broker.h"
#include "config.h"

#define SK_CTL_DELAY_BUCKETS 128

/* The delay queues of one queue that exist, shortest delay first: a
 * message in one comes back to the work queue within delay_ms of entering
 * it (the broker does not say when the oldest entered without taking it). */
struct sk_ctl_delays {
    uint32_t n;                 /* delay queues that exist */
    uint32_t messages;          /* waiting in all of them */
    int64_t  read_ms;           /* CLOCK_MONOTONIC ms when the broker was asked */
    struct {
        uint32_t delay_ms, messages;
    } bucket[SK_CTL_DELAY_BUCKETS];
};

/* Probes the ladder of q's delay queues (src/worker/reschedule.c, up to the
 * longest delay sekali schedules for q) with passive declares, which create
 * nothing: a delay queue deletes itself once unused. With the cache on, a
 * reading younger than its age is answered without asking the broker.
 * SK_OK, or the broker's failure in err. Any thread may call it (each with
 * its own broker connection). */
int sk_ctl_delays_read(struct sk_broker *b, const struct sk_queue_conf *q,
                       struct sk_ctl_delays *out, struct sk_err *err);

/* Keeps each queue's reading for ms (0: off, the command line's way), for
 * every later sk_ctl_delays_read() of the process; `sekalictl serve` turns
 * it on before it serves. */
void sk_ctl_delays_cache(unsigned ms);

/* d's buckets as a JSON array of {"delay_ms", "messages"}. */
void sk_ctl_delays_json(FILE *out, const struct sk_ctl_delays *d);

/* GET /api/retries: each queue's delay queues and what waits in them, as
 * JSON; SK_CTL_FAILED (the queues then null, broker_error why) when the
 * broker could not be asked. Takes a connection from the pool. */
int sk_ctl_retries_report(const struct sk_conf *conf, FILE *out);

#endif
