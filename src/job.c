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
 * Each delivery is counted in the shared metrics where its outcome becomes
 * a fact (the commit, the broker's confirm of a copy), never where it is
 * only attempted, so that the counters say what happened. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "envelope.h"
#include "failpoint.h"
#include "lease.h"
#include "log.h"
#include "metrics.h"
#include "process.h"
#include "reschedule.h"
#include "worker_job.h"

/* A job's steps. Each transition goes through transition(), which logs it
 * and, in a fault build, is where a test can kill the worker. */
enum job_state {
    JOB_RECEIVED,
    JOB_LOCKED,
    JOB_CLAIMED,
    JOB_HANDLED,
    JOB_COMMITTED,
    JOB_ACKED,
};

static const char *const state_names[] = {
    [JOB_RECEIVED] = "received",
    [JOB_LOCKED] = "locked",
    [JOB_CLAIMED] = "claimed",
    [JOB_HANDLED] = "handled",
    [JOB_COMMITTED] = "committed",
    [JOB_ACKED] = "acked",
};

static const char *const state_failpoints[] = {
    [JOB_RECEIVED] = "after_receive",
    [JOB_LOCKED] = "after_lock",
    [JOB_CLAIMED] = "after_claim",
    [JOB_HANDLED] = "after_handler",
    [JOB_COMMITTED] = "after_commit",
    [JOB_ACKED] = "after_ack",
};

/* What happens to the delivery itself once the job's outcome is settled. */
enum disposition {
    ACK,          /* done with it: effect committed, duplicate, or a copy confirmed */
    REQUEUE,      /* back to the queue unchanged */
    DEAD_LETTER,  /* the broker moves it to <queue>.dead */
};

struct job {
    enum job_state         state;
    const amqp_envelope_t *delivery;
    struct sk_envelope env;
    uint64_t           delivery_tag;
    char               lock_key[SK_KEY_MAX + 300];
    char               lock_token[SK_LOCK_TOKEN_LEN + 1];
    bool               locked;
    bool               leased;      /* external mode: the heartbeat renews our lease */
    struct sk_claim    claim;
    struct sk_keyref   ref;         /* the key, for the store and the lease */
    uint64_t           claimed_ns;  /* CLOCK_MONOTONIC at the claim, for the duration */
    struct sk_metrics_type *metrics;
    struct sk_log_job  log;
};

static void claim_failed(struct sk_worker *w, struct job *j, int rc, const char *why);
static void claimed(struct sk_worker *w, struct job *j);
static void run_external(struct sk_worker *w, struct job *j);
static void reply(struct sk_worker *w, struct job *j, const void *result, size_t len);
static void reply_saved(struct sk_worker *w, struct job *j);
static int call_handler(struct sk_worker *w, struct job *j, PGconn *pg);
static int take_lock(struct sk_worker *w, struct job *j);
static void waited_for_lock(struct job *j, uint64_t busy_since);
static int without_redis(struct sk_worker *w, const char *why);
static void release_lock(struct sk_worker *w, struct job *j);
static void run_handler(struct sk_worker *w, struct job *j);
static void settle_failure(struct sk_worker *w, struct job *j, int status);
static void give_up(struct sk_worker *w, struct job *j, enum sk_metrics_reason reason,
                    const char *why);
static bool crashed_too_often(struct sk_worker *w, struct job *j);
static void dead_letter(struct sk_worker *w, struct job *j, bool parsed,
                        enum sk_metrics_reason reason, const char *why);
static bool later(struct sk_worker *w, struct job *j, uint32_t delay_ms, uint32_t next_attempt,
                  const char *error, const char *outcome);
static void transition(struct job *j, enum job_state to);
static int finish(struct sk_worker *w, struct job *j, enum disposition d, const char *outcome);
static uint64_t now_ns(void);

void sk_job_process(struct sk_worker *w, const amqp_envelope_t *delivery)
{
    struct job j = { .state = JOB_RECEIVED, .delivery = delivery,
                     .delivery_tag = delivery->delivery_tag };
    struct sk_err err = { 0 };

    j.log.queue = w->queue->name;
    int parsed = sk_envelope_parse(delivery, w->queue, &j.env, &err);
    /* Even a malformed delivery has a job_type here: "" unless validated. */
    j.metrics = sk_metrics_lookup(w->metrics, j.env.job_type);
    sk_metrics_inc(j.metrics, SK_METRIC_DELIVERIES);
    if (j.env.redelivered || j.env.delivery_attempt > 1)
        sk_metrics_inc(j.metrics, SK_METRIC_REDELIVERIES);
    if (parsed != SK_OK) {
        sk_log_job(SK_LOG_WARN, &j.log, "malformed message: %s", err.msg);
        dead_letter(w, &j, false, SK_METRICS_MALFORMED, err.msg);
        return;
    }
    const char *refused = j.env.reply_to[0] != '\0'
        ? sk_envelope_reply_refused(j.env.reply_to, w->conf) : NULL;
    if (refused != NULL) {
        /* Refused before anything runs: a job whose reply cannot be sent
         * would leave its caller waiting with the effect already made. */
        char why[400];
        snprintf(why, sizeof(why), "%s: %s", refused, j.env.reply_to);
        sk_log_job(SK_LOG_WARN, &j.log, "malformed message: %s", why);
        dead_letter(w, &j, false, SK_METRICS_MALFORMED, why);
        return;
    }
    j.log.job_id = j.env.job_id;
    j.log.idempotency_key = j.env.idempotency_key;
    j.log.resource_key = j.env.resource_key;
    j.log.delivery_attempt = j.env.delivery_attempt;
    j.ref = (struct sk_keyref){ .queue = w->queue->name, .key = j.env.idempotency_key,
                                .owner = w->owner, .job_id = j.env.job_id,
                                .job_type = j.env.job_type };
    transition(&j, JOB_RECEIVED);
    /* Should this worker die now, its replacement counts the crash. */
    snprintf(w->slot->job_key, sizeof(w->slot->job_key), "%s", j.env.idempotency_key);
    /* A copy from a delay queue may be the crashing job too: re-scheduled
     * because its dead worker's lock was still held, it carries no
     * `redelivered`, and unchecked it would crash workers for ever. */
    if ((j.env.redelivered || j.env.rescheduled) && w->queue->max_crashes > 0 &&
        crashed_too_often(w, &j))
        return;

    if (w->queue->lock) {
        int rc = take_lock(w, &j);
        if (rc == SK_BUSY) {
            later(w, &j, sk_reschedule_bucket(sk_jitter(100, 1000)), j.env.delivery_attempt,
                  NULL, "lock busy");
            return;
        }
        if (rc == SK_AGAIN) {
            later(w, &j, sk_reschedule_bucket(sk_jitter(1000, 5000)), j.env.delivery_attempt,
                  NULL, "redis down");
            return;
        }
    }

    if (w->queue->mode == SK_MODE_EXTERNAL) {
        run_external(w, &j);
        return;
    }

    int rc = sk_store_claim(w->store, &j.ref, &j.claim, &err);
    if (rc == SK_DUP) {
        sk_metrics_inc(j.metrics, SK_METRIC_DUPLICATES);
        reply_saved(w, &j);
        finish(w, &j, ACK, "duplicate suppressed");
        return;
    }
    if (rc == SK_BUSY) {
        /* A live worker holds the key's row: it is running this very job.
         * Come back later rather than wait; its outcome decides ours. */
        later(w, &j, sk_reschedule_bucket(sk_jitter(100, 1000)), j.env.delivery_attempt, NULL,
              "key busy in PostgreSQL");
        return;
    }
    if (rc != SK_OK) {
        claim_failed(w, &j, rc, err.msg);
        return;
    }
    claimed(w, &j);
    run_handler(w, &j);
}

/* A redelivery may be the job that killed its worker. The broker tells a
 * classic queue's consumer no delivery count, so sekali keeps a count of
 * crashes per key (sql/006, recorded by the dead worker's replacement); past
 * the queue's max_crashes the job is failed and dead-lettered, not run. A
 * count that cannot be read lets the job run: the claim will meet whatever
 * is wrong with PostgreSQL. */
static bool crashed_too_often(struct sk_worker *w, struct job *j)
{
    int crashes = 0;
    if (sk_store_crashes(w->store, &j->ref, &crashes, NULL) != SK_OK ||
        crashes < w->queue->max_crashes)
        return false;
    char why[128];
    snprintf(why, sizeof(why), "its worker died %d times while running it", crashes);
    give_up(w, j, SK_METRICS_CRASHED, why);
    return true;
}

/* Handed back unchanged: an outage is not the job's failure, and the
 * backoff keeps it from turning into a hot redelivery loop. */
static void claim_failed(struct sk_worker *w, struct job *j, int rc, const char *why)
{
    if (!w->postgres_down_logged)
        sk_log_job(SK_LOG_ERROR, &j->log, "claim failed, backing off: %s", why);
    w->postgres_down_logged = rc == SK_AGAIN;
    /* Hand back and unlock first, then pause: the lock must not be held
     * through the backoff, or other jobs for the resource wait for nothing. */
    finish(w, j, REQUEUE, "claim failed, handed back to the broker");
    sk_sleep_ms(sk_backoff_next(&w->postgres_backoff));
}

static void claimed(struct sk_worker *w, struct job *j)
{
    if (w->postgres_down_logged)
        sk_log_info("PostgreSQL reachable again");
    w->postgres_down_logged = false;
    sk_backoff_reset(&w->postgres_backoff);
    j->log.fence = j->claim.fence;
    sk_keyref_set_fence(&j->ref, j->claim.fence);
    transition(j, JOB_CLAIMED);
}

/* External mode: the claim commits a lease instead of holding a row lock,
 * the handler acts outside PostgreSQL, and the outcome is recorded only
 * under the fence this claim got. A worker that stalled past its lease and
 * comes back finds its completion fenced out: the newer owner's outcome
 * stands, and this copy is acked without touching it. */
static void run_external(struct sk_worker *w, struct job *j)
{
    struct sk_err err = { 0 };
    int rc = sk_store_reconnect(w->store, &err);
    PGconn *pg = sk_store_conn(w->store);
    if (rc == SK_OK)
        rc = sk_lease_claim(pg, &j->ref, w->queue->lease_ms, &j->claim, &err);
    if (rc == SK_DUP) {
        sk_metrics_inc(j->metrics, SK_METRIC_DUPLICATES);
        reply_saved(w, j);
        finish(w, j, ACK, "duplicate suppressed");
        return;
    }
    if (rc == SK_BUSY) {
        later(w, j, sk_reschedule_bucket(sk_jitter(w->queue->lease_ms / 4, w->queue->lease_ms)),
              j->env.delivery_attempt, NULL, "key leased by a live worker");
        return;
    }
    if (rc != SK_OK) {
        claim_failed(w, j, rc, err.msg);
        return;
    }
    claimed(w, j);
    sk_heartbeat_watch_lease(w->heartbeat, w->queue->name, j->env.idempotency_key,
                             j->claim.fence, w->queue->lease_ms);
    j->leased = true;

    struct sekali_ctx *ctx = &w->ctx;
    sk_host_ctx_reset(ctx);
    ctx->external = true;
    if (j->claim.attempts > 1 &&
        sk_lease_load_checkpoints(pg, &j->ref, &ctx->checkpoints, &err) != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "checkpoints not loaded: %s", err.msg);
    int status = call_handler(w, j, pg);

    if (status == SEKALI_OK) {
        rc = sk_lease_finish(pg, &j->ref, "completed", ctx->result_len > 0 ? ctx->result : NULL,
                             ctx->result_len, NULL, &err);
        if (rc == SK_OK) {
            transition(j, JOB_COMMITTED);
            reply(w, j, ctx->result, ctx->result_len);
            finish(w, j, ACK, "completed");
        } else if (rc == SK_BUSY) {
            sk_metrics_inc(j->metrics, SK_METRIC_FENCED_OUT);
            sk_log_job(SK_LOG_WARN, &j->log, "completion fenced out: the lease was lost and "
                       "another worker took the job over; its outcome stands");
            finish(w, j, ACK, "fenced out");
        } else {
            sk_log_job(SK_LOG_ERROR, &j->log, "completion outcome unknown: %s", err.msg);
            finish(w, j, REQUEUE, "completion outcome unknown, handed back to the broker");
        }
        return;
    }
    if (status == SEKALI_RETRY &&
        sk_lease_release(pg, &j->ref, &err) == SK_AGAIN)
        sk_log_job(SK_LOG_WARN, &j->log, "lease not released (it will expire): %s", err.msg);
    settle_failure(w, j, status);
}

/* Sends result to the job's reply_to, once per key: replied_at is recorded
 * after the broker confirmed the reply. A reply that cannot be sent is
 * logged and given up: the job's effect is done and must not run again for
 * it, and a later copy of the job will send the saved result. */
static void reply(struct sk_worker *w, struct job *j, const void *result, size_t len)
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
    if (!sk_worker_publisher(w, &err) ||
        sk_broker_publish(w->publisher, j->env.reply_to, &msg, &err) != SK_OK) {
        if (err.code != SK_ERR)
            sk_worker_drop_publisher(w, err.msg);
        sk_log_job(SK_LOG_WARN, &j->log, "reply to %s not sent: %s", j->env.reply_to, err.msg);
        return;
    }
    if (sk_store_mark_replied(w->store, &j->ref, &err) != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "reply sent but not recorded: %s", err.msg);
}

