/* span.c - the driver of the pipeline, over a span of n >= 1 jobs: lock
 * them all, claim them all, run each handler, commit, settle.
 *
 * One job is a span of one (sk_span_process()) and a batch a span of many
 * (sk_batch_run(), batch.c): one way to take and release locks, one claim,
 * one commit and one settling, each one round trip to a server for the
 * whole span, so a span of one costs what one job costs. What a step
 * decides for a single job stays in job.c; this file carries it across the
 * span (the claim, the handlers, which jobs run again and how), each way a
 * row of ways[] below; the locks are span_lock.c's, the rest span_way.h's. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "broker.h"
#include "clock.h"
#include "job.h"
#include "limit.h"
#include "links.h"
#include "log.h"
#include "metrics.h"
#include "scoreboard.h"
#include "span_way.h"

/* One job: BEGIN and sekali.claim_completed(), the key's row written
 * completed and locked until the COMMIT that makes it true (a failed job's
 * is rolled back). A duplicate is the job's own outcome, not the round
 * trip's. */
static int claim_one(struct sk_store *st, const struct sk_keyref *refs, size_t m,
                     struct sk_claim *out, bool *dups, struct sk_err *err)
{
    (void)m;
    int rc = sk_store_claim(st, &refs[0], &out[0], err);
    if (rc == SK_DUP) {
        dups[0] = true;
        rc = SK_OK;
    }
    return rc;
}

static const struct sk_span_way ways[] = {
    [SK_WAY_ONE] = { claim_one, sk_span_commit_one, true, false, AT_COMMIT,
                     "the job's transaction failed around its handler" },
    [SK_WAY_FAST] = { sk_store_claim_completing, sk_span_commit_fast, false, true, ALL_AGAIN,
                      "the batch's transaction failed around a handler" },
    [SK_WAY_CAREFUL] = { sk_store_claim_many, sk_span_commit_careful, false, false,
                         TO_SAVEPOINT, "the batch's transaction failed around a handler" },
};

static bool transaction(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w);
static int  claim(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w);
static bool run(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w);
static bool run_handler(struct sk_pipeline *p, struct sk_job *j, const struct sk_span_way *w,
                        bool first);
static bool handle(struct sk_pipeline *p, struct sk_job *j, const struct sk_span_way *w);
static bool time_to_close(const struct sk_pipeline *p, uint64_t *close_at);
static size_t close_early(struct sk_span *s, size_t from);
static bool commit(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w,
                   size_t back);
static void alone(struct sk_pipeline *p, struct sk_span *s, struct sk_job *j);
static void each_alone(struct sk_pipeline *p, struct sk_span *s, bool same_key);
static bool ready(const struct sk_job *j);
static void survivable(struct sk_pipeline *p, struct sk_span *s);

void sk_span_process(struct sk_pipeline *p, const amqp_envelope_t *delivery)
{
    struct sk_span *s = sk_span_of(p);
    if (s == NULL) {
        /* Not even one job fits: the broker keeps the delivery. */
        sk_log_error("queue %s: out of memory for a job, handed back to the broker",
                     p->queue->name);
        sk_broker_reject(sk_links_consumer(p->links), delivery->delivery_tag, true, NULL);
        sk_sleep_ms(sk_jitter(100, 1000));
        return;
    }
    sk_span_add(s, delivery);
    sk_span_start(p, s);
    struct sk_job *j = &s->jobs[0];
    if (sk_job_live(j) && p->queue->mode == SK_MODE_EXTERNAL)
        sk_job_run_external(p, j);
    else if (sk_job_live(j))
        alone(p, s, j);
    sk_span_settle(p, s);
}

/* The span's arrays and how many of each a span of n holds. Adding one?
 * A line here is its allocation and its free. */
#define SPAN_ARRAYS(X) \
    X(jobs, n) X(deliveries, n) X(releases, n) X(keys, 2 * n) X(tokens, 2 * n) \
    X(rcs, 2 * n) X(lost, n) X(refs, n) X(ref_ptrs, n) X(results, n) X(result_lens, n) \
    X(claims, n) X(dups, n) X(index, n)

