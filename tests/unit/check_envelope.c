/* check_envelope.c - key extraction and validation of deliveries. */
/* links: core envelope broker */
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "broker.h"
#include "envelope.h"
#include "suite.h"

static struct sk_queue_conf queue = { .name = "q", .max_body = 64, .max_headers = 4096 };

struct fixture {
    amqp_envelope_t    env;
    amqp_table_entry_t headers[4];
    /* An x-death header: one death, as the broker writes it. */
    amqp_field_value_t death;
    amqp_table_entry_t death_fields[2];
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

static void add_death(struct fixture *f, const char *from, const char *reason);

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
    struct sk_queue_conf quorum = queue;
    quorum.queue_type = SK_QUEUE_QUORUM;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &quorum, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 5);

    /* The broker writes x-delivery-count in a quorum queue, on a
     * redelivery; anywhere else one is the producer's, and is ignored. */
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 2);
    f.env.redelivered = 0;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &quorum, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 1);
}
END_TEST

/* x-sekali-first-failure is sekali's, on its retry copies: a producer's
 * (any text, control sequences and all) is not taken. */
START_TEST(test_first_failure_is_read_only_from_a_retry_copy)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    add_header(&f, "x-sekali-first-failure", "\x1b]52;c;ZXZpbA==\x07");
    struct sk_envelope out;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_str_eq(out.first_failure, "");

    make(&f, "job-1", "{}");
    add_header(&f, "x-sekali-first-failure", "2026-12-01T15:00:00Z");
    add_death(&f, "q.delay.1250", "expired");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_str_eq(out.first_failure, "2026-12-01T15:00:00Z");
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

static void add_int_header(struct fixture *f, const char *key, int64_t value)
{
    amqp_basic_properties_t *p = &f->env.message.properties;
    amqp_table_entry_t *e = &f->headers[p->headers.num_entries++];
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_I64;
    e->value.value.i64 = value;
    p->_flags |= AMQP_BASIC_HEADERS_FLAG;
    p->headers.entries = f->headers;
}

/* RabbitMQ 4.3 counts in x-delivery-count only the returns that the
 * delivery limit counts (a reject, not a nack nor a lost consumer), and
 * every earlier acquisition in x-acquired-count: the attempt is the larger,
 * so that a worker killed mid-job is still seen as a redelivery. Written
 * from the 4.3 release notes: Debian 13's 4.0 sends no x-acquired-count. */
START_TEST(test_acquired_count_sets_the_attempt_where_present)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    f.env.redelivered = 1;
    add_int_header(&f, "x-delivery-count", 0);
    add_int_header(&f, "x-acquired-count", 3);
    struct sk_queue_conf quorum = queue;
    quorum.queue_type = SK_QUEUE_QUORUM;
    struct sk_envelope out;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &quorum, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 4);

    /* A first delivery's, or a classic queue's, is the producer's. */
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 2);
    f.env.redelivered = 0;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &quorum, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 1);
}
END_TEST

/* Adds x-death with its latest death: `reason` in queue `from`. */
static void add_death(struct fixture *f, const char *from, const char *reason)
{
    f->death_fields[0].key = amqp_cstring_bytes("queue");
    f->death_fields[0].value.kind = AMQP_FIELD_KIND_UTF8;
    f->death_fields[0].value.value.bytes = amqp_cstring_bytes(from);
    f->death_fields[1].key = amqp_cstring_bytes("reason");
    f->death_fields[1].value.kind = AMQP_FIELD_KIND_UTF8;
    f->death_fields[1].value.value.bytes = amqp_cstring_bytes(reason);
    f->death.kind = AMQP_FIELD_KIND_TABLE;
    f->death.value.table = (amqp_table_t){ .num_entries = 2, .entries = f->death_fields };
    amqp_basic_properties_t *p = &f->env.message.properties;
    amqp_table_entry_t *e = &f->headers[p->headers.num_entries++];
    e->key = amqp_cstring_bytes("x-death");
    e->value.kind = AMQP_FIELD_KIND_ARRAY;
    e->value.value.array = (amqp_array_t){ .num_entries = 1, .entries = &f->death };
    p->_flags |= AMQP_BASIC_HEADERS_FLAG;
    p->headers.entries = f->headers;
}

