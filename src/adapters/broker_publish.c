/* broker_publish.c - publishing with publisher confirms: one message and
 * its wait, many messages and one wait for them all (the relay), and the
 * republish of a delivery with headers added (retries and dead letters).
 *
 * Apart from consuming because a publish is done only once the broker
 * confirms it, and that answer is read here frame by frame: an ack or a
 * nack may cover many publishes (`multiple`), a basic.return comes before
 * the ack of the publish it refuses, and a channel.close means the broker
 * refused what was sent. A message librabbitmq could not encode is refused
 * before a byte of it is sent, so the connection stays usable. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "amqp_lib.h"

#include "broker.h"
#include "broker_conn.h"

static amqp_basic_properties_t message_properties(const struct sk_message *msg,
                                                  amqp_table_entry_t *headers, int n_headers);
static void set_text(amqp_basic_properties_t *props, amqp_flags_t flag, amqp_bytes_t *field,
                     const char *value);
static int send_publish(struct sk_broker *b, const char *routing_key,
                        const amqp_basic_properties_t *props, amqp_bytes_t body,
                        struct sk_err *err);
static int await_one(struct sk_broker *b, struct sk_publish *p, const char *routing_key,
                     struct sk_err *err);
static size_t settle(struct sk_publish *p, size_t n, uint64_t tag, bool multiple,
                     const char *nacked);
static struct sk_publish *find_returned(struct sk_publish *p, size_t n,
                                        const amqp_basic_properties_t *props);
static const char *unsendable(struct sk_broker *b, const char *routing_key,
                              const amqp_basic_properties_t *props);
static int republish(struct sk_broker *b, const char *routing_key,
                     const amqp_envelope_t *original, const struct sk_header *extra,
                     size_t n_extra, bool fit, struct sk_publish *async, struct sk_err *err);
static bool leave_out(struct sk_broker *b, amqp_basic_properties_t *props, size_t n_original,
                      char *note, size_t size);
static void append_name(char *list, size_t size, amqp_bytes_t name);
static size_t merge_headers(const amqp_table_t *old, size_t n_old, const struct sk_header *extra,
                            size_t n_extra, amqp_table_entry_t *entries, size_t *n_kept);
static int read_return(struct sk_broker *b, amqp_channel_t channel, struct sk_publish *p,
                       size_t n, struct sk_err *err);
static int channel_closed(struct sk_broker *b, const amqp_channel_close_t *m,
                          struct sk_err *err);
static bool bytes_is(amqp_bytes_t b, const char *s);

/* The header a fitted copy names what it left out in, its longest value,
 * and the room a fitted copy keeps in its frame: for that header (350
 * bytes at most) and for a broker that dead-letters the copy once more. */
#define DROPPED_HEADER   "x-sekali-headers-dropped"
#define DROPPED_NOTE_MAX 320
#define COPY_MARGIN      2048

int sk_broker_confirm_select(struct sk_broker *b, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    sk_assert(!b->large_frames);  /* its bodies would go out in frames too large */
    amqp_confirm_select(b->conn, SK_BROKER_CHANNEL);
    int rc = sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), "confirm.select", err);
    if (rc != SK_OK)
        return rc;
    b->confirming = true;
    return SK_OK;
}

int sk_broker_publish(struct sk_broker *b, const char *routing_key,
                      const struct sk_message *msg, struct sk_err *err)
{
    struct sk_publish p;
    int rc = sk_broker_publish_async(b, routing_key, msg, &p, err);
    if (rc == SK_OK)
        rc = await_one(b, &p, routing_key, err);
    return rc;
}

int sk_broker_publish_async(struct sk_broker *b, const char *routing_key,
                            const struct sk_message *msg, struct sk_publish *p,
                            struct sk_err *err)
{
    sk_assert(b->confirming);
    SK_BROKER_USABLE(b, err);

