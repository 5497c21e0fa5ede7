/* job.c - the pipeline of a delivery, in a worker process.
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
 * One delivery goes through the pipeline as a span of one, a batch as a
 * span of many: span.c drives the steps over a span of n >= 1 jobs, and
 * calls this file for what each step decides for one job: whether a
 * delivery is valid, what a refused lock or a claim's answer means, how a
 * failed handler is retried or dead-lettered. The job's states are
 * job_state.c's, its dead letters letter.c's. A job carries everything about its delivery (envelope,
 * lock, claim, state, outcome), and the struct sk_pipeline only what the
 * process shares between jobs. The servers are reached through the links
 * (links.c), which keep the outages; this file decides only what an outage
 * means for a job.
 *
 * Each delivery is counted in the shared metrics where its outcome becomes
 * a fact (the commit, the broker's confirm of a copy), never where it is
 * only attempted, so that the counters say what happened. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "broker.h"
#include "clock.h"
#include "envelope.h"
#include "heartbeat.h"
#include "job.h"
#include "job_steps.h"
#include "job_trace.h"
#include "lease.h"
#include "letter.h"
#include "links.h"
#include "log.h"
#include "metrics.h"
#include "reschedule.h"
#include "scoreboard.h"
#include "store.h"

static bool crashed_too_often(struct sk_pipeline *p, struct sk_job *j);
static bool claimed_too_often(struct sk_pipeline *p, struct sk_job *j);
static void completed_external(struct sk_pipeline *p, struct sk_job *j, PGconn *pg);
static void reply_saved(struct sk_pipeline *p, struct sk_job *j);

/* Validates the delivery and counts it; dead-letters what can never run. */
bool sk_job_admit(struct sk_pipeline *p, struct sk_job *j)
{
    struct sk_err err = { 0 };
    j->admitted_ns = sk_now_ns();
    j->log.queue = p->queue->name;
    int parsed = sk_envelope_parse(j->delivery, p->queue, &j->env, &err);
    /* Even a malformed delivery has a job_type here: "" unless validated. */
    j->metrics = sk_metrics_lookup(p->metrics, j->env.job_type);
    sk_job_trace_admit(&j->log, &j->env, j->metrics);
    sk_metrics_inc(j->metrics, SK_METRIC_DELIVERIES);
    if (j->env.redelivered || j->env.delivery_attempt > 1)
        sk_metrics_inc(j->metrics, SK_METRIC_REDELIVERIES);
    const char *refused = parsed == SK_OK && j->env.reply_to[0] != '\0'
        ? sk_envelope_reply_refused(j->env.reply_to, p->conf) : NULL;
    if (parsed != SK_OK || refused != NULL) {
        /* A reply_to is refused before anything runs: a job whose reply
         * cannot be sent would leave its caller waiting, the effect made. */
        char why[700];
        snprintf(why, sizeof(why), "%s%s%s", refused != NULL ? refused : err.msg,
                 refused != NULL ? ": " : "", refused != NULL ? j->env.reply_to : "");
        sk_log_event(SK_LOG_WARN, SK_EVENT_MALFORMED, NULL, &j->log, "malformed message: %s",
                     why);
        sk_letter_dead(p, j, false, SK_METRICS_MALFORMED, why);
        return false;
    }
    j->log.job_id = j->env.job_id;
    j->log.idempotency_key = j->env.idempotency_key;
    j->log.resource_key = j->env.resource_key;
    j->log.delivery_attempt = j->env.delivery_attempt;
    if (sk_envelope_beyond_retention(&j->env, p->queue, (uint64_t)time(NULL))) {
        const char *why = "published longer ago than the queue's retention: its key may be "
                          "purged, so a duplicate could not be recognised";
        sk_log_job(SK_LOG_WARN, &j->log, "job beyond retention, not run: %s", why);
        sk_letter_dead(p, j, true, SK_METRICS_BEYOND_RETENTION, why);
        return false;
    }
    j->ref = (struct sk_keyref){ .queue = p->queue->name, .key = j->env.idempotency_key,
                                 .owner = p->owner, .job_id = j->env.job_id,
                                 .job_type = j->env.job_type };
    sk_job_transition(j, SK_JOB_RECEIVED);
    /* Should this worker die now, its replacement counts the crash. */
    sk_slot_publish_job(p->slot, j->env.idempotency_key, j->env.job_type,
                        j->env.delivery_attempt, j->env.trace.trace_id);
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
bool sk_job_survivable(struct sk_pipeline *p, struct sk_job *j)
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
static bool crashed_too_often(struct sk_pipeline *p, struct sk_job *j)
{
    int crashes = 0;
    if (sk_store_crashes(sk_links_store(p->links), &j->ref, &crashes, NULL) != SK_OK ||
        crashes < p->queue->max_crashes)
        return false;
    char why[128];
    snprintf(why, sizeof(why), "its worker died %d times while running it", crashes);
    sk_letter_give_up(p, j, SK_METRICS_CRASHED, why);
    return true;
}

/* What a claim's answer means for the job, whichever mode and however many
 * keys the round trip claimed: true when the job owns its key and goes on
 * to its handler; otherwise the job is settled here. */
bool sk_job_claimed(struct sk_pipeline *p, struct sk_job *j, int rc, const struct sk_err *err)
{
    bool external = p->queue->mode == SK_MODE_EXTERNAL;
    switch (rc) {
    case SK_OK:
        sk_links_up(p->links, SK_LINK_STORE);
        j->log.fence = j->claim.fence;
        sk_keyref_set_fence(&j->ref, j->claim.fence);
        sk_job_transition(j, SK_JOB_CLAIMED);
        return true;
    case SK_DUP:
        if (j->claim.cancelled) {
            /* The tombstone (sql/018): the job must never run. */
            sk_metrics_inc(j->metrics, SK_METRIC_CANCELLED);
            sk_job_finish(j, SK_ACK, SK_OUTCOME_CANCELLED, "before_run", "cancelled, not run");
            return false;
        }
        sk_metrics_inc(j->metrics, SK_METRIC_DUPLICATES);
        reply_saved(p, j);
        sk_job_finish(j, SK_ACK, SK_OUTCOME_DUPLICATE, NULL, "duplicate suppressed");
        return false;
    case SK_BUSY:
        /* A live worker holds the key (its row lock, or its lease): it is
         * running this very job. Come back later rather than wait; its
         * outcome decides ours. */
        sk_job_later(p, j, sk_reschedule_bucket(external
                  ? sk_jitter(p->queue->lease_ms / 4, p->queue->lease_ms)
                  : sk_jitter(100, 1000)),
              j->env.delivery_attempt, NULL,
              external ? "key leased" : "key busy");
        return false;
    default:
        /* Handed back unchanged: an outage is not the job's failure. The
         * links pause before the next delivery, after the hand-back, so
         * the lock is not held through the backoff (other jobs for the
         * resource would wait for nothing). */
        sk_links_drop(p->links, SK_LINK_STORE, &j->log, err);
        sk_job_hand_back(j, "claim_failed", "claim failed, handed back to the broker");
        return false;
    }
}

/* External mode: the claim committed a lease instead of holding a row lock,
 * the handler acts outside PostgreSQL, and the outcome is recorded only
 * under the fence this claim got. A worker that stalled past its lease and
 * comes back finds its completion fenced out: the newer owner's outcome
 * stands, and this copy is acked without touching it. */
void sk_job_run_external(struct sk_pipeline *p, struct sk_job *j)
{
    struct sk_err err = { 0 };
    struct sk_store *store = sk_links_store(p->links);
    int rc = sk_store_reconnect(store, &err);
    if (rc == SK_OK)
        rc = sk_lease_claim(sk_store_conn(store), &j->ref, p->queue->lease_ms, &j->claim, &err);
    if (!sk_job_claimed(p, j, rc, &err))
        return;
    sk_heartbeat_watch_lease(p->heartbeat, p->queue->name, j->env.idempotency_key,
                             j->claim.fence, p->queue->lease_ms);
    j->leased = true;
    if (claimed_too_often(p, j))
        return;

    PGconn *pg = sk_store_conn(store);
    struct sekali_ctx *ctx = &p->ctx;
    sk_host_ctx_reset(ctx);
    ctx->external = true;
    err = (struct sk_err){ 0 };
    if (j->claim.attempts > 1 &&
        sk_lease_load_checkpoints(pg, &j->ref, &ctx->checkpoints, &err) != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "checkpoints not loaded: %s", err.msg);
    int status = sk_job_call_handler(p, j, pg);
    if (status == SEKALI_OK) {
        completed_external(p, j, pg);
        return;
    }
    if (status == SEKALI_RETRY &&
        sk_lease_release(pg, &j->ref, &err) == SK_AGAIN)
        sk_log_job(SK_LOG_WARN, &j->log, "lease not released (it will expire): %s", err.msg);
    sk_job_settle_failure(p, j, status, ctx->error, ctx->conflict);
}

/* An external handler's success, recorded under the job's fence. */
static void completed_external(struct sk_pipeline *p, struct sk_job *j, PGconn *pg)
{
    struct sk_err err = { 0 };
    struct sekali_ctx *ctx = &p->ctx;
    int rc = sk_lease_finish(pg, &j->ref, "completed", ctx->result_len > 0 ? ctx->result : NULL,
                             ctx->result_len, NULL, &err);
    if (rc == SK_OK) {
        sk_job_transition(j, SK_JOB_COMMITTED);
        sk_job_reply(p, j, ctx->result, ctx->result_len);
        sk_job_finish(j, SK_ACK, SK_OUTCOME_COMPLETED, NULL, "completed");
    } else if (rc != SK_AGAIN && sk_job_refused_cancelled(p, j)) {
        /* Fenced out (the cancel wrote the row cancelled), or refused at
         * COMMIT (sql/018's trigger): no outcome is recorded. */
    } else if (rc == SK_BUSY) {
        sk_metrics_inc(j->metrics, SK_METRIC_FENCED_OUT);
        sk_log_event(SK_LOG_WARN, SK_EVENT_FENCED_OUT, NULL, &j->log,
                     "completion fenced out: the lease was lost and "
                     "another worker took the job over; its outcome stands");
        sk_job_finish(j, SK_ACK, SK_OUTCOME_FENCED_OUT, "completion", "fenced out");
    } else if (sk_pg_refused_for_good(&err)) {
        /* Handed back, it would run again at each lease's end, for ever:
         * the effect is made, only its record is missing. */
        sk_letter_unrecorded(p, j, "its completion", "the handler succeeded", &err);
    } else {
        sk_log_job(SK_LOG_ERROR, &j->log, "completion outcome unknown: %s", err.msg);
        sk_job_hand_back(j, "completion_unknown",
                         "completion outcome unknown, handed back to the broker");
    }
}

/* The key's claims, counted by PostgreSQL, bound its runs whatever the
 * copies say. A last failure PostgreSQL would not take for a while (a
 * passing condition) leaves the key leased, its message goes back, and
 * each copy that takes the lease over would run the handler again, at the
 * same attempt, past max_attempts: an outside call made again every lease.
 * A worker's death and a lost lease count a claim too, hence max_crashes
 * of slack. Past that, the job is failed without running. */
static bool claimed_too_often(struct sk_pipeline *p, struct sk_job *j)
{
    int most = p->queue->retry.max_attempts + p->queue->max_crashes;
    if (j->claim.attempts <= most)
        return false;
    char why[200];
    snprintf(why, sizeof(why), "its key was claimed %d times, past retry.max_attempts %d and "
             "max_crashes %d: not run again", j->claim.attempts, p->queue->retry.max_attempts,
             p->queue->max_crashes);
    sk_letter_give_up(p, j, SK_METRICS_RETRIES_EXHAUSTED, why);
    return true;
}

bool sk_job_refused_cancelled(struct sk_pipeline *p, struct sk_job *j)
{
    struct sk_err err = { 0 };
    bool cancelled = false;
    if (sk_store_settle_cancelled(sk_links_store(p->links), &j->ref, &cancelled, &err) != SK_OK) {
        sk_log_job(SK_LOG_WARN, &j->log, "whether the key was cancelled is unknown: %s",
                   err.msg);
        return false;
    }
    if (!cancelled)
        return false;
    sk_metrics_inc(j->metrics, SK_METRIC_CANCELLED);
    sk_log_event(SK_LOG_WARN, SK_EVENT_JOB_CANCELLED, NULL, &j->log,
                 "cancelled while it ran: its outcome was refused and not recorded");
    sk_job_finish(j, SK_ACK, SK_OUTCOME_CANCELLED, "while_running",
                  "cancelled while running, outcome refused");
    return true;
}

/* Sends result to the job's reply_to, once per key: replied_at is recorded
 * after the broker confirmed the reply. A reply that cannot be sent is
 * logged and given up: the job's effect is done and must not run again for
 * it, and a later copy of the job will send the saved result. */
void sk_job_reply(struct sk_pipeline *p, struct sk_job *j, const void *result, size_t len)
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
        sk_links_drop(p->links, SK_LINK_PUBLISHER, &j->log, &err);
        sk_log_job(SK_LOG_WARN, &j->log, "reply to %s not sent: %s", j->env.reply_to, err.msg);
        return;
    }
    if (sk_store_mark_replied(sk_links_store(p->links), &j->ref, &err) != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "reply sent but not recorded: %s", err.msg);
}

