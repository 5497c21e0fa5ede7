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
 * The steps are job.c's (job_steps.h); this file only drives them over an
 * array. Every step's exit is deferred (struct job's `deferred`) and
 * carried out at the end, in delivery order, because an ack covers every
 * earlier delivery too. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "batch.h"
#include "broker.h"
#include "clock.h"
#include "failpoint.h"
#include "heartbeat.h"
#include "job.h"
#include "job_steps.h"
#include "links.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "process.h"
#include "scoreboard.h"
#include "store.h"

/* What a batch keeps per job beyond struct job: the handler's outcome,
 * saved until the batch's COMMIT says what becomes of it. */
struct outcome {
    int     status;        /* the handler's, or RETRY when the step around it failed */
    bool    conflict;
    char    error[512];
    void   *result;        /* a copy of ctx->result, for the completion and the reply */
    size_t  result_len;
    bool    same_key;      /* an earlier job of the batch has the same key */
};

struct sk_batch {
    size_t           cap;
    amqp_envelope_t *deliveries;
    struct job      *jobs;
    struct outcome  *outcomes;
    /* Scratch arrays for the round trips over the batch. */
    const char     **keys, **tokens;
    int             *rcs;
    struct sk_keyref *refs;
    const struct sk_keyref **ref_ptrs;
    const void     **results;
    size_t          *result_lens;
    struct sk_claim *claims;
    bool            *dups;
    size_t          *index;    /* which job each scratch entry is */
};

static struct sk_batch *batch_of(struct sk_pipeline *p);
static size_t collect(struct sk_pipeline *p, struct sk_batch *b, amqp_envelope_t *first);
static void lock_all(struct sk_pipeline *p, struct sk_batch *b, size_t n);
static void record_locks(struct sk_pipeline *p, struct sk_batch *b, size_t n);
static size_t lock_round(struct sk_pipeline *p, struct sk_batch *b, size_t n, size_t *asked,
                         size_t *locked);
static void refuse_busy(struct sk_pipeline *p, struct sk_batch *b, size_t asked);
/* How a batch's keys are claimed, and so how its handlers run. */
enum way {
    FAST,     /* claimed completed, handlers straight in the transaction */
    CAREFUL,  /* claimed processing, each handler in a savepoint */
};

static bool claim_all(struct sk_pipeline *p, struct sk_batch *b, size_t n, enum way way);
static void run_fast(struct sk_pipeline *p, struct sk_batch *b, size_t n);
static void run_careful(struct sk_pipeline *p, struct sk_batch *b, size_t n);
static bool run_one(struct sk_pipeline *p, struct job *j, struct outcome *o, bool first);
static bool handle(struct sk_pipeline *p, struct job *j, struct outcome *o);
static void commit_all(struct sk_pipeline *p, struct sk_batch *b, size_t n, enum way way);
static void settle_all(struct sk_pipeline *p, struct sk_batch *b, size_t n);
static void abandon(struct sk_pipeline *p, struct sk_batch *b, size_t n, const char *why);
static uint64_t now_ns(void);

size_t sk_batch_run(struct sk_pipeline *p, amqp_envelope_t *first)
{
    struct sk_batch *b = batch_of(p);
    if (b == NULL) {
        /* No memory for a batch: the delivery goes the one-job way. */
        sk_job_process(p, first);
        sk_broker_release(sk_links_consumer(p->links), first);
        return 1;
    }
    size_t n = collect(p, b, first);
    for (size_t i = 0; i < n; i++) {
        b->jobs[i] = (struct job){ .state = JOB_NEW, .delivery = &b->deliveries[i],
                                   .delivery_tag = b->deliveries[i].delivery_tag,
                                   .deferred = true };
        b->outcomes[i] = (struct outcome){ .status = SEKALI_OK };
        sk_job_admit(p, &b->jobs[i]);
    }
    if (p->queue->lock)
        lock_all(p, b, n);
    for (size_t i = 0; i < n; i++)
        if (!b->jobs[i].exit_decided)
            sk_job_survivable(p, &b->jobs[i]);
    if (claim_all(p, b, n, FAST))
        run_fast(p, b, n);
    /* Same keys: their leader has committed (or not); each now claims for
     * itself, and finds the leader's outcome as any later copy would. */
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        if (b->outcomes[i].same_key && !j->exit_decided && sk_job_claim(p, j))
            sk_job_run_transactional(p, j);
    }
    settle_all(p, b, n);
    for (size_t i = 0; i < n; i++) {
        free(b->outcomes[i].result);
        b->outcomes[i].result = NULL;
        sk_broker_release(sk_links_consumer(p->links), &b->deliveries[i]);
    }
    return n;
}

