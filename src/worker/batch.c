/* batch.c - many deliveries in one transaction (queues[].batch > 1).
 *
 * The guarantee is the single job's, unchanged: every effect commits in the
 * same transaction as its key's completion, and no delivery is acked before
 * that COMMIT. What a batch saves is the per-job round trips and COMMIT:
 * the locks taken and released in one pipelined Redis round trip each, the
 * keys claimed by one statement, the completions sent with the one COMMIT,
 * the acks as one multiple-ack. A worker that dies mid-batch takes the
 * uncommitted transaction with it and every job of it is redelivered; the
 * scoreboard names only the job whose handler was running (the one counted
 * as a crash) but records every lock, so the replacement frees them all.
 *
 * A batch runs twice as carefully as it must, at most: first the fast way
 * (keys claimed completed, sql/016, every handler straight in the
 * transaction), and after a first failure the rest the careful way (keys
 * claimed processing, sql/015, each handler in a savepoint), so a job's
 * own failure stays its own at the price of its batch-mates' handlers
 * perhaps running twice, the first run rolled back unseen. Batching is the
 * default (batch 16, batch_wait 0): a batch is what the prefetch window
 * already holds, so a quiet queue runs batches of one; and once its
 * handlers have run for batch_close_after the rest of the batch goes to
 * the next transaction, so one slow handler keeps no batch-mate waiting.
 * That time is never less than 16 of PostgreSQL's round trips as the span
 * measures them (span.c's time_to_close()): a far server, whose every
 * statement is slow, makes a batch larger, not one job a transaction.
 *
 * The steps and the transaction are span.c's (its ways[] say fast and
 * careful), over the batch as one span: this file adds only the collecting
 * and the choice of the way. */
#include <stdio.h>

#include "batch.h"
#include "batch_size.h"
#include "broker.h"
#include "clock.h"
#include "forward.h"
#include "job.h"
#include "job_steps.h"
#include "links.h"
#include "log.h"

/* The most forwards (each up to 64 of an intake's deliveries, forward.c)
 * while a batch is collected. */
#define FORWARDS_MAX 4

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
    s->ran_before_close = 0;
    size_t n = collect(p, s, first);
    for (size_t i = 0; i < n; i++)
        sk_span_add(s, &s->deliveries[i]);
    sk_span_start(p, s);
    /* A batch closed early leaves its unrun jobs to the next transaction,
     * and the rest of a batch leaves the jobs whose locks were busy to the
     * next pass. */
    do {
        while (sk_span_transaction(p, s, fast_is_safe(s) ? SK_WAY_FAST : SK_WAY_CAREFUL))
            ;
        sk_span_followers(p, s);
    } while (sk_span_deferred(p, s));
    sk_span_settle(p, s);
    for (size_t i = 0; i < n; i++)
        sk_broker_release(sk_links_consumer(p->links), &s->deliveries[i]);
    /* With nothing in hand: the next batch's size, and perhaps a new
     * prefetch window (batch_size.c). */
    sk_batch_size_update(p, s->ran_before_close);
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
    size_t most = p->batch.now > 0 ? (size_t)p->batch.now : (size_t)p->queue->batch;
    if (most > s->cap)
        most = s->cap;
    uint64_t until = sk_now_ns() + (uint64_t)p->queue->batch_wait_ms * 1000000u;
    struct sk_err err = { 0 };
    unsigned forwarded = 0;
    while (n < most) {
        uint64_t now = sk_now_ns();
        int wait_ms = now >= until ? 0 : (int)((until - now + 999999u) / 1000000u);
        /* The previous batch's locks would wait with us. */
        if (wait_ms > 0 && s->n_releases > 0 && !sk_broker_waiting(sk_links_consumer(p->links)))
            sk_span_release_locks(p);
        int rc = sk_broker_next(sk_links_consumer(p->links), &s->deliveries[n], wait_ms, &err);
        /* An intake's delivery is forwarded in passing: it joins no batch.
         * A few only, while the batch in hand waits (its job timeout runs). */
        if (rc == SK_OK) {
            if (!sk_forward_intake(p, &s->deliveries[n]))
                n++;
            else if (++forwarded >= FORWARDS_MAX)
                break;
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
