/* span.c - the driver of the pipeline, over a span of n >= 1 jobs: lock
 * them all, claim them all, run each handler, commit, settle.
 *
 * One job is a span of one (sk_span_process()) and a batch a span of
 * many (sk_batch_run(), batch.c): so there is one way to take and release
 * locks, one claim, one commit and one settling, and a span of one costs
 * what one job costs, round trip for round trip. Each step costs one round
 * trip to a server for the whole span: every lock in one pipelined Redis
 * round trip (acquire, renew in the heartbeat, release), every key in one
 * claim statement and the completions with the one COMMIT. What the steps
 * decide for a single job (what a refused lock, a claim's answer, a failed
 * handler mean) stays in job.c; this file only carries it across the span,
 * and holds the span's transaction: its claim, savepoints, rollbacks and
 * COMMIT. A transaction goes one of three ways, each a row of ways[]
 * below; the locks are span_lock.c's.
 *
 * Every exit is only decided by sk_job_finish() while the steps run, and
 * carried out by sk_span_settle() in delivery order once the span's locks
 * are released: an ack is a multiple-ack (broker.c), covering every earlier
 * delivery too. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "broker.h"
#include "clock.h"
#include "heartbeat.h"
#include "job.h"
#include "job_steps.h"
#include "limit.h"
#include "links.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "scoreboard.h"
#include "store.h"

/* A way through one transaction: how its keys are claimed, how a
 * handler's failure is undone, and how the outcomes commit. Chosen once
 * per transaction (batch.c: fast, or careful for an outbox job; a job
 * alone: one). Adding a way? A row here and a name in enum sk_way. */
struct way {
    int  (*claim)(struct sk_store *st, const struct sk_keyref *refs, size_t m,
                  struct sk_claim *out, bool *dups, struct sk_err *err);
    int  (*commit)(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                   struct sk_err *err);
    bool alone;         /* one job: the claim's answers and the transaction are its own */
    bool results_only;  /* the claim wrote the keys completed: the COMMIT adds results */
    enum {
        AT_COMMIT,      /* the job's transaction is rolled back at its commit */
        TO_SAVEPOINT,   /* the handler runs in a savepoint, rolled back alone */
        ALL_AGAIN,      /* the whole transaction goes; the others run again, careful */
    } failure;
    const char *lost;   /* why its jobs go back when a handler's transaction fails */
};

static int  claim_one(struct sk_store *st, const struct sk_keyref *refs, size_t m,
                      struct sk_claim *out, bool *dups, struct sk_err *err);
static int  commit_one(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                       struct sk_err *err);
static int  commit_fast(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                        struct sk_err *err);
static int  commit_careful(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                           struct sk_err *err);

static const struct way ways[] = {
    [SK_WAY_ONE] = { claim_one, commit_one, true, false, AT_COMMIT,
                     "the job's transaction failed around its handler" },
    [SK_WAY_FAST] = { sk_store_claim_completing, commit_fast, false, true, ALL_AGAIN,
                      "the batch's transaction failed around a handler" },
    [SK_WAY_CAREFUL] = { sk_store_claim_many, commit_careful, false, false, TO_SAVEPOINT,
                         "the batch's transaction failed around a handler" },
};

static bool transaction(struct sk_pipeline *p, struct sk_span *s, const struct way *w);
static int  claim(struct sk_pipeline *p, struct sk_span *s, const struct way *w);
static bool run(struct sk_pipeline *p, struct sk_span *s, const struct way *w);
static bool run_handler(struct sk_pipeline *p, struct sk_job *j, const struct way *w, bool first);
static bool handle(struct sk_pipeline *p, struct sk_job *j, const struct way *w);
static bool again_careful(struct sk_pipeline *p, struct sk_span *s, struct sk_job *failed);
static bool time_to_close(const struct sk_pipeline *p, uint64_t *close_at);
static size_t close_early(struct sk_span *s, size_t from);
static bool commit(struct sk_pipeline *p, struct sk_span *s, const struct way *w, size_t back);
static bool settle_outcomes(struct sk_pipeline *p, struct sk_span *s, const struct way *w,
                            int rc, const struct sk_err *err);
