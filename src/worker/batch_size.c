/* batch_size.c - how many jobs a worker's batch takes.
 *
 * What a batch pays once, whatever its size, is a few round trips: the
 * lock, the claim and the COMMIT (the broker's refill overlaps them while
 * the window holds two batches). Near PostgreSQL those cost well under a
 * millisecond, and the queue's batch, small, keeps each job's wait for its
 * batch-mates short. Far away they are most of a job's cost, and only more
 * jobs a batch spread them: at 20 ms each way batch 64 ran 2.3 times batch
 * 16 (docs/benchmark.md). So each worker measures its own round trips (the
 * least of its last claims and COMMITs, store.c, and of its last Redis
 * pipelines, redis_link.c), and for the farther server doubles its batch for
 * each doubling past SK_BATCH_NEAR_RTT_NS, up to the queue's batch_max;
 * its prefetch window, when sekali chooses it, follows at two batches, so
 * that the next batch is arriving while one runs.
 *
 * "Far" is what a round trip costs, not where the server is: on a machine
 * whose cores are all busy a loopback round trip waits for a core too, and
 * there a larger batch, fewer round trips a job, is what raises the rate
 * (make bench-distance's 0 ms runs, 16 workers on 2 cores). Such a round
 * trip moves by several times from one batch to the next, so a batch
 * shrinks only SK_BATCH_KEEP batches after it changed, when the estimate
 * is made of round trips of its new size (it grows at once, on the first
 * round trips: a far server's first seconds are the ones a small batch
 * wastes, and a worker starting among many may grow for the crowd), and the
 * window only grows: a new window is a new consumer, three round trips,
 * while a window larger than the batch costs nothing but deliveries held
 * (handed back if the worker dies).
 *
 * A larger batch helps only while its transaction does not close early:
 * a handler that waits for its own statement spends a round trip a job,
 * the transaction closes after 16 round trips of handlers (span.c), and
 * the keys it gives back are claimed again by the next one. So a batch
 * never grows past the handlers a transaction last ran before closing, and
 * tries a larger one again only SK_BATCH_RETRY_AFTER batches later (the
 * mix of jobs may have changed).
 *
 * RabbitMQ fixes a consumer's prefetch when it subscribes, so a new window
 * is a new consumer on the same channel (sk_broker_set_prefetch()); the
 * deliveries the old one was sent stay ours and are run and acked as
 * usual. It changes between batches, with no delivery in hand. */
#include <stdio.h>

#include "batch_size.h"
#include "config.h"
#include "links.h"
#include "log.h"
#include "pipeline.h"
#include "store.h"

static int grown(const struct sk_queue_conf *q, int ceiling, uint64_t rtt_ns);
static int clamp(int n, int least, int most);

int sk_batch_size_next(struct sk_batch_size *bs, const struct sk_queue_conf *q, uint64_t rtt_ns,
                       size_t ran)
{
    if (bs->now == 0)
        *bs = (struct sk_batch_size){ .now = q->batch, .ceiling = q->batch_max };
    bs->kept++;
    if (ran > 0) {
        /* ran is at most the span's size, batch_max. */
        bs->ceiling = clamp((int)ran, q->batch, q->batch_max);
        bs->calm = 0;
    } else if (bs->ceiling < q->batch_max && ++bs->calm >= SK_BATCH_RETRY_AFTER) {
        bs->ceiling = clamp(2 * bs->ceiling, q->batch, q->batch_max);
        bs->calm = 0;
    }
    int want = bs->now;
    int fits = rtt_ns != 0 ? grown(q, bs->ceiling, rtt_ns) : bs->now;
    if (fits > bs->now ||
        (bs->kept >= SK_BATCH_KEEP && grown(q, bs->ceiling, 2 * rtt_ns) < bs->now))
        want = fits;
    want = clamp(want, q->batch, bs->ceiling);
    if (want != bs->now)
        bs->kept = 0;
    bs->now = want;
    return want;
}

/* The queue's batch, doubled while the round trip is more than the near
 * one times the doublings so far, up to ceiling. */
static int grown(const struct sk_queue_conf *q, int ceiling, uint64_t rtt_ns)
{
    int size = q->batch;
    for (uint64_t near = SK_BATCH_NEAR_RTT_NS; rtt_ns > near && size < ceiling; near *= 2)
        size = clamp(2 * size, size, ceiling);
    return size;
}

static int clamp(int n, int least, int most)
{
    return n < least ? least : n > most ? most : n;
}

void sk_batch_size_update(struct sk_pipeline *p, size_t ran_before_close)
{
    const struct sk_queue_conf *q = p->queue;
    if (q->batch_max <= q->batch)
        return;
    int was = p->batch.now > 0 ? p->batch.now : q->batch;
    /* The lock's round trip is a batch's too: the farther server decides. */
    uint64_t pg = sk_store_rtt_ns(sk_links_store(p->links));
    uint64_t redis = sk_links_redis_rtt_ns(p->links);
    uint64_t rtt = pg > redis ? pg : redis;
    const char *server = pg >= redis ? "PostgreSQL" : "Redis";
    int now = sk_batch_size_next(&p->batch, q, rtt, ran_before_close);
    if (now == was)
        return;
    sk_log_debug("queue %s: %s's round trip is %.1f ms%s: batches of up to %d (were %d)",
                 q->name, server, (double)rtt / 1e6,
                 ran_before_close > 0 ? " and a transaction closed early" : "", now, was);
    /* The window only grows (see above). */
    int prefetch = clamp(2 * now, q->prefetch, q->prefetch_max);
    if (prefetch <= sk_links_prefetch(p->links))
        return;
    char batch[16], window[16], rtt_ms[24];
    snprintf(batch, sizeof(batch), "%d", now);
    snprintf(window, sizeof(window), "%d", prefetch);
    snprintf(rtt_ms, sizeof(rtt_ms), "%.1f", (double)rtt / 1e6);
    const struct sk_log_field fields[] = {
        { "batch", batch }, { "prefetch", window }, { "rtt_ms", rtt_ms },
    };
    sk_log_event_fields(SK_LOG_INFO, SK_EVENT_BATCH_RESIZED,
                        pg >= redis ? SK_SERVER_POSTGRES : SK_SERVER_REDIS,
                        &(struct sk_log_job){ .queue = q->name }, fields, SK_ARRAY_LEN(fields),
                        "queue %s: %s's round trip is %s ms: batches of up to %d, prefetch %d",
                        q->name, server, rtt_ms, now, prefetch);
    sk_links_set_prefetch(p->links, prefetch);
}
