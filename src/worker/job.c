/* job.c - the pipeline of one delivery, in a worker process.
 *
 *   deliver -> validate -> lock -> claim -> handler -> commit -> ack -> release
 *
 * The order is the whole design: the effect and the key's completion commit
 * in one PostgreSQL transaction, and the ack is sent only after that commit.
 * Dying anywhere before COMMIT rolls everything back and the broker
 * redelivers; dying after it leaves a completed key, and the redelivery is
 * acked as a duplicate without running the handler. The Redis lock only keeps
 * two workers from doing the same work at once; it decides nothing.
 * External mode replaces the transaction by a lease and a fence.
 *
 * Each step is a function of one struct job (job_steps.h): it either passes
 * the job on (returns true) or settles it through sk_job_finish(), the job's
 * only exit. A job carries everything about its delivery (envelope, lock, claim, state), and
 * the struct sk_pipeline only what the process shares between jobs, so that
 * several jobs can be in flight at once: a batch (batch.c) runs the same
 * steps over an array of jobs. The servers are reached through the links (links.c), which
 * keep the outages; this file decides only what an outage means for a job.
 *
 * Each delivery is counted in the shared metrics where its outcome becomes
 * a fact (the commit, the broker's confirm of a copy), never where it is
 * only attempted, so that the counters say what happened. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "broker.h"
#include "envelope.h"
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

static const char *const state_names[JOB_STATES] = {
    [JOB_NEW] = "new",
    [JOB_RECEIVED] = "received",
    [JOB_LOCKED] = "locked",
    [JOB_CLAIMED] = "claimed",
    [JOB_HANDLED] = "handled",
    [JOB_COMMITTED] = "committed",
    [JOB_ACKED] = "acked",
    [JOB_HANDED_BACK] = "handed back",
};

static const char *const state_failpoints[JOB_STATES] = {
    [JOB_RECEIVED] = "after_receive",
    [JOB_LOCKED] = "after_lock",
    [JOB_CLAIMED] = "after_claim",
    [JOB_HANDLED] = "after_handler",
    [JOB_COMMITTED] = "after_commit",
    [JOB_ACKED] = "after_ack",
};

#define FROM(s) (1u << (s))
/* Any state a job can be settled from: every one but the two exits. */
#define LIVE (FROM(JOB_NEW) | FROM(JOB_RECEIVED) | FROM(JOB_LOCKED) | FROM(JOB_CLAIMED) | \
              FROM(JOB_HANDLED) | FROM(JOB_COMMITTED))

/* The states each state may be entered from. The lock is optional (lock:
 * false, or Redis down under `proceed`); a job may be settled at any point
 * before its exit, but exits once. */
static const unsigned legal_from[JOB_STATES] = {
    [JOB_NEW] = 0,
    [JOB_RECEIVED] = FROM(JOB_NEW),
    [JOB_LOCKED] = FROM(JOB_RECEIVED),
    [JOB_CLAIMED] = FROM(JOB_RECEIVED) | FROM(JOB_LOCKED),
    [JOB_HANDLED] = FROM(JOB_CLAIMED),
    [JOB_COMMITTED] = FROM(JOB_HANDLED),
    [JOB_ACKED] = LIVE,
    [JOB_HANDED_BACK] = LIVE,
};

static bool crashed_too_often(struct sk_pipeline *p, struct job *j);
static bool lock(struct sk_pipeline *p, struct job *j);
static int  take_lock(struct sk_pipeline *p, struct job *j);
static void waited_for_lock(struct job *j, uint64_t busy_since);
static void release_lock(struct sk_pipeline *p, struct job *j);
static int  claim_key(struct sk_pipeline *p, struct job *j, struct sk_err *err);
static void run_external(struct sk_pipeline *p, struct job *j);
static void reply_saved(struct sk_pipeline *p, struct job *j);
static void give_up(struct sk_pipeline *p, struct job *j, enum sk_metrics_reason reason,
                    const char *why);
static void dead_letter(struct sk_pipeline *p, struct job *j, bool parsed,
                        enum sk_metrics_reason reason, const char *why);
static uint64_t now_ns(void);