static void abandon(struct sk_pipeline *p, struct sk_span *s, const char *why);
static size_t queued_steps(struct sk_pipeline *p, struct sk_span *s, struct sk_pg_stmt **out);
static bool blame_alone(struct sk_pipeline *p, struct sk_span *s);
static void alone(struct sk_pipeline *p, struct sk_span *s, struct sk_job *j);
static void each_alone(struct sk_pipeline *p, struct sk_span *s, bool same_key);
static bool ready(const struct sk_job *j);
static void recount_duplicates(struct sk_pipeline *p, struct sk_span *s);
static void survivable(struct sk_pipeline *p, struct sk_span *s);
static void count_lost_locks(struct sk_pipeline *p, struct sk_span *s);
static void settle_done(struct sk_pipeline *p, struct sk_span *s);
static void exit_job(struct sk_pipeline *p, struct sk_job *j);

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
    size_t n = p->queue->batch > 1 ? (size_t)p->queue->batch : 1;
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
    sk_limit_admit(p, s);
    if (p->queue->lock)
        sk_span_lock(p, s);
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
    settle_done(p, s);
    if (p->heartbeat != NULL)
        count_lost_locks(p, s);
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
        settle_done(p, s);
    return more;
}

void sk_span_followers(struct sk_pipeline *p, struct sk_span *s)
{
    each_alone(p, s, true);
}

/* Claims the live jobs' keys the way w says and runs them to their
 * COMMIT; a key held by another worker sends each job alone, to wait for
 * that key alone. True as sk_span_transaction(). */
static bool transaction(struct sk_pipeline *p, struct sk_span *s, const struct way *w)
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
static int claim(struct sk_pipeline *p, struct sk_span *s, const struct way *w)
{
    recount_duplicates(p, s);
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

/* Each claimed job's handler, then the one COMMIT. Once the handlers have
 * run for batch_close_after (or, from a far server, for CLOSE_ROUND_TRIPS
 * round trips: time_to_close()) the keys of the jobs not yet run are given
 * back with the COMMIT of the rest. True when jobs are left for another
 * transaction (closed early, or a COMMIT refused for a batch-mate's
 * cancelled key). */
static bool run(struct sk_pipeline *p, struct sk_span *s, const struct way *w)
{
    bool first = true;
    uint64_t close_at = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_CLAIMED)
            continue;
        if (time_to_close(p, &close_at)) {
            commit(p, s, w, close_early(s, i));
            return true;
        }
        if (!run_handler(p, j, w, first)) {
            abandon(p, s, w->lost);
            return false;
        }
        first = false;
        if (j->out.status != SEKALI_OK && w->failure == ALL_AGAIN)
            return again_careful(p, s, j);
    }
    return commit(p, s, w, 0);
}

/* One handler, in its savepoint when the way undoes a failure there. False
 * when the transaction itself is lost (the connection, or a savepoint
 * refused): then nothing of the span can commit. */
static bool run_handler(struct sk_pipeline *p, struct sk_job *j, const struct way *w, bool first)
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
static bool handle(struct sk_pipeline *p, struct sk_job *j, const struct way *w)
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

/* The fast way's first failure: the whole transaction is rolled back, the
 * failed job settled with its outcome (its handler does not run again), and
 * the rest claimed again and run the careful way. Its batch-mates' runs
 * went with the transaction, unseen, and are made again: counted, since a
 * handler that fails often makes a batch cost twice its work (batch: 1 is
 * then the cheaper way). */
static bool again_careful(struct sk_pipeline *p, struct sk_span *s, struct sk_job *failed)
{
    struct sk_err err = { 0 };
    if (sk_store_rollback(sk_links_store(p->links), &err) != SK_OK) {
        /* The connection went with the transaction: nobody's fault. */
        abandon(p, s, "the batch's transaction was lost");
        return false;
    }
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j == failed)
            continue;
        if (j->state == SK_JOB_HANDLED)
            sk_metrics_inc(j->metrics, SK_METRIC_BATCH_RERUNS);
        if (j->state == SK_JOB_CLAIMED || j->state == SK_JOB_HANDLED)
            sk_job_rewind(j);
    }
    sk_job_settle_failure(p, failed, failed->out.status, failed->out.error,
                          failed->out.conflict);
    return transaction(p, s, &ways[SK_WAY_CAREFUL]);
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

