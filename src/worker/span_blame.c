/* span_blame.c - whose a failed transaction of the span is: nobody's when
 * it was lost (all handed back), the handler's when the fast way's failed,
 * no one job's when a COMMIT with queued statements did; span.c reruns. */
#include <stdio.h>

#include "links.h"
#include "log.h"
#include "metrics.h"
#include "span_way.h"

/* The transaction is lost before any COMMIT: every job still in it is
 * handed back unchanged. */
void sk_span_abandon(struct sk_pipeline *p, struct sk_span *s, const char *why)
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

/* The fast way's first failure: the whole transaction is rolled back, the
 * failed job settled with its outcome (its handler does not run again), and
 * the rest rewound, to be claimed again the careful way. Its batch-mates'
 * runs went with the transaction, unseen, and are made again: counted,
 * since a handler that fails often makes a batch cost twice its work
 * (batch: 1 is then the cheaper way). */
bool sk_span_blame_handler(struct sk_pipeline *p, struct sk_span *s, struct sk_job *failed)
{
    struct sk_err err = { 0 };
    if (sk_store_rollback(sk_links_store(p->links), &err) != SK_OK) {
        /* The connection went with the transaction: nobody's fault. */
        sk_span_abandon(p, s, "the batch's transaction was lost");
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
    return true;
}

/* The blame rule for queued statements: a COMMIT of several jobs that
 * failed with statements queued cannot say whose statement it was, so no
 * job is charged: the ones whose handlers succeeded are rewound and each
 * runs again alone, in a transaction of its own, where a failure is its
 * own (retried or dead-lettered as any failed COMMIT). A job whose handler
 * failed is settled with its own outcome as before. A COMMIT refused for a
 * cancelled key settles that job; the others then run again together, as
 * sk_span_settle_outcomes() does. */
bool sk_span_blame_queued(struct sk_pipeline *p, struct sk_span *s)
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
    return false;
}