struct sk_span *sk_span_of(struct sk_pipeline *p)
{
    if (p->span != NULL)
        return p->span;
    size_t n = p->queue->batch_max > 1 ? (size_t)p->queue->batch_max : 1;
    struct sk_span *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->cap = n;
    bool ok = true;
#define ALLOC(array, count) ok &= (s->array = calloc(count, sizeof(*s->array))) != NULL;
    SPAN_ARRAYS(ALLOC)
#undef ALLOC
    if (!ok) {
        sk_span_free(s);
        return NULL;
    }
    p->span = s;
    return s;
}

void sk_span_free(struct sk_span *s)
{
    if (s == NULL)
        return;
#define FREE(array, count) free(s->array);
    SPAN_ARRAYS(FREE)
#undef FREE
    free(s);
}

void sk_span_add(struct sk_span *s, const amqp_envelope_t *delivery)
{
    sk_assert(s->n < s->cap);
    s->jobs[s->n++] = (struct sk_job){ .state = SK_JOB_NEW, .delivery = delivery,
                                       .out.status = SEKALI_OK };
}

void sk_span_start(struct sk_pipeline *p, struct sk_span *s)
{
    for (size_t i = 0; i < s->n; i++)
        sk_job_admit(p, &s->jobs[i]);
    if (p->queue->lock)
        sk_span_admit_lock(p, s);  /* the rate limit asked in the locks' round trip */
    else
        sk_limit_admit(p, s);
    survivable(p, s);
}

bool sk_span_deferred(struct sk_pipeline *p, struct sk_span *s)
{
    bool any = false;
    for (size_t i = 0; i < s->n && !any; i++)
        any = sk_job_live(&s->jobs[i]) && s->jobs[i].lock.deferred;
    if (!any)
        return false;
    /* The committed jobs' acks need not wait for the deferred ones, nor
     * their locks: a span never waits for a lock while it holds one. */
    sk_span_settle_done(p, s);
    if (p->heartbeat != NULL)
        sk_span_count_lost_locks(p, s);
    sk_span_unlock(p, s);
    sk_span_lock(p, s);
    survivable(p, s);
    return true;
}

/* A live job that may be claimed: not waiting for a deferred lock. */
static bool ready(const struct sk_job *j)
{
    return sk_job_live(j) && !j->lock.deferred;
}

/* Read after the lock, so that a copy that waited for a dead worker's lock
 * sees its crash: a deferred job is asked once it has its lock. */
static void survivable(struct sk_pipeline *p, struct sk_span *s)
{
    for (size_t i = 0; i < s->n; i++)
        if (ready(&s->jobs[i]))
            sk_job_survivable(p, &s->jobs[i]);
}

bool sk_span_transaction(struct sk_pipeline *p, struct sk_span *s, enum sk_way way)
{
    bool more = transaction(p, s, &ways[way]);
    if (more)
        sk_span_settle_done(p, s);
    return more;
}

void sk_span_followers(struct sk_pipeline *p, struct sk_span *s)
{
    each_alone(p, s, true);
}

/* Claims the live jobs' keys the way w says and runs them to their
 * COMMIT; a key held by another worker sends each job alone, to wait for
 * that key alone. True as sk_span_transaction(). */
static bool transaction(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w)
{
    int rc = claim(p, s, w);
    if (rc == SK_OK)
        return run(p, s, w);
    if (rc == SK_BUSY)
        each_alone(p, s, false);
    return false;
}

/* Every live job's key (a later job with an earlier one's key is left
 * out, marked same_key) in one round trip, BEGIN included; each answer
 * through sk_job_claimed(). SK_OK with the transaction open and the claimed
 * jobs in it (of several: perhaps none, all duplicates, whose count only
 * the COMMIT makes true); SK_BUSY when a key was held past lock_timeout and
 * nothing was claimed (a job alone finds that its own answer); otherwise
 * nothing is left to run. */
