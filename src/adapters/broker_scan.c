/* broker_scan.c - reading a queue without consuming it: the letters come
 * by basic.consume within a prefetch window, stay the broker's until the
 * reader takes one (an ack, exactly that letter), and every letter not
 * taken goes back to its place when the scan ends. sekalictl dlq and the
 * console read dead-letter queues this way.
 *
 * Apart from broker_consume.c because a scan is not a worker's consumer:
 * it keeps most of what it reads unacked to the end, so a window of unacked
 * deliveries (basic.qos) would fill and stop after `window` letters. It
 * therefore reads through a series of consumers on one channel of its own,
 * each with a window of its own: once a consumer was sent `window` letters,
 * it is cancelled (its letters stay unacked on the channel, which is all
 * AMQP asks of a cancel) and the next one starts where it stopped, in
 * the queue's order. Both go out in one write without waiting for an
 * answer (our own consumer tags, no-wait), so the letters stream with one
 * pause of a round trip every `window` letters instead of a basic.get round
 * trip each.
 *
 * The scan ends by closing its channel, not by nacking what it did not
 * take: closing hands back every unacked delivery in one step, including
 * those the broker sent after the last one we read (whose tags we never
 * saw), needs no cancel first (a nack with requeue while a consumer is
 * active would have the broker deliver the letter to us again), and is
 * exactly what the broker does when sekalictl dies or its connection
 * drops, so the ordinary end and every failure return letters the same
 * way: RabbitMQ puts them back at their places in the queue. The channel
 * is ours alone, so closing it leaves the connection's own channel
 * (declarations, publishes of a replay) as it was.
 *
 * Memory: one letter at a time. The window's letters wait in the socket
 * and the broker, not here: the one place librabbitmq would gather
 * deliveries (frames it reads while waiting for an RPC's answer) is kept
 * off the scan's path: the rotation does not wait for answers, and the
 * close reads and drops what is still in flight itself, one frame at a
 * time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#include "broker.h"
#include "broker_conn.h"
#include "clock.h"

/* Deliveries one consumer of a scan may be sent before it is replaced:
 * enough that the pause between consumers (one round trip) is lost in the
 * stream, few enough that a scan stopping early has not had many more
 * letters sent to it than it read (the broker marks them redelivered when
 * they come back). */
#define SCAN_WINDOW 1000
/* Nothing arrived this long: ask the broker whether anything is left. */
#define SCAN_IDLE_MS 500
/* The broker says letters are ready but sends none: a fault, not an end. */
#define SCAN_STALL_MS 15000
/* The longest the close waits for the broker to take the letters back. */
#define SCAN_CLOSE_MS 60000

struct sk_broker_scan {
    struct sk_broker *b;
    char              queue[256];
    uint32_t          want;          /* letters to hand out at most */
    uint32_t          given;
    uint16_t          window;
    unsigned          consumer;      /* number of the current consumer, from 1 */
    char              tag[64];       /* its consumer tag */
    uint32_t          sent;          /* deliveries the current consumer had */
    bool              closed;        /* the broker closed the channel */
};

static int open_channel(struct sk_broker_scan *s, uint32_t max, uint32_t *depth,
                        struct sk_err *err);
static int consume(struct sk_broker_scan *s, bool replace, struct sk_err *err);
static int idle(struct sk_broker_scan *s, int64_t *stalled_since, struct sk_err *err);
static int other_frame(struct sk_broker_scan *s, const amqp_frame_t *frame, struct sk_err *err);
static int close_channel(struct sk_broker_scan *s, struct sk_err *err);
static void refused(struct sk_broker_scan *s, amqp_rpc_reply_t reply);
static void close_ok(struct sk_broker_scan *s);

int sk_broker_scan_open(struct sk_broker *b, const char *queue, uint32_t max,
                        struct sk_broker_scan **out, uint32_t *depth, struct sk_err *err)
{
    *out = NULL;
    *depth = 0;
    SK_BROKER_USABLE(b, err);
    sk_assert(!b->scanning);
    struct sk_broker_scan *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(scan)");
    s->b = b;
    s->closed = true;  /* until the channel is open */
    int n = snprintf(s->queue, sizeof(s->queue), "%s", queue);
    if (n < 0 || (size_t)n >= sizeof(s->queue)) {
        free(s);
        return sk_err_set(err, SK_ERR, "queue name too long: %.64s...", queue);
    }
    /* A reader of dead letters must read a letter the broker grew past
     * frame_max, or it could list nothing behind it (broker_conn.h). A
     * publisher's frames stay as agreed. */
    int rc = b->confirming ? SK_OK : sk_broker_read_large_frames(b, err);
    if (rc != SK_OK) {
        free(s);
        return rc;
    }
    b->scanning = true;
    rc = open_channel(s, max, depth, err);
    if (rc != SK_OK) {
        sk_broker_scan_close(s, NULL);
        return rc;
    }
    *out = s;
    return SK_OK;
}