START_TEST(test_producer_attempt_header_is_ignored)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    add_int_header(&f, "x-sekali-attempt", 5);
    struct sk_envelope out;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 1);

    /* Dead-lettered by some other queue, or rejected from a delay queue:
     * still not one of sekali's retry copies coming back. */
    add_death(&f, "elsewhere.delay.100", "expired");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 1);
    make(&f, "job-1", "{}");
    add_int_header(&f, "x-sekali-attempt", 5);
    add_death(&f, "q.delay.100", "rejected");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 1);
}
END_TEST

START_TEST(test_attempt_header_counts_on_a_copy_back_from_a_delay_queue)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    add_int_header(&f, "x-sekali-attempt", 3);
    add_death(&f, "q.delay.1250", "expired");
    struct sk_envelope out;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.delivery_attempt, 3);
}
END_TEST

START_TEST(test_headers_over_max_headers_are_malformed)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    char big[5000];
    memset(big, 'h', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    add_header(&f, "x-big", big);
    struct sk_envelope out;
    struct sk_err err;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_ERR);
    /* key (1 + 5), kind (1), length (4), value (4999) */
    ck_assert_str_eq(err.msg, "headers of 5010 bytes exceed max_headers 4096");
    struct sk_queue_conf roomy = queue;
    roomy.max_headers = 5010;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &roomy, &out, &err), SK_OK);
    /* x-death counts: a producer can forge one of any size, and it rides
     * on every copy sekali and the broker make. */
    add_death(&f, "q.delay.10", "expired");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &roomy, &out, &err), SK_ERR);
    ck_assert_msg(strstr(err.msg, "exceed max_headers 5010") != NULL, "%s", err.msg);
}
END_TEST

/* The sizes librabbitmq's own encoder produces, for every kind of field. */
START_TEST(test_a_stamp_older_than_the_retention_is_beyond_it)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    struct sk_queue_conf q = queue;
    q.retention_ms = 3600 * 1000;
    struct sk_envelope out;
    /* No timestamp: never beyond, whatever the time. */
    ck_assert_int_eq(sk_envelope_parse(&f.env, &q, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.published_s, 0);
    ck_assert(!sk_envelope_beyond_retention(&out, &q, UINT64_C(4000000000)));

    amqp_basic_properties_t *p = &f.env.message.properties;
    p->_flags |= AMQP_BASIC_TIMESTAMP_FLAG;
    p->timestamp = 1000000;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &q, &out, NULL), SK_OK);
    ck_assert_uint_eq(out.published_s, 1000000);
    ck_assert(!sk_envelope_beyond_retention(&out, &q, 1000000 + 3600));
    ck_assert(sk_envelope_beyond_retention(&out, &q, 1000000 + 3601));
    ck_assert(!sk_envelope_beyond_retention(&out, &q, 999000));  /* from the future */
    q.retention_ms = SK_RETENTION_FOREVER;
    ck_assert(!sk_envelope_beyond_retention(&out, &q, UINT64_C(4000000000)));
}
END_TEST

START_TEST(test_wire_sizes_match_the_encoder)
{
    amqp_field_value_t inner[2] = {
        { .kind = AMQP_FIELD_KIND_I8, .value.i8 = 1 },
        { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("abc") },
    };
    amqp_table_entry_t sub[1] = {
        { .key = amqp_cstring_bytes("d"), .value = { .kind = AMQP_FIELD_KIND_DECIMAL } },
    };
    amqp_table_entry_t e[] = {
        { .key = amqp_cstring_bytes("b"), .value = { .kind = AMQP_FIELD_KIND_BOOLEAN } },
        { .key = amqp_cstring_bytes("i16"), .value = { .kind = AMQP_FIELD_KIND_I16 } },
        { .key = amqp_cstring_bytes("u32"), .value = { .kind = AMQP_FIELD_KIND_U32 } },
        { .key = amqp_cstring_bytes("f64"), .value = { .kind = AMQP_FIELD_KIND_F64 } },
        { .key = amqp_cstring_bytes("ts"), .value = { .kind = AMQP_FIELD_KIND_TIMESTAMP } },
        { .key = amqp_cstring_bytes("v"), .value = { .kind = AMQP_FIELD_KIND_VOID } },
        { .key = amqp_cstring_bytes("x"), .value = { .kind = AMQP_FIELD_KIND_BYTES,
                                                     .value.bytes = amqp_cstring_bytes("xy") } },
        { .key = amqp_cstring_bytes("a"), .value = { .kind = AMQP_FIELD_KIND_ARRAY,
                                                     .value.array = { 2, inner } } },
        { .key = amqp_cstring_bytes("t"), .value = { .kind = AMQP_FIELD_KIND_TABLE,
                                                     .value.table = { 1, sub } } },
    };
    amqp_table_t table = { .num_entries = SK_ARRAY_LEN(e), .entries = e };
    char buf[1024];
    size_t offset = 0;
    ck_assert_int_eq(amqp_encode_table((amqp_bytes_t){ sizeof(buf), buf }, &table, &offset),
                     AMQP_STATUS_OK);
    /* amqp_encode_table() writes the table's 4-byte length too. */
    ck_assert_uint_eq(sk_broker_table_size(&table) + 4, offset);

    amqp_basic_properties_t p = {
        ._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG |
                  AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
                  AMQP_BASIC_REPLY_TO_FLAG,
        .message_id = amqp_cstring_bytes("job-1"), .type = amqp_cstring_bytes("t"),
        .reply_to = amqp_cstring_bytes("r"), .headers = table, .delivery_mode = 2,
    };
    /* flags 2, id 6, type 2, reply_to 2, headers 4 + table, mode 1, time 8 */
    ck_assert_uint_eq(sk_broker_properties_size(&p), 25 + sk_broker_table_size(&table));
}
END_TEST