/* The handled jobs' completions and the COMMIT in one round trip (with the
 * back keys in s->refs given back, of a batch closed early); then each is
 * settled: completed, or its failure re-scheduled or dead-lettered. True as
 * run(). */
static bool commit(struct sk_pipeline *p, struct sk_span *s, const struct way *w, size_t back)
{
    struct sk_err err = { 0 };
    size_t m = 0;
    struct sk_pg_stmt *queued = NULL;
    size_t n_queued = queued_steps(p, s, &queued);
    if (n_queued == SIZE_MAX) {
        abandon(p, s, "no memory for the handlers' queued statements");
        return false;
    }
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        /* Settled in an earlier transaction of the span: not in this one. */
        if (j->state != SK_JOB_HANDLED || j->out.status != SEKALI_OK)
            continue;
        if (w->results_only && j->out.result_len == 0)
            continue;
        s->ref_ptrs[m] = &j->ref;
        s->results[m] = j->out.result;
        s->result_lens[m++] = j->out.result_len;
    }
    int rc = w->commit(p, s, m, back, &err);
    free(queued);
    /* Committed, the duplicates' counts are true; of an unknown outcome
     * they are left as they are, lest one be counted twice. */
    for (size_t i = 0; (rc == SK_OK || rc == SK_AGAIN) && i < s->n; i++)
        s->jobs[i].dup_uncounted = false;
    if (rc == SK_ERR && n_queued > 0 && !w->alone)
        return blame_alone(p, s);
    if (rc == SK_AGAIN) {
        /* The COMMIT may or may not have happened; only a redelivery's
         * claim can tell, so the messages must go back unchanged. */
        sk_log_job(SK_LOG_ERROR, &s->jobs[0].log, "commit outcome unknown: %s", err.msg);
        abandon(p, s, "commit outcome unknown");
        return false;
    }
    return settle_outcomes(p, s, w, rc, &err);
}

/* The statements the handled jobs queued (host->queue_sql()), in the
 * jobs' order, handed to the store for this COMMIT's pipeline; *out is
 * the caller's to free after it. Returns how many, or SIZE_MAX when out
 * of memory. */
static size_t queued_steps(struct sk_pipeline *p, struct sk_span *s, struct sk_pg_stmt **out)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->jobs[i].state == SK_JOB_HANDLED && s->jobs[i].out.status == SEKALI_OK)
            n += s->jobs[i].out.queued.n;
    *out = NULL;
    if (n == 0)
        return 0;
    struct sk_pg_stmt *steps = malloc(n * sizeof(*steps));
    if (steps == NULL)
        return SIZE_MAX;
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_HANDLED || j->out.status != SEKALI_OK)
            continue;
        sk_sqlq_steps(&j->out.queued, steps + k);
        k += j->out.queued.n;
    }
    sk_store_send_first(sk_links_store(p->links), steps, n);
    *out = steps;
    return n;
}

/* The blame rule for queued statements: a COMMIT of several jobs that
 * failed with statements queued cannot say whose statement it was, so no
 * job is charged: the ones whose handlers succeeded are rewound and each
 * runs again alone, in a transaction of its own, where a failure is its
 * own (retried or dead-lettered as any failed COMMIT). A job whose handler
 * failed is settled with its own outcome as before. A COMMIT refused for a
 * cancelled key settles that job; the others then run again together, as
 * settle_outcomes() does. True as run(). */
static bool blame_alone(struct sk_pipeline *p, struct sk_span *s)
{
    bool refused = false;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state == SK_JOB_HANDLED && j->out.status == SEKALI_OK)
            refused |= sk_job_refused_cancelled(p, j);
    }
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_HANDLED)
            continue;
        if (j->out.status == SEKALI_OK) {
            sk_metrics_inc(j->metrics, SK_METRIC_BATCH_RERUNS);
            sk_job_rewind(j);
        } else {
            sk_job_settle_failure(p, j, j->out.status, j->out.error, j->out.conflict);
        }
    }
    if (refused)
        return true;
    sk_log_debug("a batch's queued statement failed: its jobs run again, each alone");
    each_alone(p, s, false);
    return false;
}