    amqp_table_entry_t headers[5];
    int n_headers = 0;
    if (msg->idempotency_key != NULL)
        headers[n_headers++] = sk_broker_text_entry("x-idempotency-key", msg->idempotency_key);
    if (msg->resource_key != NULL)
        headers[n_headers++] = sk_broker_text_entry("x-resource-key", msg->resource_key);
    if (msg->traceparent != NULL)
        headers[n_headers++] = sk_broker_text_entry("traceparent", msg->traceparent);
    if (msg->tracestate != NULL)
        headers[n_headers++] = sk_broker_text_entry("tracestate", msg->tracestate);
    if (msg->tenant != NULL && msg->tenant_header != NULL)
        headers[n_headers++] = sk_broker_text_entry(msg->tenant_header, msg->tenant);

    amqp_basic_properties_t props = message_properties(msg, headers, n_headers);

    /* librabbitmq writes basic.publish before it encodes the properties: a
     * message it cannot encode would leave half a publish on the wire, and
     * the broker would close the connection for it. So a message is checked
     * whole before any of it is sent, and one that can never be sent is
     * refused here, with the connection left as it was. */
    const char *why = unsendable(b, routing_key, &props);
    if (why != NULL) {
        *p = (struct sk_publish){ .message_id = msg->message_id, .settled = true, .rc = SK_ERR,
                                  .why = why };
        return sk_err_set(err, SK_ERR, "publish to %.64s%s refused before sending: %s",
                          routing_key, strlen(routing_key) > 64 ? "..." : "", why);
    }
    amqp_bytes_t body = { .len = msg->body_len, .bytes = (void *)msg->body };
    int rc = send_publish(b, routing_key, &props, body, err);
    if (rc != SK_OK)
        return rc;
    *p = (struct sk_publish){ .message_id = msg->message_id, .tag = b->next_publish_tag++ };
    return SK_OK;
}

/* A job's message is persistent and stamped with when it was published
 * (AMQP's timestamp, Unix seconds), which a worker holds against the
 * queue's key retention; copies (sk_broker_republish()) keep the stamp.
 * Each optional field is sent only when set. */
static amqp_basic_properties_t message_properties(const struct sk_message *msg,
                                                  amqp_table_entry_t *headers, int n_headers)
{
    amqp_basic_properties_t props = { 0 };
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    props.timestamp = (uint64_t)time(NULL);
    if (msg->priority > 0) {
        props._flags |= AMQP_BASIC_PRIORITY_FLAG;
        props.priority = msg->priority;
    }
    set_text(&props, AMQP_BASIC_MESSAGE_ID_FLAG, &props.message_id, msg->message_id);
    set_text(&props, AMQP_BASIC_TYPE_FLAG, &props.type, msg->type);
    set_text(&props, AMQP_BASIC_CONTENT_TYPE_FLAG, &props.content_type, msg->content_type);
    set_text(&props, AMQP_BASIC_REPLY_TO_FLAG, &props.reply_to, msg->reply_to);
    set_text(&props, AMQP_BASIC_CORRELATION_ID_FLAG, &props.correlation_id,
             msg->correlation_id);
    if (n_headers > 0) {
        props._flags |= AMQP_BASIC_HEADERS_FLAG;
        props.headers.num_entries = n_headers;
        props.headers.entries = headers;
    }
    return props;
}

static void set_text(amqp_basic_properties_t *props, amqp_flags_t flag, amqp_bytes_t *field,
                     const char *value)
{
    if (value == NULL)
        return;
    props->_flags |= flag;
    *field = amqp_cstring_bytes(value);
}

/* basic.publish to the default exchange, mandatory, so an unroutable
 * message comes back as a return instead of vanishing. */
static int send_publish(struct sk_broker *b, const char *routing_key,
                        const amqp_basic_properties_t *props, amqp_bytes_t body,
                        struct sk_err *err)
{
    int status = amqp_basic_publish(b->conn, SK_BROKER_CHANNEL, amqp_empty_bytes,
                                    amqp_cstring_bytes(routing_key), 1, 0, props, body);
    if (status != AMQP_STATUS_OK) {
        b->broken = true;
        return sk_err_set(err, SK_AGAIN, "basic.publish to %s failed: %s", routing_key,
                          amqp_error_string2(status));
    }
    return SK_OK;
}