void sk_job_process(struct sk_pipeline *p, const amqp_envelope_t *delivery)
{
    struct job j = { .state = JOB_NEW, .delivery = delivery,
                     .delivery_tag = delivery->delivery_tag };

    if (!sk_job_admit(p, &j))
        return;
    if (p->queue->lock && !lock(p, &j))
        return;
    if (!sk_job_survivable(p, &j) || !sk_job_claim(p, &j))
        return;
    if (p->queue->mode == SK_MODE_EXTERNAL)
        run_external(p, &j);
    else
        sk_job_run_transactional(p, &j);
}

/* Validates the delivery and counts it; dead-letters what can never run. */
bool sk_job_admit(struct sk_pipeline *p, struct job *j)
{
    struct sk_err err = { 0 };
    j->log.queue = p->queue->name;
    int parsed = sk_envelope_parse(j->delivery, p->queue, &j->env, &err);
    /* Even a malformed delivery has a job_type here: "" unless validated. */
    j->metrics = sk_metrics_lookup(p->metrics, j->env.job_type);
    sk_metrics_inc(j->metrics, SK_METRIC_DELIVERIES);
    if (j->env.redelivered || j->env.delivery_attempt > 1)
        sk_metrics_inc(j->metrics, SK_METRIC_REDELIVERIES);
    if (parsed != SK_OK) {
        sk_log_job(SK_LOG_WARN, &j->log, "malformed message: %s", err.msg);
        dead_letter(p, j, false, SK_METRICS_MALFORMED, err.msg);
        return false;
    }
    const char *refused = j->env.reply_to[0] != '\0'
        ? sk_envelope_reply_refused(j->env.reply_to, p->conf) : NULL;
    if (refused != NULL) {
        /* Refused before anything runs: a job whose reply cannot be sent
         * would leave its caller waiting with the effect already made. */
        char why[400];
        snprintf(why, sizeof(why), "%s: %s", refused, j->env.reply_to);
        sk_log_job(SK_LOG_WARN, &j->log, "malformed message: %s", why);
        dead_letter(p, j, false, SK_METRICS_MALFORMED, why);
        return false;
    }
    j->log.job_id = j->env.job_id;
    j->log.idempotency_key = j->env.idempotency_key;
    j->log.resource_key = j->env.resource_key;
    j->log.delivery_attempt = j->env.delivery_attempt;
    j->ref = (struct sk_keyref){ .queue = p->queue->name, .key = j->env.idempotency_key,
                                 .owner = p->owner, .job_id = j->env.job_id,
                                 .job_type = j->env.job_type };
    sk_job_transition(j, JOB_RECEIVED);
    /* Should this worker die now, its replacement counts the crash. */
    snprintf(p->slot->job_key, sizeof(p->slot->job_key), "%s", j->env.idempotency_key);
    return true;
}

/* False, with the job dead-lettered, when it has killed max_crashes
 * workers. Asked once the job holds its lock, never before: a dead
 * worker's locks are freed only after its crash is recorded (worker.c),
 * so a copy that waited for the lock reads a count with that crash in it;
 * read before the wait, the count could miss it. A copy from a delay queue
 * may be the crashing job too: re-scheduled because its dead worker's lock
 * was still held, it carries no `redelivered`, and unchecked it would
 * crash workers for ever. */
bool sk_job_survivable(struct sk_pipeline *p, struct job *j)
{
    return !((j->env.redelivered || j->env.rescheduled) && p->queue->max_crashes > 0 &&
             crashed_too_often(p, j));
}

/* A redelivery may be the job that killed its worker. The broker tells a
 * classic queue's consumer no delivery count, so sekali keeps a count of
 * crashes per key (sql/006, recorded by the dead worker's replacement); past
 * the queue's max_crashes the job is failed and dead-lettered, not run. A
 * count that cannot be read lets the job run: the claim will meet whatever
 * is wrong with PostgreSQL. */
static bool crashed_too_often(struct sk_pipeline *p, struct job *j)
{
    int crashes = 0;
    if (sk_store_crashes(sk_links_store(p->links), &j->ref, &crashes, NULL) != SK_OK ||
        crashes < p->queue->max_crashes)
        return false;
    char why[128];
    snprintf(why, sizeof(why), "its worker died %d times while running it", crashes);
    give_up(p, j, SK_METRICS_CRASHED, why);
    return true;
}

