/* pause.h - a worker obeys its queue's pause (sekalictl pause, sql/019).
 *
 * The pause is a row in PostgreSQL, so that every host's workers see it and
 * it outlives restarts. Between jobs, the worker asks this module whether
 * it may take a delivery: the module reads the row when told of a change
 * (LISTEN sekali_pause on the worker's own store connection, read without
 * a round trip) or when its poll is due, and has the links cancel or
 * resubscribe the consumer. Used by the worker's main thread only. */
#ifndef SK_PAUSE_H
#define SK_PAUSE_H

#include <stdbool.h>
#include <stdint.h>

struct sk_links;
struct sk_pause;

/* queue is borrowed for the pause's life. Returns NULL out of memory. */
struct sk_pause *sk_pause_new(const char *queue);
void sk_pause_free(struct sk_pause *pz);

/* Before each delivery, once sk_links_ready() said true. Returns false when
 * the queue runs: take a delivery. True while it is paused: the consumer
 * is cancelled (its prefetched deliveries went back to the queue), and
 * this call waited up to wait_ms for a NOTIFY; the caller turns its loop.
 * While PostgreSQL cannot be asked, the state last read holds. Blocks at
 * most wait_ms plus a round trip to each server. */
bool sk_pause_hold(struct sk_pause *pz, struct sk_links *links, uint32_t wait_ms);

#endif