/* The channel, the depth (a passive declare: the letters there now are the
 * scan's, any that arrive later are not), the window and the first
 * consumer. A queue that does not exist closes only this channel. */
static int open_channel(struct sk_broker_scan *s, uint32_t max, uint32_t *depth,
                        struct sk_err *err)
{
    struct sk_broker *b = s->b;
    amqp_channel_open(b->conn, SK_BROKER_SCAN_CHANNEL);
    int rc = sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), "channel.open(scan)", err);
    if (rc != SK_OK)
        return rc;
    s->closed = false;
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(b->conn, SK_BROKER_SCAN_CHANNEL,
                                                     amqp_cstring_bytes(s->queue), 1, 0, 0, 0,
                                                     amqp_empty_table);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(b->conn);
    refused(s, reply);
    rc = sk_broker_rpc_check(b, reply, "queue.declare(passive)", err);
    if (rc != SK_OK)
        return rc;
    *depth = ok->message_count;
    s->want = max > 0 && max < *depth ? max : *depth;
    if (s->want == 0)
        return SK_OK;  /* nothing to read: no consumer */
    /* A scan that stops early (a page) needs no window past it. */
    s->window = s->want < SCAN_WINDOW ? (uint16_t)s->want : SCAN_WINDOW;
    amqp_basic_qos(b->conn, SK_BROKER_SCAN_CHANNEL, 0, s->window, 0);
    reply = amqp_get_rpc_reply(b->conn);
    refused(s, reply);
    rc = sk_broker_rpc_check(b, reply, "basic.qos(scan)", err);
    if (rc != SK_OK)
        return rc;
    return consume(s, false, err);
}

/* Starts the next consumer; with replace, cancels the current one in the
 * same write. Neither waits for the broker's answer (no-wait): its refusal
 * would close the channel, which sk_broker_scan_next() reads as such. The
 * broker acts on them in order, so the cancelled consumer's last
 * deliveries come before the first of the next: the queue's order holds. */
static int consume(struct sk_broker_scan *s, bool replace, struct sk_err *err)
{
    struct sk_broker *b = s->b;
    if (replace) {
        amqp_basic_cancel_t cancel = { .consumer_tag = amqp_cstring_bytes(s->tag), .nowait = 1 };
        int status = amqp_send_method(b->conn, SK_BROKER_SCAN_CHANNEL, AMQP_BASIC_CANCEL_METHOD,
                                      &cancel);
        if (status != AMQP_STATUS_OK)
            return sk_broker_lost(b, status, "basic.cancel(scan)", err);
    }
    s->consumer++;
    s->sent = 0;
    snprintf(s->tag, sizeof(s->tag), "sekali-scan-%u", s->consumer);
    amqp_basic_consume_t consume = {
        .queue = amqp_cstring_bytes(s->queue), .consumer_tag = amqp_cstring_bytes(s->tag),
        .no_local = 0, .no_ack = 0, .exclusive = 0, .nowait = 1, .arguments = amqp_empty_table,
    };
    int status = amqp_send_method(b->conn, SK_BROKER_SCAN_CHANNEL, AMQP_BASIC_CONSUME_METHOD,
                                  &consume);
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "basic.consume(scan)", err);
    return SK_OK;
}