/* Takes the resource's lock, or re-schedules the job: the resource is
 * busy, or Redis is down and the queue waits for it. */
static bool lock(struct sk_pipeline *p, struct job *j)
{
    return sk_job_lock_refused(p, j, take_lock(p, j));
}

bool sk_job_lock_refused(struct sk_pipeline *p, struct job *j, int rc)
{
    if (rc == SK_BUSY)
        sk_job_later(p, j, sk_reschedule_bucket(sk_jitter(100, 1000)),
                     j->env.delivery_attempt, NULL, "lock busy");
    else if (rc == SK_AGAIN)
        sk_job_later(p, j, sk_reschedule_bucket(sk_jitter(1000, 5000)),
                     j->env.delivery_attempt, NULL, "redis down");
    return rc == SK_OK;
}

/* SK_OK once locked, or when Redis is down and the queue proceeds without
 * it; SK_BUSY when another owner kept the resource for all of
 * lock.busy_wait; SK_AGAIN when Redis is down and the queue waits for it. */
static int take_lock(struct sk_pipeline *p, struct job *j)
{
    sk_lock_key(j->lock_key, sizeof(j->lock_key), p->queue->name, j->env.resource_key);
    sk_lock_new_token(j->lock_token);
    struct sk_lock *redis;
    int rc = sk_links_lock(p->links, &redis);
    if (redis == NULL)
        return rc;

    /* Recorded before Redis is asked, not after it said yes: a worker that
     * dies between the SET and this store would otherwise leave a lock its
     * replacement knows nothing of, and the redelivery would wait out the
     * TTL. Deleting by a token that never took the lock deletes nothing. */
    sk_slot_record_locks(p->slot, 1, (const char *const[]){ j->lock_key },
                         (const char *const[]){ j->lock_token });

    struct sk_err err = { 0 };
    int64_t give_up_at = sk_now_ms() + p->conf->lock.busy_wait_ms;
    uint64_t busy_since = 0;  /* the first refusal: waiting starts there */
    for (;;) {
        rc = sk_lock_acquire(redis, j->lock_key, j->lock_token, p->queue->lock_ttl_ms, &err);
        if (rc == SK_AGAIN) {
            sk_slot_forget_locks(p->slot);
            waited_for_lock(j, busy_since);
            return sk_links_drop(p->links, SK_LINK_LOCK, &j->log, &err);
        }
        if (rc == SK_OK) {
            waited_for_lock(j, busy_since);
            sk_links_up(p->links, SK_LINK_LOCK);
            j->locked = true;
            j->redis = redis;
            j->log.lock_owner = j->lock_token;
            sk_heartbeat_watch_lock(p->heartbeat, j->lock_key, j->lock_token,
                                    p->queue->lock_ttl_ms);
            sk_job_transition(j, JOB_LOCKED);
            return SK_OK;
        }
        if (busy_since == 0)
            busy_since = now_ns();
        sk_failpoint("lock_busy", j->env.idempotency_key);  /* dying while waiting */
        if (sk_now_ms() >= give_up_at || sk_process_stopping()) {
            sk_slot_forget_locks(p->slot);
            waited_for_lock(j, busy_since);
            sk_metrics_inc(j->metrics, SK_METRIC_LOCK_BUSY);
            return SK_BUSY;
        }
        sk_sleep_ms(sk_jitter(5, 50));
    }
}

/* Adds the time since the lock was first refused (0: it never was). */
static void waited_for_lock(struct job *j, uint64_t busy_since)
{
    if (busy_since != 0)
        sk_metrics_lock_wait(j->metrics, now_ns() - busy_since);
}

static void release_lock(struct sk_pipeline *p, struct job *j)
{
    if (!j->locked)
        return;
    j->locked = false;
    struct sk_err err = { 0 };
    int rc = sk_lock_release(j->redis, j->lock_key, j->lock_token, &err);
    sk_slot_forget_locks(p->slot);
    if (rc == SK_BUSY)
        sk_log_job(SK_LOG_WARN, &j->log, "lock had expired before release");
    else if (rc != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "lock release failed (it will expire): %s", err.msg);
}

/* One claim step for both modes: the round trip, then its outcome. */
bool sk_job_claim(struct sk_pipeline *p, struct job *j)
{
    struct sk_err err = { 0 };
    int rc = claim_key(p, j, &err);
    return sk_job_claimed(p, j, rc, &err);
}