/* A duplicate of a completed job gets the saved result, unless the reply
 * already went out (the usual case: it did, with the first copy). */
static void reply_saved(struct sk_pipeline *p, struct sk_job *j)
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
int sk_job_call_handler(struct sk_pipeline *p, struct sk_job *j, PGconn *pg)
{
    struct sekali_ctx *ctx = &p->ctx;
    /* A copy with a NUL after it (ABI 1.3), so text handlers need none. */
    const char *body = sk_host_ctx_body(ctx, j->env.body, j->env.body_len);
    if (body == NULL) {
        snprintf(ctx->error, sizeof(ctx->error), "out of memory copying a %zu-byte body",
                 j->env.body_len);
        sk_job_transition(j, SK_JOB_HANDLED);
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
        .traceparent = j->env.trace.traceparent,
        .tracestate = j->env.trace.tracestate,
    };
    ctx->pg = pg;
    ctx->log = &j->log;
    ctx->trace = &j->env.trace;
    ctx->headers_done = false;
    ctx->headers = j->delivery->message.properties._flags & AMQP_BASIC_HEADERS_FLAG
        ? &j->delivery->message.properties.headers : NULL;
    ctx->lock_lost = p->heartbeat != NULL && (j->lock.held || j->lock.shared || ctx->external)
        ? sk_heartbeat_lost(p->heartbeat) : NULL;
    /* Counted before the call: a handler that kills its worker still ran. */
    sk_metrics_inc(j->metrics, SK_METRIC_EXECUTIONS);
    sk_links_lend(p->links, p->heartbeat);
    /* Only a death inside this call can be the job's doing. */
    atomic_store(&p->slot->phase, SK_PHASE_HANDLER);
    int status = p->handler->handle(p->handler_state, &job, ctx);
    atomic_store(&p->slot->phase, SK_PHASE_JOB);
    sk_links_take_back(p->links, p->heartbeat);
    sk_job_transition(j, SK_JOB_HANDLED);
    /* The job's own, since a batch-mate's handler resets ctx before the
     * job's outcome is settled. */
    j->out.retry_after_ms = ctx->retry_after_ms;
    return status;
}

