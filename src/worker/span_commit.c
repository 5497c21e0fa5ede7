/* span_commit.c - a span's COMMIT: the handlers' queued statements, the
 * completions and the COMMIT in one round trip, the way the transaction
 * took (span_way.h), and each job settled by its answer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "links.h"
#include "log.h"
#include "span_way.h"

static size_t queued_steps(struct sk_pipeline *p, struct sk_span *s, struct sk_pg_stmt **out);

int sk_span_commit(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w,
                   size_t back, bool *queued, struct sk_err *err)
{
    size_t m = 0;
    struct sk_pg_stmt *steps = NULL;
    size_t n_queued = queued_steps(p, s, &steps);
    if (n_queued == SIZE_MAX) {
        sk_span_abandon(p, s, "no memory for the handlers' queued statements");
        return SK_AGAIN;
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
    int rc = w->commit(p, s, m, back, err);
    free(steps);
    /* Committed, the duplicates' counts are true; of an unknown outcome
     * they are left as they are, lest one be counted twice. */
    for (size_t i = 0; (rc == SK_OK || rc == SK_AGAIN) && i < s->n; i++)
        s->jobs[i].dup_uncounted = false;
    *queued = n_queued > 0;
    if (rc == SK_AGAIN) {
        /* The COMMIT may or may not have happened; only a redelivery's
         * claim can tell, so the messages must go back unchanged. */
        sk_log_job(SK_LOG_ERROR, &s->jobs[0].log, "commit outcome unknown: %s", err->msg);
        sk_span_abandon(p, s, "commit outcome unknown");
    }
    return rc;
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

int sk_span_commit_fast(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                        struct sk_err *err)
{
    return sk_store_commit_results(sk_links_store(p->links), s->ref_ptrs, s->results,
                                   s->result_lens, m, s->refs, back, err);
}

int sk_span_commit_careful(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                           struct sk_err *err)
{
    return sk_store_complete_many(sk_links_store(p->links), s->ref_ptrs, s->results,
                                  s->result_lens, m, s->refs, back, err);
}

/* One job: its completion and COMMIT; failed, its transaction goes, and
 * its failure is settled outside any. */
int sk_span_commit_one(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
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
bool sk_span_settle_outcomes(struct sk_pipeline *p, struct sk_span *s,
                             const struct sk_span_way *w, int rc, const struct sk_err *err)
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
