/* broker_consume.c - taking messages off a queue: the consumer (qos,
 * basic.consume, each delivery read frame by frame), settling deliveries
 * (acks sent lazily as one multiple-ack, rejects), and basic.get for the
 * tools that read a queue without consuming it.
 *
 * Apart from publishing because a consuming connection reads frames it did
 * not ask for: sk_broker_next() must notice a channel.close, a connection
 * close or a cancel arriving between deliveries, and it decides when the
 * pending acks go out. A publisher's connection never consumes, so its
 * wait for confirms (sk_broker_await_confirms()) never meets a delivery. */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "amqp_lib.h"

#include "broker.h"
#include "broker_conn.h"
#include "clock.h"

/* The longest a finished job's ack is held back to share a multiple-ack
 * with the next ones while deliveries keep arriving. */
#define SK_ACK_DELAY_MS 100

static int basic_get(struct sk_broker *b, const char *queue, bool no_ack, amqp_message_t *msg,
                     uint64_t *delivery_tag, struct sk_err *err);
static int flush_acks(struct sk_broker *b, struct sk_err *err);
static int broken_delivery(struct sk_broker *b, amqp_envelope_t *env, int status,
                           const char *what, struct sk_err *err);
static int subscribe(struct sk_broker *b, bool fixed_too, struct sk_err *err);
static int cancel(struct sk_broker *b, bool fixed_too, struct sk_err *err);
static int qos(struct sk_broker *b, uint16_t prefetch, struct sk_err *err);

int sk_broker_consume(struct sk_broker *b, const struct sk_broker_sub *subs, size_t n,
                      size_t max_body, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    if (n == 0 || n > SK_BROKER_SUBS_MAX)
        return sk_err_set(err, SK_ERR, "%zu queues to consume: 1 to %d", n, SK_BROKER_SUBS_MAX);
    b->max_body = max_body;
    for (size_t i = 0; i < n; i++) {
        int len = snprintf(b->subs[i].queue, sizeof(b->subs[i].queue), "%s", subs[i].queue);
        if (len < 0 || (size_t)len >= sizeof(b->subs[i].queue))
            return sk_err_set(err, SK_ERR, "queue name too long: %.64s...", subs[i].queue);
        b->subs[i].prefetch = subs[i].prefetch;
        b->subs[i].fixed = subs[i].fixed;
    }
    b->n_subs = n;
    /* Before the first delivery can arrive: a message grown past
     * frame_max on its way here is read and refused like any other. */
    int large = sk_broker_read_large_frames(b, err);
    if (large != SK_OK)
        return large;
    return subscribe(b, true, err);
}

/* basic.qos with global=false sets the window of the consumers that
 * subscribe after it, each its own: so each queue's consumer follows its
 * own qos. */
static int qos(struct sk_broker *b, uint16_t prefetch, struct sk_err *err)
{
    amqp_basic_qos(b->conn, SK_BROKER_CHANNEL, 0, prefetch, 0);
    return sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), "basic.qos", err);
}

/* Our own tags, "sk.<index>": a delivery names the queue it came from by
 * its consumer's tag, also one queued for a consumer since cancelled, and
 * a tag is free again on its channel once its cancel-ok came. */
static int subscribe(struct sk_broker *b, bool fixed_too, struct sk_err *err)
{
    int sent = -1;
    for (size_t i = 0; i < b->n_subs; i++) {
        const struct sk_broker_sub_state *sub = &b->subs[i];
        if (sub->fixed && !fixed_too)
            continue;
        int rc = sub->prefetch == sent ? SK_OK : qos(b, sub->prefetch, err);
        if (rc != SK_OK)
            return rc;
        sent = sub->prefetch;
        char tag[32];
        snprintf(tag, sizeof(tag), "sk.%zu", i);
        amqp_basic_consume(b->conn, SK_BROKER_CHANNEL, amqp_cstring_bytes(sub->queue),
                           amqp_cstring_bytes(tag), 0, 0, 0, amqp_empty_table);
        rc = sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), "basic.consume", err);
        if (rc != SK_OK)
            return rc;
    }
    b->subscribed = true;
    return SK_OK;
}

static int cancel(struct sk_broker *b, bool fixed_too, struct sk_err *err)
{
    for (size_t i = 0; i < b->n_subs; i++) {
        if (b->subs[i].fixed && !fixed_too)
            continue;
        char tag[32];
        snprintf(tag, sizeof(tag), "sk.%zu", i);
        amqp_basic_cancel(b->conn, SK_BROKER_CHANNEL, amqp_cstring_bytes(tag));
        int rc = sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), "basic.cancel", err);
        if (rc != SK_OK)
            return rc;
    }
    if (fixed_too)
        b->subscribed = false;
    return SK_OK;
}