static int claim(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w)
{
    sk_span_recount_duplicates(p, s);
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (!ready(j))
            continue;
        for (size_t k = 0; k < m && !j->same_key; k++)
            j->same_key = strcmp(s->refs[k].key, j->env.idempotency_key) == 0;
        if (j->same_key)
            continue;
        s->refs[m] = j->ref;
        s->index[m++] = i;
    }
    if (m == 0)
        return SK_ERR;
    sk_assert(!w->alone || m == 1);
    struct sk_err err = { 0 };
    memset(s->dups, 0, m * sizeof(*s->dups));
    int rc = w->claim(sk_links_store(p->links), s->refs, m, s->claims, s->dups, &err);
    if (rc == SK_BUSY && !w->alone)
        return SK_BUSY;
    bool any = false;
    for (size_t k = 0; k < m; k++) {
        struct sk_job *j = &s->jobs[s->index[k]];
        j->claim = s->claims[k];
        j->dup_uncounted = !w->alone && rc == SK_OK && s->dups[k];
        any |= sk_job_claimed(p, j, rc == SK_OK && s->dups[k] ? SK_DUP : rc, &err);
    }
    if (w->alone)
        return any ? SK_OK : SK_ERR;
    return rc == SK_OK ? SK_OK : SK_ERR;
}

/* Each claimed job's handler, then the one COMMIT. Once the handlers have
 * run for batch_close_after (or, from a far server, for CLOSE_ROUND_TRIPS
 * round trips: time_to_close()) the keys of the jobs not yet run are given
 * back with the COMMIT of the rest. True when jobs are left for another
 * transaction (closed early, or a COMMIT refused for a batch-mate's
 * cancelled key). */
static bool run(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w)
{
    size_t ran = 0;
    uint64_t close_at = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_CLAIMED)
            continue;
        if (time_to_close(p, &close_at)) {
            if (s->ran_before_close == 0 || ran < s->ran_before_close)
                s->ran_before_close = ran;
            commit(p, s, w, close_early(s, i));
            return true;
        }
        if (!run_handler(p, j, w, ran == 0)) {
            sk_span_abandon(p, s, w->lost);
            return false;
        }
        ran++;
        if (j->out.status != SEKALI_OK && w->failure == ALL_AGAIN)
            return sk_span_blame_handler(p, s, j) && transaction(p, s, &ways[SK_WAY_CAREFUL]);
    }
    return commit(p, s, w, 0);
}

/* One handler, in its savepoint when the way undoes a failure there. False
 * when the transaction itself is lost (the connection, or a savepoint
 * refused): then nothing of the span can commit. */
static bool run_handler(struct sk_pipeline *p, struct sk_job *j, const struct sk_span_way *w,
                        bool first)
{
    struct sk_store *store = sk_links_store(p->links);
    struct sk_err err = { 0 };
    if (w->failure == TO_SAVEPOINT && sk_store_savepoint(store, first, &err) != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "savepoint failed: %s", err.msg);
        return false;
    }
    if (!handle(p, j, w))
        return false;
    if (j->out.status == SEKALI_OK || w->failure != TO_SAVEPOINT)
        return true;
    if (sk_store_rollback_job(store, &j->ref, &err) != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "rollback to the job's savepoint failed: %s", err.msg);
        return false;
    }
    return true;
}

/* Runs one claimed job's handler in the span's transaction and keeps its
 * outcome in the job. False when the transaction is lost around it (or no
 * memory to keep its result). */
static bool handle(struct sk_pipeline *p, struct sk_job *j, const struct sk_span_way *w)
{
    /* The scoreboard names the job whose handler runs, and only it: should
     * the worker die now, this is the job its replacement counts. In a span
     * of many, the job timeout is this job's alone. */
    struct sk_slot *slot = p->slot;
    sk_slot_publish_job(slot, j->env.idempotency_key, j->env.job_type, j->env.delivery_attempt,
                        j->env.trace.trace_id);
    if (!w->alone)
        atomic_store(&slot->job_started_ms, sk_now_ms());
    struct sekali_ctx *ctx = &p->ctx;
    sk_host_ctx_reset(ctx);
    PGconn *pg = sk_store_conn(sk_links_store(p->links));
    j->out.status = sk_job_call_handler(p, j, pg);
    /* Alone, a transaction the handler spoiled fails its COMMIT; in a span
     * of many it would spoil its batch-mates' too. */
    if (!w->alone && j->out.status == SEKALI_OK && PQtransactionStatus(pg) != PQTRANS_INTRANS) {
        j->out.status = SEKALI_RETRY;
        snprintf(ctx->error, sizeof(ctx->error), "the handler left its transaction %s",
                 PQtransactionStatus(pg) == PQTRANS_INERROR ? "failed" : "ended");
    }
    j->out.conflict = ctx->conflict;
    snprintf(j->out.error, sizeof(j->out.error), "%s", ctx->error);
    /* The job owns what its handler queued: sent by its COMMIT, or dropped
     * with its failure. */
    sk_sqlq_clear(&j->out.queued);
    if (j->out.status == SEKALI_OK) {
        j->out.queued = ctx->queued;
        ctx->queued = (struct sk_sqlq){ .n = 0 };
    }
    free(j->out.result);
    j->out.result = NULL;
    j->out.result_len = 0;
    if (j->out.status != SEKALI_OK || ctx->result_len == 0)
        return true;
    j->out.result = malloc(ctx->result_len);
    if (j->out.result == NULL) {
        sk_log_job(SK_LOG_ERROR, &j->log, "out of memory saving a %zu-byte result",
                   ctx->result_len);
        return false;
    }
    memcpy(j->out.result, ctx->result, ctx->result_len);
    j->out.result_len = ctx->result_len;
    return true;
}