/* Why librabbitmq could not send this publish, or NULL if it can: a short
 * string over AMQP's 255 bytes (each is named), or properties and headers
 * that do not fit in one frame of the negotiated size (a body is split over
 * as many frames as it needs, a header frame is not). Computed, not trial
 * encoded, so a publish costs no second encoding. */
static const char *unsendable(struct sk_broker *b, const char *routing_key,
                              const amqp_basic_properties_t *props)
{
    static const struct { amqp_flags_t flag; size_t offset; const char *why; } strings[] = {
        { AMQP_BASIC_MESSAGE_ID_FLAG, offsetof(amqp_basic_properties_t, message_id),
          "the message id (job id) is longer than 255 bytes, the AMQP limit" },
        { AMQP_BASIC_TYPE_FLAG, offsetof(amqp_basic_properties_t, type),
          "the type (job type) is longer than 255 bytes, the AMQP limit" },
        { AMQP_BASIC_CONTENT_TYPE_FLAG, offsetof(amqp_basic_properties_t, content_type),
          "the content type is longer than 255 bytes, the AMQP limit" },
        { AMQP_BASIC_REPLY_TO_FLAG, offsetof(amqp_basic_properties_t, reply_to),
          "reply_to is longer than 255 bytes, the AMQP limit" },
        { AMQP_BASIC_CORRELATION_ID_FLAG, offsetof(amqp_basic_properties_t, correlation_id),
          "the correlation id is longer than 255 bytes, the AMQP limit" },
    };
    if (strlen(routing_key) > UINT8_MAX)
        return "the queue name is longer than 255 bytes, the AMQP limit";
    for (size_t i = 0; i < SK_ARRAY_LEN(strings); i++) {
        const amqp_bytes_t *text =
            (const amqp_bytes_t *)((const char *)props + strings[i].offset);
        if ((props->_flags & strings[i].flag) && text->len > UINT8_MAX)
            return strings[i].why;
    }
    int frame_max = b->frame_max;
    if (frame_max > 0 &&
        SK_BROKER_HEADER_FRAME_OVERHEAD + sk_broker_properties_size(props) > (size_t)frame_max)
        return "its properties and headers (keys) do not fit in one AMQP frame";
    return NULL;
}

int sk_broker_republish(struct sk_broker *b, const char *routing_key,
                        const amqp_envelope_t *original, const struct sk_header *extra,
                        size_t n_extra, struct sk_err *err)
{
    return republish(b, routing_key, original, extra, n_extra, false, NULL, err);
}

int sk_broker_republish_async(struct sk_broker *b, const char *routing_key,
                              const amqp_envelope_t *original, struct sk_publish *p,
                              struct sk_err *err)
{
    return republish(b, routing_key, original, NULL, 0, false, p, err);
}

int sk_broker_republish_fitted(struct sk_broker *b, const char *routing_key,
                               const amqp_envelope_t *original, const struct sk_header *extra,
                               size_t n_extra, struct sk_err *err)
{
    return republish(b, routing_key, original, extra, n_extra, true, NULL, err);
}

/* The original's headers into entries, less those extra replaces, then
 * extra's: returns how many; *n_kept, how many of them are the original's
 * (they come first). */
static size_t merge_headers(const amqp_table_t *old, size_t n_old, const struct sk_header *extra,
                            size_t n_extra, amqp_table_entry_t *entries, size_t *n_kept)
{
    size_t n = 0;
    for (size_t i = 0; i < n_old; i++) {
        bool replaced = false;
        for (size_t k = 0; k < n_extra && !replaced; k++)
            replaced = old->entries[i].key.len == strlen(extra[k].key) &&
                       memcmp(old->entries[i].key.bytes, extra[k].key,
                              old->entries[i].key.len) == 0;
        if (!replaced)
            entries[n++] = old->entries[i];
    }
    *n_kept = n;
    for (size_t k = 0; k < n_extra; k++) {
        entries[n++] = extra[k].text != NULL ? sk_broker_text_entry(extra[k].key, extra[k].text)
                                             : sk_broker_int_entry(extra[k].key, extra[k].number);
    }
    return n;
}