int sk_broker_delivery_sub(const struct sk_broker *b, const amqp_envelope_t *env)
{
    const char *tag = env->consumer_tag.bytes;
    size_t len = env->consumer_tag.len;
    if (tag == NULL || len < 4 || len > 5 || memcmp(tag, "sk.", 3) != 0)
        return -1;
    size_t i = 0;
    for (size_t k = 3; k < len; k++) {
        if (tag[k] < '0' || tag[k] > '9')
            return -1;
        i = i * 10 + (size_t)(tag[k] - '0');
    }
    return i < b->n_subs ? (int)i : -1;
}

/* RabbitMQ fixes a consumer's prefetch when it subscribes (basic.qos
 * applies to the consumers that start after it), so a new window is a new
 * consumer on the same channel. The deliveries sent to the old one before
 * its cancel-ok are still ours, unacked on the channel: librabbitmq queued
 * them while it waited for the answer, and sk_broker_next() returns them
 * like any others, to be acked by their tags. None goes back to the queue,
 * where a requeue would count against a quorum queue's delivery limit. */
int sk_broker_set_prefetch(struct sk_broker *b, uint16_t prefetch, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    for (size_t i = 0; i < b->n_subs; i++)
        if (!b->subs[i].fixed)
            b->subs[i].prefetch = prefetch;
    if (!b->subscribed)
        return SK_OK;
    int rc = cancel(b, false, err);
    if (rc != SK_OK)
        return rc;
    return subscribe(b, false, err);
}

bool sk_broker_subscribed(const struct sk_broker *b)
{
    return b != NULL && b->subscribed;
}

int sk_broker_unsubscribe(struct sk_broker *b, size_t *returned, struct sk_err *err)
{
    *returned = 0;
    SK_BROKER_USABLE(b, err);
    if (!b->subscribed)
        return SK_OK;
    /* The acks of finished jobs first: the multiple-nack below must settle
     * only deliveries that never started. */
    if (flush_acks(b, err) != SK_OK)
        return SK_AGAIN;
    int rc = cancel(b, true, err);
    if (rc != SK_OK)
        return rc;
    /* The broker sent every delivery of each consumer before its
     * cancel-ok, and librabbitmq queued each frame it read while waiting
     * for them: those are the prefetched messages no job has started,
     * whole. (What its buffer holds beyond is from after the last
     * cancel-ok: no delivery of ours.) One multiple-nack with requeue gives
     * them all back, at their places in their queues. */
    uint64_t last = 0;
    while (amqp_frames_enqueued(b->conn)) {
        amqp_envelope_t env;
        rc = sk_broker_next(b, &env, 0, err);
        if (rc == SK_AGAIN)
            continue;
        if (rc != SK_OK)
            return rc;
        last = env.delivery_tag;
        (*returned)++;
        amqp_destroy_envelope(&env);
    }
    if (last == 0)
        return SK_OK;
    int status = amqp_basic_nack(b->conn, SK_BROKER_CHANNEL, last, 1, 1);
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "basic.nack(requeue) failed", err);
    return SK_OK;
}

int sk_broker_resubscribe(struct sk_broker *b, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    if (b->subscribed || b->n_subs == 0)
        return SK_OK;
    return subscribe(b, true, err);
}

bool sk_broker_waiting(const struct sk_broker *b)
{
    if (b == NULL)
        return false;
    if (amqp_data_in_buffer(b->conn) || amqp_frames_enqueued(b->conn))
        return true;
    /* What the broker sent may still be in the kernel's buffer. */
    struct pollfd fd = { .fd = amqp_get_sockfd(b->conn), .events = POLLIN };
    return fd.fd >= 0 && poll(&fd, 1, 0) == 1 && (fd.revents & POLLIN);
}

