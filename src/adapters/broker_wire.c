/* broker_wire.c - AMQP 0-9-1 arithmetic that needs no connection: the
 * bytes a field table or a content header's properties take on the wire,
 * an integer field's value, a deep copy of decoded properties, and the
 * table entries the declarations and republishes build.
 *
 * Apart from the connection files because it is pure: envelope.c validates
 * deliveries with it (and the envelope fuzzer runs it with no broker),
 * broker_publish.c checks that a message fits in a frame before sending it.
 * One table of the short-string properties serves both the size and the
 * copy, so a property is never counted by one and missed by the other. */
#include <stddef.h>
#include <string.h>

#include "amqp_lib.h"

#include "broker.h"
#include "broker_conn.h"

/* The short-string properties, each with its flag. */
static const struct {
    amqp_flags_t flag;
    size_t       offset;
} property_strings[] = {
    { AMQP_BASIC_CONTENT_TYPE_FLAG, offsetof(amqp_basic_properties_t, content_type) },
    { AMQP_BASIC_CONTENT_ENCODING_FLAG, offsetof(amqp_basic_properties_t, content_encoding) },
    { AMQP_BASIC_CORRELATION_ID_FLAG, offsetof(amqp_basic_properties_t, correlation_id) },
    { AMQP_BASIC_REPLY_TO_FLAG, offsetof(amqp_basic_properties_t, reply_to) },
    { AMQP_BASIC_EXPIRATION_FLAG, offsetof(amqp_basic_properties_t, expiration) },
    { AMQP_BASIC_MESSAGE_ID_FLAG, offsetof(amqp_basic_properties_t, message_id) },
    { AMQP_BASIC_TYPE_FLAG, offsetof(amqp_basic_properties_t, type) },
    { AMQP_BASIC_USER_ID_FLAG, offsetof(amqp_basic_properties_t, user_id) },
    { AMQP_BASIC_APP_ID_FLAG, offsetof(amqp_basic_properties_t, app_id) },
    { AMQP_BASIC_CLUSTER_ID_FLAG, offsetof(amqp_basic_properties_t, cluster_id) },
};

static size_t field_size(const amqp_field_value_t *v);

/* Deep copy into pool: the decoded frame lives only until the connection's
 * buffers are recycled. */
int sk_broker_clone_properties(const amqp_basic_properties_t *from, amqp_basic_properties_t *to,
                               amqp_pool_t *pool)
{
    /* Only the flagged fields were decoded: the others hold garbage. */
    *to = *from;
    for (size_t i = 0; i < SK_ARRAY_LEN(property_strings); i++) {
        amqp_bytes_t *b = (amqp_bytes_t *)((char *)to + property_strings[i].offset);
        if (!(from->_flags & property_strings[i].flag) || b->len == 0) {
            *b = amqp_empty_bytes;
            continue;
        }
        void *copy = amqp_pool_alloc(pool, b->len);
        if (copy == NULL)
            return SK_ERR;
        memcpy(copy, b->bytes, b->len);
        b->bytes = copy;
    }
    to->headers = amqp_empty_table;
    if ((from->_flags & AMQP_BASIC_HEADERS_FLAG) &&
        amqp_table_clone(&from->headers, &to->headers, pool) != AMQP_STATUS_OK)
        return SK_ERR;
    return SK_OK;
}

int64_t sk_broker_field_int(const amqp_field_value_t *v)
{
    if (v == NULL)
        return -1;
    switch (v->kind) {
    case AMQP_FIELD_KIND_I8:  return v->value.i8;
    case AMQP_FIELD_KIND_U8:  return v->value.u8;
    case AMQP_FIELD_KIND_I16: return v->value.i16;
    case AMQP_FIELD_KIND_U16: return v->value.u16;
    case AMQP_FIELD_KIND_I32: return v->value.i32;
    case AMQP_FIELD_KIND_U32: return v->value.u32;
    case AMQP_FIELD_KIND_I64: return v->value.i64;
    case AMQP_FIELD_KIND_U64: return v->value.u64 > INT64_MAX ? -1 : (int64_t)v->value.u64;
    default:                  return -1;
    }
}

size_t sk_broker_table_size(const amqp_table_t *t)
{
    size_t n = 0;
    for (int i = 0; i < t->num_entries; i++)
        n += 1 + t->entries[i].key.len + field_size(&t->entries[i].value);
    return n;
}

/* A field's kind octet and its value. */
static size_t field_size(const amqp_field_value_t *v)
{
    size_t n = 1;
    switch (v->kind) {
    case AMQP_FIELD_KIND_BOOLEAN:
    case AMQP_FIELD_KIND_I8:
    case AMQP_FIELD_KIND_U8:        return n + 1;
    case AMQP_FIELD_KIND_I16:
    case AMQP_FIELD_KIND_U16:       return n + 2;
    case AMQP_FIELD_KIND_I32:
    case AMQP_FIELD_KIND_U32:
    case AMQP_FIELD_KIND_F32:       return n + 4;
    case AMQP_FIELD_KIND_DECIMAL:   return n + 5;
    case AMQP_FIELD_KIND_I64:
    case AMQP_FIELD_KIND_U64:
    case AMQP_FIELD_KIND_F64:
    case AMQP_FIELD_KIND_TIMESTAMP: return n + 8;
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:     return n + 4 + v->value.bytes.len;
    case AMQP_FIELD_KIND_TABLE:     return n + 4 + sk_broker_table_size(&v->value.table);
    case AMQP_FIELD_KIND_ARRAY:
        n += 4;
        for (int i = 0; i < v->value.array.num_entries; i++)
            n += field_size(&v->value.array.entries[i]);
        return n;
    default:                        return n;  /* void */
    }
}

size_t sk_broker_properties_size(const amqp_basic_properties_t *p)
{
    size_t n = 2;  /* the flags: 14 properties fit in one flag word */
    for (size_t i = 0; i < SK_ARRAY_LEN(property_strings); i++)
        if (p->_flags & property_strings[i].flag)
            n += 1 + ((const amqp_bytes_t *)((const char *)p + property_strings[i].offset))->len;
    if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
        n += 4 + sk_broker_table_size(&p->headers);
    if (p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
        n += 1;
    if (p->_flags & AMQP_BASIC_PRIORITY_FLAG)
        n += 1;
    if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG)
        n += 8;
    return n;
}

amqp_table_entry_t sk_broker_text_entry(const char *key, const char *value)
{
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(key);
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = amqp_cstring_bytes(value);
    return e;
}

amqp_table_entry_t sk_broker_int_entry(const char *key, int64_t value)
{
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(key);
    e.value.kind = AMQP_FIELD_KIND_I64;
    e.value.value.i64 = value;
    return e;
}