int sk_broker_scan_next(struct sk_broker_scan *s, amqp_message_t *msg, uint64_t *tag,
                        struct sk_err *err)
{
    struct sk_broker *b = s->b;
    if (s->given >= s->want)
        return SK_BUSY;
    if (s->closed)
        return sk_err_set(err, SK_ERR, "the broker closed the scan's channel");
    SK_BROKER_USABLE(b, err);
    int64_t stalled_since = 0;
    for (;;) {
        /* The previous letter was copied into its own pool: the frames it
         * came in can go, or a long scan would keep them all. */
        amqp_maybe_release_buffers_on_channel(b->conn, SK_BROKER_SCAN_CHANNEL);
        struct timeval timeout = sk_broker_timeval(SCAN_IDLE_MS);
        amqp_frame_t frame;
        int status = amqp_simple_wait_frame_noblock(b->conn, &frame, &timeout);
        if (status == AMQP_STATUS_TIMEOUT) {
            int rc = idle(s, &stalled_since, err);
            if (rc != SK_OK)
                return rc;
            continue;
        }
        if (status != AMQP_STATUS_OK)
            return sk_broker_lost(b, status, "reading a scan's delivery", err);
        if (frame.frame_type != AMQP_FRAME_METHOD || frame.channel != SK_BROKER_SCAN_CHANNEL ||
            frame.payload.method.id != AMQP_BASIC_DELIVER_METHOD) {
            int rc = other_frame(s, &frame, err);
            if (rc != SK_OK)
                return rc;
            continue;
        }
        const amqp_basic_deliver_t *d = frame.payload.method.decoded;
        bool current = d->consumer_tag.len == strlen(s->tag) &&
                       memcmp(d->consumer_tag.bytes, s->tag, d->consumer_tag.len) == 0;
        amqp_envelope_t env;
        int rc = sk_broker_read_delivery(b, &frame, 0, &env, err);
        if (rc != SK_OK)
            return rc;
        *msg = env.message;
        *tag = env.delivery_tag;
        amqp_bytes_free(env.consumer_tag);
        amqp_bytes_free(env.exchange);
        amqp_bytes_free(env.routing_key);
        s->given++;
        /* A consumer that was sent its window gets no more, whatever we
         * took (acks give its window back, so it may be sent a few more
         * before the cancel: those come first, and count as letters). */
        if (current && ++s->sent >= s->window && s->given < s->want &&
            (rc = consume(s, true, err)) != SK_OK) {
            amqp_destroy_message(msg);
            return rc;
        }
        return SK_OK;
    }
}

/* Nothing arrived for SCAN_IDLE_MS while the scan still has room in its
 * window: the letters counted at the start may be gone (another reader
 * holds them, they expired, someone purged the queue). The broker's count
 * of ready letters tells: none, and the scan is over (SK_BUSY); some, and
 * the broker is only slow, up to SCAN_STALL_MS. Asked on the scan's
 * channel, so that its answer comes after every delivery already sent. */
static int idle(struct sk_broker_scan *s, int64_t *stalled_since, struct sk_err *err)
{
    struct sk_broker *b = s->b;
    int64_t now = sk_now_ms();
    if (*stalled_since == 0)
        *stalled_since = now - SCAN_IDLE_MS;
    /* librabbitmq queues the deliveries that arrive before declare-ok: a
     * few at most, since none came for SCAN_IDLE_MS; the next call reads
     * them first. */
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(b->conn, SK_BROKER_SCAN_CHANNEL,
                                                     amqp_cstring_bytes(s->queue), 1, 0, 0, 0,
                                                     amqp_empty_table);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(b->conn);
    refused(s, reply);
    int rc = sk_broker_rpc_check(b, reply, "queue.declare(passive, scan)", err);
    if (rc != SK_OK)
        return rc;
    if (amqp_frames_enqueued(b->conn))
        return SK_OK;
    if (ok->message_count == 0)
        return SK_BUSY;
    if (now - *stalled_since >= SCAN_STALL_MS)
        return sk_err_set(err, SK_AGAIN, "the broker sent no letter of %s for %d s though it "
                          "holds %u ready", s->queue, SCAN_STALL_MS / 1000, ok->message_count);
    return SK_OK;
}

/* A frame that is not a delivery of the scan: the channel or the
 * connection closing is an error, the rest (a heartbeat, a frame of the
 * connection's own channel) is nothing to the scan. */
static int other_frame(struct sk_broker_scan *s, const amqp_frame_t *frame, struct sk_err *err)
{
    struct sk_broker *b = s->b;
    if (frame->frame_type != AMQP_FRAME_METHOD)
        return SK_OK;
    switch (frame->payload.method.id) {
    case AMQP_CHANNEL_CLOSE_METHOD: {
        if (frame->channel != SK_BROKER_SCAN_CHANNEL)
            return SK_OK;
        amqp_channel_close_t *m = frame->payload.method.decoded;
        close_ok(s);
        return sk_err_set(err, SK_ERR, "the broker closed the scan of %s: %u %.*s", s->queue,
                          m->reply_code, (int)m->reply_text.len,
                          (const char *)m->reply_text.bytes);
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
        amqp_connection_close_t *m = frame->payload.method.decoded;
        b->broken = true;
        return sk_err_set(err, SK_ERR, "the broker closed the connection: %u %.*s",
                          m->reply_code, (int)m->reply_text.len,
                          (const char *)m->reply_text.bytes);
    }
    case AMQP_BASIC_CANCEL_METHOD:
        if (frame->channel != SK_BROKER_SCAN_CHANNEL)
            return SK_OK;
        return sk_err_set(err, SK_ERR, "the broker cancelled the scan of %s (queue deleted?)",
                          s->queue);
    default:
        return SK_OK;
    }
}

