/* check_envelope.c - key extraction and validation of deliveries. */
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "envelope.h"
#include "suite.h"

static struct sk_queue_conf queue = { .name = "q", .max_body = 64 };

struct fixture {
    amqp_envelope_t    env;
    amqp_table_entry_t headers[4];
};

static void make(struct fixture *f, const char *message_id, const char *body)
{
    memset(f, 0, sizeof(*f));
    amqp_basic_properties_t *p = &f->env.message.properties;
    if (message_id != NULL) {
        p->_flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
        p->message_id = amqp_cstring_bytes(message_id);
    }
    f->env.message.body = amqp_cstring_bytes(body);
}

static void add_header(struct fixture *f, const char *key, const char *value)
{
    amqp_basic_properties_t *p = &f->env.message.properties;
    amqp_table_entry_t *e = &f->headers[p->headers.num_entries++];
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_UTF8;
    e->value.value.bytes = amqp_cstring_bytes(value);
    p->_flags |= AMQP_BASIC_HEADERS_FLAG;
    p->headers.entries = f->headers;
}

START_TEST(test_keys_default_to_the_message_id)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    struct sk_envelope out;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_str_eq(out.job_id, "job-1");
    ck_assert_str_eq(out.idempotency_key, "job-1");
    ck_assert_str_eq(out.resource_key, "job-1");
    ck_assert_uint_eq(out.delivery_attempt, 1);
}
END_TEST

START_TEST(test_headers_override_keys_and_resource_defaults_to_idempotency_key)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    add_header(&f, "x-idempotency-key", "invoice:42");
    struct sk_envelope out;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_str_eq(out.idempotency_key, "invoice:42");
    ck_assert_str_eq(out.resource_key, "invoice:42");

    add_header(&f, "x-resource-key", "account:7");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_str_eq(out.resource_key, "account:7");
}
END_TEST

START_TEST(test_redelivery_and_delivery_count_set_the_attempt)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    f.env.redelivered = 1;
    struct sk_envelope out;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 2);

    amqp_basic_properties_t *p = &f.env.message.properties;
    amqp_table_entry_t *e = &f.headers[p->headers.num_entries++];
    e->key = amqp_cstring_bytes("x-delivery-count");
    e->value.kind = AMQP_FIELD_KIND_I64;
    e->value.value.i64 = 4;
    p->_flags |= AMQP_BASIC_HEADERS_FLAG;
    p->headers.entries = f.headers;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 5);
}
END_TEST

/* Each bad input and the dead-letter reason it must produce. */
START_TEST(test_bad_messages_get_a_reason)
{
    struct sk_envelope out;
    struct sk_err err;
    struct fixture f;

    make(&f, NULL, "{}");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "missing message_id");

    make(&f, "job-1", "this body is longer than sixty-four bytes, which is this queue's max");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "body of 68 bytes exceeds max_body 64");

    make(&f, "job-1", "{}");
    add_header(&f, "x-idempotency-key", "bad\xff" "utf8");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "x-idempotency-key is not valid UTF-8");

    make(&f, "job-1", "{}");
    add_header(&f, "x-resource-key", "\xc0\xaf");  /* overlong "/" */
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "x-resource-key is not valid UTF-8");

    make(&f, "job-1", "{}");
    amqp_basic_properties_t *p = &f.env.message.properties;
    f.headers[0].key = amqp_cstring_bytes("x-idempotency-key");
    f.headers[0].value.kind = AMQP_FIELD_KIND_I32;
    f.headers[0].value.value.i32 = 7;
    p->headers.num_entries = 1;
    p->headers.entries = f.headers;
    p->_flags |= AMQP_BASIC_HEADERS_FLAG;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "header x-idempotency-key must be a string");

    char long_key[SK_KEY_MAX + 2];
    memset(long_key, 'k', sizeof(long_key) - 1);
    long_key[sizeof(long_key) - 1] = '\0';
    make(&f, "job-1", "{}");
    add_header(&f, "x-idempotency-key", long_key);
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "x-idempotency-key of 513 bytes is longer than 512");
}
END_TEST

START_TEST(test_unknown_job_type_is_rejected_when_types_are_listed)
{
    char *types[] = { "create_invoice" };
    struct sk_queue_conf typed = queue;
    typed.job_types = types;
    typed.n_job_types = 1;
    struct fixture f;
    make(&f, "job-1", "{}");
    amqp_basic_properties_t *p = &f.env.message.properties;
    p->_flags |= AMQP_BASIC_TYPE_FLAG;
    p->type = amqp_cstring_bytes("refund");
    struct sk_envelope out;
    struct sk_err err;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &typed, &out, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "unknown job type \"refund\"");
    /* An unaccepted type is not kept: the metrics would count it as one. */
    ck_assert_str_eq(out.job_type, "");
    p->type = amqp_cstring_bytes("create_invoice");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &typed, &out, &err), SK_OK);
    ck_assert_str_eq(out.job_type, "create_invoice");
}
END_TEST

START_TEST(test_valid_multibyte_keys_pass)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    add_header(&f, "x-idempotency-key", "faktur-\xc3\xa9-\xe2\x82\xac-\xf0\x9f\x98\x80");
    struct sk_envelope out;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_keys_default_to_the_message_id,
        test_headers_override_keys_and_resource_defaults_to_idempotency_key,
        test_redelivery_and_delivery_count_set_the_attempt,
        test_bad_messages_get_a_reason,
        test_unknown_job_type_is_rejected_when_types_are_listed,
        test_valid_multibyte_keys_pass,
        NULL,
    };
    Suite *s = suite_create("envelope");
    h_tcase(s, "parse", 0, tests);
    return h_run_suite(s);
}