int sk_broker_next(struct sk_broker *b, amqp_envelope_t *env, int timeout_ms,
                   struct sk_err *err)
{
    if (b->broken)
        return sk_err_set(err, SK_ERR, "the AMQP connection failed earlier");
    /* Acks go out when no delivery is waiting in our buffers, so that one
     * multiple-ack settles a prefetch window (half the broker's work per
     * job), and at least every SK_ACK_DELAY_MS while deliveries keep
     * coming: a finished job's ack then waits that long plus, at worst, the
     * one job taken before it goes, never the whole window. The clock is
     * read only while the buffer holds a delivery. Over TLS, "our buffers"
     * include OpenSSL's: librabbitmq's holds one record at a time, and a
     * burst of deliveries comes as several records, so without asking
     * OpenSSL every record boundary would flush an ack of its own (twice
     * the acks of clear text, each a record for the broker to decrypt). */
    if (b->ack_pending != 0 &&
        ((!amqp_data_in_buffer(b->conn) && !amqp_frames_enqueued(b->conn) &&
          !sk_tls_pending(b->tls)) ||
         sk_now_ms() - b->ack_flushed_ms >= SK_ACK_DELAY_MS) &&
        flush_acks(b, err) != SK_OK)
        return SK_ERR;
    amqp_maybe_release_buffers(b->conn);
    struct timeval timeout = sk_broker_timeval((uint32_t)timeout_ms);
    amqp_frame_t frame;
    int status = amqp_simple_wait_frame_noblock(b->conn, &frame, &timeout);
    if (status == AMQP_STATUS_TIMEOUT)
        return SK_AGAIN;
    if (status != AMQP_STATUS_OK) {
        sk_broker_lost(b, status, "amqp connection lost while waiting for a delivery", err);
        return err != NULL ? (err->code = SK_ERR) : SK_ERR;
    }
    if (frame.frame_type != AMQP_FRAME_METHOD)
        return SK_AGAIN;
    if (frame.payload.method.id == AMQP_BASIC_DELIVER_METHOD)
        return sk_broker_read_delivery(b, &frame, b->max_body, env, err);

    /* Something other than a delivery arrived: it tells whether the
     * channel or the connection is going away. */
    switch (frame.payload.method.id) {
    case AMQP_CHANNEL_CLOSE_METHOD: {
        amqp_channel_close_t *m = frame.payload.method.decoded;
        return sk_err_set(err, SK_ERR, "broker closed the channel: %.*s",
                          (int)m->reply_text.len, (const char *)m->reply_text.bytes);
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
        amqp_connection_close_t *m = frame.payload.method.decoded;
        b->broken = true;
        return sk_err_set(err, SK_ERR, "broker closed the connection: %.*s",
                          (int)m->reply_text.len, (const char *)m->reply_text.bytes);
    }
    case AMQP_BASIC_CANCEL_METHOD:
        return sk_err_set(err, SK_ERR, "broker cancelled the consumer (queue deleted?)");
    default:
        return SK_AGAIN;
    }
}

/* What amqp_consume_message() does, with one difference: the content
 * header announces the body's size, and a body over max_body is skipped
 * frame by frame instead of being gathered in memory. The frames are read
 * from the same buffer either way: no extra system call per delivery. */
int sk_broker_read_delivery(struct sk_broker *b, const amqp_frame_t *deliver, size_t max_body,
                            amqp_envelope_t *env, struct sk_err *err)
{
    const amqp_basic_deliver_t *d = deliver->payload.method.decoded;
    memset(env, 0, sizeof(*env));
    env->channel = deliver->channel;
    env->delivery_tag = d->delivery_tag;
    env->redelivered = d->redelivered;
    env->consumer_tag = amqp_bytes_malloc_dup(d->consumer_tag);
    env->exchange = amqp_bytes_malloc_dup(d->exchange);
    env->routing_key = amqp_bytes_malloc_dup(d->routing_key);
    init_amqp_pool(&env->message.pool, 4096);

    amqp_frame_t frame;
    int status = amqp_simple_wait_frame(b->conn, &frame);
    if (status != AMQP_STATUS_OK || frame.frame_type != AMQP_FRAME_HEADER ||
        frame.channel != env->channel)
        return broken_delivery(b, env, status, "header", err);
    uint64_t size = frame.payload.properties.body_size;
    bool keep = max_body == 0 || size <= max_body;
    if (keep) {
        if (sk_broker_clone_properties(frame.payload.properties.decoded, &env->message.properties,
                                       &env->message.pool) != SK_OK ||
            (size > 0 && (env->message.body = amqp_bytes_malloc(size)).bytes == NULL)) {
            amqp_destroy_envelope(env);
            return sk_err_set(err, SK_ERR, "out of memory reading a delivery");
        }
    }
    /* A body not kept is announced by its length with no bytes; the
     * properties are left out too (the delivery is refused unread). */
    env->message.body.len = size;

    for (uint64_t got = 0; got < size;) {
        status = amqp_simple_wait_frame(b->conn, &frame);
        if (status != AMQP_STATUS_OK || frame.frame_type != AMQP_FRAME_BODY ||
            frame.channel != env->channel ||
            frame.payload.body_fragment.len > size - got)
            return broken_delivery(b, env, status, "body", err);
        if (keep)
            memcpy((char *)env->message.body.bytes + got, frame.payload.body_fragment.bytes,
                   frame.payload.body_fragment.len);
        else
            amqp_maybe_release_buffers_on_channel(b->conn, env->channel);
        got += frame.payload.body_fragment.len;
    }
    return SK_OK;
}

/* A delivery that could not be read whole leaves the connection in the
 * middle of a message, or librabbitmq in the middle of a frame it refused:
 * the connection is broken (see broker_conn.h). Its tag is logged, so
 * that a delivery that keeps failing this way can be told from an outage. */