/* What a claim's answer means for the job, whichever mode and however many
 * keys the round trip claimed: true when the job owns its key and goes on
 * to its handler; otherwise the job is settled here. */
bool sk_job_claimed(struct sk_pipeline *p, struct job *j, int rc, const struct sk_err *err)
{
    bool external = p->queue->mode == SK_MODE_EXTERNAL;
    switch (rc) {
    case SK_OK:
        sk_links_up(p->links, SK_LINK_STORE);
        j->log.fence = j->claim.fence;
        sk_keyref_set_fence(&j->ref, j->claim.fence);
        sk_job_transition(j, JOB_CLAIMED);
        return true;
    case SK_DUP:
        sk_metrics_inc(j->metrics, SK_METRIC_DUPLICATES);
        reply_saved(p, j);
        sk_job_finish(p, j, ACK, "duplicate suppressed");
        return false;
    case SK_BUSY:
        /* A live worker holds the key (its row lock, or its lease): it is
         * running this very job. Come back later rather than wait; its
         * outcome decides ours. */
        sk_job_later(p, j, sk_reschedule_bucket(external
                  ? sk_jitter(p->queue->lease_ms / 4, p->queue->lease_ms)
                  : sk_jitter(100, 1000)),
              j->env.delivery_attempt, NULL,
              external ? "key leased by a live worker" : "key busy in PostgreSQL");
        return false;
    default:
        /* Handed back unchanged: an outage is not the job's failure. The
         * links pause before the next delivery, after the hand-back, so
         * the lock is not held through the backoff (other jobs for the
         * resource would wait for nothing). */
        sk_links_drop(p->links, SK_LINK_STORE, &j->log, err);
        sk_job_finish(p, j, REQUEUE, "claim failed, handed back to the broker");
        return false;
    }
}

/* Transactional mode: BEGIN and sekali.sk_job_claim(), the key's row locked until
 * COMMIT. External mode: a lease committed at once, under a new fence.
 * Returns SK_OK, SK_DUP (completed before), SK_BUSY (a live owner) or a
 * failure (SK_AGAIN, SK_ERR) explained in err. */
static int claim_key(struct sk_pipeline *p, struct job *j, struct sk_err *err)
{
    struct sk_store *store = sk_links_store(p->links);
    if (p->queue->mode != SK_MODE_EXTERNAL)
        return sk_store_claim(store, &j->ref, &j->claim, err);
    int rc = sk_store_reconnect(store, err);
    if (rc != SK_OK)
        return rc;
    return sk_lease_claim(sk_store_conn(store), &j->ref, p->queue->lease_ms, &j->claim, err);
}

void sk_job_run_transactional(struct sk_pipeline *p, struct job *j)
{
    struct sk_store *store = sk_links_store(p->links);
    struct sekali_ctx *ctx = &p->ctx;
    sk_host_ctx_reset(ctx);
    int status = sk_job_call_handler(p, j, sk_store_conn(store));

    struct sk_err err = { 0 };
    if (status == SEKALI_OK) {
        int rc = sk_store_complete(store, &j->ref, ctx->result_len > 0 ? ctx->result : NULL,
                                   ctx->result_len, &err);
        if (rc == SK_OK) {
            sk_job_transition(j, JOB_COMMITTED);
            sk_job_reply(p, j, ctx->result, ctx->result_len);
            sk_job_finish(p, j, ACK, "completed");
            return;
        }
        if (rc == SK_AGAIN) {
            /* The COMMIT may or may not have happened; only a redelivery's
             * claim can tell, so the message must go back unchanged. */
            sk_log_job(SK_LOG_ERROR, &j->log, "commit outcome unknown: %s", err.msg);
            sk_job_finish(p, j, REQUEUE, "commit outcome unknown, handed back to the broker");
            return;
        }
        /* Rolled back: the handler left the transaction failed. */
        snprintf(ctx->error, sizeof(ctx->error), "commit failed: %s", err.msg);
        status = SEKALI_RETRY;
    } else if (sk_store_rollback(store, &err) != SK_OK) {
        sk_log_job(SK_LOG_WARN, &j->log, "rollback failed: %s", err.msg);
    }
    sk_job_settle_failure(p, j, status, ctx->error, ctx->conflict);
}