static int commit_fast(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                       struct sk_err *err)
{
    return sk_store_commit_results(sk_links_store(p->links), s->ref_ptrs, s->results,
                                   s->result_lens, m, s->refs, back, err);
}

static int commit_careful(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                          struct sk_err *err)
{
    return sk_store_complete_many(sk_links_store(p->links), s->ref_ptrs, s->results,
                                  s->result_lens, m, s->refs, back, err);
}

/* One job: its completion and COMMIT; failed, its transaction goes, and
 * its failure is settled outside any. */
static int commit_one(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                      struct sk_err *err)
{
    sk_assert(back == 0);  /* a job alone never closes early */
    struct sk_store *store = sk_links_store(p->links);
    if (m == 1)
        return sk_store_complete(store, s->ref_ptrs[0], s->results[0], s->result_lens[0], err);
    struct sk_err rb = { 0 };
    if (sk_store_rollback(store, &rb) != SK_OK)
        sk_log_job(SK_LOG_WARN, &s->jobs[0].log, "rollback failed: %s", rb.msg);
    return SK_OK;
}

/* Each handled job after the COMMIT answered rc. One refused because a key
 * was cancelled while its job ran (sql/018) is settled as cancelled, not
 * retried; its batch-mates did nothing wrong and run again in the next
 * transaction, costing them no attempt (asked of every job before any
 * other is settled). */
static bool settle_outcomes(struct sk_pipeline *p, struct sk_span *s, const struct way *w,
                            int rc, const struct sk_err *err)
{
    bool refused = false;
    for (size_t i = 0; rc != SK_OK && i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state == SK_JOB_HANDLED && j->out.status == SEKALI_OK)
            refused |= sk_job_refused_cancelled(p, j);
    }
    bool again = false;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_HANDLED)
            continue;
        if (j->out.status == SEKALI_OK && rc == SK_OK) {
            sk_job_transition(j, SK_JOB_COMMITTED);
            sk_job_reply(p, j, j->out.result, j->out.result_len);
            sk_job_finish(j, SK_ACK, SK_OUTCOME_COMPLETED, NULL, "completed");
            continue;
        }
        if (j->out.status == SEKALI_OK && refused && !w->alone) {
            sk_job_rewind(j);
            again = true;
            continue;
        }
        if (j->out.status == SEKALI_OK) {
            /* Rolled back (the handler left the transaction failed, or as a
             * whole): which job's doing is not known. */
            j->out.status = SEKALI_RETRY;
            j->out.retry_after_ms = 0;
            snprintf(j->out.error, sizeof(j->out.error), "commit failed: %s", err->msg);
        }
        sk_job_settle_failure(p, j, j->out.status, j->out.error, j->out.conflict);
    }
    return again;
}

/* The transaction is lost before any COMMIT: every job still in it is
 * handed back unchanged. */
static void abandon(struct sk_pipeline *p, struct sk_span *s, const char *why)
{
    sk_store_rollback(sk_links_store(p->links), NULL);
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_CLAIMED && j->state != SK_JOB_HANDLED)
            continue;
        char text[200];
        snprintf(text, sizeof(text), "%s, handed back to the broker", why);
        sk_job_finish(j, SK_REQUEUE, SK_OUTCOME_HANDED_BACK, "transaction_lost", text);
    }
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

/* The duplicates a rolled-back transaction of the span claimed took their
 * count with it, and are settled, so no later claim counts them: written
 * again on their own, before the next transaction or the span's exits. A
 * counter, not an outcome: if that fails, it is logged and let go. */
static void recount_duplicates(struct sk_pipeline *p, struct sk_span *s)
{
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->jobs[i].dup_uncounted)
            s->ref_ptrs[m++] = &s->jobs[i].ref;
        s->jobs[i].dup_uncounted = false;
    }
    struct sk_err err = { 0 };
    if (m > 0 && sk_store_count_duplicates(sk_links_store(p->links), s->ref_ptrs, m, &err) != SK_OK)
        sk_log_warn("queue %s: %zu duplicate deliveries left uncounted: %s", p->queue->name, m,
                    err.msg);
}

