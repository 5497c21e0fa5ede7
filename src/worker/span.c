/* span.c - the steps of the pipeline over a span of n >= 1 jobs: lock them
 * all, claim them all, run each handler, commit, settle.
 *
 * One job is a span of one (sk_span_process()) and a batch a span of
 * many (sk_batch_run(), batch.c): so there is one way to take and release
 * locks, one claim, one commit and one settling, and a span of one costs
 * what one job costs, round trip for round trip. Each step costs one round
 * trip to a server for the whole span: every lock in one pipelined Redis
 * round trip (acquire, renew in the heartbeat, release), every key in one
 * claim statement and the completions with the one COMMIT. What the steps
 * decide for a single job (what a refused lock, a claim's answer, a failed
 * handler mean) stays in job.c; this file only carries it across the span.
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
#include "failpoint.h"
#include "heartbeat.h"
#include "job.h"
#include "job_steps.h"
#include "lease.h"
#include "links.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "process.h"
#include "reschedule.h"
#include "scoreboard.h"
#include "store.h"

static void lock_span(struct sk_pipeline *p, struct sk_span *s);
static size_t put_releases(struct sk_span *s);
static void released(struct sk_pipeline *p, struct sk_span *s, int rc, const struct sk_err *err);
static size_t lock_round(struct sk_pipeline *p, struct sk_span *s, struct sk_lock *redis,
                         size_t r, size_t *asked, size_t *locked);
static void lock_refused(struct sk_pipeline *p, struct sk_job *j, int rc);
static bool asks_for_lock(const struct sk_job *j);
static size_t lock_leader(const struct sk_span *s, size_t i);
static void follow_leaders(struct sk_pipeline *p, struct sk_span *s);
static void waited_for_lock(struct sk_job *j);
static void release_span(struct sk_pipeline *p, struct sk_span *s);
static int  claim_round(struct sk_pipeline *p, struct sk_span *s, enum sk_way way, size_t m,
                        struct sk_err *err);
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
    if (sk_job_live(j)) {
        if (p->queue->mode == SK_MODE_EXTERNAL) {
            if (sk_span_claim(p, s, SK_WAY_ONE) == SK_OK)
                sk_job_run_external(p, j);
        } else {
            sk_span_alone(p, s, j);
        }
    }
    sk_span_settle(p, s);
}

struct sk_span *sk_span_of(struct sk_pipeline *p)
{
    if (p->span != NULL)
        return p->span;
    size_t n = p->queue->batch > 1 ? (size_t)p->queue->batch : 1;
    struct sk_span *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->cap = n;
    s->jobs = calloc(n, sizeof(*s->jobs));
    s->deliveries = calloc(n, sizeof(*s->deliveries));
    s->releases = calloc(n, sizeof(*s->releases));
    s->keys = calloc(2 * n, sizeof(*s->keys));
    s->tokens = calloc(2 * n, sizeof(*s->tokens));
    s->rcs = calloc(2 * n, sizeof(*s->rcs));
    s->lost = calloc(n, sizeof(*s->lost));
    s->refs = calloc(n, sizeof(*s->refs));
    s->ref_ptrs = calloc(n, sizeof(*s->ref_ptrs));
    s->results = calloc(n, sizeof(*s->results));
    s->result_lens = calloc(n, sizeof(*s->result_lens));
    s->claims = calloc(n, sizeof(*s->claims));
    s->dups = calloc(n, sizeof(*s->dups));
    s->index = calloc(n, sizeof(*s->index));
    if (!s->jobs || !s->deliveries || !s->releases || !s->keys || !s->tokens || !s->rcs ||
        !s->lost || !s->refs || !s->ref_ptrs || !s->results || !s->result_lens || !s->claims ||
        !s->dups || !s->index) {
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
    free(s->jobs);
    free(s->deliveries);
    free(s->releases);
    free(s->keys);
    free(s->tokens);
    free(s->rcs);
    free(s->lost);
    free(s->refs);
    free(s->ref_ptrs);
    free(s->results);
    free(s->result_lens);
    free(s->claims);
    free(s->dups);
    free(s->index);
    free(s);
}

void sk_span_add(struct sk_span *s, const amqp_envelope_t *delivery)
{
    sk_assert(s->n < s->cap);
    s->jobs[s->n++] = (struct sk_job){ .state = SK_JOB_NEW, .delivery = delivery,
                                    .delivery_tag = delivery->delivery_tag,
                                    .status = SEKALI_OK };
}

void sk_span_start(struct sk_pipeline *p, struct sk_span *s)
{
    for (size_t i = 0; i < s->n; i++)
        sk_job_admit(p, &s->jobs[i]);
    if (p->queue->lock)
        lock_span(p, s);
    for (size_t i = 0; i < s->n; i++)
        if (sk_job_live(&s->jobs[i]))
            sk_job_survivable(p, &s->jobs[i]);
}

/* Every received job's lock, in one round trip a try; the first carries
 * the releases of the jobs settled before (put_releases()). Jobs of one
 * resource share the first one's lock (lock_leader()). A busy one is
 * re-scheduled, as a lock still busy after lock.busy_wait is; the span does
 * not wait for it, unless it is all the span has to do (a span of one
 * always): then it is asked again until busy_wait. Each lock is recorded in
 * the scoreboard before Redis is asked, not after it said yes: a worker
 * that dies between the SET and the record would otherwise leave a lock its
 * replacement knows nothing of, and the redelivery would wait out the TTL;
 * deleting by a token that never took the lock deletes nothing. They stay
 * recorded until they are released. */
