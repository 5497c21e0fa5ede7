/* job_state.c - a job's states and the one way between them.
 *
 * A job is in exactly one state (job_steps.h); sk_job_transition() asserts
 * each move is legal, logs it and, in a fault build, is where a test kills
 * the worker. sk_job_finish() decides the job's exit, which span.c carries
 * out; sk_job_exited() then logs what became of the job. Every file of the
 * pipeline moves a job through here, and this file calls none of them, so
 * the steps (job.c, span.c) and the ways out (letter.c) can each settle a
 * job without calling one another. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <sekali/handler.h>

#include "backoff.h"
#include "clock.h"
#include "failpoint.h"
#include "job_steps.h"
#include "log.h"
#include "metrics.h"
#include "span_export.h"

static const char *const state_names[SK_JOB_STATES] = {
    [SK_JOB_NEW] = "new",
    [SK_JOB_RECEIVED] = "received",
    [SK_JOB_LOCKED] = "locked",
    [SK_JOB_CLAIMED] = "claimed",
    [SK_JOB_HANDLED] = "handled",
    [SK_JOB_COMMITTED] = "committed",
    [SK_JOB_SETTLED] = "settled",
    [SK_JOB_ACKED] = "acked",
    [SK_JOB_HANDED_BACK] = "handed back",
};

static const char *const outcome_names[] = {
    [SK_OUTCOME_COMPLETED] = "completed",
    [SK_OUTCOME_DUPLICATE] = "duplicate",
    [SK_OUTCOME_CANCELLED] = "cancelled",
    [SK_OUTCOME_FENCED_OUT] = "fenced_out",
    [SK_OUTCOME_RETRY] = "retry",
    [SK_OUTCOME_RESCHEDULED] = "rescheduled",
    [SK_OUTCOME_DEAD] = "dead",
    [SK_OUTCOME_HANDED_BACK] = "handed_back",
};

static const char *const state_failpoints[SK_JOB_STATES] = {
    [SK_JOB_RECEIVED] = "after_receive",
    [SK_JOB_LOCKED] = "after_lock",
    [SK_JOB_CLAIMED] = "after_claim",
    [SK_JOB_HANDLED] = "after_handler",
    [SK_JOB_COMMITTED] = "after_commit",
    [SK_JOB_ACKED] = "after_ack",
};

#define FROM(s) (1u << (s))
/* Any state a job can be settled from: every one before it. */
#define LIVE (FROM(SK_JOB_NEW) | FROM(SK_JOB_RECEIVED) | FROM(SK_JOB_LOCKED) | \
              FROM(SK_JOB_CLAIMED) | FROM(SK_JOB_HANDLED) | FROM(SK_JOB_COMMITTED))

/* The states each state may be entered from. The lock is optional (lock:
 * false, or Redis down under `proceed`); a job may be settled at any point
 * before, and exits once, only once settled. */
static const unsigned legal_from[SK_JOB_STATES] = {
    [SK_JOB_NEW] = 0,
    [SK_JOB_RECEIVED] = FROM(SK_JOB_NEW),
    [SK_JOB_LOCKED] = FROM(SK_JOB_RECEIVED),
    [SK_JOB_CLAIMED] = FROM(SK_JOB_RECEIVED) | FROM(SK_JOB_LOCKED),
    [SK_JOB_HANDLED] = FROM(SK_JOB_CLAIMED),
    [SK_JOB_COMMITTED] = FROM(SK_JOB_HANDLED),
    [SK_JOB_SETTLED] = LIVE,
    [SK_JOB_ACKED] = FROM(SK_JOB_SETTLED),
    [SK_JOB_HANDED_BACK] = FROM(SK_JOB_SETTLED),
};

/* Counts before the failpoint: a worker killed right after COMMIT has
 * committed, and a later copy will be a duplicate of a counted completion. */
