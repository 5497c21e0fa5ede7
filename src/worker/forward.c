/* forward.c - deliveries of a queue's intake moved to their tenants' lanes
 * (see forward.h).
 *
 * A forward is a re-schedule with no delay: the worker's publisher sends a
 * copy to the lane with the message's properties and headers unchanged,
 * the broker confirms it, and only then is the original acked. A worker
 * that dies between the confirm and the ack leaves both: the original is
 * redelivered and forwarded again, and the two copies are one job to
 * PostgreSQL, whose idempotency key makes the second a duplicate. No claim
 * is made and no attempt counted: a forward is not a run.
 *
 * The intake's deliveries already in the worker's buffers go together, up
 * to FORWARD_BATCH: each copy is published without waiting, then one wait
 * takes all their confirms (which the broker writes to disk together), and
 * the originals are acked one by one (a multiple-ack could settle a lane's
 * delivery taken before them and not yet run). One confirm wait per
 * delivery would hold the forward rate to one disk write each, below the
 * rate of jobs, and the intake would be the slowest queue.
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

#define FORWARD_BATCH 64

/* The copies sent and not yet confirmed, and the originals to settle. */
struct pending {
    struct sk_publish pub[FORWARD_BATCH];
    uint64_t          tag[FORWARD_BATCH];   /* the original's delivery tag */
    char              id[FORWARD_BATCH][256];  /* message_id, for a return */
    size_t            n;
};

static int  send_copy(struct sk_pipeline *p, struct pending *f, amqp_envelope_t *env);
static void settle(struct sk_pipeline *p, struct pending *f);
static bool is_intake(struct sk_pipeline *p, const amqp_envelope_t *env);
static unsigned lane_of(const struct sk_queue_conf *q, const amqp_envelope_t *env);

bool sk_forward_intake(struct sk_pipeline *p, amqp_envelope_t *env)
{
    if (!is_intake(p, env))
        return false;
    struct sk_broker *consumer = sk_links_consumer(p->links);
    static struct pending f;
    f.n = 0;
    for (;;) {
        int rc = send_copy(p, &f, env);
        if (rc == SK_ERR) {
            /* No copy can be made of this one (a body not read, over
             * max_body; properties over a frame): the job's own way deals
             * with it, as it would from a lane. */
            settle(p, &f);
            return false;
        }
        sk_broker_release(consumer, env);
        if (rc == SK_AGAIN || f.n == FORWARD_BATCH || !sk_broker_waiting(consumer))
            break;
        struct sk_err err = { 0 };
        amqp_envelope_t next;
        if (sk_broker_next(consumer, &next, 0, &err) != SK_OK)
            break;
        if (!is_intake(p, &next)) {
            /* A lane's delivery: the caller's to run, once these are
             * settled (its tag comes after theirs). */
            settle(p, &f);
            *env = next;
            return false;
        }
        *env = next;
    }
    settle(p, &f);
    return true;
}

static bool is_intake(struct sk_pipeline *p, const amqp_envelope_t *env)
{
    return p->queue->lanes > 0 && sk_broker_delivery_sub(sk_links_consumer(p->links), env) == 0;
}

/* Publishes env's copy to its lane without waiting, and records it in f.
 * SK_ERR: no copy of it can be made (nothing sent, env untouched). SK_AGAIN:
 * the publisher failed; env is handed back to the intake. */
static int send_copy(struct sk_pipeline *p, struct pending *f, amqp_envelope_t *env)
{
    const struct sk_queue_conf *q = p->queue;
    struct sk_broker *consumer = sk_links_consumer(p->links);
    if (env->message.body.len > 0 && env->message.body.bytes == NULL)
        return SK_ERR;
    char name[512];
    if (sk_lane_name(q->name, lane_of(q, env), name, sizeof(name)) != 0)
        return SK_ERR;
    /* A return is matched to its publish by message id: one without an id
     * (or whose id AMQP cannot carry whole here) goes alone. */
    const amqp_basic_properties_t *props = &env->message.properties;
    bool has_id = (props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) &&
                  props->message_id.len < sizeof(f->id[0]) &&
                  memchr(props->message_id.bytes, '\0', props->message_id.len) == NULL;
    if (f->n == FORWARD_BATCH)
        settle(p, f);
    struct sk_err err = { 0 };
    struct sk_broker *pub = sk_links_publisher(p->links, &err);
    size_t i = f->n;
    if (has_id) {
        memcpy(f->id[i], props->message_id.bytes, props->message_id.len);
        f->id[i][props->message_id.len] = '\0';
    }
    f->pub[i] = (struct sk_publish){ .message_id = has_id ? f->id[i] : NULL };
    int rc = pub != NULL ? sk_broker_republish_async(pub, name, env, &f->pub[i], &err) : SK_AGAIN;
    if (rc == SK_ERR && pub != NULL)
        return SK_ERR;
    if (rc != SK_OK) {
        sk_log_warn("queue %s: could not forward to %s, handed back: %s", q->name, name,
                    err.msg);
        sk_links_drop(p->links, SK_LINK_PUBLISHER, NULL, &err);
        sk_broker_reject(consumer, env->delivery_tag, true, NULL);
        settle(p, f);
        sk_sleep_ms(sk_jitter(100, 1000));
        return SK_AGAIN;
    }
    f->tag[i] = env->delivery_tag;
    f->n++;
    if (!has_id)
        settle(p, f);
    return SK_OK;
}

/* Waits for the copies' confirms and settles each original: acked once its
 * copy is the broker's, handed back to the intake otherwise (as a failed
 * re-schedule is: nothing acked before its copy is confirmed). */
static void settle(struct sk_pipeline *p, struct pending *f)
{
    if (f->n == 0)
        return;
    struct sk_broker *consumer = sk_links_consumer(p->links);
    struct sk_err err = { 0 };
    struct sk_broker *pub = sk_links_publisher(p->links, &err);
    bool waited = pub != NULL && sk_broker_await_confirms(pub, f->pub, f->n, &err) == SK_OK;
    /* Dying here leaves the copies and the originals: check_fairness. */
    sk_failpoint("forward_confirmed", NULL);
    size_t forwarded = 0, back = 0;
    for (size_t i = 0; i < f->n; i++) {
        bool ok = waited && f->pub[i].rc == SK_OK;
        struct sk_err e = { 0 };
        int rc = ok ? sk_broker_ack_one(consumer, f->tag[i], &e)
                    : sk_broker_reject(consumer, f->tag[i], true, &e);
        if (rc != SK_OK)
            sk_log_warn("queue %s: a forwarded delivery not settled (it comes back and is "
                        "forwarded again): %s", p->queue->name, e.msg);
        if (ok) {
            forwarded++;
            sk_metrics_inc(sk_metrics_lookup(p->metrics, ""), SK_METRIC_LANE_FORWARDS);
        } else {
            back++;
        }
    }
    sk_log_debug("queue %s: forwarded %zu deliveries to lanes, %zu handed back",
                 p->queue->name, forwarded, back);
    f->n = 0;
    if (back > 0) {
        sk_log_warn("queue %s: %zu forwards not confirmed, handed back: %s", p->queue->name,
                    back, waited ? "the broker refused them" : err.msg);
        if (!waited)
            sk_links_drop(p->links, SK_LINK_PUBLISHER, NULL, &err);
        sk_sleep_ms(sk_jitter(100, 1000));
    }
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