/* A duplicate of a completed job gets the saved result, unless the reply
 * already went out (the usual case: it did, with the first copy). */
static void reply_saved(struct sk_worker *w, struct job *j)
{
    if (j->env.reply_to[0] == '\0')
        return;
    struct sk_err err = { 0 };
    bool replied;
    char *result;
    size_t len;
    if (sk_store_reply_state(w->store, &j->ref, &replied, &result, &len, &err) != SK_OK) {
        sk_log_job(SK_LOG_WARN, &j->log, "reply state unknown, not replying: %s", err.msg);
        return;
    }
    if (!replied)
        reply(w, j, result, len);
    free(result);
}

/* Builds the job the handler sees, and runs it on pg. */
static int call_handler(struct sk_worker *w, struct job *j, PGconn *pg)
{
    struct sekali_ctx *ctx = &w->ctx;
    /* A copy with a NUL after it (ABI 1.3), so text handlers need none. */
    const char *body = sk_host_ctx_body(ctx, j->env.body, j->env.body_len);
    if (body == NULL) {
        snprintf(ctx->error, sizeof(ctx->error), "out of memory copying a %zu-byte body",
                 j->env.body_len);
        transition(j, JOB_HANDLED);
        return SEKALI_RETRY;
    }
    struct sekali_job job = {
        .struct_size = sizeof(job),
        .queue = w->queue->name,
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
    ctx->lock_lost = w->heartbeat != NULL && (j->locked || ctx->external)
        ? sk_heartbeat_lost(w->heartbeat) : NULL;
    /* Counted before the call: a handler that kills its worker still ran. */
    sk_metrics_inc(j->metrics, SK_METRIC_EXECUTIONS);
    if (w->heartbeat != NULL)
        sk_heartbeat_lend_brokers(w->heartbeat, w->broker, w->publisher);
    /* Only a death inside this call can be the job's doing. */
    atomic_store(&w->slot->phase, SK_PHASE_HANDLER);
    int status = w->handler->handle(w->handler_state, &job, ctx);
    atomic_store(&w->slot->phase, SK_PHASE_JOB);
    if (w->heartbeat != NULL)
        sk_heartbeat_return_brokers(w->heartbeat);
    transition(j, JOB_HANDLED);
    return status;
}

/* SK_OK once locked, or when Redis is down and the queue proceeds without
 * it; SK_BUSY when another owner kept the resource for all of
 * lock.busy_wait; SK_AGAIN when Redis is down and the queue waits for it. */
static int take_lock(struct sk_worker *w, struct job *j)
{
    snprintf(j->lock_key, sizeof(j->lock_key), "sekali:lock:%s:%s", w->queue->name,
             j->env.resource_key);
    sk_lock_new_token(j->lock_token);

    /* While Redis is down, ask it again only when the backoff allows: an
     * unreachable host would otherwise cost a connect timeout per job. */
    if (w->redis_down && sk_now_ms() < w->redis_retry_at_ms)
        return without_redis(w, NULL);

    /* Recorded before Redis is asked, not after it said yes: a worker that
     * dies between the SET and this store would otherwise leave a lock its
     * replacement knows nothing of, and the redelivery would wait out the
     * TTL. Deleting by a token that never took the lock deletes nothing. */
    memcpy(w->slot->lock_key, j->lock_key, sizeof(w->slot->lock_key));
    memcpy(w->slot->lock_token, j->lock_token, sizeof(w->slot->lock_token));
    atomic_store(&w->slot->lock_held, 1);

    struct sk_err err = { 0 };
    int64_t give_up_at = sk_now_ms() + w->conf->lock.busy_wait_ms;
    uint64_t busy_since = 0;  /* the first refusal: waiting starts there */
    for (;;) {
        int rc = w->lock != NULL ? SK_OK : sk_lock_open(&w->lock, &w->conf->redis, &err);
        if (rc == SK_OK)
            rc = sk_lock_acquire(w->lock, j->lock_key, j->lock_token, w->queue->lock_ttl_ms,
                                 &err);
        if (rc == SK_AGAIN) {
            atomic_store(&w->slot->lock_held, 0);
            waited_for_lock(j, busy_since);
            w->redis_retry_at_ms = sk_now_ms() + sk_backoff_next(&w->redis_backoff);
            if (err.code == SK_AUTH && !w->redis_refused)
                sk_log_error("redis refused sekali's credentials: holding jobs back whatever "
                             "on_redis_down says, until redis.password is fixed: %s", err.msg);
            w->redis_refused = err.code == SK_AUTH;
            return without_redis(w, err.msg);
        }
        if (rc == SK_OK) {
            waited_for_lock(j, busy_since);
            if (w->redis_down)
                sk_log_info("redis reachable again, locking resumed");
            w->redis_down = false;
            w->redis_refused = false;
            sk_backoff_reset(&w->redis_backoff);
            j->locked = true;
            j->log.lock_owner = j->lock_token;
            sk_heartbeat_watch_lock(w->heartbeat, j->lock_key, j->lock_token,
                                    w->queue->lock_ttl_ms);
            transition(j, JOB_LOCKED);
            return SK_OK;
        }
        if (busy_since == 0)
            busy_since = now_ns();
        sk_failpoint("lock_busy", j->env.idempotency_key);  /* dying while waiting */
        if (sk_now_ms() >= give_up_at || sk_process_stopping()) {
            atomic_store(&w->slot->lock_held, 0);
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

/* PostgreSQL's row lock still serialises each key; the Redis lock only saves
 * duplicate work, so with `proceed` an outage costs speed, not safety, and
 * `wait` keeps the work itself serialised. Logs once per outage. */
static int without_redis(struct sk_worker *w, const char *why)
{
    /* A refused password is a configuration error, not an outage: going on
     * without locks would hide it for as long as nobody reads the log. */
    if (w->redis_refused) {
        w->redis_down = true;
        return SK_AGAIN;
    }
    bool proceed = w->queue->on_redis_down == SK_REDIS_DOWN_PROCEED;
    if (!w->redis_down)
        sk_log_warn("redis unavailable, %s: %s",
                    proceed ? "going on without locks" : "holding jobs back",
                    why != NULL ? why : "");
    w->redis_down = true;
    return proceed ? SK_OK : SK_AGAIN;
}

static void release_lock(struct sk_worker *w, struct job *j)
{
    if (!j->locked)
        return;
    j->locked = false;
    struct sk_err err = { 0 };
    int rc = sk_lock_release(w->lock, j->lock_key, j->lock_token, &err);
    atomic_store(&w->slot->lock_held, 0);
    if (rc == SK_BUSY)
        sk_log_job(SK_LOG_WARN, &j->log, "lock had expired before release");
    else if (rc != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "lock release failed (it will expire): %s", err.msg);
}

static void run_handler(struct sk_worker *w, struct job *j)
{
    struct sekali_ctx *ctx = &w->ctx;
    sk_host_ctx_reset(ctx);
    int status = call_handler(w, j, sk_store_conn(w->store));

    struct sk_err err = { 0 };
    if (status == SEKALI_OK) {
        int rc = sk_store_complete(w->store, &j->ref, ctx->result_len > 0 ? ctx->result : NULL,
                                   ctx->result_len, &err);
        if (rc == SK_OK) {
            transition(j, JOB_COMMITTED);
            reply(w, j, ctx->result, ctx->result_len);
            finish(w, j, ACK, "completed");
            return;
        }
        if (rc == SK_AGAIN) {
            /* The COMMIT may or may not have happened; only a redelivery's
             * claim can tell, so the message must go back unchanged. */
            sk_log_job(SK_LOG_ERROR, &j->log, "commit outcome unknown: %s", err.msg);
            finish(w, j, REQUEUE, "commit outcome unknown, handed back to the broker");
            return;
        }
        /* Rolled back: the handler left the transaction failed. */
        snprintf(ctx->error, sizeof(ctx->error), "commit failed: %s", err.msg);
        status = SEKALI_RETRY;
    } else if (sk_store_rollback(w->store, &err) != SK_OK) {
        sk_log_job(SK_LOG_WARN, &j->log, "rollback failed: %s", err.msg);
    }
    settle_failure(w, j, status);
}

/* RETRY: another attempt later, until retry.max_attempts; FAIL, an invalid
 * status or the last attempt: the key is recorded failed and dead-lettered. */
static void settle_failure(struct sk_worker *w, struct job *j, int status)
{
    struct sekali_ctx *ctx = &w->ctx;
    if (status == SEKALI_RETRY) {
        const char *why = ctx->error[0] != '\0' ? ctx->error : "handler asked to retry";
        /* host->conflict(): the handler's guarded update lost a race. */
        if (ctx->conflict)
            sk_metrics_inc(j->metrics, SK_METRIC_OCC_CONFLICTS);
        if (j->env.delivery_attempt < (uint32_t)w->queue->retry.max_attempts) {
            uint32_t next = j->env.delivery_attempt + 1;
            if (later(w, j, sk_reschedule_retry_delay(&w->queue->retry, next), next, why,
                      ctx->conflict ? "conflict" : "retry"))
                sk_metrics_inc(j->metrics, SK_METRIC_RETRIES);
            return;
        }
        give_up(w, j, SK_METRICS_RETRIES_EXHAUSTED, why);
        return;
    }
    char why[600];
    if (status == SEKALI_FAIL)
        snprintf(why, sizeof(why), "%s", ctx->error[0] != '\0' ? ctx->error : "handler failed");
    else
        snprintf(why, sizeof(why), "handler returned invalid status %d", status);
    give_up(w, j, SK_METRICS_FAILED, why);
}

/* Records the key as failed, then dead-letters the message. Without the
 * failed row a later copy would run again, so if it cannot be written the
 * message goes back to the broker instead. A leased job (external mode)
 * fails under its fence; any other in a transaction of its own. */
static void give_up(struct sk_worker *w, struct job *j, enum sk_metrics_reason reason,
                    const char *why)
{
    struct sk_err err = { 0 };
    int rc = j->leased
        ? sk_lease_finish(sk_store_conn(w->store), &j->ref, "failed", NULL, 0, why, &err)
        : sk_store_fail(w->store, &j->ref, why, &err);
    if (rc == SK_BUSY) {
        sk_metrics_inc(j->metrics, SK_METRIC_FENCED_OUT);
        sk_log_job(SK_LOG_WARN, &j->log, "failure fenced out: another worker owns the job");
        finish(w, j, ACK, "fenced out");
        return;
    }
    if (rc != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "recording failure failed: %s", err.msg);
        finish(w, j, REQUEUE, "failure not recorded, handed back to the broker");
        sk_sleep_ms(sk_jitter(100, 1000));
        return;
    }
    sk_log_job(SK_LOG_WARN, &j->log, "job %s: %s", sk_metrics_reason_name(reason), why);
    dead_letter(w, j, true, reason, why);
}

/* Sends a confirmed copy to `queue`.dead with the reason, then acks. If no
 * copy can be made, the broker's own dead-lettering (reject) still keeps the
 * message, without the reason headers, which the log line gives. Counted
 * once a copy exists: if the ack is lost, the redelivery makes a second one,
 * and counts it. */
static void dead_letter(struct sk_worker *w, struct job *j, bool parsed,
                        enum sk_metrics_reason reason, const char *why)
{
    struct sk_err err = { 0 };
    bool connected = sk_worker_publisher(w, &err);
    if (connected &&
        sk_reschedule_dead(w->publisher, w->queue->name, j->delivery, parsed ? &j->env : NULL,
                           sk_metrics_reason_name(reason), why, &err) == SK_OK) {
        sk_metrics_dead_letter(j->metrics, reason);
        finish(w, j, ACK, "dead-lettered");
        return;
    }
    /* A copy refused for its own sake (too large) leaves the connection
     * sound; only a failed connection is dropped. */
    if (!connected || err.code != SK_ERR)
        sk_worker_drop_publisher(w, err.msg);
    char text[1200];
    snprintf(text, sizeof(text), "dead-lettered by the broker (no reason headers; %s: %s; "
             "no copy: %s)", sk_metrics_reason_name(reason), why, err.msg);
    if (finish(w, j, DEAD_LETTER, text) == SK_OK)
        sk_metrics_dead_letter(j->metrics, reason);
}

/* Sends a confirmed copy that comes back after delay_ms, then acks, and
 * returns true. If the publisher cannot reach the broker, the message goes
 * back to the queue as it is, after a pause, and false. If the broker
 * refuses the copy or it cannot be made at all (too large for a frame),
 * handing it back would bring it straight back, at the same attempt, ahead
 * of the jobs behind it, for ever: it is dead-lettered instead (reason
 * malformed: nothing about it can change), and false. */
static bool later(struct sk_worker *w, struct job *j, uint32_t delay_ms, uint32_t next_attempt,
                  const char *error, const char *outcome)
{
    struct sk_err err = { 0 };
    bool connected = sk_worker_publisher(w, &err);
    if (connected &&
        sk_reschedule_later(w->publisher, w->queue->name, j->delivery, &j->env, delay_ms,
                            next_attempt, error, &err) == SK_OK) {
        char text[128];
        snprintf(text, sizeof(text), "%s: re-scheduled in %u ms", outcome, delay_ms);
        finish(w, j, ACK, text);
        return true;
    }
    if (connected && err.code == SK_ERR) {
        char why[700];
        snprintf(why, sizeof(why), "cannot be re-scheduled (%s): %s", outcome, err.msg);
        sk_log_job(SK_LOG_WARN, &j->log, "job malformed: %s", why);
        dead_letter(w, j, true, SK_METRICS_MALFORMED, why);
        return false;
    }
    sk_worker_drop_publisher(w, err.msg);
    finish(w, j, REQUEUE, "could not re-schedule, handed back to the broker");
    sk_sleep_ms(sk_jitter(100, 1000));
    return false;
}

/* Counts before the failpoint: a worker killed right after COMMIT has
 * committed, and a later copy will be a duplicate of a counted completion. */
static void transition(struct job *j, enum job_state to)
{
    j->state = to;
    if (to == JOB_CLAIMED) {
        j->claimed_ns = now_ns();
    } else if (to == JOB_COMMITTED) {
        sk_metrics_inc(j->metrics, SK_METRIC_COMPLETIONS);
        sk_metrics_duration(j->metrics, now_ns() - j->claimed_ns);
    }
    sk_log_job(SK_LOG_DEBUG, &j->log, "%s", state_names[to]);
    sk_failpoint(state_failpoints[to], j->env.idempotency_key);
}

/* The only exit of a delivered job: ack it (effect durable, duplicate, or a
 * confirmed copy made), requeue it, or let the broker dead-letter it; then
 * drop the lock. The ack may leave later (see sk_broker_ack()): by then the
 * outcome is already durable, so releasing the lock first is safe, and a
 * redelivery of an unsent ack finds a completed key. Returns the broker's
 * answer to the ack or reject: SK_OK, or SK_AGAIN (connection lost). */
static int finish(struct sk_worker *w, struct job *j, enum disposition d, const char *outcome)
{
    struct sk_err err = { 0 };
    int rc = d == ACK ? sk_broker_ack(w->broker, j->delivery_tag, &err)
                      : sk_broker_reject(w->broker, j->delivery_tag, d == REQUEUE, &err);
    if (d == ACK && rc == SK_OK)
        transition(j, JOB_ACKED);
    if (w->heartbeat != NULL) {
        sk_heartbeat_unwatch(w->heartbeat);
        /* After unwatch the heartbeat can no longer raise the flag for this
         * job, and only a watch clears it: read now, it is this job's. */
        if ((j->locked || j->leased) && atomic_load(sk_heartbeat_lost(w->heartbeat)))
            sk_metrics_inc(j->metrics, SK_METRIC_LOCKS_LOST);
    }
    release_lock(w, j);
    sk_log_job(SK_LOG_INFO, &j->log, "%s", outcome);
    if (rc != SK_OK)
        sk_worker_drop_broker(w, err.msg);
    return rc;
}

/* CLOCK_MONOTONIC in nanoseconds: read through the vDSO, not a syscall. */
static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