/* RETRY: another attempt later, until retry.max_attempts; FAIL, an invalid
 * status or the last attempt: the key is recorded failed and dead-lettered. */
void sk_job_settle_failure(struct sk_pipeline *p, struct sk_job *j, int status, const char *error,
                           bool conflict)
{
    /* A handler that ran may have failed because its job was cancelled
     * (host->cancelled()): neither retried nor recorded failed, which would
     * overwrite the tombstone. A round trip on this path only. */
    if (j->state == SK_JOB_HANDLED && sk_job_refused_cancelled(p, j))
        return;
    if (status == SEKALI_RETRY) {
        const char *why = error[0] != '\0' ? error : "handler asked to retry";
        /* host->conflict(): the handler's guarded update lost a race. */
        if (conflict)
            sk_metrics_inc(j->metrics, SK_METRIC_OCC_CONFLICTS);
        if (j->env.delivery_attempt < (uint32_t)p->queue->retry.max_attempts) {
            uint32_t next = j->env.delivery_attempt + 1;
            uint32_t delay = sk_reschedule_retry_delay(&p->queue->retry, next);
            /* host->retry_after(): the service's own word, within retry.max. */
            uint32_t asked = j->out.retry_after_ms;
            if (asked > p->queue->retry.max_ms)
                asked = p->queue->retry.max_ms;
            if (asked > delay)
                delay = sk_reschedule_bucket(asked);
            if (sk_job_later(p, j, delay, next, why,
                      conflict ? "conflict" : "retry"))
                sk_metrics_inc(j->metrics, SK_METRIC_RETRIES);
            return;
        }
        sk_letter_give_up(p, j, SK_METRICS_RETRIES_EXHAUSTED, why);
        return;
    }
    char why[600];
    if (status == SEKALI_FAIL)
        snprintf(why, sizeof(why), "%s", error[0] != '\0' ? error : "handler failed");
    else
        snprintf(why, sizeof(why), "handler returned invalid status %d", status);
    sk_letter_give_up(p, j, SK_METRICS_FAILED, why);
}