void sk_span_settle(struct sk_pipeline *p, struct sk_span *s)
{
    recount_duplicates(p, s);
    if (p->heartbeat != NULL)
        count_lost_locks(p, s);
    sk_span_unlock(p, s);
    uint32_t pause_ms = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        sk_assert(!sk_job_live(j));
        pause_ms += j->exit.pause_ms;
        if (j->state != SK_JOB_SETTLED) {
            /* settle_done() carried it out. */
        } else if (sk_links_consumer(p->links) != NULL) {
            exit_job(p, j);
        } else {
            /* An earlier exit found the consumer gone: the broker puts this
             * delivery back itself, and its redelivery finds what we did. */
            sk_job_exited(j, false);
        }
        free(j->out.result);
        j->out.result = NULL;
        sk_sqlq_clear(&j->out.queued);
    }
    s->n = 0;
    /* After the exits, so that no lock or delivery is held through it. */
    if (pause_ms > 0) {
        sk_span_release_locks(p);
        sk_sleep_ms(pause_ms);
    }
}

/* Which locks were lost is known only once the heartbeat let go of them,
 * and counted before they are released. */
static void count_lost_locks(struct sk_pipeline *p, struct sk_span *s)
{
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->jobs[i].lock.held)
            s->index[m++] = i;
    bool any = sk_heartbeat_unwatch(p->heartbeat, s->lost, m);
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        j->lock.lost = j->lock.held ? s->lost[k++]
                     : j->lock.shared && s->jobs[j->lock.leader - 1].lock.lost;
        bool lock_lost = j->lock.lost;
        if (!lock_lost && !(j->leased && any))
            continue;
        sk_metrics_inc(j->metrics, SK_METRIC_LOCKS_LOST);
        /* The heartbeat saw it first, but knows no job: this line carries
         * the job's keys, so a search by key finds it. */
        sk_log_event(SK_LOG_WARN, SK_EVENT_LOCK_LOST, lock_lost ? SK_SERVER_REDIS : NULL,
                     &j->log, "the job ran without its %s: expired or taken over "
                     "while it ran", lock_lost ? "lock" : "lease");
    }
}

/* Between two transactions of one span: the exits of the settled jobs
 * ahead of the first live one, sent now, so that a job committed early in
 * a long batch is not redelivered as a duplicate should the worker die
 * before the batch ends. */
static void settle_done(struct sk_pipeline *p, struct sk_span *s)
{
    bool any = false;
    for (size_t i = 0; i < s->n && !sk_job_live(&s->jobs[i]); i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_SETTLED || sk_links_consumer(p->links) == NULL)
            continue;
        exit_job(p, j);
        any = true;
    }
    struct sk_err err = { 0 };
    struct sk_broker *consumer = sk_links_consumer(p->links);
    if (any && consumer != NULL && sk_broker_flush_acks(consumer, &err) != SK_OK)
        sk_links_drop(p->links, SK_LINK_CONSUMER, NULL, &err);
}

/* The ack or reject, and the log line. */
static void exit_job(struct sk_pipeline *p, struct sk_job *j)
{
    /* The delivery came on the consumer, and only an exit drops it. */
    struct sk_broker *consumer = sk_links_consumer(p->links);
    sk_assert(consumer != NULL);
    struct sk_err err = { 0 };
    uint64_t tag = j->delivery->delivery_tag;
    enum sk_disposition how = j->exit.how;
    int rc = how == SK_ACKED ? SK_OK
           : how == SK_ACK   ? sk_broker_ack(consumer, tag, &err)
                             : sk_broker_reject(consumer, tag, how == SK_REQUEUE, &err);
    sk_job_exited(j, rc == SK_OK);
    if (how == SK_DEAD_LETTER && rc == SK_OK)
        sk_metrics_dead_letter(j->metrics, j->exit.dead_reason);
    if (rc != SK_OK)
        sk_links_drop(p->links, SK_LINK_CONSUMER, &j->log, &err);
}