void sk_batch_free(struct sk_batch *b)
{
    if (b == NULL)
        return;
    free(b->deliveries);
    free(b->jobs);
    free(b->outcomes);
    free(b->keys);
    free(b->tokens);
    free(b->rcs);
    free(b->refs);
    free(b->ref_ptrs);
    free(b->results);
    free(b->result_lens);
    free(b->claims);
    free(b->dups);
    free(b->index);
    free(b);
}

static struct sk_batch *batch_of(struct sk_pipeline *p)
{
    if (p->batch != NULL)
        return p->batch;
    size_t n = (size_t)p->queue->batch;
    struct sk_batch *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->cap = n;
    b->deliveries = calloc(n, sizeof(*b->deliveries));
    b->jobs = calloc(n, sizeof(*b->jobs));
    b->outcomes = calloc(n, sizeof(*b->outcomes));
    b->keys = calloc(n, sizeof(*b->keys));
    b->tokens = calloc(n, sizeof(*b->tokens));
    b->rcs = calloc(n, sizeof(*b->rcs));
    b->refs = calloc(n, sizeof(*b->refs));
    b->ref_ptrs = calloc(n, sizeof(*b->ref_ptrs));
    b->results = calloc(n, sizeof(*b->results));
    b->result_lens = calloc(n, sizeof(*b->result_lens));
    b->claims = calloc(n, sizeof(*b->claims));
    b->dups = calloc(n, sizeof(*b->dups));
    b->index = calloc(n, sizeof(*b->index));
    if (!b->deliveries || !b->jobs || !b->outcomes || !b->keys || !b->tokens || !b->rcs ||
        !b->refs || !b->ref_ptrs || !b->results || !b->result_lens || !b->claims || !b->dups ||
        !b->index) {
        sk_batch_free(b);
        return NULL;
    }
    p->batch = b;
    return b;
}

/* The first delivery, and what else arrives within batch_wait: a batch
 * never waits for a full window, only for what the broker is already
 * sending (prefetch keeps it coming). */
static size_t collect(struct sk_pipeline *p, struct sk_batch *b, amqp_envelope_t *first)
{
    b->deliveries[0] = *first;
    size_t n = 1;
    uint64_t until = now_ns() + (uint64_t)p->queue->batch_wait_ms * 1000000u;
    struct sk_err err = { 0 };
    while (n < b->cap) {
        uint64_t now = now_ns();
        int wait_ms = now >= until ? 0 : (int)((until - now + 999999u) / 1000000u);
        int rc = sk_broker_next(sk_links_consumer(p->links), &b->deliveries[n], wait_ms, &err);
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

/* All the received jobs' locks in one round trip. A busy one leaves the
 * batch and is re-scheduled, as job.c re-schedules a lock still busy after
 * lock.busy_wait; the batch does not wait for it, unless it is all the
 * batch has to do: then it is asked again until busy_wait, as job.c does. */
static void lock_all(struct sk_pipeline *p, struct sk_batch *b, size_t n)
{
    record_locks(p, b, n);
    int64_t give_up_at = sk_now_ms() + p->conf->lock.busy_wait_ms;
    size_t locked = 0, asked;
    for (;;) {
        size_t busy = lock_round(p, b, n, &asked, &locked);
        if (busy == 0)
            break;
        if (locked > 0 || sk_now_ms() >= give_up_at || sk_process_stopping()) {
            refuse_busy(p, b, asked);
            break;
        }
        sk_sleep_ms(sk_jitter(5, 50));
    }
    if (locked == 0 || p->heartbeat == NULL)
        return;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!b->jobs[i].locked)
            continue;
        b->keys[m] = b->jobs[i].lock_key;
        b->tokens[m++] = b->jobs[i].lock_token;
    }
    sk_heartbeat_watch_locks(p->heartbeat, m, b->keys, b->tokens, p->queue->lock_ttl_ms);
}

/* Names every received job's lock and token, and records them all in the
 * scoreboard before Redis is asked, as job.c's take_lock() records its one:
 * a worker dying now leaves its replacement every lock to free, not just
 * the running job's, whose batch-mates would otherwise wait out lock_ttl.
 * They stay recorded until settle_all() released them. */