static int broken_delivery(struct sk_broker *b, amqp_envelope_t *env, int status,
                           const char *what, struct sk_err *err)
{
    uint64_t tag = env->delivery_tag;
    amqp_destroy_envelope(env);
    b->broken = true;
    return sk_err_set(err, SK_ERR, "reading the %s of delivery %llu: %s", what,
                      (unsigned long long)tag,
                      status == AMQP_STATUS_BAD_AMQP_DATA
                          ? "invalid AMQP data (a frame over 1 MiB?)"
                          : status != AMQP_STATUS_OK ? amqp_error_string2(status)
                                                     : "unexpected frame");
}

void sk_broker_release(struct sk_broker *b, amqp_envelope_t *env)
{
    (void)b;
    amqp_destroy_envelope(env);
}

int sk_broker_ack(struct sk_broker *b, uint64_t delivery_tag, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    sk_assert(delivery_tag > b->ack_pending);
    b->ack_pending = delivery_tag;
    return SK_OK;
}

/* Deliveries are settled strictly in order, so acking up to the highest
 * pending tag with `multiple` settles exactly the ones acked since the last
 * flush: every lower tag was already acked, rejected or flushed. */
static int flush_acks(struct sk_broker *b, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    if (b->ack_pending == 0)
        return SK_OK;
    int status = amqp_basic_ack(b->conn, SK_BROKER_CHANNEL, b->ack_pending, 1);
    b->ack_pending = 0;
    b->ack_flushed_ms = sk_now_ms();
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "basic.ack failed", err);
    return SK_OK;
}

int sk_broker_flush_acks(struct sk_broker *b, struct sk_err *err)
{
    return flush_acks(b, err);
}

void sk_broker_close_consumer(struct sk_broker *b)
{
    if (b == NULL)
        return;
    /* On a broken connection the acks are lost with it: the broker
     * redelivers those jobs, and their completed keys make them
     * duplicates. */
    if (!b->broken)
        flush_acks(b, NULL);
    sk_broker_close(b);
}

int sk_broker_reject(struct sk_broker *b, uint64_t delivery_tag, bool requeue,
                     struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    int status = amqp_basic_reject(b->conn, SK_BROKER_CHANNEL, delivery_tag, requeue);
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "basic.reject failed", err);
    return SK_OK;
}

int sk_broker_get(struct sk_broker *b, const char *queue, amqp_message_t *msg,
                  struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    return basic_get(b, queue, true, msg, NULL, err);
}

int sk_broker_peek(struct sk_broker *b, const char *queue, amqp_message_t *msg,
                   uint64_t *delivery_tag, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    /* A reader of dead letters, of all queues, must read a letter that the
     * broker grew past frame_max, or it could list nothing behind it. A
     * publisher peeks too (the tests do); its frames stay as agreed. */
    if (!b->confirming) {
        int large = sk_broker_read_large_frames(b, err);
        if (large != SK_OK)
            return large;
    }
    /* The previous message was copied into its own pool: the channel's
     * frames can go, or a long scan would keep every basic.get-ok. */
    amqp_maybe_release_buffers_on_channel(b->conn, SK_BROKER_CHANNEL);
    return basic_get(b, queue, false, msg, delivery_tag, err);
}

/* One basic.get and the message it brings; SK_BUSY when queue is empty.
 * With no_ack the broker forgets the message as it sends it; without, the
 * message stays the broker's until acked by its tag (*delivery_tag, unless
 * NULL), so the tools that peek leave a queue as it was if they stop. */
static int basic_get(struct sk_broker *b, const char *queue, bool no_ack, amqp_message_t *msg,
                     uint64_t *delivery_tag, struct sk_err *err)
{
    amqp_rpc_reply_t reply =
        amqp_basic_get(b->conn, SK_BROKER_CHANNEL, amqp_cstring_bytes(queue), no_ack);
    int rc = sk_broker_rpc_check(b, reply, "basic.get", err);
    if (rc != SK_OK)
        return rc;
    if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD)
        return SK_BUSY;
    if (delivery_tag != NULL)
        *delivery_tag = ((amqp_basic_get_ok_t *)reply.reply.decoded)->delivery_tag;
    reply = amqp_read_message(b->conn, SK_BROKER_CHANNEL, msg, 0);
    return sk_broker_rpc_check(b, reply, "basic.get(read)", err);
}

int sk_broker_ack_one(struct sk_broker *b, uint64_t delivery_tag, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    int status = amqp_basic_ack(b->conn, SK_BROKER_CHANNEL, delivery_tag, 0);
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "basic.ack failed", err);
    return SK_OK;
}
