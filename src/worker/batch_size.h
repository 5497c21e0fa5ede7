/* batch_size.h - how many jobs a worker's batch takes: the queue's batch
 * near PostgreSQL, more the farther it is (batch_size.c). */
#ifndef SK_BATCH_SIZE_H
#define SK_BATCH_SIZE_H

#include <stddef.h>
#include <stdint.h>

struct sk_pipeline;
struct sk_queue_conf;

struct sk_batch_size;  /* pipeline.h: a worker's batch as it goes */

/* The next batch for a round trip of rtt_ns (0: none measured yet: the
 * batch stays), ran handlers having run in a transaction that
 * closed early (0: none closed early): the queue's batch doubled for each
 * doubling of the round trip past SK_BATCH_NEAR_RTT_NS, up to the
 * ceiling, as soon as the round trip calls for more. An early close
 * lowers the ceiling to what ran, at once; SK_BATCH_RETRY_AFTER calm
 * batches later it doubles again. A batch shrinks only SK_BATCH_KEEP
 * batches or more after its last change, and only once the round trip
 * has fallen below half of what its size calls for: the round trip of a
 * busy machine moves by more than that between batches. */
int sk_batch_size_next(struct sk_batch_size *bs, const struct sk_queue_conf *q, uint64_t rtt_ns,
                       size_t ran);

/* After a batch: p's batch for the next one from the farther of its
 * PostgreSQL and Redis round trips and how many handlers a transaction ran before it closed
 * early (0: none closed early), and, when the prefetch is sekali's to
 * choose, the consumer's window grown to two of those batches (a new
 * window is logged; it never shrinks, see batch_size.c). */
void sk_batch_size_update(struct sk_pipeline *p, size_t ran_before_close);

/* A round trip up to this is a near server's: the queue's batch as set. */
#define SK_BATCH_NEAR_RTT_NS 1000000u
#define SK_BATCH_RETRY_AFTER 64
#define SK_BATCH_KEEP 8

#endif