static void record_locks(struct sk_pipeline *p, struct sk_batch *b, size_t n)
{
    size_t recorded = 0;
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        if (j->state != JOB_RECEIVED)
            continue;
        sk_lock_key(j->lock_key, sizeof(j->lock_key), p->queue->name, j->env.resource_key);
        sk_lock_new_token(j->lock_token);
        b->keys[recorded] = j->lock_key;
        b->tokens[recorded++] = j->lock_token;
    }
    sk_slot_record_locks(p->slot, recorded, b->keys, b->tokens);
}

/* One pipelined SET for each job still without its lock: those granted are
 * locked (*locked counts them all so far). Returns how many were busy,
 * which b->index and b->rcs name among the *asked; 0 also when Redis
 * failed, its jobs then sent on (unlocked, or re-scheduled) by
 * sk_job_lock_refused(). */
static size_t lock_round(struct sk_pipeline *p, struct sk_batch *b, size_t n, size_t *asked,
                         size_t *locked)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        if (j->state != JOB_RECEIVED || j->exit_decided)
            continue;
        b->keys[m] = j->lock_key;
        b->tokens[m] = j->lock_token;
        b->index[m++] = i;
    }
    *asked = m;
    if (m == 0)
        return 0;
    struct sk_lock *redis;
    int rc = sk_links_lock(p->links, &redis);
    struct sk_err err = { 0 };
    if (redis != NULL) {
        rc = sk_lock_acquire_many(redis, m, b->keys, b->tokens, p->queue->lock_ttl_ms, b->rcs,
                                  &err);
        if (rc == SK_OK)
            sk_links_up(p->links, SK_LINK_LOCK);
        else
            rc = sk_links_drop(p->links, SK_LINK_LOCK, &b->jobs[b->index[0]].log, &err);
    }
    if (redis == NULL || rc != SK_OK) {
        /* Redis down: the queue proceeds without locks, or re-schedules. */
        for (size_t k = 0; k < m; k++)
            if (rc != SK_OK)
                sk_job_lock_refused(p, &b->jobs[b->index[k]], rc);
        return 0;
    }
    size_t busy = 0;
    for (size_t k = 0; k < m; k++) {
        struct job *j = &b->jobs[b->index[k]];
        if (b->rcs[k] == SK_BUSY) {
            busy++;
            sk_failpoint("lock_busy", j->env.idempotency_key);  /* dying while waiting */
            continue;
        }
        j->locked = true;
        j->redis = redis;
        j->log.lock_owner = j->lock_token;
        sk_job_transition(j, JOB_LOCKED);
        (*locked)++;
    }
    return busy;
}

/* The jobs the last lock_round() found busy leave the batch, re-scheduled. */
static void refuse_busy(struct sk_pipeline *p, struct sk_batch *b, size_t asked)
{
    for (size_t k = 0; k < asked; k++) {
        if (b->rcs[k] != SK_BUSY)
            continue;
        struct job *j = &b->jobs[b->index[k]];
        sk_metrics_inc(j->metrics, SK_METRIC_LOCK_BUSY);
        sk_job_lock_refused(p, j, SK_BUSY);
    }
}

/* BEGIN and every key's claim in one round trip. True when the batch's
 * transaction is open with the claimed jobs in it. A key another worker
 * holds (lock_timeout) fails the whole statement: the jobs then go the
 * one-at-a-time way, each in its own transaction, which waits for that key
 * alone. */
static bool claim_all(struct sk_pipeline *p, struct sk_batch *b, size_t n, enum way way)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        if (j->exit_decided)
            continue;
        for (size_t k = 0; k < m && !b->outcomes[i].same_key; k++)
            b->outcomes[i].same_key =
                strcmp(b->refs[k].key, j->env.idempotency_key) == 0;
        if (b->outcomes[i].same_key)
            continue;
        b->refs[m] = j->ref;
        b->index[m++] = i;
    }
    if (m == 0)
        return false;
    struct sk_err err = { 0 };
    memset(b->dups, 0, m * sizeof(*b->dups));
    struct sk_store *store = sk_links_store(p->links);
    int rc = way == FAST ? sk_store_claim_completing(store, b->refs, m, b->claims, b->dups, &err)
                         : sk_store_claim_many(store, b->refs, m, b->claims, b->dups, &err);
    if (rc == SK_BUSY) {
        for (size_t k = 0; k < m; k++) {
            struct job *j = &b->jobs[b->index[k]];
            if (sk_job_claim(p, j))
                sk_job_run_transactional(p, j);
        }
        return false;
    }
    for (size_t k = 0; k < m; k++) {
        struct job *j = &b->jobs[b->index[k]];
        j->claim = b->claims[k];
        sk_job_claimed(p, j, rc == SK_OK && b->dups[k] ? SK_DUP : rc, &err);
    }
    return rc == SK_OK;
}