START_TEST(test_unused_optional_properties_do_not_fail_a_job)
{
    struct fixture f;
    make(&f, "job-1", "{}");
    amqp_basic_properties_t *p = &f.env.message.properties;
    p->_flags |= AMQP_BASIC_CORRELATION_ID_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
    p->correlation_id = amqp_cstring_bytes("");
    p->content_type = amqp_cstring_bytes("text/\xff");
    struct sk_envelope out;
    struct sk_err err;
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_OK);
    ck_assert_str_eq(out.content_type, "");
    ck_assert_str_eq(out.correlation_id, "");

    /* Without a reply the correlation id is not used at all. */
    p->correlation_id = amqp_cstring_bytes("c\xfe");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_OK);
    /* With one, it must be text the reply can carry. */
    p->_flags |= AMQP_BASIC_REPLY_TO_FLAG;
    p->reply_to = amqp_cstring_bytes("replies");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "correlation_id is not valid UTF-8");
    p->correlation_id = amqp_cstring_bytes("");
    ck_assert_int_eq(sk_envelope_parse(&f.env, &queue, &out, &err), SK_OK);
    ck_assert_str_eq(out.reply_to, "replies");
    ck_assert_str_eq(out.correlation_id, "");
}
END_TEST

START_TEST(test_replies_to_sekali_and_broker_queues_are_refused)
{
    struct sk_queue_conf queues[2] = { { .name = "billing" }, { .name = "mail" } };
    struct sk_conf conf = { .queues = queues, .n_queues = 2 };
    static const char *const refused[] = {
        "billing", "mail", "billing.dead", "mail.delay.10", "billing.delay.",
        "amq.gen-123", "amq.direct",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(refused); i++)
        ck_assert_msg(sk_envelope_reply_refused(refused[i], &conf) != NULL,
                      "a reply to %s should be refused", refused[i]);
    static const char *const allowed[] = {
        "billing.replies", "billing.deadline", "mailbox", "amq.rabbitmq.reply-to",
        "amq.rabbitmq.reply-to.g1h2AA5yZXBseUAyODQ0MDkxMw==.z6OCh", "replies",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(allowed); i++)
        ck_assert_msg(sk_envelope_reply_refused(allowed[i], &conf) == NULL,
                      "a reply to %s should be allowed", allowed[i]);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_keys_default_to_the_message_id,
        test_headers_override_keys_and_resource_defaults_to_idempotency_key,
        test_redelivery_and_delivery_count_set_the_attempt,
        test_first_failure_is_read_only_from_a_retry_copy,
        test_bad_messages_get_a_reason,
        test_unknown_job_type_is_rejected_when_types_are_listed,
        test_valid_multibyte_keys_pass,
        test_producer_attempt_header_is_ignored,
        test_attempt_header_counts_on_a_copy_back_from_a_delay_queue,
        test_headers_over_max_headers_are_malformed,
        test_a_stamp_older_than_the_retention_is_beyond_it,
        test_wire_sizes_match_the_encoder,
        test_unused_optional_properties_do_not_fail_a_job,
        test_replies_to_sekali_and_broker_queues_are_refused,
        test_acquired_count_sets_the_attempt_where_present,
        NULL,
    };
    Suite *s = suite_create("envelope");
    h_tcase(s, "parse", 0, tests);
    return h_run_suite(s);
}