/* External mode: the claim committed a lease instead of holding a row lock,
 * the handler acts outside PostgreSQL, and the outcome is recorded only
 * under the fence this claim got. A worker that stalled past its lease and
 * comes back finds its completion fenced out: the newer owner's outcome
 * stands, and this copy is acked without touching it. */
static void run_external(struct sk_pipeline *p, struct job *j)
{
    sk_heartbeat_watch_lease(p->heartbeat, p->queue->name, j->env.idempotency_key,
                             j->claim.fence, p->queue->lease_ms);
    j->leased = true;

    PGconn *pg = sk_store_conn(sk_links_store(p->links));
    struct sk_err err = { 0 };
    struct sekali_ctx *ctx = &p->ctx;
    sk_host_ctx_reset(ctx);
    ctx->external = true;
    if (j->claim.attempts > 1 &&
        sk_lease_load_checkpoints(pg, &j->ref, &ctx->checkpoints, &err) != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "checkpoints not loaded: %s", err.msg);
    int status = sk_job_call_handler(p, j, pg);

    if (status == SEKALI_OK) {
        int rc = sk_lease_finish(pg, &j->ref, "completed",
                                 ctx->result_len > 0 ? ctx->result : NULL, ctx->result_len,
                                 NULL, &err);
        if (rc == SK_OK) {
            sk_job_transition(j, JOB_COMMITTED);
            sk_job_reply(p, j, ctx->result, ctx->result_len);
            sk_job_finish(p, j, ACK, "completed");
        } else if (rc == SK_BUSY) {
            sk_metrics_inc(j->metrics, SK_METRIC_FENCED_OUT);
            sk_log_job(SK_LOG_WARN, &j->log, "completion fenced out: the lease was lost and "
                       "another worker took the job over; its outcome stands");
            sk_job_finish(p, j, ACK, "fenced out");
        } else {
            sk_log_job(SK_LOG_ERROR, &j->log, "completion outcome unknown: %s", err.msg);
            sk_job_finish(p, j, REQUEUE, "completion outcome unknown, handed back to the broker");
        }
        return;
    }
    if (status == SEKALI_RETRY &&
        sk_lease_release(pg, &j->ref, &err) == SK_AGAIN)
        sk_log_job(SK_LOG_WARN, &j->log, "lease not released (it will expire): %s", err.msg);
    sk_job_settle_failure(p, j, status, ctx->error, ctx->conflict);
}

/* Sends result to the job's reply_to, once per key: replied_at is recorded
 * after the broker confirmed the reply. A reply that cannot be sent is
 * logged and given up: the job's effect is done and must not run again for
 * it, and a later copy of the job will send the saved result. */
void sk_job_reply(struct sk_pipeline *p, struct job *j, const void *result, size_t len)
{
    if (j->env.reply_to[0] == '\0')
        return;
    struct sk_err err = { 0 };
    struct sk_message msg = {
        .message_id = j->env.job_id,
        .correlation_id = j->env.correlation_id[0] != '\0' ? j->env.correlation_id : NULL,
        .content_type = "application/octet-stream",
        .idempotency_key = j->env.idempotency_key,
        .body = result != NULL ? result : "",
        .body_len = len,
    };
    struct sk_broker *pub = sk_links_publisher(p->links, &err);
    if (pub == NULL || sk_broker_publish(pub, j->env.reply_to, &msg, &err) != SK_OK) {
        if (err.code != SK_ERR)
            sk_links_drop(p->links, SK_LINK_PUBLISHER, &j->log, &err);
        sk_log_job(SK_LOG_WARN, &j->log, "reply to %s not sent: %s", j->env.reply_to, err.msg);
        return;
    }
    if (sk_store_mark_replied(sk_links_store(p->links), &j->ref, &err) != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "reply sent but not recorded: %s", err.msg);
}

/* A duplicate of a completed job gets the saved result, unless the reply
 * already went out (the usual case: it did, with the first copy). */