/* Every claimed job's handler straight in the transaction, then the one
 * COMMIT. At the first failure the transaction is rolled back; the failed
 * job is settled with its outcome (its handler does not run again), and
 * the rest of the batch goes the careful way. */
static void run_fast(struct sk_pipeline *p, struct sk_batch *b, size_t n)
{
    size_t failed = n;
    for (size_t i = 0; i < n && failed == n; i++) {
        struct job *j = &b->jobs[i];
        if (j->state != JOB_CLAIMED)
            continue;
        if (!handle(p, j, &b->outcomes[i])) {
            abandon(p, b, n, "the batch's transaction failed around a handler");
            return;
        }
        if (b->outcomes[i].status != SEKALI_OK)
            failed = i;
    }
    if (failed == n) {
        commit_all(p, b, n, FAST);
        return;
    }
    struct sk_err err = { 0 };
    if (sk_store_rollback(sk_links_store(p->links), &err) != SK_OK) {
        /* The connection went with the transaction: nobody's fault. */
        abandon(p, b, n, "the batch's transaction was lost");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        if (i != failed && (j->state == JOB_CLAIMED || j->state == JOB_HANDLED)) {
            free(b->outcomes[i].result);
            b->outcomes[i] = (struct outcome){ .status = SEKALI_OK,
                                               .same_key = b->outcomes[i].same_key };
            sk_job_rewind(j);
        }
    }
    struct outcome *o = &b->outcomes[failed];
    sk_job_settle_failure(p, &b->jobs[failed], o->status, o->error, o->conflict);
    if (claim_all(p, b, n, CAREFUL))
        run_careful(p, b, n);
}

/* Each claimed job's handler in its savepoint, then the one COMMIT. */
static void run_careful(struct sk_pipeline *p, struct sk_batch *b, size_t n)
{
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        if (j->state != JOB_CLAIMED)
            continue;
        if (!run_one(p, j, &b->outcomes[i], first)) {
            abandon(p, b, n, "the batch's transaction failed around a handler");
            return;
        }
        first = false;
    }
    commit_all(p, b, n, CAREFUL);
}

/* One handler in its savepoint. False when the transaction itself is lost
 * (the connection, or a savepoint refused): then nothing of the batch can
 * commit. */
static bool run_one(struct sk_pipeline *p, struct job *j, struct outcome *o, bool first)
{
    struct sk_store *store = sk_links_store(p->links);
    struct sk_err err = { 0 };
    if (sk_store_savepoint(store, first, &err) != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "savepoint failed: %s", err.msg);
        return false;
    }
    if (!handle(p, j, o))
        return false;
    if (o->status == SEKALI_OK)
        return true;
    if (sk_store_rollback_job(store, &j->ref, &err) != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "rollback to the job's savepoint failed: %s", err.msg);
        return false;
    }
    return true;
}

/* Runs one claimed job's handler and keeps its outcome in o. False only
 * when there is no memory to keep its result. */
static bool handle(struct sk_pipeline *p, struct job *j, struct outcome *o)
{
    /* The scoreboard names the job whose handler runs, and only it: should
     * the worker die now, this is the job its replacement counts, and the
     * job timeout is this job's alone. */
    struct sk_slot *slot = p->slot;
    snprintf(slot->job_key, sizeof(slot->job_key), "%s", j->env.idempotency_key);
    atomic_store(&slot->job_started_ms, sk_now_ms());
    struct sekali_ctx *ctx = &p->ctx;
    sk_host_ctx_reset(ctx);
    PGconn *pg = sk_store_conn(sk_links_store(p->links));
    o->status = sk_job_call_handler(p, j, pg);
    if (o->status == SEKALI_OK && PQtransactionStatus(pg) != PQTRANS_INTRANS) {
        o->status = SEKALI_RETRY;
        snprintf(ctx->error, sizeof(ctx->error), "the handler left its transaction %s",
                 PQtransactionStatus(pg) == PQTRANS_INERROR ? "failed" : "ended");
    }
    o->conflict = ctx->conflict;
    snprintf(o->error, sizeof(o->error), "%s", ctx->error);
    o->result_len = 0;
    if (o->status != SEKALI_OK || ctx->result_len == 0)
        return true;
    o->result = malloc(ctx->result_len);
    if (o->result == NULL) {
        sk_log_job(SK_LOG_ERROR, &j->log, "out of memory saving a %zu-byte result",
                   ctx->result_len);
        return false;
    }
    memcpy(o->result, ctx->result, ctx->result_len);
    o->result_len = ctx->result_len;
    return true;
}

