/* batch.c - many deliveries in one transaction (queues[].batch > 1).
 *
 *   collect -> validate each -> lock all -> claim all -> for each:
 *   savepoint, handler -> complete all + COMMIT -> settle each -> release all
 *
 * The guarantee is job.c's, unchanged: every effect commits in the same
 * transaction as its key's completion, and no delivery is acked before
 * that COMMIT. What a batch saves is the per-job round trips and the
 * per-job COMMIT: the locks are taken and released in one pipelined Redis
 * round trip each, the keys claimed by one statement (sekali.claim_many,
 * sql/015), the completions sent with the one COMMIT, and the acks leave
 * as one multiple-ack.
 *
 * A batch runs twice as carefully as it must, at most. First the fast
 * way: the keys are claimed as completed (sekali.claim_completing, sql/016)
 * and every handler runs straight in the one transaction, which commits
 * only if all of them succeed; a job then costs its handler's statements
 * and nothing else. The first handler to fail (RETRY, FAIL, an error, a
 * conflict) rolls the whole transaction back: that job is settled with its
 * outcome, and the rest of the batch is claimed again and run the careful
 * way, each handler inside a savepoint, where a failure rolls back only its
 * job and its claim (sekali.unclaim). So a job's own failure stays its own;
 * the price is that its batch-mates' handlers may run twice, the first run
 * rolled back unseen. A failed job's retry or dead-letter copy is made
 * outside the transaction, as job.c would make it. A worker that dies mid-batch
 * takes the whole uncommitted transaction with it, and every job of the
 * batch is redelivered; the scoreboard names only the job whose handler
 * was running, so only that one is counted as a crash, but it records
 * every lock of the batch, so the replacement frees them all at once.
 *
 * Batching is the default (config.c: batch 16, batch_wait 0): the batch
 * is what the prefetch window already holds, so a queue with little work
 * runs batches of one. A batch also never holds its transaction open for
 * longer than its handlers' batch_close_after: asked before each handler,
 * once that much time has gone the keys of the jobs not yet run are given
 * back (sekali.unclaim_many, sql/021) and the rest commits and is acked;
 * the jobs given back are claimed by the next transaction of the same
 * batch. So one slow
 * handler does not keep the rows of every later batch-mate locked, nor
 * their outcomes waiting.
 *
 * The steps are span.c's (job_steps.h), over the batch as one span, as
 * they run one job as a span of one, and the transaction is theirs: this
 * file adds only the collecting and the choice between the fast way and
 * the careful one. */
#include <stdio.h>

#include "batch.h"
#include "broker.h"
#include "clock.h"
#include "job.h"
#include "job_steps.h"
#include "links.h"
#include "log.h"

static size_t collect(struct sk_pipeline *p, struct sk_span *s, amqp_envelope_t *first);
static bool fast_is_safe(const struct sk_span *s);

size_t sk_batch_run(struct sk_pipeline *p, amqp_envelope_t *first)
{
    struct sk_span *s = sk_span_of(p);
    if (s == NULL) {
        /* No memory for a batch: sk_span_process() hands the delivery back. */
        sk_span_process(p, first);
        sk_broker_release(sk_links_consumer(p->links), first);
        return 1;
    }
    size_t n = collect(p, s, first);
    for (size_t i = 0; i < n; i++)
        sk_span_add(s, &s->deliveries[i]);
    sk_span_start(p, s);
    /* A batch closed early leaves its unrun jobs to the next transaction. */
    while (sk_span_transaction(p, s, fast_is_safe(s) ? SK_WAY_FAST : SK_WAY_CAREFUL))
        ;
    sk_span_followers(p, s);
    sk_span_settle(p, s);
    for (size_t i = 0; i < n; i++)
        sk_broker_release(sk_links_consumer(p->links), &s->deliveries[i]);
    return n;
}

/* The fast way writes each key completed at its claim. For a job that may
 * hold an outbox dedupe key that write releases the key (a trigger), and
 * the released row would stay locked while the batch runs: a producer
 * enqueueing the same dedupe key would wait on the worker for as long. So
 * a batch with such a job goes the careful way, whose keys are written
 * completed only in the COMMIT's round trip. */
static bool fast_is_safe(const struct sk_span *s)
{
    for (size_t i = 0; i < s->n; i++)
        if (sk_job_live(&s->jobs[i]) && sk_keyref_may_hold_dedupe(&s->jobs[i].ref))
            return false;
    return true;
}

/* The first delivery, and what else arrives within batch_wait: a batch
 * never waits for a full window, only for what the broker is already
 * sending (prefetch keeps it coming). */
static size_t collect(struct sk_pipeline *p, struct sk_span *s, amqp_envelope_t *first)
{
    s->deliveries[0] = *first;
    size_t n = 1;
    uint64_t until = sk_now_ns() + (uint64_t)p->queue->batch_wait_ms * 1000000u;
    struct sk_err err = { 0 };
    while (n < s->cap) {
        uint64_t now = sk_now_ns();
        int wait_ms = now >= until ? 0 : (int)((until - now + 999999u) / 1000000u);
        /* The previous batch's locks would wait with us. */
        if (wait_ms > 0 && s->n_releases > 0 && !sk_broker_waiting(sk_links_consumer(p->links)))
            sk_span_release_locks(p);
        int rc = sk_broker_next(sk_links_consumer(p->links), &s->deliveries[n], wait_ms, &err);
        if (rc == SK_OK) {
            n++;
            continue;
        }
        if (rc != SK_AGAIN)
            /* Those taken are still settled on this connection, which the
             * next loop turn finds closed: their acks are lost, and the
             * redeliveries find their keys completed. */
            sk_log_warn("queue %s: consumer lost while filling a batch: %s", p->queue->name,
                        err.msg);
        break;
    }
    return n;
}