/* Closing a batch early costs the jobs left another transaction: the
 * round trips of its claim and its COMMIT (the keys given back travel with
 * this COMMIT). So a transaction's handlers run for batch_close_after and
 * for at least CLOSE_ROUND_TRIPS of PostgreSQL's round trips, measured as
 * the span runs (sk_store_rtt_ns()): closing then costs the worker at most
 * 2/CLOSE_ROUND_TRIPS of its time however far the server is, and a far
 * server makes batches larger, not smaller. On loopback (a round trip well
 * under a millisecond) batch_close_after alone decides, as before. */
#define CLOSE_ROUND_TRIPS 16

/* Whether the handlers of this transaction have run for as long as the
 * above allows, asked before each one: *close_at is 0 until the first
 * starts, so the first always runs (and a job alone is never closed
 * early). */
static bool time_to_close(const struct sk_pipeline *p, uint64_t *close_at)
{
    uint64_t now = sk_now_ns();
    if (*close_at == 0) {
        uint64_t budget = (uint64_t)p->queue->batch_close_after_ms * 1000000u;
        uint64_t trips = CLOSE_ROUND_TRIPS * sk_store_rtt_ns(sk_links_store(p->links));
        *close_at = now + (trips > budget ? trips : budget);
        return false;
    }
    return now >= *close_at;
}

/* The claimed jobs from the from-th on, whose handlers have not run, are
 * rewound to where they stood before their claim, and their keys put in
 * s->refs for the COMMIT to give back (sekali.unclaim_many, sql/021), so
 * that it covers only the jobs that ran. Returns how many. Should that
 * COMMIT fail, the transaction goes with their claims in it. */
static size_t close_early(struct sk_span *s, size_t from)
{
    size_t m = 0;
    for (size_t i = from; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_CLAIMED)
            continue;
        s->refs[m++] = j->ref;
        sk_job_rewind(j);
        sk_metrics_inc(j->metrics, SK_METRIC_BATCH_DEFERRED);
    }
    sk_log_debug("batch closed after its handlers' time, %zu jobs left for the next "
                 "transaction", m);
    return m;
}

/* The COMMIT, then each job settled by its answer; a failed one with queued
 * statements is no one job's (span_blame.c): they run again alone. */
static bool commit(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w,
                   size_t back)
{
    struct sk_err err = { 0 };
    bool queued = false;
    int rc = sk_span_commit(p, s, w, back, &queued, &err);
    if (rc == SK_AGAIN)
        return false;
    if (rc != SK_ERR || !queued || w->alone)
        return sk_span_settle_outcomes(p, s, w, rc, &err);
    if (sk_span_blame_queued(p, s))
        return true;
    each_alone(p, s, false);
    return false;
}

/* A job of s claimed, run and committed on its own, in its own
 * transaction: a span of its own over the same scratch arrays. */
static void alone(struct sk_pipeline *p, struct sk_span *s, struct sk_job *j)
{
    struct sk_span one = *s;
    one.jobs = j;
    one.n = 1;
    j->same_key = false;
    transaction(p, &one, &ways[SK_WAY_ONE]);
}

/* Every live job (of the same-key followers, or of the others) alone. */
static void each_alone(struct sk_pipeline *p, struct sk_span *s, bool same_key)
{
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (ready(j) && j->same_key == same_key)
            alone(p, s, j);
    }
}