static int republish(struct sk_broker *b, const char *routing_key,
                     const amqp_envelope_t *original, const struct sk_header *extra,
                     size_t n_extra, bool fit, struct sk_publish *async, struct sk_err *err)
{
    sk_assert(b->confirming);
    SK_BROKER_USABLE(b, err);
    if (original->message.body.bytes == NULL && original->message.body.len > 0)
        return sk_err_set(err, SK_ERR, "no copy of a body of %zu bytes that was not read",
                          original->message.body.len);
    amqp_basic_properties_t props = original->message.properties;
    const amqp_table_t *old = (props._flags & AMQP_BASIC_HEADERS_FLAG) ? &props.headers : NULL;
    size_t n_old = old != NULL ? (size_t)old->num_entries : 0;
    /* One more for the note of headers left out. */
    amqp_table_entry_t *entries = calloc(n_old + n_extra + 1, sizeof(*entries));
    if (entries == NULL)
        return sk_err_errno(err, SK_AGAIN, "calloc(headers)");

    size_t n_kept, n = merge_headers(old, n_old, extra, n_extra, entries, &n_kept);
    props._flags |= AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.headers.num_entries = (int)n;
    props.headers.entries = entries;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    /* A TTL set by the producer would make the copy vanish in a delay queue. */
    props._flags &= ~AMQP_BASIC_EXPIRATION_FLAG;

    /* A dead letter names the user sekali logged in as, which RabbitMQ
     * verifies: sekalictl dlq trusts x-sekali-* headers only on a letter
     * that says so (a producer's user_id, checked as well, is replaced). */
    if (fit && b->user[0] != '\0') {
        props._flags |= AMQP_BASIC_USER_ID_FLAG;
        props.user_id = amqp_cstring_bytes(b->user);
    }
    char note[DROPPED_NOTE_MAX];
    if (fit && leave_out(b, &props, n_kept, note, sizeof(note)))
        entries[props.headers.num_entries++] = sk_broker_text_entry(DROPPED_HEADER, note);

    /* librabbitmq would send the method frame, then fail to encode the
     * header frame, leaving the channel half-way through a publish; checked
     * first, the connection stays usable and the caller learns that this
     * message, not the broker, is the problem. */
    const char *why = unsendable(b, routing_key, &props);
    if (why != NULL) {
        free(entries);
        return sk_err_set(err, SK_ERR, "no copy to %s can be sent: %s", routing_key, why);
    }

    int rc = send_publish(b, routing_key, &props, original->message.body, err);
    free(entries);
    if (rc != SK_OK)
        return rc;
    if (async != NULL) {
        *async = (struct sk_publish){ .message_id = async->message_id,
                                      .tag = b->next_publish_tag++ };
        return SK_OK;
    }
    /* Alone in flight, a return can only be this copy's: no id needed. */
    struct sk_publish p = { .tag = b->next_publish_tag++ };
    return await_one(b, &p, routing_key, err);
}

/* Leaves the largest of the original's headers (the first n_original
 * entries of props' table, which sekali's own follow) out of a copy until
 * it fits in one frame with COPY_MARGIN to spare, for the note and for
 * what the broker may add; the keys sekali reads back (x-idempotency-key,
 * x-resource-key) go last. Returns whether any was left out, with the note
 * for DROPPED_HEADER: how many, how many bytes, and the first names,
 * reduced to printable ASCII (a producer's names are not to be trusted
 * with a terminal). */