static void reply_saved(struct sk_pipeline *p, struct job *j)
{
    if (j->env.reply_to[0] == '\0')
        return;
    struct sk_err err = { 0 };
    bool replied;
    char *result;
    size_t len;
    if (sk_store_reply_state(sk_links_store(p->links), &j->ref, &replied, &result, &len,
                             &err) != SK_OK) {
        sk_log_job(SK_LOG_WARN, &j->log, "reply state unknown, not replying: %s", err.msg);
        return;
    }
    if (!replied)
        sk_job_reply(p, j, result, len);
    free(result);
}

/* Builds the job the handler sees, and runs it on pg. */
int sk_job_call_handler(struct sk_pipeline *p, struct job *j, PGconn *pg)
{
    struct sekali_ctx *ctx = &p->ctx;
    /* A copy with a NUL after it (ABI 1.3), so text handlers need none. */
    const char *body = sk_host_ctx_body(ctx, j->env.body, j->env.body_len);
    if (body == NULL) {
        snprintf(ctx->error, sizeof(ctx->error), "out of memory copying a %zu-byte body",
                 j->env.body_len);
        sk_job_transition(j, JOB_HANDLED);
        return SEKALI_RETRY;
    }
    struct sekali_job job = {
        .struct_size = sizeof(job),
        .queue = p->queue->name,
        .job_id = j->env.job_id,
        .job_type = j->env.job_type,
        .idempotency_key = j->env.idempotency_key,
        .resource_key = j->env.resource_key,
        .content_type = j->env.content_type,
        .body = body,
        .body_len = j->env.body_len,
        .delivery_attempt = j->env.delivery_attempt,
        .fence = j->claim.fence,
        .host = sk_host(),
    };
    ctx->pg = pg;
    ctx->log = &j->log;
    ctx->headers_done = false;
    ctx->headers = j->delivery->message.properties._flags & AMQP_BASIC_HEADERS_FLAG
        ? &j->delivery->message.properties.headers : NULL;
    ctx->lock_lost = p->heartbeat != NULL && (j->locked || ctx->external)
        ? sk_heartbeat_lost(p->heartbeat) : NULL;
    /* Counted before the call: a handler that kills its worker still ran. */
    sk_metrics_inc(j->metrics, SK_METRIC_EXECUTIONS);
    sk_links_lend(p->links, p->heartbeat);
    /* Only a death inside this call can be the job's doing. */
    atomic_store(&p->slot->phase, SK_PHASE_HANDLER);
    int status = p->handler->handle(p->handler_state, &job, ctx);
    atomic_store(&p->slot->phase, SK_PHASE_JOB);
    sk_links_take_back(p->links, p->heartbeat);
    sk_job_transition(j, JOB_HANDLED);
    return status;
}

/* RETRY: another attempt later, until retry.max_attempts; FAIL, an invalid
 * status or the last attempt: the key is recorded failed and dead-lettered. */
void sk_job_settle_failure(struct sk_pipeline *p, struct job *j, int status, const char *error,
                           bool conflict)
{
    if (status == SEKALI_RETRY) {
        const char *why = error[0] != '\0' ? error : "handler asked to retry";
        /* host->conflict(): the handler's guarded update lost a race. */
        if (conflict)
            sk_metrics_inc(j->metrics, SK_METRIC_OCC_CONFLICTS);
        if (j->env.delivery_attempt < (uint32_t)p->queue->retry.max_attempts) {
            uint32_t next = j->env.delivery_attempt + 1;
            uint32_t delay = sk_reschedule_retry_delay(&p->queue->retry, next);
            /* host->retry_after(): the service's own word, within retry.max.
             * A batch's outcomes do not carry it (ABI: not in batch mode). */
            uint32_t asked = p->queue->batch > 1 ? 0 : p->ctx.retry_after_ms;
            if (asked > p->queue->retry.max_ms)
                asked = p->queue->retry.max_ms;
            if (asked > delay)
                delay = sk_reschedule_bucket(asked);
            if (sk_job_later(p, j, delay, next, why,
                      conflict ? "conflict" : "retry"))
                sk_metrics_inc(j->metrics, SK_METRIC_RETRIES);
            return;
        }
        give_up(p, j, SK_METRICS_RETRIES_EXHAUSTED, why);
        return;
    }
    char why[600];
    if (status == SEKALI_FAIL)
        snprintf(why, sizeof(why), "%s", error[0] != '\0' ? error : "handler failed");
    else
        snprintf(why, sizeof(why), "handler returned invalid status %d", status);
    give_up(p, j, SK_METRICS_FAILED, why);
}

