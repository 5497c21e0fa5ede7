/* span_settle.c - a span's end: the duplicates a rolled-back claim counted
 * counted again, the lost locks counted, the locks handed to the next
 * acquire, and every job's exit in delivery order (an ack is a multiple-ack,
 * broker.c); between two transactions, the exits of the jobs settled ahead. */
#include <stdlib.h>

#include "broker.h"
#include "clock.h"
#include "heartbeat.h"
#include "job.h"
#include "links.h"
#include "log.h"
#include "metrics.h"
#include "span_way.h"

static void exit_job(struct sk_pipeline *p, struct sk_job *j);

void sk_span_settle(struct sk_pipeline *p, struct sk_span *s)
{
    sk_span_recount_duplicates(p, s);
    if (p->heartbeat != NULL)
        sk_span_count_lost_locks(p, s);
    sk_span_unlock(p, s);
    uint32_t pause_ms = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        sk_assert(!sk_job_live(j));
        pause_ms += j->exit.pause_ms;
        if (j->state != SK_JOB_SETTLED) {
            /* sk_span_settle_done() carried it out. */
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
void sk_span_count_lost_locks(struct sk_pipeline *p, struct sk_span *s)
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
void sk_span_settle_done(struct sk_pipeline *p, struct sk_span *s)
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

/* The duplicates a rolled-back transaction of the span claimed took their
 * count with it, and are settled, so no later claim counts them: written
 * again on their own, before the next transaction or the span's exits. A
 * counter, not an outcome: if that fails, it is logged and let go. */
void sk_span_recount_duplicates(struct sk_pipeline *p, struct sk_span *s)
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
