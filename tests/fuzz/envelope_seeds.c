/* envelope_seeds.c - writes the seed corpus of fuzz_envelope.
 *
 *   make fuzz-seeds   (rewrites tests/fuzz/corpus/envelope/)
 *
 * Each seed is a delivery in fuzz_envelope's input layout, its properties
 * encoded by librabbitmq's own amqp_encode_properties(), so the fuzzer
 * starts from what a producer can really send: the messages of
 * tests/unit/check_envelope.c, sekali's retry headers, a quorum queue's
 * x-delivery-count, and a few of each kind of bad key. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

struct seed {
    const char *name;
    uint8_t     control;       /* fuzz_envelope's byte 0 */
    const char *message_id, *type, *content_type, *reply_to, *correlation_id;
    const char *idempotency_key, *resource_key, *first_failure;
    int64_t     attempt, delivery_count;  /* -1: no such header */
    bool        key_as_int;    /* x-idempotency-key as an integer, which is refused */
    const char *body;
};

static const struct seed seeds[] = {
    { "minimal", 0, "job-1", .attempt = -1, .delivery_count = -1, .body = "{}" },
    { "keys", 0, "job-1", .idempotency_key = "invoice:42", .resource_key = "account:7",
      .attempt = -1, .delivery_count = -1, .body = "{\"amount\":10}" },
    { "all_properties", 2, "job-2", "create_invoice", "application/json", "replies",
      "corr-9", "invoice:43", "account:8", .attempt = -1, .delivery_count = -1,
      .body = "{}" },
    { "unknown_type", 2, "job-3", "refund_everything", .attempt = -1, .delivery_count = -1,
      .body = "{}" },
    { "retry_copy", 1, "job-4", .first_failure = "2026-01-01T00:00:00Z", .attempt = 3,
      .delivery_count = -1, .body = "{}" },
    { "quorum_redelivery", 1, "job-5", .attempt = 2, .delivery_count = 4, .body = "{}" },
    { "no_message_id", 0, NULL, .attempt = -1, .delivery_count = -1, .body = "{}" },
    { "body_too_large", 4, "job-6", .attempt = -1, .delivery_count = -1,
      .body = "a body longer than sixteen bytes" },
    { "bad_utf8_key", 0, "job-7", .idempotency_key = "bad\xff" "utf8", .attempt = -1,
      .delivery_count = -1, .body = "{}" },
    { "overlong_utf8", 0, "job-8", .resource_key = "\xc0\xaf", .attempt = -1,
      .delivery_count = -1, .body = "{}" },
    { "key_not_a_string", 0, "job-9", .key_as_int = true, .attempt = -1,
      .delivery_count = -1, .body = "{}" },
    { "utf8_keys", 0, "j\xc3\xb8" "b-\xe2\x82\xac", .idempotency_key = "\xf0\x9f\x94\x91",
      .attempt = -1, .delivery_count = -1, .body = "" },
};

static int write_seed(const char *dir, const struct seed *s);

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
        if (write_seed(argv[1], &seeds[i]) != 0)
            return 1;
    return 0;
}

static int write_seed(const char *dir, const struct seed *s)
{
    amqp_basic_properties_t p;
    amqp_table_entry_t h[8];
    int nh = 0;
    uint8_t buf[65536];
    char path[4096];

    memset(&p, 0, sizeof(p));
#define PROP(field, flag)                                   \
    if (s->field != NULL) {                                 \
        p._flags |= flag;                                   \
        p.field = amqp_cstring_bytes(s->field);             \
    }
    PROP(message_id, AMQP_BASIC_MESSAGE_ID_FLAG)
    PROP(type, AMQP_BASIC_TYPE_FLAG)
    PROP(content_type, AMQP_BASIC_CONTENT_TYPE_FLAG)
    PROP(reply_to, AMQP_BASIC_REPLY_TO_FLAG)
    PROP(correlation_id, AMQP_BASIC_CORRELATION_ID_FLAG)
#undef PROP
#define HEADER_STR(key_, value_)                                       \
    if (value_ != NULL) {                                              \
        h[nh].key = amqp_cstring_bytes(key_);                          \
        h[nh].value.kind = AMQP_FIELD_KIND_UTF8;                       \
        h[nh++].value.value.bytes = amqp_cstring_bytes(value_);        \
    }
    HEADER_STR("x-idempotency-key", s->idempotency_key)
    HEADER_STR("x-resource-key", s->resource_key)
    HEADER_STR("x-sekali-first-failure", s->first_failure)
#undef HEADER_STR
    if (s->attempt >= 0) {
        h[nh].key = amqp_cstring_bytes("x-sekali-attempt");
        h[nh].value.kind = AMQP_FIELD_KIND_I32;
        h[nh++].value.value.i32 = (int32_t)s->attempt;
    }
    if (s->delivery_count >= 0) {
        h[nh].key = amqp_cstring_bytes("x-delivery-count");
        h[nh].value.kind = AMQP_FIELD_KIND_I64;
        h[nh++].value.value.i64 = s->delivery_count;
    }
    if (s->key_as_int) {
        h[nh].key = amqp_cstring_bytes("x-idempotency-key");
        h[nh].value.kind = AMQP_FIELD_KIND_I32;
        h[nh++].value.value.i32 = 7;
    }
    if (nh > 0) {
        p._flags |= AMQP_BASIC_HEADERS_FLAG;
        p.headers.num_entries = nh;
        p.headers.entries = h;
    }
    p._flags |= AMQP_BASIC_DELIVERY_MODE_FLAG;
    p.delivery_mode = AMQP_DELIVERY_PERSISTENT;

    amqp_bytes_t out = { .len = sizeof(buf) - 3, .bytes = buf + 3 };
    int n = amqp_encode_properties(AMQP_BASIC_CLASS, &p, out);
    if (n < 0) {
        fprintf(stderr, "%s: amqp_encode_properties: %s\n", s->name, amqp_error_string2(n));
        return 1;
    }
    buf[0] = s->control;
    buf[1] = (uint8_t)(n >> 8);
    buf[2] = (uint8_t)n;
    size_t body_len = strlen(s->body);
    memcpy(buf + 3 + n, s->body, body_len);

    snprintf(path, sizeof(path), "%s/%s", dir, s->name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, 3 + (size_t)n + body_len, f) != 3 + (size_t)n + body_len ||
        fclose(f) != 0) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}