/* Records the key as failed, then dead-letters the message. Without the
 * failed row a later copy would run again, so if it cannot be written the
 * message goes back to the broker instead. A leased job (external mode)
 * fails under its fence; any other in a transaction of its own. */
static void give_up(struct sk_pipeline *p, struct job *j, enum sk_metrics_reason reason,
                    const char *why)
{
    struct sk_err err = { 0 };
    struct sk_store *store = sk_links_store(p->links);
    int rc = j->leased
        ? sk_lease_finish(sk_store_conn(store), &j->ref, "failed", NULL, 0, why, &err)
        : sk_store_fail(store, &j->ref, why, &err);
    if (rc == SK_BUSY) {
        sk_metrics_inc(j->metrics, SK_METRIC_FENCED_OUT);
        sk_log_job(SK_LOG_WARN, &j->log, "failure fenced out: another worker owns the job");
        sk_job_finish(p, j, ACK, "fenced out");
        return;
    }
    if (rc != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "recording failure failed: %s", err.msg);
        sk_job_finish(p, j, REQUEUE, "failure not recorded, handed back to the broker");
        sk_sleep_ms(sk_jitter(100, 1000));
        return;
    }
    sk_log_job(SK_LOG_WARN, &j->log, "job %s: %s", sk_metrics_reason_name(reason), why);
    dead_letter(p, j, true, reason, why);
}

/* Sends a confirmed copy to `queue`.dead with the reason, then acks. If no
 * copy can be made, the broker's own dead-lettering (reject) still keeps the
 * message, without the reason headers, which the log line gives. Counted
 * once a copy exists: if the ack is lost, the redelivery makes a second one,
 * and counts it. */
static void dead_letter(struct sk_pipeline *p, struct job *j, bool parsed,
                        enum sk_metrics_reason reason, const char *why)
{
    struct sk_err err = { 0 };
    struct sk_broker *pub = sk_links_publisher(p->links, &err);
    bool connected = pub != NULL;
    if (connected &&
        sk_reschedule_dead(pub, p->queue->name, j->delivery, parsed ? &j->env : NULL,
                           sk_metrics_reason_name(reason), why, &err) == SK_OK) {
        sk_metrics_dead_letter(j->metrics, reason);
        sk_job_finish(p, j, ACK, "dead-lettered");
        return;
    }
    /* A copy refused for its own sake (too large) leaves the connection
     * sound; only a failed connection is dropped. */
    if (!connected || err.code != SK_ERR)
        sk_links_drop(p->links, SK_LINK_PUBLISHER, &j->log, &err);
    char text[1200];
    snprintf(text, sizeof(text), "dead-lettered by the broker (no reason headers; %s: %s; "
             "no copy: %s)", sk_metrics_reason_name(reason), why, err.msg);
    if (sk_job_finish(p, j, DEAD_LETTER, text) == SK_OK)
        sk_metrics_dead_letter(j->metrics, reason);
}

/* Sends a confirmed copy that comes back after delay_ms, then acks, and
 * returns true. If the publisher cannot reach the broker, the message goes
 * back to the queue as it is, after a pause, and false. If the broker
 * refuses the copy or it cannot be made at all (too large for a frame),
 * handing it back would bring it straight back, at the same attempt, ahead
 * of the jobs behind it, for ever: it is dead-lettered instead (reason
 * malformed: nothing about it can change), and false. */
bool sk_job_later(struct sk_pipeline *p, struct job *j, uint32_t delay_ms, uint32_t next_attempt,
                  const char *error, const char *outcome)
{
    struct sk_err err = { 0 };
    struct sk_broker *pub = sk_links_publisher(p->links, &err);
    bool connected = pub != NULL;
    if (connected &&
        sk_reschedule_later(pub, p->queue->name, j->delivery, &j->env, delay_ms,
                            next_attempt, error, &err) == SK_OK) {
        char text[128];
        snprintf(text, sizeof(text), "%s: re-scheduled in %u ms", outcome, delay_ms);
        sk_job_finish(p, j, ACK, text);
        return true;
    }
    if (connected && err.code == SK_ERR) {
        char why[700];
        snprintf(why, sizeof(why), "cannot be re-scheduled (%s): %s", outcome, err.msg);
        sk_log_job(SK_LOG_WARN, &j->log, "job malformed: %s", why);
        dead_letter(p, j, true, SK_METRICS_MALFORMED, why);
        return false;
    }
    sk_links_drop(p->links, SK_LINK_PUBLISHER, &j->log, &err);
    sk_job_finish(p, j, REQUEUE, "could not re-schedule, handed back to the broker");
    sk_sleep_ms(sk_jitter(100, 1000));
    return false;
}

