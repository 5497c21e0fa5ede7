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
 * The steps are job.c's (job_steps.h), over the batch as one span, as
 * they run one job as a span of one: this file adds only the collecting
 * and the choice between the fast way and the careful one. */
#include <stdio.h>

#include "batch.h"
#include "broker.h"
#include "clock.h"
#include "job.h"
#include "job_steps.h"
#include "links.h"
#include "log.h"
#include "metrics.h"
#include "store.h"

static size_t collect(struct sk_pipeline *p, struct sk_span *s, amqp_envelope_t *first);
static bool run_fast(struct sk_pipeline *p, struct sk_span *s);
static bool run_careful(struct sk_pipeline *p, struct sk_span *s);
static bool run_one(struct sk_pipeline *p, struct sk_job *j, bool first);
static bool fast_is_safe(const struct sk_span *s);
static bool time_to_close(const struct sk_pipeline *p, uint64_t *close_at);
static bool close_early(struct sk_pipeline *p, struct sk_span *s, size_t from);
static void each_alone(struct sk_pipeline *p, struct sk_span *s, bool same_key);

size_t sk_batch_run(struct sk_pipeline *p, amqp_envelope_t *first)
{
    struct sk_span *s = sk_span_of(p);
    if (s == NULL) {
        /* No memory for a batch: job.c hands the delivery back. */
        sk_span_process(p, first);
        sk_broker_release(sk_links_consumer(p->links), first);
        return 1;
    }
    size_t n = collect(p, s, first);
    for (size_t i = 0; i < n; i++)
        sk_span_add(s, &s->deliveries[i]);
    sk_span_start(p, s);
    /* A batch closed early leaves its unrun jobs to the next transaction. */
    for (bool more = true; more;) {
        more = false;
        enum sk_way way = fast_is_safe(s) ? SK_WAY_FAST : SK_WAY_CAREFUL;
        int rc = sk_span_claim(p, s, way);
        if (rc == SK_OK)
            more = way == SK_WAY_FAST ? run_fast(p, s) : run_careful(p, s);
        else if (rc == SK_BUSY)
            /* A key another worker holds: each job in its own transaction,
             * which waits for that key alone. */
            each_alone(p, s, false);
        if (more)
            sk_span_settle_done(p, s);
    }
    /* Same keys: their leader has committed (or not); each now claims for
     * itself, and finds the leader's outcome as any later copy would. */
    each_alone(p, s, true);
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

/* Every live job (of the same-key followers, or of the others) alone. */
static void each_alone(struct sk_pipeline *p, struct sk_span *s, bool same_key)
{
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (!j->settled && j->same_key == same_key)
            sk_span_alone(p, s, j);
    }
}

/* Every claimed job's handler straight in the transaction, then the one
 * COMMIT. At the first failure the transaction is rolled back; the failed
 * job is settled with its outcome (its handler does not run again), and
 * the rest of the batch goes the careful way. Either way, once the
 * handlers have run for batch_close_after the batch commits what ran. True
 * when jobs are left for another transaction (closed early, or a COMMIT
 * refused for a batch-mate's cancelled key). */
static bool run_fast(struct sk_pipeline *p, struct sk_span *s)
{
    size_t failed = s->n;
    uint64_t close_at = 0;
    for (size_t i = 0; i < s->n && failed == s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_CLAIMED || j->settled)
            continue;
        if (time_to_close(p, &close_at)) {
            if (!close_early(p, s, i))
                return false;
            sk_span_commit(p, s, SK_WAY_FAST);
            return true;
        }
        if (!sk_span_handle(p, j, SK_WAY_FAST)) {
            sk_span_abandon(p, s, "the batch's transaction failed around a handler");
            return false;
        }
        if (j->status != SEKALI_OK)
            failed = i;
    }
    if (failed == s->n)
        return sk_span_commit(p, s, SK_WAY_FAST);
    struct sk_err err = { 0 };
    if (sk_store_rollback(sk_links_store(p->links), &err) != SK_OK) {
        /* The connection went with the transaction: nobody's fault. */
        sk_span_abandon(p, s, "the batch's transaction was lost");
        return false;
    }
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (i == failed || j->settled)
            continue;
        /* Its handler's run went with the transaction, unseen, and will be
         * made again: counted, since a handler that fails often makes a
         * batch cost twice its work (batch: 1 is then the cheaper way). */
        if (j->state == SK_JOB_HANDLED)
            sk_metrics_inc(j->metrics, SK_METRIC_BATCH_RERUNS);
        if (j->state == SK_JOB_CLAIMED || j->state == SK_JOB_HANDLED)
            sk_job_rewind(j);
    }
    struct sk_job *f = &s->jobs[failed];
    sk_job_settle_failure(p, f, f->status, f->error, f->conflict);
    int rc = sk_span_claim(p, s, SK_WAY_CAREFUL);
    if (rc == SK_OK)
        return run_careful(p, s);
    if (rc == SK_BUSY)
        each_alone(p, s, false);
    return false;
}