static bool leave_out(struct sk_broker *b, amqp_basic_properties_t *props, size_t n_original,
                      char *note, size_t size)
{
    size_t limit = b->frame_max > COPY_MARGIN ? (size_t)b->frame_max - COPY_MARGIN : 0;
    amqp_table_entry_t *e = props->headers.entries;
    size_t n = (size_t)props->headers.num_entries, dropped = 0, bytes = 0;
    char names[DROPPED_NOTE_MAX / 2] = "";
    while (n_original > 0 &&
           SK_BROKER_HEADER_FRAME_OVERHEAD + sk_broker_properties_size(props) > limit) {
        size_t worst = SIZE_MAX, worst_size = 0;
        for (int pass = 0; pass < 2 && worst == SIZE_MAX; pass++) {
            for (size_t i = 0; i < n_original; i++) {
                bool key = bytes_is(e[i].key, "x-idempotency-key") ||
                           bytes_is(e[i].key, "x-resource-key");
                size_t one = sk_broker_table_size(&(amqp_table_t){ .num_entries = 1,
                                                                   .entries = &e[i] });
                if ((pass == 1 || !key) && one > worst_size) {
                    worst = i;
                    worst_size = one;
                }
            }
        }
        if (worst == SIZE_MAX)
            break;
        append_name(names, sizeof(names), e[worst].key);
        memmove(&e[worst], &e[worst + 1], (n - worst - 1) * sizeof(*e));
        n--;
        n_original--;
        props->headers.num_entries = (int)n;
        dropped++;
        bytes += worst_size;
    }
    if (dropped == 0)
        return false;
    snprintf(note, size, "left out %zu of the producer's headers (%zu bytes) so that this copy "
             "fits in one frame: %s", dropped, bytes, names);
    return true;
}

/* Appends ", name" (or "name") to list, with what is not printable ASCII
 * as '?', ending in "..." once full. */
static void append_name(char *list, size_t size, amqp_bytes_t name)
{
    size_t used = strlen(list);
    if (used + 8 >= size) {
        if (used < 3 || strcmp(list + used - 3, "...") != 0)
            memcpy(list + (used + 4 <= size ? used : size - 4), "...", 4);
        return;
    }
    if (used > 0) {
        list[used++] = ',';
        list[used++] = ' ';
    }
    for (size_t i = 0; i < name.len && used + 5 < size; i++) {
        unsigned char c = ((const unsigned char *)name.bytes)[i];
        list[used++] = c > 0x20 && c < 0x7f ? (char)c : '?';
    }
    list[used] = '\0';
}

static bool bytes_is(amqp_bytes_t b, const char *s)
{
    return b.len == strlen(s) && memcmp(b.bytes, s, b.len) == 0;
}

static int await_one(struct sk_broker *b, struct sk_publish *p, const char *routing_key,
                     struct sk_err *err)
{
    int rc = sk_broker_await_confirms(b, p, 1, err);
    if (rc == SK_OK && p->rc != SK_OK)
        return sk_err_set(err, p->rc, "publish to %s: %s", routing_key, p->why);
    return rc;
}

/* A mandatory publish to a missing queue comes back as basic.return, sent
 * before the ack that confirms it (an ack may confirm many: `multiple`), so
 * a publish returned before it is settled is a failure. */
/* A basic.return's message, which follows it on channel: marks the
 * publish of p its id names as returned. SK_OK, or SK_AGAIN with the
 * connection broken. */
static int read_return(struct sk_broker *b, amqp_channel_t channel, struct sk_publish *p,
                       size_t n, struct sk_err *err)
{
    amqp_message_t message;
    amqp_rpc_reply_t reply = amqp_read_message(b->conn, channel, &message, 0);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
        b->broken = true;
        return sk_err_set(err, SK_AGAIN, "reading a returned message failed");
    }
    struct sk_publish *returned = find_returned(p, n, &message.properties);
    if (returned != NULL)
        returned->returned = true;
    amqp_destroy_message(&message);
    return SK_OK;
}

/* 406 and 403: the broker refused something sent on this channel (over
 * its max_message_size, not permitted). Any other code is taken as a
 * failure of the broker, to retry. Returns SK_AGAIN. */
