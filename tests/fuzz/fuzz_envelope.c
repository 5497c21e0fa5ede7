/* fuzz_envelope.c - libFuzzer harness for the envelope parser, fed what
 * librabbitmq makes of bytes off the wire.
 *
 * Input layout (tests/fuzz/envelope_seeds.c writes seeds in it):
 *   byte 0      bit 0: basic.deliver's `redelivered`;
 *               bit 1: the queue lists job_types (else it takes any type);
 *               bit 2: the queue's max_body is 16 bytes (else 1 MiB)
 *   bytes 1-2   n, big-endian: length of the properties
 *   n bytes     a basic content header's properties as sent on the wire,
 *               from the property flags on (what follows class, weight and
 *               body size in the frame)
 *   the rest    the body
 * The properties are decoded by amqp_decode_properties(), the call
 * librabbitmq makes for every content header it receives, and handed to
 * sk_envelope_parse() in an envelope as amqp_consume_message() fills it. A
 * delivery keeps copies in its pool; here the strings point into an
 * exact-size copy of the input and the header entries are moved to an
 * exact-size array, so that reading one byte past either hits ASan's redzone
 * instead of the next thing in a pool page. A parse must succeed with keys
 * that are non-empty strings, or fail with a dead-letter reason. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#include "envelope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_key(const char *what, const char *key, size_t size);

#define EXPECT(cond, ...)                                                \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "fuzz_envelope: " __VA_ARGS__);              \
            fputc('\n', stderr);                                         \
            abort();                                                     \
        }                                                                \
    } while (0)

static char *job_types[] = { "create_invoice", "refund" };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sk_queue_conf q = { .name = "fuzz", .max_body = 1024 * 1024 };
    amqp_envelope_t env;
    struct sk_envelope out;
    struct sk_err err;
    amqp_table_entry_t *entries = NULL;
    amqp_pool_t pool;
    size_t n;

    if (size < 3)
        return 0;
    n = (size_t)data[1] << 8 | data[2];
    if (n > size - 3)
        return 0;
    if (data[0] & 2) {
        q.job_types = job_types;
        q.n_job_types = SK_ARRAY_LEN(job_types);
    }
    if (data[0] & 4)
        q.max_body = 16;

    memset(&env, 0, sizeof(env));
    env.redelivered = data[0] & 1;
    env.delivery_tag = 1;
    env.exchange = amqp_cstring_bytes("");
    env.routing_key = amqp_cstring_bytes("fuzz");
    init_amqp_pool(&pool, 4096);
    amqp_bytes_t encoded = { .len = n, .bytes = malloc(n ? n : 1) };
    amqp_basic_properties_t *props = NULL;
    if (encoded.bytes == NULL)
        goto done;
    memcpy(encoded.bytes, data + 3, n);
    if (amqp_decode_properties(AMQP_BASIC_CLASS, &pool, encoded, (void **)&props) != 0)
        goto done;
    env.message.properties = *props;
    amqp_table_t *h = &env.message.properties.headers;
    if (h->num_entries > 0) {
        if ((entries = malloc((size_t)h->num_entries * sizeof(*entries))) == NULL)
            goto done;
        memcpy(entries, h->entries, (size_t)h->num_entries * sizeof(*entries));
        h->entries = entries;
    }
    env.message.body.len = size - 3 - n;
    env.message.body.bytes = (void *)(data + 3 + n);

    memset(&err, 0, sizeof(err));
    memset(&out, 0xa5, sizeof(out));  /* garbage left in a field would show */
    if (sk_envelope_parse(&env, &q, &out, &err) != SK_OK) {
        EXPECT(err.msg[0] != '\0', "refused without a dead-letter reason");
        EXPECT(memchr(out.job_type, '\0', sizeof(out.job_type)) != NULL,
               "job_type left unterminated on failure");
        goto done;
    }
    check_key("job_id", out.job_id, sizeof(out.job_id));
    check_key("idempotency_key", out.idempotency_key, sizeof(out.idempotency_key));
    check_key("resource_key", out.resource_key, sizeof(out.resource_key));
    EXPECT(memchr(out.job_type, '\0', sizeof(out.job_type)) != NULL, "job_type unterminated");
    EXPECT(memchr(out.content_type, '\0', sizeof(out.content_type)) != NULL,
           "content_type unterminated");
    EXPECT(memchr(out.reply_to, '\0', sizeof(out.reply_to)) != NULL, "reply_to unterminated");
    EXPECT(memchr(out.correlation_id, '\0', sizeof(out.correlation_id)) != NULL,
           "correlation_id unterminated");
    EXPECT(memchr(out.first_failure, '\0', sizeof(out.first_failure)) != NULL,
           "first_failure unterminated");
    EXPECT(out.body_len <= q.max_body, "body of %zu bytes passed max_body %zu", out.body_len,
           q.max_body);
    EXPECT(out.delivery_attempt >= 1 && out.scheduled_attempt >= 1 &&
           out.delivery_attempt >= out.scheduled_attempt,
           "attempts out of order: delivery %u, scheduled %u", out.delivery_attempt,
           out.scheduled_attempt);
    if (q.n_job_types > 0)
        EXPECT(strcmp(out.job_type, job_types[0]) == 0 || strcmp(out.job_type, job_types[1]) == 0,
               "type \"%s\" accepted by a queue that does not list it", out.job_type);
done:
    free(entries);
    free(encoded.bytes);
    empty_amqp_pool(&pool);
    return 0;
}

static void check_key(const char *what, const char *key, size_t size)
{
    size_t len = strnlen(key, size);

    EXPECT(len > 0 && len < size, "%s is empty or unterminated", what);
}
