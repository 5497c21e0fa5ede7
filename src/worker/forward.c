/* forward.c - a delivery of a queue's intake moved to its tenant's lane
 * (see forward.h).
 *
 * A forward is a re-schedule with no delay: the worker's publisher sends a
 * copy to the lane with the message's properties and headers unchanged,
 * waits for the broker's confirm, and only then acks the original. A
 * worker that dies between the confirm and the ack leaves both: the
 * original is redelivered and forwarded again, and the two copies are one
 * job to PostgreSQL, whose idempotency key makes the second a duplicate.
 * No claim is made and no attempt counted: a forward is not a run.
 *
 * Retries come back through the queue's delay queues to `<queue>`, the
 * intake, and are forwarded again: the delay queues stay one set per
 * queue (lanes of their own would multiply them by the lanes), and the
 * tenant header travels with every copy, so the retry lands in the same
 * lane at the price of one more hop. */
#include <string.h>

#include "backoff.h"
#include "broker.h"
#include "failpoint.h"
#include "forward.h"
#include "lane.h"
#include "links.h"
#include "log.h"
#include "metrics.h"
#include "pipeline.h"

static unsigned lane_of(const struct sk_queue_conf *q, const amqp_envelope_t *env);

bool sk_forward_intake(struct sk_pipeline *p, amqp_envelope_t *env)
{
    const struct sk_queue_conf *q = p->queue;
    struct sk_broker *consumer = sk_links_consumer(p->links);
    if (q->lanes == 0 || sk_broker_delivery_sub(consumer, env) != 0)
        return false;
    /* A body not read (over max_body) cannot be copied: the job's own way
     * dead-letters it, as it would from a lane. */
    if (env->message.body.len > 0 && env->message.body.bytes == NULL)
        return false;
    unsigned lane = lane_of(q, env);
    char name[512];
    if (sk_lane_name(q->name, lane, name, sizeof(name)) != 0)
        return false;
    struct sk_err err = { 0 };
    struct sk_broker *pub = sk_links_publisher(p->links, &err);
    int rc = pub != NULL ? sk_broker_republish(pub, name, env, NULL, 0, &err) : SK_AGAIN;
    if (rc == SK_ERR && pub != NULL)
        /* The copy cannot be made (its properties do not fit a frame):
         * a fault of the message, which the job's own way deals with. */
        return false;
    if (rc == SK_OK) {
        /* Dying here leaves the copy and the original: check_fairness. */
        sk_failpoint("forward_confirmed", NULL);
        struct sk_err ack_err = { 0 };
        if (sk_broker_ack_one(consumer, env->delivery_tag, &ack_err) != SK_OK)
            sk_log_warn("queue %s: forward to %s not acked (it will be forwarded again): %s",
                        q->name, name, ack_err.msg);
        sk_log_debug("queue %s: forwarded delivery %llu to %s", q->name,
                     (unsigned long long)env->delivery_tag, name);
        sk_metrics_inc(sk_metrics_lookup(p->metrics, ""), SK_METRIC_LANE_FORWARDS);
    } else {
        /* As a failed re-schedule: back to the intake, and a pause so that
         * a broker refusing copies is not asked again at once. */
        sk_links_drop(p->links, SK_LINK_PUBLISHER, NULL, &err);
        sk_broker_reject(consumer, env->delivery_tag, true, NULL);
        sk_log_warn("queue %s: could not forward to %s, handed back: %s", q->name, name,
                    err.msg);
        sk_sleep_ms(sk_jitter(100, 1000));
    }
    sk_broker_release(consumer, env);
    return true;
}

/* lane.h's rule: the tenant header's text, or lane 0. */
static unsigned lane_of(const struct sk_queue_conf *q, const amqp_envelope_t *env)
{
    const amqp_basic_properties_t *props = &env->message.properties;
    if (!(props->_flags & AMQP_BASIC_HEADERS_FLAG))
        return 0;
    size_t want = strlen(q->tenant_header);
    for (int i = 0; i < props->headers.num_entries; i++) {
        const amqp_table_entry_t *e = &props->headers.entries[i];
        if (e->key.len != want || memcmp(e->key.bytes, q->tenant_header, want) != 0)
            continue;
        if (e->value.kind != AMQP_FIELD_KIND_UTF8 && e->value.kind != AMQP_FIELD_KIND_BYTES)
            return 0;
        return sk_lane_of(e->value.value.bytes.bytes, e->value.value.bytes.len,
                          (unsigned)q->lanes);
    }
    return 0;
}