static void lock_span(struct sk_pipeline *p, struct sk_span *s)
{
    size_t r = put_releases(s), m = r;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_RECEIVED || !sk_job_live(j))
            continue;
        sk_lock_key(j->lock_key, sizeof(j->lock_key), p->queue->name, j->env.resource_key);
        j->lock_leader = lock_leader(s, i);
        if (j->lock_leader != 0)
            continue;
        sk_lock_new_token(j->lock_token);
        s->keys[m] = j->lock_key;
        s->tokens[m++] = j->lock_token;
    }
    if (m == r)
        return;  /* the releases wait for the next acquire, or the worker's idling */
    struct sk_lock *redis;
    int rc = sk_links_lock(p->links, &redis);
    if (redis == NULL) {
        /* Redis in its backoff: the queue proceeds without locks, or
         * re-schedules. */
        for (size_t i = 0; i < s->n; i++)
            if (s->jobs[i].state == SK_JOB_RECEIVED && sk_job_live(&s->jobs[i]))
                lock_refused(p, &s->jobs[i], rc);
        return;
    }
    sk_slot_record_locks(p->slot, m, s->keys, s->tokens);

    int64_t give_up_at = sk_now_ms() + p->conf->lock.busy_wait_ms;
    size_t locked = 0, asked;
    for (;;) {
        size_t busy = lock_round(p, s, redis, r, &asked, &locked);
        r = 0;
        if (busy == 0)
            break;
        if (locked > 0 || sk_now_ms() >= give_up_at || sk_process_stopping()) {
            if (locked == 0)
                sk_slot_forget_locks(p->slot);
            for (size_t k = 0; k < asked; k++) {
                if (s->rcs[k] != SK_BUSY)
                    continue;
                struct sk_job *j = &s->jobs[s->index[k]];
                waited_for_lock(j);
                sk_metrics_inc(j->metrics, SK_METRIC_LOCK_BUSY);
                lock_refused(p, j, SK_BUSY);
            }
            break;
        }
        sk_sleep_ms(sk_jitter(5, 50));
    }
    follow_leaders(p, s);
    if (locked == 0 || p->heartbeat == NULL)
        return;
    m = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (!s->jobs[i].locked)
            continue;
        s->keys[m] = s->jobs[i].lock_key;
        s->tokens[m++] = s->jobs[i].lock_token;
    }
    sk_heartbeat_watch_locks(p->heartbeat, m, s->keys, s->tokens, p->queue->lock_ttl_ms);
}

/* A job still to ask Redis for its own lock. */
static bool asks_for_lock(const struct sk_job *j)
{
    return j->state == SK_JOB_RECEIVED && sk_job_live(j) && j->lock_leader == 0;
}