/* Counts before the failpoint: a worker killed right after COMMIT has
 * committed, and a later copy will be a duplicate of a counted completion. */
void sk_job_transition(struct job *j, enum job_state to)
{
    sk_assert(legal_from[to] & FROM(j->state));
    j->state = to;
    if (to == JOB_CLAIMED) {
        j->claimed_ns = now_ns();
    } else if (to == JOB_COMMITTED) {
        sk_metrics_inc(j->metrics, SK_METRIC_COMPLETIONS);
        sk_metrics_duration(j->metrics, now_ns() - j->claimed_ns);
    }
    sk_log_job(SK_LOG_DEBUG, &j->log, "%s", state_names[to]);
    if (state_failpoints[to] != NULL)
        sk_failpoint(state_failpoints[to], j->env.idempotency_key);
}

/* A batch's fast path rolled its whole transaction back (batch.c): the
 * job's claim went with it, so it stands where it stood before its claim,
 * and is claimed again. The one way back in the states, and only from a
 * claim that no COMMIT made true. */
void sk_job_rewind(struct job *j)
{
    sk_assert(j->state == JOB_CLAIMED || j->state == JOB_HANDLED);
    sk_assert(!j->exit_decided);
    j->state = j->locked ? JOB_LOCKED : JOB_RECEIVED;
    sk_log_job(SK_LOG_DEBUG, &j->log, "claim rolled back with its batch");
}

/* The only exit of a delivered job: ack it (effect durable, duplicate, or a
 * confirmed copy made), requeue it, or let the broker dead-letter it; then
 * drop the lock. The ack may leave later (see sk_broker_ack()): by then the
 * outcome is already durable, so releasing the lock first is safe, and a
 * redelivery of an unsent ack finds a completed key. Returns the broker's
 * answer to the ack or reject: SK_OK, or SK_AGAIN (connection lost). */
int sk_job_finish(struct sk_pipeline *p, struct job *j, enum disposition d, const char *outcome)
{
    if (j->deferred) {
        sk_assert(!j->exit_decided);
        j->exit_decided = true;
        j->exit = d;
        snprintf(j->outcome, sizeof(j->outcome), "%s", outcome);
        return SK_OK;
    }
    return sk_job_exit(p, j, d, outcome);
}

int sk_job_exit(struct sk_pipeline *p, struct job *j, enum disposition d, const char *outcome)
{
    /* The delivery came on the consumer, and only an exit drops it. */
    struct sk_broker *consumer = sk_links_consumer(p->links);
    sk_assert(consumer != NULL);
    struct sk_err err = { 0 };
    int rc = d == ACK ? sk_broker_ack(consumer, j->delivery_tag, &err)
                      : sk_broker_reject(consumer, j->delivery_tag, d == REQUEUE, &err);
    sk_job_transition(j, d == ACK && rc == SK_OK ? JOB_ACKED : JOB_HANDED_BACK);
    if (p->heartbeat != NULL) {
        sk_heartbeat_unwatch(p->heartbeat);
        /* After unwatch the heartbeat can no longer raise the flag for this
         * job, and only a watch clears it: read now, it is this job's. */
        if ((j->locked || j->leased) && atomic_load(sk_heartbeat_lost(p->heartbeat)))
            sk_metrics_inc(j->metrics, SK_METRIC_LOCKS_LOST);
    }
    release_lock(p, j);
    sk_log_job(SK_LOG_INFO, &j->log, "%s", outcome);
    if (rc != SK_OK)
        sk_links_drop(p->links, SK_LINK_CONSUMER, &j->log, &err);
    return rc;
}

/* CLOCK_MONOTONIC in nanoseconds: read through the vDSO, not a syscall. */
static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