/* The survivors' completions and the COMMIT in one round trip; then every
 * handled job is settled: completed, or its failure (its savepoint rolled
 * back) re-scheduled or dead-lettered outside the transaction. */
static void commit_all(struct sk_pipeline *p, struct sk_batch *b, size_t n, enum way way)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (b->jobs[i].state != JOB_HANDLED || b->outcomes[i].status != SEKALI_OK)
            continue;
        /* Claimed completed: only a result is left to write. */
        if (way == FAST && b->outcomes[i].result_len == 0)
            continue;
        b->ref_ptrs[m] = &b->jobs[i].ref;
        b->results[m] = b->outcomes[i].result;
        b->result_lens[m++] = b->outcomes[i].result_len;
    }
    struct sk_err err = { 0 };
    struct sk_store *store = sk_links_store(p->links);
    int rc = way == FAST
        ? sk_store_commit_results(store, b->ref_ptrs, b->results, b->result_lens, m, &err)
        : sk_store_complete_many(store, b->ref_ptrs, b->results, b->result_lens, m, &err);
    if (rc == SK_AGAIN) {
        abandon(p, b, n, "commit outcome unknown");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        struct outcome *o = &b->outcomes[i];
        /* A job the fast way already settled is handled, but not here. */
        if (j->state != JOB_HANDLED || j->exit_decided)
            continue;
        if (o->status == SEKALI_OK && rc == SK_OK) {
            sk_job_transition(j, JOB_COMMITTED);
            sk_job_reply(p, j, o->result, o->result_len);
            sk_job_finish(p, j, ACK, "completed");
            continue;
        }
        if (o->status == SEKALI_OK) {
            /* Rolled back as a whole: which job's doing is not known. */
            o->status = SEKALI_RETRY;
            snprintf(o->error, sizeof(o->error), "commit failed: %s", err.msg);
        }
        sk_job_settle_failure(p, j, o->status, o->error, o->conflict);
    }
}

/* The transaction is lost before any COMMIT: every job still in it is
 * handed back unchanged, as job.c hands back a job whose commit failed
 * unseen; its redelivery's claim finds out what happened. */
static void abandon(struct sk_pipeline *p, struct sk_batch *b, size_t n, const char *why)
{
    sk_store_rollback(sk_links_store(p->links), NULL);
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        if (j->exit_decided || (j->state != JOB_CLAIMED && j->state != JOB_HANDLED))
            continue;
        char text[200];
        snprintf(text, sizeof(text), "%s, handed back to the broker", why);
        sk_job_finish(p, j, REQUEUE, text);
    }
}

/* The locks go in one round trip, then each job's exit in delivery order:
 * an ack is a multiple-ack (broker.c), sent only once the next delivery is
 * awaited, by when every job of the batch is settled. */
static void settle_all(struct sk_pipeline *p, struct sk_batch *b, size_t n)
{
    if (p->heartbeat != NULL)
        sk_heartbeat_unwatch(p->heartbeat);
    size_t m = 0;
    struct sk_lock *redis = NULL;
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        if (!j->locked)
            continue;
        redis = j->redis;
        j->locked = false;
        b->keys[m] = j->lock_key;
        b->tokens[m] = j->lock_token;
        b->index[m++] = i;
    }
    struct sk_err err = { 0 };
    if (m > 0 && sk_lock_release_many(redis, m, b->keys, b->tokens, b->rcs, &err) != SK_OK)
        sk_log_warn("queue %s: releasing %zu locks failed (they will expire): %s",
                    p->queue->name, m, err.msg);
    else
        for (size_t k = 0; k < m; k++)
            if (b->rcs[k] == SK_BUSY)
                sk_log_job(SK_LOG_WARN, &b->jobs[b->index[k]].log,
                           "lock had expired before release");
    sk_slot_forget_locks(p->slot);
    for (size_t i = 0; i < n; i++) {
        struct job *j = &b->jobs[i];
        sk_assert(j->exit_decided);
        j->deferred = false;
        if (sk_links_consumer(p->links) != NULL) {
            sk_job_exit(p, j, j->exit, j->outcome);
            continue;
        }
        /* An earlier exit found the consumer gone: the broker puts this
         * delivery back itself, and its redelivery finds what we did. */
        sk_job_transition(j, JOB_HANDED_BACK);
        sk_log_job(SK_LOG_INFO, &j->log, "%s; not acked: the consumer was lost", j->outcome);
    }
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