/* 1 + the index of the first earlier job of the span asking for the same
 * lock as job i, or 0. The lock keeps two workers off one resource; jobs of
 * one worker run one after the other anyway, so the later job needs no lock
 * of its own, only to run after the first. Asking Redis would find the lock
 * taken by its batch-mate and re-schedule the job through a delay queue, so
 * that a burst on one resource would trickle through one job a batch. */
static size_t lock_leader(const struct sk_span *s, size_t i)
{
    const struct sk_job *j = &s->jobs[i];
    for (size_t k = 0; k < i; k++)
        if (asks_for_lock(&s->jobs[k]) && strcmp(s->jobs[k].lock_key, j->lock_key) == 0)
            return k + 1;
    return 0;
}

/* Each follower of a lock leader ends as its leader did: locked (under the
 * leader's lock), sent on unlocked, or re-scheduled for the same reason. */
static void follow_leaders(struct sk_pipeline *p, struct sk_span *s)
{
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_RECEIVED || !sk_job_live(j) || j->lock_leader == 0)
            continue;
        const struct sk_job *leader = &s->jobs[j->lock_leader - 1];
        if (leader->locked) {
            j->lock_shared = true;
            j->log.lock_owner = leader->lock_token;
            sk_job_transition(j, SK_JOB_LOCKED);
        } else if (!sk_job_live(leader)) {
            lock_refused(p, j, leader->lock_refusal);
        }
    }
}

/* The releases waiting, as the first r of s->keys and s->tokens. */
static size_t put_releases(struct sk_span *s)
{
    for (size_t i = 0; i < s->n_releases; i++) {
        s->keys[i] = s->releases[i].key;
        s->tokens[i] = s->releases[i].token;
    }
    return s->n_releases;
}

/* The answers to the releases waiting (the first of s->rcs), when the
 * round trip carrying them returned rc; they are done with either way. */
static void released(struct sk_pipeline *p, struct sk_span *s, int rc, const struct sk_err *err)
{
    for (size_t i = 0; i < s->n_releases; i++) {
        const struct sk_release *x = &s->releases[i];
        if (rc == SK_OK && s->rcs[i] == SK_OK)
            continue;
        const struct sk_log_job job = {
            .queue = p->queue->name, .job_id = x->job_id, .idempotency_key = x->idempotency_key,
            .resource_key = x->resource_key, .lock_owner = x->token, .fence = x->fence,
            .delivery_attempt = x->delivery_attempt,
        };
        if (rc != SK_OK && s->n_releases > 1 && i == 0)
            sk_log_warn("queue %s: releasing %zu locks failed (they will expire): %s",
                        p->queue->name, s->n_releases, err->msg);
        if (rc != SK_OK && s->n_releases == 1)
            sk_log_job(SK_LOG_WARN, &job, "lock release failed (it will expire): %s", err->msg);
        else if (rc == SK_OK)
            sk_log_job(SK_LOG_WARN, &job, "lock had expired before release");
    }
    s->n_releases = 0;
}

/* One script for each job still without its lock (SET NX PX), after the r
 * releases that s->keys starts with: those granted are locked (*locked
 * counts them all so far). Returns how many were busy, which s->index and
 * s->rcs name among the *asked; 0 also when Redis failed, its jobs then
 * sent on (unlocked, or re-scheduled). */
static size_t lock_round(struct sk_pipeline *p, struct sk_span *s, struct sk_lock *redis,
                         size_t r, size_t *asked, size_t *locked)
{
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (!asks_for_lock(j))
            continue;
        s->keys[r + m] = j->lock_key;
        s->tokens[r + m] = j->lock_token;
        s->index[m++] = i;
    }
    *asked = m;
    if (m == 0)
        return 0;
    struct sk_err err = { 0 };
    int rc = sk_lock_swap_many(redis, r, r + m, s->keys, s->tokens, p->queue->lock_ttl_ms,
                               s->rcs, &err);
    if (r > 0)
        released(p, s, rc, &err);
    if (rc != SK_OK) {
        /* No lock of this round was taken, and none of an earlier one
         * (only a span holding none asks again). */
        sk_slot_forget_locks(p->slot);
        rc = sk_links_drop(p->links, SK_LINK_LOCK, &s->jobs[s->index[0]].log, &err);
        for (size_t k = 0; k < m; k++) {
            struct sk_job *j = &s->jobs[s->index[k]];
            waited_for_lock(j);
            lock_refused(p, j, rc);
        }
        return 0;
    }
    /* The jobs' answers first in s->rcs, where the caller reads them. */
    if (r > 0)
        memmove(s->rcs, s->rcs + r, m * sizeof(*s->rcs));
    sk_links_up(p->links, SK_LINK_LOCK);
    size_t busy = 0;
    for (size_t k = 0; k < m; k++) {
        struct sk_job *j = &s->jobs[s->index[k]];
        if (s->rcs[k] == SK_BUSY) {
            busy++;
            if (j->busy_since == 0)
                j->busy_since = sk_now_ns();
            sk_failpoint("lock_busy", j->env.idempotency_key);  /* dying while waiting */
            continue;
        }
        waited_for_lock(j);
        j->locked = true;
        j->redis = redis;
        j->log.lock_owner = j->lock_token;
        sk_job_transition(j, SK_JOB_LOCKED);
        (*locked)++;
    }
    return busy;
}

