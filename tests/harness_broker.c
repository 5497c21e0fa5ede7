/* harness_broker.c - the test broker over sekali's own broker module: a
 * confirm-mode publishing connection, well-formed and malformed messages,
 * basic.get and the headers of what it took, and queue counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_private.h"

void h_declare_as_foreign(const char *name, amqp_table_t args)
{
    char *url = strdup(h_amqp_url());
    struct amqp_connection_info info;
    ck_assert_int_eq(amqp_parse_url(url, &info), AMQP_STATUS_OK);
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *socket = amqp_tcp_socket_new(conn);
    ck_assert_int_eq(amqp_socket_open(socket, info.host, info.port), AMQP_STATUS_OK);
    ck_assert_int_eq(amqp_login(conn, info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                                info.user, info.password).reply_type, AMQP_RESPONSE_NORMAL);
    amqp_channel_open(conn, 1);
    ck_assert_int_eq(amqp_get_rpc_reply(conn).reply_type, AMQP_RESPONSE_NORMAL);
    amqp_queue_declare(conn, 1, amqp_cstring_bytes(name), 0, 1, 0, 0, args);
    ck_assert_msg(amqp_get_rpc_reply(conn).reply_type == AMQP_RESPONSE_NORMAL,
                  "declaring %s failed", name);
    amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
    free(url);
}

struct sk_broker *h_broker(void)
{
    struct sk_broker *b = NULL;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_open(&b, h_amqp_conf(), &err) == SK_OK, "broker: %s", err.msg);
    ck_assert_msg(sk_broker_confirm_select(b, &err) == SK_OK, "confirm.select: %s", err.msg);
    return b;
}

void h_publish(struct sk_broker *b, const char *queue, const char *type, const char *message_id,
               const char *idempotency_key, const char *resource_key, const char *body)
{
    struct sk_message msg = {
        .message_id = message_id, .type = type, .content_type = "text/plain",
        .idempotency_key = idempotency_key, .resource_key = resource_key,
        .body = body, .body_len = strlen(body),
    };
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_publish(b, queue, &msg, &err) == SK_OK, "publish to %s: %s", queue,
                  err.msg);
}

uint32_t h_queue_depth(struct sk_broker *b, const char *queue)
{
    uint32_t messages = 0;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_queue_depth(b, queue, &messages, NULL, &err) == SK_OK,
                  "queue depth of %s: %s", queue, err.msg);
    return messages;
}

uint32_t h_consumers(struct sk_broker *b, const char *queue)
{
    uint32_t consumers = 0;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_queue_depth(b, queue, NULL, &consumers, &err) == SK_OK,
                  "consumers of %s: %s", queue, err.msg);
    return consumers;
}

void h_publish_raw(struct sk_broker *b, const char *queue, const char *message_id,
                   const char *type, const struct sk_header *headers, size_t n_headers,
                   const void *body, size_t body_len)
{
    amqp_envelope_t env;
    memset(&env, 0, sizeof(env));
    amqp_basic_properties_t *p = &env.message.properties;
    if (message_id != NULL) {
        p->_flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
        p->message_id = amqp_cstring_bytes(message_id);
    }
    if (type != NULL) {
        p->_flags |= AMQP_BASIC_TYPE_FLAG;
        p->type = amqp_cstring_bytes(type);
    }
    env.message.body.bytes = (void *)body;
    env.message.body.len = body_len;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_republish(b, queue, &env, headers, n_headers, &err) == SK_OK,
                  "publish to %s: %s", queue, err.msg);
}

bool h_get(struct sk_broker *b, const char *queue, amqp_message_t *msg)
{
    struct sk_err err = { 0 };
    int rc = sk_broker_get(b, queue, msg, &err);
    ck_assert_msg(rc == SK_OK || rc == SK_BUSY, "basic.get from %s: %s", queue, err.msg);
    return rc == SK_OK;
}

static const amqp_field_value_t *header(const amqp_message_t *msg, const char *key)
{
    const amqp_basic_properties_t *p = &msg->properties;
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return NULL;
    for (int i = 0; i < p->headers.num_entries; i++)
        if (p->headers.entries[i].key.len == strlen(key) &&
            memcmp(p->headers.entries[i].key.bytes, key, strlen(key)) == 0)
            return &p->headers.entries[i].value;
    return NULL;
}

const char *h_header_text(const amqp_message_t *msg, const char *key, char *buf, size_t size)
{
    const amqp_field_value_t *v = header(msg, key);
    buf[0] = '\0';
    if (v != NULL && v->kind == AMQP_FIELD_KIND_UTF8)
        snprintf(buf, size, "%.*s", (int)v->value.bytes.len, (const char *)v->value.bytes.bytes);
    return buf;
}

int64_t h_header_int(const amqp_message_t *msg, const char *key)
{
    return sk_broker_field_int(header(msg, key));
}

char *h_header_filling(const char *message_id, const char *key, size_t frame)
{
    /* frame overhead 20, flags 2, message_id 1 + n, type 1 + 4, delivery
     * mode 1, headers length 4, entry: key 1 + n, kind 1, length 4 */
    size_t fixed = 20 + 2 + 1 + strlen(message_id) + 5 + 1 + 4 + 1 + strlen(key) + 1 + 4;
    ck_assert_uint_gt(frame, fixed);
    size_t len = frame - fixed;
    char *value = malloc(len + 1);
    ck_assert_ptr_nonnull(value);
    memset(value, 'h', len);
    value[len] = '\0';
    return value;
}