/* Sends a confirmed copy that comes back after delay_ms, then acks, and
 * returns true. If the publisher cannot reach the broker, the message goes
 * back to the queue as it is, after a pause, and false. If the broker
 * refuses the copy or it cannot be made at all (too large for a frame),
 * handing it back would bring it straight back, at the same attempt, ahead
 * of the jobs behind it, for ever: it is dead-lettered instead (reason
 * malformed: nothing about it can change), and false. */
bool sk_job_later(struct sk_pipeline *p, struct sk_job *j, uint32_t delay_ms, uint32_t next_attempt,
                  const char *error, const char *outcome)
{
    struct sk_err err = { 0 };
    struct sk_broker *pub = sk_links_publisher(p->links, &err);
    bool connected = pub != NULL;
    if (connected &&
        sk_reschedule_later(pub, p->queue, j->delivery, &j->env, delay_ms,
                            next_attempt, error, &err) == SK_OK) {
        /* With the cause: a retry's log line is all an operator sees of an
         * attempt that failed and will be tried again. */
        char text[sizeof(j->exit.text)];
        snprintf(text, sizeof(text), "%s: re-scheduled in %u ms%s%s", outcome, delay_ms,
                 error != NULL && error[0] != '\0' ? ": " : "", error != NULL ? error : "");
        /* The cause in prose ("lock busy") is the event's reason word. */
        char reason[sizeof(j->exit.reason)];
        snprintf(reason, sizeof(reason), "%s", outcome);
        for (char *c = strchr(reason, ' '); c != NULL; c = strchr(c, ' '))
            *c = '_';
        sk_job_finish(j, SK_ACK, next_attempt > j->env.delivery_attempt
                      ? SK_OUTCOME_RETRY : SK_OUTCOME_RESCHEDULED, reason, text);
        return true;
    }
    if (connected && err.code == SK_ERR) {
        char why[700];
        snprintf(why, sizeof(why), "cannot be re-scheduled (%s): %s", outcome, err.msg);
        sk_log_job(SK_LOG_WARN, &j->log, "job malformed: %s", why);
        sk_letter_dead(p, j, true, SK_METRICS_MALFORMED, why);
        return false;
    }
    /* A nacked copy (a delay queue electing its leader) leaves the
     * connection sound: sk_links_drop() keeps it, so the hand-back costs
     * no reconnect. */
    sk_links_drop(p->links, SK_LINK_PUBLISHER, &j->log, &err);
    sk_job_hand_back(j, "reschedule_failed", "could not re-schedule, handed back to the broker");
    return false;
}