/* Each claimed job's handler in its savepoint, then the one COMMIT; closed
 * early as run_fast() is. */
static bool run_careful(struct sk_pipeline *p, struct sk_span *s)
{
    bool first = true;
    uint64_t close_at = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_CLAIMED || j->settled)
            continue;
        if (time_to_close(p, &close_at)) {
            if (!close_early(p, s, i))
                return false;
            sk_span_commit(p, s, SK_WAY_CAREFUL);
            return true;
        }
        if (!run_one(p, j, first)) {
            sk_span_abandon(p, s, "the batch's transaction failed around a handler");
            return false;
        }
        first = false;
    }
    return sk_span_commit(p, s, SK_WAY_CAREFUL);
}

/* Whether the handlers of this transaction have run for batch_close_after,
 * asked before each one: *close_at is 0 until the first starts, so the
 * first always runs. */
static bool time_to_close(const struct sk_pipeline *p, uint64_t *close_at)
{
    uint64_t now = sk_now_ns();
    if (*close_at == 0) {
        *close_at = now + (uint64_t)p->queue->batch_close_after_ms * 1000000u;
        return false;
    }
    return now >= *close_at;
}

/* Gives back the keys of the claimed jobs from the from-th on, whose
 * handlers have not run, so that the COMMIT to come covers only the jobs
 * that ran; the jobs given back stand where they stood before their claim.
 * False when the transaction is lost (then every job in it is handed back). */
static bool close_early(struct sk_pipeline *p, struct sk_span *s, size_t from)
{
    size_t m = 0;
    for (size_t i = from; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state == SK_JOB_CLAIMED && !j->settled)
            s->refs[m++] = j->ref;
    }
    struct sk_err err = { 0 };
    if (m > 0 && sk_store_unclaim_many(sk_links_store(p->links), s->refs, m, &err) != SK_OK) {
        sk_log_warn("queue %s: giving back the %zu keys of a batch closed early failed: %s",
                    p->queue->name, m, err.msg);
        sk_span_abandon(p, s, "the batch's transaction failed closing it early");
        return false;
    }
    for (size_t i = from; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state == SK_JOB_CLAIMED && !j->settled) {
            sk_job_rewind(j);
            sk_metrics_inc(j->metrics, SK_METRIC_BATCH_DEFERRED);
        }
    }
    sk_log_debug("queue %s: batch closed after %u ms of handlers, %zu jobs left for the next "
                 "transaction", p->queue->name, p->queue->batch_close_after_ms, m);
    return true;
}

/* One handler in its savepoint. False when the transaction itself is lost
 * (the connection, or a savepoint refused): then nothing of the batch can
 * commit. */
static bool run_one(struct sk_pipeline *p, struct sk_job *j, bool first)
{
    struct sk_store *store = sk_links_store(p->links);
    struct sk_err err = { 0 };
    if (sk_store_savepoint(store, first, &err) != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "savepoint failed: %s", err.msg);
        return false;
    }
    if (!sk_span_handle(p, j, SK_WAY_CAREFUL))
        return false;
    if (j->status == SEKALI_OK)
        return true;
    if (sk_store_rollback_job(store, &j->ref, &err) != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "rollback to the job's savepoint failed: %s", err.msg);
        return false;
    }
    return true;
}
