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
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <amqp.h>

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

int sk_broker_confirm_select(struct sk_broker *b, struct sk_err *err)
{
    amqp_confirm_select(b->conn, SK_BROKER_CHANNEL);
    int rc = sk_broker_rpc_check(amqp_get_rpc_reply(b->conn), "confirm.select", err);
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

    amqp_table_entry_t headers[2];
    int n_headers = 0;
    if (msg->idempotency_key != NULL)
        headers[n_headers++] = sk_broker_text_entry("x-idempotency-key", msg->idempotency_key);
    if (msg->resource_key != NULL)
        headers[n_headers++] = sk_broker_text_entry("x-resource-key", msg->resource_key);

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
    if (status != AMQP_STATUS_OK)
        return sk_err_set(err, SK_AGAIN, "basic.publish to %s failed: %s", routing_key,
                          amqp_error_string2(status));
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
    int frame_max = amqp_get_frame_max(b->conn);
    if (frame_max > 0 &&
        SK_BROKER_HEADER_FRAME_OVERHEAD + sk_broker_properties_size(props) > (size_t)frame_max)
        return "its properties and headers (keys) do not fit in one AMQP frame";
    return NULL;
}

int sk_broker_republish(struct sk_broker *b, const char *routing_key,
                        const amqp_envelope_t *original, const struct sk_header *extra,
                        size_t n_extra, struct sk_err *err)
{
    sk_assert(b->confirming);
    if (original->message.body.bytes == NULL && original->message.body.len > 0)
        return sk_err_set(err, SK_ERR, "no copy of a body of %zu bytes that was not read",
                          original->message.body.len);
    amqp_basic_properties_t props = original->message.properties;
    const amqp_table_t *old = (props._flags & AMQP_BASIC_HEADERS_FLAG) ? &props.headers : NULL;
    size_t n_old = old != NULL ? (size_t)old->num_entries : 0;
    amqp_table_entry_t *entries = calloc(n_old + n_extra, sizeof(*entries));
    if (entries == NULL)
        return sk_err_errno(err, SK_AGAIN, "calloc(headers)");

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
    for (size_t k = 0; k < n_extra; k++) {
        entries[n++] = extra[k].text != NULL ? sk_broker_text_entry(extra[k].key, extra[k].text)
                                             : sk_broker_int_entry(extra[k].key, extra[k].number);
    }
    props._flags |= AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.headers.num_entries = (int)n;
    props.headers.entries = entries;
    props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    /* A TTL set by the producer would make the copy vanish in a delay queue. */
    props._flags &= ~AMQP_BASIC_EXPIRATION_FLAG;

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
    /* Alone in flight, a return can only be this copy's: no id needed. */
    struct sk_publish p = { .tag = b->next_publish_tag++ };
    return await_one(b, &p, routing_key, err);
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
int sk_broker_await_confirms(struct sk_broker *b, struct sk_publish *p, size_t n,
                             struct sk_err *err)
{
    size_t unsettled = 0;
    for (size_t i = 0; i < n; i++)
        unsettled += !p[i].settled;
    while (unsettled > 0) {
        amqp_frame_t frame;
        struct timeval timeout = sk_broker_timeval(30000);
        int status = amqp_simple_wait_frame_noblock(b->conn, &frame, &timeout);
        if (status != AMQP_STATUS_OK)
            return sk_err_set(err, SK_AGAIN, "waiting for publisher confirms: %s",
                              amqp_error_string2(status));
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
                                "the broker nacked the message");
            continue;
        }
        case AMQP_BASIC_RETURN_METHOD: {
            /* The returned message's header and body follow; its id says
             * which publish it was. */
            amqp_message_t message;
            amqp_rpc_reply_t reply = amqp_read_message(b->conn, frame.channel, &message, 0);
            if (reply.reply_type != AMQP_RESPONSE_NORMAL)
                return sk_err_set(err, SK_AGAIN, "reading a returned message failed");
            struct sk_publish *returned = find_returned(p, n, &message.properties);
            if (returned != NULL)
                returned->returned = true;
            amqp_destroy_message(&message);
            continue;
        }
        case AMQP_CHANNEL_CLOSE_METHOD: {
            /* 406 and 403: the broker refused something sent on this
             * channel (over its max_message_size, not permitted). Any other
             * code is taken as a failure of the broker, to retry. */
            amqp_channel_close_t *m = frame.payload.method.decoded;
            b->channel_closed = m->reply_code == AMQP_PRECONDITION_FAILED ||
                                m->reply_code == AMQP_ACCESS_REFUSED;
            return sk_err_set(err, SK_AGAIN, "the broker closed the channel while publishing: "
                              "%u %.*s", m->reply_code, (int)m->reply_text.len,
                              (const char *)m->reply_text.bytes);
        }
        case AMQP_CONNECTION_CLOSE_METHOD:
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
        if (nacked != NULL || p[i].returned) {
            p[i].rc = SK_ERR;
            p[i].why = nacked != NULL ? nacked : "the broker returned the message: no such queue";
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
