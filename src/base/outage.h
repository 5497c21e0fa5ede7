/* outage.h - one server's outage: when it began, when to ask again, and
 * whether its start and end are still to be logged.
 *
 * Every process that keeps a connection (a worker's links, its heartbeat
 * thread, the outbox relay, the janitor) meets servers that go away and come
 * back, and treats that alike: log the outage when it begins and when it
 * ends, once each however many calls fail in between (a log line per job
 * would flood the log), and space the attempts with jittered backoff (a
 * fleet of workers must not hammer a server that is coming back up). This
 * is that policy; the caller decides what a failure is and writes the two
 * lines (SK_EVENT_OUTAGE_BEGIN and _END, log.h) when told to.
 *
 * Plain data, no lock: each tracker belongs to one thread. */
#ifndef SK_OUTAGE_H
#define SK_OUTAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "backoff.h"

struct sk_outage {
    struct sk_backoff backoff;
    bool              down;         /* from a failure to the first success after it */
    int64_t           retry_at_ms;  /* sk_now_ms() from which the server may be asked */
};

/* An outage tracker whose backoff grows from base_ms to cap_ms. */
#define SK_OUTAGE_INIT(base, cap) \
    ((struct sk_outage){ .backoff = { .base_ms = (base), .cap_ms = (cap) } })

/* A call on the server failed for want of the server: the outage begins or
 * goes on, and the next attempt waits the backoff's next delay (see
 * sk_outage_wait_ms()). Returns true when this failure began the outage:
 * the caller logs it then, and only then. */
bool sk_outage_failed(struct sk_outage *o);

/* The server is known gone, but the next attempt is due at once (a dropped
 * connection that the caller reopens and backs off from itself, or a loop
 * that already runs on a fixed tick): the outage begins without a delay.
 * Returns true when it began, as sk_outage_failed(). */
bool sk_outage_begin(struct sk_outage *o);

/* A call failed on a server that answered (a statement, not the
 * connection): no outage begins, but the next attempt still waits the
 * backoff's next delay, so that a failing statement does not spin. */
void sk_outage_pause(struct sk_outage *o);

/* A call on the server succeeded: the outage, if any, is over and the
 * backoff starts again from its base. Returns true when this ended an
 * outage: the caller logs the end then. */
bool sk_outage_ok(struct sk_outage *o);

/* True during an outage while its backoff runs: do not ask the server yet
 * (an unreachable host would cost a connect timeout per attempt). */
bool sk_outage_waiting(const struct sk_outage *o);

/* Milliseconds until the next attempt is due, 0 if it is due now: for a
 * loop that sleeps out the backoff. Counts a pause as well as an outage. */
uint32_t sk_outage_wait_ms(const struct sk_outage *o);

#endif