/* What a refused lock means: SK_BUSY or SK_AGAIN re-schedule the job; SK_OK
 * (Redis down, the queue proceeds without it) sends it on unlocked. */
static void lock_refused(struct sk_pipeline *p, struct sk_job *j, int rc)
{
    j->lock_refusal = rc;
    if (rc == SK_BUSY)
        sk_job_later(p, j, sk_reschedule_bucket(sk_jitter(100, 1000)),
                     j->env.delivery_attempt, NULL, "lock busy");
    else if (rc == SK_AGAIN)
        sk_job_later(p, j, sk_reschedule_bucket(sk_jitter(1000, 5000)),
                     j->env.delivery_attempt, NULL, "redis down");
}

/* Adds the time since the job's lock was first refused (none: it never
 * was), once. */
static void waited_for_lock(struct sk_job *j)
{
    if (j->busy_since != 0)
        sk_metrics_lock_wait(j->metrics, sk_now_ns() - j->busy_since);
    j->busy_since = 0;
}

/* The span's locks join the releases waiting, for the next acquire or the
 * worker's idling to carry (sk_span_release_locks()): a lock release costs
 * no round trip of its own while jobs keep coming. The scoreboard keeps
 * exactly those until then. */
static void release_span(struct sk_pipeline *p, struct sk_span *s)
{
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        j->lock_shared = false;
        if (!j->locked)
            continue;
        j->locked = false;
        /* Only a span that asked Redis nothing keeps older releases, and it
         * locked none of its own: they never exceed the span's size. */
        sk_assert(s->n_releases < s->cap);
        struct sk_release *x = &s->releases[s->n_releases++];
        snprintf(x->key, sizeof(x->key), "%s", j->lock_key);
        snprintf(x->token, sizeof(x->token), "%s", j->lock_token);
        snprintf(x->job_id, sizeof(x->job_id), "%s", j->env.job_id);
        snprintf(x->idempotency_key, sizeof(x->idempotency_key), "%s", j->env.idempotency_key);
        snprintf(x->resource_key, sizeof(x->resource_key), "%s", j->env.resource_key);
        x->fence = j->log.fence;
        x->delivery_attempt = j->log.delivery_attempt;
    }
    size_t r = put_releases(s);
    if (r > 0)
        sk_slot_record_locks(p->slot, r, s->keys, s->tokens);
    else
        sk_slot_forget_locks(p->slot);
}

bool sk_span_releases_waiting(const struct sk_pipeline *p)
{
    return p->span != NULL && p->span->n_releases > 0;
}

void sk_span_release_locks(struct sk_pipeline *p)
{
    struct sk_span *s = p->span;
    if (s == NULL || s->n_releases == 0)
        return;
    size_t r = put_releases(s);
    struct sk_lock *redis;
    struct sk_err err = { 0 };
    sk_links_lock(p->links, &redis);
    int rc = SK_AGAIN;
    if (redis == NULL)
        sk_err_set(&err, SK_AGAIN, "redis unavailable");
    else
        rc = sk_lock_swap_many(redis, r, r, s->keys, s->tokens, p->queue->lock_ttl_ms, s->rcs,
                               &err);
    released(p, s, rc, &err);
    sk_slot_forget_locks(p->slot);
    if (redis != NULL && rc != SK_OK)
        sk_links_drop(p->links, SK_LINK_LOCK, NULL, &err);
    else if (redis != NULL)
        sk_links_up(p->links, SK_LINK_LOCK);
}