void sk_job_transition(struct sk_job *j, enum sk_job_state to)
{
    sk_assert(legal_from[to] & FROM(j->state));
    j->state = to;
    if (to == SK_JOB_CLAIMED) {
        j->claimed_ns = sk_now_ns();
    } else if (to == SK_JOB_COMMITTED) {
        sk_metrics_inc(j->metrics, SK_METRIC_COMPLETIONS);
        sk_metrics_duration(j->metrics, sk_now_ns() - j->claimed_ns);
    }
    sk_log_job(SK_LOG_DEBUG, &j->log, "%s", state_names[to]);
    if (state_failpoints[to] != NULL)
        sk_failpoint(state_failpoints[to], j->env.idempotency_key);
}

/* A batch's fast path rolled its whole transaction back (batch.c): the
 * job's claim went with it, so it stands where it stood before its claim,
 * and is claimed again. The one way back in the states, and only from a
 * claim that no COMMIT made true. */
void sk_job_rewind(struct sk_job *j)
{
    sk_assert(j->state == SK_JOB_CLAIMED || j->state == SK_JOB_HANDLED);
    j->state = j->lock.held || j->lock.shared ? SK_JOB_LOCKED : SK_JOB_RECEIVED;
    free(j->out.result);
    sk_sqlq_clear(&j->out.queued);
    j->out = (struct sk_outcome){ .status = SEKALI_OK };
    sk_log_job(SK_LOG_DEBUG, &j->log, "claim rolled back with its batch");
}

/* The only exit of a delivered job: ack it (effect durable, duplicate, or a
 * confirmed copy made), requeue it, or let the broker dead-letter it. Only
 * decided here, once; sk_span_settle() drops the span's locks and then
 * carries the exits out in delivery order. The ack may leave later (see
 * sk_broker_ack()): by then the outcome is already durable, so releasing
 * the lock first is safe, and a redelivery of an unsent ack finds a
 * completed key. */
void sk_job_finish(struct sk_job *j, enum sk_disposition d, enum sk_job_outcome outcome,
                   const char *reason, const char *text)
{
    sk_job_transition(j, SK_JOB_SETTLED);
    j->exit.how = d;
    j->exit.outcome = outcome;
    snprintf(j->exit.reason, sizeof(j->exit.reason), "%s", reason != NULL ? reason : "");
    snprintf(j->exit.text, sizeof(j->exit.text), "%s", text);
}

/* The worker waits a moment before its next delivery, so that a failing
 * server is not asked again at once. */
void sk_job_hand_back(struct sk_job *j, const char *reason, const char *text)
{
    sk_job_finish(j, SK_REQUEUE, SK_OUTCOME_HANDED_BACK, reason, text);
    j->exit.pause_ms = (uint32_t)sk_jitter(100, 1000);
}

/* One line per delivery, whatever became of it, with stable fields: what
 * tests, alerts and scripts count rather than the prose. */
void sk_job_exited(struct sk_job *j, bool sent)
{
    static const char *const exits[] = {
        [SK_ACK] = "ack", [SK_REQUEUE] = "requeue", [SK_DEAD_LETTER] = "reject",
        [SK_ACKED] = "ack",
    };
    bool acked = sent && (j->exit.how == SK_ACK || j->exit.how == SK_ACKED);
    sk_job_transition(j, acked ? SK_JOB_ACKED : SK_JOB_HANDED_BACK);
    char ms[24];
    snprintf(ms, sizeof(ms), "%" PRIu64, (sk_now_ns() - j->admitted_ns) / 1000000);
    struct sk_log_field f[SK_LOG_MAX_FIELDS] = {
        { "outcome", outcome_names[j->exit.outcome] },
        { "exit", sent ? exits[j->exit.how] : "lost" },
        { "ms", ms },
        { "reason", j->exit.reason },
    };
    sk_log_event_fields(SK_LOG_INFO, SK_EVENT_OUTCOME, NULL, &j->log, f,
                        j->exit.reason[0] != '\0' ? 4 : 3, "%s%s", j->exit.text,
                        sent ? "" : "; not acked: the consumer was lost");
    sk_span_export_job(j, outcome_names[j->exit.outcome],
                       j->exit.outcome == SK_OUTCOME_RETRY || j->exit.outcome == SK_OUTCOME_DEAD);
}