static int channel_closed(struct sk_broker *b, const amqp_channel_close_t *m,
                          struct sk_err *err)
{
    b->channel_closed = m->reply_code == AMQP_PRECONDITION_FAILED ||
                        m->reply_code == AMQP_ACCESS_REFUSED;
    b->broken = true;  /* its only channel is gone */
    return sk_err_set(err, SK_AGAIN, "the broker closed the channel while publishing: "
                      "%u %.*s", m->reply_code, (int)m->reply_text.len,
                      (const char *)m->reply_text.bytes);
}

int sk_broker_await_confirms(struct sk_broker *b, struct sk_publish *p, size_t n,
                             struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    size_t unsettled = 0;
    for (size_t i = 0; i < n; i++)
        unsettled += !p[i].settled;
    while (unsettled > 0) {
        amqp_frame_t frame;
        struct timeval timeout = sk_broker_timeval(30000);
        int status = amqp_simple_wait_frame_noblock(b->conn, &frame, &timeout);
        if (status != AMQP_STATUS_OK)
            return sk_broker_lost(b, status, "waiting for publisher confirms", err);
        if (frame.frame_type != AMQP_FRAME_METHOD)
            continue;
        switch (frame.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
            amqp_basic_ack_t *ack = frame.payload.method.decoded;
            unsettled -= settle(p, n, ack->delivery_tag, ack->multiple, NULL);
            continue;
        }
        case AMQP_BASIC_NACK_METHOD: {
            amqp_basic_nack_t *nack = frame.payload.method.decoded;
            unsettled -= settle(p, n, nack->delivery_tag, nack->multiple,
                                "the broker nacked the message (a quorum queue without a "
                                "leader, or a full queue that rejects publishes)");
            continue;
        }
        case AMQP_BASIC_RETURN_METHOD:
            if (read_return(b, frame.channel, p, n, err) != SK_OK)
                return SK_AGAIN;
            continue;
        case AMQP_CHANNEL_CLOSE_METHOD:
            return channel_closed(b, frame.payload.method.decoded, err);
        case AMQP_CONNECTION_CLOSE_METHOD:
            b->broken = true;
            return sk_err_set(err, SK_AGAIN, "broker closed the channel while publishing");
        default:
            continue;
        }
    }
    return SK_OK;
}

bool sk_broker_channel_refused(const struct sk_broker *b)
{
    return b != NULL && b->channel_closed;
}

bool sk_broker_broken(const struct sk_broker *b)
{
    return b == NULL || b->broken;
}

/* Settles the publishes a confirm covers (tag, or every tag up to it when
 * multiple) and returns how many were not settled before. A confirm for an
 * older publish, outside p, settles nothing. */
static size_t settle(struct sk_publish *p, size_t n, uint64_t tag, bool multiple,
                     const char *nacked)
{
    size_t settled = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].settled || p[i].tag > tag || (!multiple && p[i].tag != tag))
            continue;
        p[i].settled = true;
        p[i].rc = SK_OK;
        /* A return is the broker's verdict on this message (no queue takes
         * it); a nack is the queue's state: a quorum queue electing a
         * leader, or a full one under reject-publish. Worth another try. */
        if (p[i].returned) {
            p[i].rc = SK_ERR;
            p[i].why = "the broker returned the message: no such queue";
        } else if (nacked != NULL) {
            p[i].rc = SK_AGAIN;
            p[i].why = nacked;
        }
        settled++;
    }
    return settled;
}

static struct sk_publish *find_returned(struct sk_publish *p, size_t n,
                                        const amqp_basic_properties_t *props)
{
    if (n == 1)
        return p;
    if (!(props->_flags & AMQP_BASIC_MESSAGE_ID_FLAG))
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (!p[i].settled && p[i].message_id != NULL &&
            strlen(p[i].message_id) == props->message_id.len &&
            memcmp(p[i].message_id, props->message_id.bytes, props->message_id.len) == 0)
            return &p[i];
    }
    return NULL;
}