int sk_span_claim(struct sk_pipeline *p, struct sk_span *s, enum sk_way way)
{
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (!sk_job_live(j))
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
    sk_assert(way != SK_WAY_ONE || m == 1);
    struct sk_err err = { 0 };
    memset(s->dups, 0, m * sizeof(*s->dups));
    int rc = claim_round(p, s, way, m, &err);
    if (rc == SK_BUSY && way != SK_WAY_ONE)
        return SK_BUSY;
    bool any = false;
    for (size_t k = 0; k < m; k++) {
        struct sk_job *j = &s->jobs[s->index[k]];
        j->claim = s->claims[k];
        any |= sk_job_claimed(p, j, rc == SK_OK && s->dups[k] ? SK_DUP : rc, &err);
    }
    /* Several: the transaction is open even when every key was a
     * duplicate, whose count in it only the COMMIT makes true. */
    if (way != SK_WAY_ONE)
        return rc == SK_OK ? SK_OK : SK_ERR;
    return any ? SK_OK : SK_ERR;
}

/* The claim's round trip. One job (SK_WAY_ONE): in transactional mode BEGIN
 * and sekali.claim_completed(), the key's row written completed and locked
 * until the COMMIT that makes it true (a failed job's is rolled back), or in external mode
 * a lease committed at once, under a new fence; SK_DUP, SK_BUSY as the
 * job's own. Several: BEGIN and every key's claim in one statement, claimed
 * completed (fast) or processing (careful); a key another worker holds
 * (lock_timeout) fails the whole statement with SK_BUSY. Failures (SK_AGAIN,
 * SK_ERR) are explained in err. */
static int claim_round(struct sk_pipeline *p, struct sk_span *s, enum sk_way way, size_t m,
                       struct sk_err *err)
{
    struct sk_store *store = sk_links_store(p->links);
    if (way == SK_WAY_FAST)
        return sk_store_claim_completing(store, s->refs, m, s->claims, s->dups, err);
    if (way == SK_WAY_CAREFUL)
        return sk_store_claim_many(store, s->refs, m, s->claims, s->dups, err);
    int rc;
    if (p->queue->mode != SK_MODE_EXTERNAL) {
        rc = sk_store_claim(store, &s->refs[0], &s->claims[0], err);
    } else {
        rc = sk_store_reconnect(store, err);
        if (rc == SK_OK)
            rc = sk_lease_claim(sk_store_conn(store), &s->refs[0], p->queue->lease_ms,
                                &s->claims[0], err);
    }
    /* A duplicate is the job's own outcome, not the round trip's. */
    if (rc == SK_DUP) {
        s->dups[0] = true;
        rc = SK_OK;
    }
    return rc;
}

bool sk_span_handle(struct sk_pipeline *p, struct sk_job *j, enum sk_way way)
{
    /* The scoreboard names the job whose handler runs, and only it: should
     * the worker die now, this is the job its replacement counts. In a span
     * of many, the job timeout is this job's alone. */
    struct sk_slot *slot = p->slot;
    snprintf(slot->job_key, sizeof(slot->job_key), "%s", j->env.idempotency_key);
    if (way != SK_WAY_ONE)
        atomic_store(&slot->job_started_ms, sk_now_ms());
    struct sekali_ctx *ctx = &p->ctx;
    sk_host_ctx_reset(ctx);
    PGconn *pg = sk_store_conn(sk_links_store(p->links));
    j->status = sk_job_call_handler(p, j, pg);
    /* Alone, a transaction the handler spoiled fails its COMMIT; in a span
     * of many it would spoil its batch-mates' too. */
    if (way != SK_WAY_ONE && j->status == SEKALI_OK && PQtransactionStatus(pg) != PQTRANS_INTRANS) {
        j->status = SEKALI_RETRY;
        snprintf(ctx->error, sizeof(ctx->error), "the handler left its transaction %s",
                 PQtransactionStatus(pg) == PQTRANS_INERROR ? "failed" : "ended");
    }
    j->conflict = ctx->conflict;
    snprintf(j->error, sizeof(j->error), "%s", ctx->error);
    free(j->result);
    j->result = NULL;
    j->result_len = 0;
    if (j->status != SEKALI_OK || ctx->result_len == 0)
        return true;
    j->result = malloc(ctx->result_len);
    if (j->result == NULL) {
        sk_log_job(SK_LOG_ERROR, &j->log, "out of memory saving a %zu-byte result",
                   ctx->result_len);
        return false;
    }
    memcpy(j->result, ctx->result, ctx->result_len);
    j->result_len = ctx->result_len;
    return true;
}