int sk_broker_scan_take(struct sk_broker_scan *s, uint64_t tag, struct sk_err *err)
{
    struct sk_broker *b = s->b;
    SK_BROKER_USABLE(b, err);
    if (s->closed)
        return sk_err_set(err, SK_ERR, "the broker closed the scan's channel: the letter is "
                          "back in %s", s->queue);
    /* Exactly this one: the letters before it that were not taken stay
     * unacked, to be handed back. */
    int status = amqp_basic_ack(b->conn, SK_BROKER_SCAN_CHANNEL, tag, 0);
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "basic.ack(scan)", err);
    return SK_OK;
}

int sk_broker_scan_close(struct sk_broker_scan *s, struct sk_err *err)
{
    if (s == NULL)
        return SK_OK;
    int rc = SK_OK;
    if (!s->closed)
        rc = close_channel(s, err);
    s->b->scanning = false;
    free(s);
    return rc;
}

/* channel.close, then every frame up to close-ok read and dropped: the
 * deliveries the broker sent before it saw the close are handed back with
 * the rest, and reading them one frame at a time keeps them out of memory
 * (librabbitmq's own wait for close-ok would keep each one). Once close-ok
 * arrives the broker has acted on every ack of the channel and put every
 * other letter back. Past SCAN_CLOSE_MS the connection is given up as
 * broken; closing it hands the letters back all the same. */
static int close_channel(struct sk_broker_scan *s, struct sk_err *err)
{
    struct sk_broker *b = s->b;
    SK_BROKER_USABLE(b, err);
    amqp_channel_close_t close = { .reply_code = AMQP_REPLY_SUCCESS,
                                   .reply_text = amqp_cstring_bytes("scan done") };
    int status = amqp_send_method(b->conn, SK_BROKER_SCAN_CHANNEL, AMQP_CHANNEL_CLOSE_METHOD,
                                  &close);
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "channel.close(scan)", err);
    s->closed = true;
    int64_t deadline = sk_now_ms() + SCAN_CLOSE_MS;
    for (;;) {
        amqp_maybe_release_buffers_on_channel(b->conn, SK_BROKER_SCAN_CHANNEL);
        int64_t left = deadline - sk_now_ms();
        if (left <= 0) {
            b->broken = true;
            return sk_err_set(err, SK_AGAIN, "the broker did not confirm the end of the scan "
                              "of %s within %d s", s->queue, SCAN_CLOSE_MS / 1000);
        }
        struct timeval timeout = sk_broker_timeval((uint32_t)left);
        amqp_frame_t frame;
        status = amqp_simple_wait_frame_noblock(b->conn, &frame, &timeout);
        if (status == AMQP_STATUS_TIMEOUT)
            continue;
        if (status != AMQP_STATUS_OK)
            return sk_broker_lost(b, status, "waiting for the end of a scan", err);
        if (frame.frame_type != AMQP_FRAME_METHOD)
            continue;
        amqp_method_number_t id = frame.payload.method.id;
        if (frame.channel == SK_BROKER_SCAN_CHANNEL && id == AMQP_CHANNEL_CLOSE_OK_METHOD)
            return SK_OK;
        if (frame.channel == SK_BROKER_SCAN_CHANNEL && id == AMQP_CHANNEL_CLOSE_METHOD) {
            /* Both sides closed at once: the broker's close settles it too. */
            close_ok(s);
            return SK_OK;
        }
        if (id == AMQP_CONNECTION_CLOSE_METHOD) {
            b->broken = true;
            return sk_err_set(err, SK_AGAIN, "the broker closed the connection while the scan "
                              "of %s ended", s->queue);
        }
    }
}

/* After an RPC of the scan: a refusal (a queue that does not exist) closed
 * the scan's channel only; answer it, so the connection goes on. */
static void refused(struct sk_broker_scan *s, amqp_rpc_reply_t reply)
{
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
        close_ok(s);
}

/* The broker closed the scan's channel, handing its letters back:
 * librabbitmq does not answer for us, and the connection is of no use
 * until we do. */
static void close_ok(struct sk_broker_scan *s)
{
    amqp_channel_close_ok_t ok = { 0 };
    if (amqp_send_method(s->b->conn, SK_BROKER_SCAN_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD,
                         &ok) != AMQP_STATUS_OK)
        s->b->broken = true;
    s->closed = true;
}