bool sk_span_commit(struct sk_pipeline *p, struct sk_span *s, enum sk_way way)
{
    struct sk_err err = { 0 };
    struct sk_store *store = sk_links_store(p->links);
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        /* Settled in an earlier transaction of the span: not in this one. */
        if (j->state != SK_JOB_HANDLED || j->status != SEKALI_OK || !sk_job_live(j))
            continue;
        /* Claimed completed: only a result is left to write. */
        if (way == SK_WAY_FAST && j->result_len == 0)
            continue;
        s->ref_ptrs[m] = &j->ref;
        s->results[m] = j->result;
        s->result_lens[m++] = j->result_len;
    }
    int rc;
    if (way == SK_WAY_FAST) {
        rc = sk_store_commit_results(store, s->ref_ptrs, s->results, s->result_lens, m, &err);
    } else if (way == SK_WAY_CAREFUL) {
        rc = sk_store_complete_many(store, s->ref_ptrs, s->results, s->result_lens, m, &err);
    } else if (m == 1) {
        rc = sk_store_complete(store, s->ref_ptrs[0], s->results[0], s->result_lens[0], &err);
    } else {
        /* One job, failed: its transaction goes, its failure is settled
         * outside any. */
        rc = SK_OK;
        struct sk_err rb = { 0 };
        if (sk_store_rollback(store, &rb) != SK_OK)
            sk_log_job(SK_LOG_WARN, &s->jobs[0].log, "rollback failed: %s", rb.msg);
    }
    if (rc == SK_AGAIN) {
        /* The COMMIT may or may not have happened; only a redelivery's
         * claim can tell, so the messages must go back unchanged. */
        sk_log_job(SK_LOG_ERROR, &s->jobs[0].log, "commit outcome unknown: %s", err.msg);
        sk_span_abandon(p, s, "commit outcome unknown");
        return false;
    }
    /* Refused because a key was cancelled while its job ran (sql/018):
     * that job is settled as cancelled, not retried; its batch-mates did
     * nothing wrong and run again in the next transaction, costing them no
     * attempt. Asked of every job before any other is settled. */
    bool refused = false;
    for (size_t i = 0; rc != SK_OK && i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state == SK_JOB_HANDLED && sk_job_live(j) && j->status == SEKALI_OK)
            refused |= sk_job_refused_cancelled(p, j);
    }
    bool again = false;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        /* A job the fast way already settled is handled, but not here. */
        if (j->state != SK_JOB_HANDLED || !sk_job_live(j))
            continue;
        if (j->status == SEKALI_OK && rc == SK_OK) {
            sk_job_transition(j, SK_JOB_COMMITTED);
            sk_job_reply(p, j, j->result, j->result_len);
            sk_job_finish(p, j, SK_ACK, "completed");
            continue;
        }
        if (j->status == SEKALI_OK && refused && way != SK_WAY_ONE) {
            sk_job_rewind(j);
            again = true;
            continue;
        }
        if (j->status == SEKALI_OK) {
            /* Rolled back (the handler left the transaction failed, or as a
             * whole): which job's doing is not known. */
            j->status = SEKALI_RETRY;
            j->retry_after_ms = 0;
            snprintf(j->error, sizeof(j->error), "commit failed: %s", err.msg);
        }
        sk_job_settle_failure(p, j, j->status, j->error, j->conflict);
    }
    return again;
}

void sk_span_abandon(struct sk_pipeline *p, struct sk_span *s, const char *why)
{
    sk_store_rollback(sk_links_store(p->links), NULL);
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (!sk_job_live(j) || (j->state != SK_JOB_CLAIMED && j->state != SK_JOB_HANDLED))
            continue;
        char text[200];
        snprintf(text, sizeof(text), "%s, handed back to the broker", why);
        sk_job_finish(p, j, SK_REQUEUE, text);
    }
}

void sk_span_alone(struct sk_pipeline *p, struct sk_span *s, struct sk_job *j)
{
    /* A span of its own over the same scratch arrays: the caller keeps
     * nothing in them across this call. */
    struct sk_span one = *s;
    one.jobs = j;
    one.n = 1;
    j->same_key = false;
    if (sk_span_claim(p, &one, SK_WAY_ONE) != SK_OK)
        return;
    if (!sk_span_handle(p, j, SK_WAY_ONE)) {
        sk_span_abandon(p, &one, "the job's transaction failed around its handler");
        return;
    }
    sk_span_commit(p, &one, SK_WAY_ONE);
}

void sk_span_settle(struct sk_pipeline *p, struct sk_span *s)
{
    /* Which locks were lost is known only once the heartbeat let go of
     * them, and counted before they are released. */
    if (p->heartbeat != NULL) {
        size_t m = 0;
        for (size_t i = 0; i < s->n; i++)
            if (s->jobs[i].locked)
                s->index[m++] = i;
        bool any = sk_heartbeat_unwatch(p->heartbeat, s->lost, m);
        size_t k = 0;
        for (size_t i = 0; i < s->n; i++) {
            struct sk_job *j = &s->jobs[i];
            j->lock_lost = j->locked ? s->lost[k++]
                         : j->lock_shared && s->jobs[j->lock_leader - 1].lock_lost;
            bool lock_lost = j->lock_lost;
            if (!lock_lost && !(j->leased && any))
                continue;
            sk_metrics_inc(j->metrics, SK_METRIC_LOCKS_LOST);
            /* The heartbeat saw it first, but knows no job: this line
             * carries the job's keys, so a search by key finds it. */
            sk_log_event(SK_LOG_WARN, SK_EVENT_LOCK_LOST, lock_lost ? SK_SERVER_REDIS : NULL,
                         &j->log, "the job ran without its %s: expired or taken over "
                         "while it ran", lock_lost ? "lock" : "lease");
        }
    }
    release_span(p, s);
    uint32_t pause_ms = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        sk_assert(j->settled);
        pause_ms += j->pause_ms;
        if (j->exited) {
            /* sk_span_settle_done() carried it out. */
        } else if (sk_links_consumer(p->links) != NULL) {
            exit_job(p, j);
        } else {
            /* An earlier exit found the consumer gone: the broker puts this
             * delivery back itself, and its redelivery finds what we did. */
            sk_job_transition(j, SK_JOB_HANDED_BACK);
            sk_log_job(SK_LOG_INFO, &j->log, "%s; not acked: the consumer was lost",
                       j->outcome);
        }
        free(j->result);
        j->result = NULL;
    }
    s->n = 0;
    /* After the exits, so that no lock or delivery is held through it. */
    if (pause_ms > 0) {
        sk_span_release_locks(p);
        sk_sleep_ms(pause_ms);
    }
}

void sk_span_settle_done(struct sk_pipeline *p, struct sk_span *s)
{
    bool any = false;
    for (size_t i = 0; i < s->n && s->jobs[i].settled; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->exited || sk_links_consumer(p->links) == NULL)
            continue;
        exit_job(p, j);
        j->exited = true;
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
    int rc = j->acked          ? SK_OK
           : j->exit == SK_ACK ? sk_broker_ack(consumer, j->delivery_tag, &err)
                               : sk_broker_reject(consumer, j->delivery_tag,
                                                  j->exit == SK_REQUEUE, &err);
    sk_job_transition(j, j->exit == SK_ACK && rc == SK_OK ? SK_JOB_ACKED : SK_JOB_HANDED_BACK);
    if (j->exit == SK_DEAD_LETTER && rc == SK_OK)
        sk_metrics_dead_letter(j->metrics, j->dead_reason);
    sk_log_job(SK_LOG_INFO, &j->log, "%s", j->outcome);
    if (rc != SK_OK)
        sk_links_drop(p->links, SK_LINK_CONSUMER, &j->log, &err);
}

