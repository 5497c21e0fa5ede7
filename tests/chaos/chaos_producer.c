/* chaos_producer.c - the chaos soak's producer: every key once, some twice.
 *
 *   chaos_producer URL QUEUE KEYS DUP_PERCENT SEED BODY [quorum[:LIMIT]] [resources:R]
 *                  [tenants:T]
 *
 * Declares QUEUE as sekalid does (with `quorum`, as sekalid declares a queue
 * of queue_type quorum and delivery_limit LIMIT) and publishes keys QUEUE-1 .. QUEUE-KEYS,
 * plus a second copy of about DUP_PERCENT % of them (a producer that retried
 * after a lost confirm), in an order shuffled with SEED so that a copy may
 * come before or long after its original. Each message is what a producer
 * sends: persistent, its own message_id, the key in x-idempotency-key, and
 * BODY (for tests/plugins/effect.c, "sleep:MS": a job that takes MS).
 * With `resources:R`, key K also carries x-resource-key QUEUE-rK%R: R
 * resources shared by every key, so that a queue's `concurrency` (or its
 * plain resource lock) really has jobs to hold back. With `tenants:T`, key K
 * carries x-tenant tK%T, so that a queue's lanes all have jobs to forward.
 *
 * A separate process from the one that injects faults, so that publishing
 * is never held up by them. Publishing uses confirms with a window (as
 * tests/bench/bench_amqp.c does, for the same reason: a confirm per message
 * would measure the broker's fsync). Prints "published=N keys=K copies=C"
 * on stdout; errors go to stderr with exit status 1. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#define CHANNEL 1
#define WINDOW  1000  /* unconfirmed messages in flight, at most */

struct job {
    uint32_t key;
    uint32_t copy;
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void check_reply(amqp_rpc_reply_t reply, const char *what);
static amqp_connection_state_t connect_url(const char *url);
static void declare(amqp_connection_state_t conn, const char *queue, const char *type);
static void publish(amqp_connection_state_t conn, const char *queue, const struct job *job,
                    const char *body);
static void wait_confirms(amqp_connection_state_t conn, unsigned char *acked, uint64_t *confirmed,
                          uint64_t published, uint64_t below);
static uint64_t parse_u32(const char *s, const char *what, uint64_t max);
static uint64_t next_random(uint64_t *state);
static uint64_t resources;  /* 0: no x-resource-key */
static uint64_t tenants;    /* 0: no x-tenant */

int main(int argc, char **argv)
{
    if (argc < 7 || argc > 10) {
        fprintf(stderr, "usage: chaos_producer URL QUEUE KEYS DUP_PERCENT SEED BODY "
                        "[quorum[:LIMIT]] [resources:R] [tenants:T]\n");
        return 2;
    }
    const char *type = NULL;
    for (int i = 7; i < argc; i++) {
        if (strncmp(argv[i], "resources:", 10) == 0)
            resources = parse_u32(argv[i] + 10, "resources:R", 1000000);
        else if (strncmp(argv[i], "tenants:", 8) == 0)
            tenants = parse_u32(argv[i] + 8, "tenants:T", 1000000);
        else
            type = argv[i];
    }
    const char *queue = argv[2];
    uint64_t keys = parse_u32(argv[3], "KEYS", 10000000);
    uint64_t percent = parse_u32(argv[4], "DUP_PERCENT", 100);
    uint64_t seed = parse_u32(argv[5], "SEED", UINT32_MAX) | 1;
    if (keys == 0)
        die("KEYS must be at least 1");

    /* The copies are chosen and the order shuffled up front, so that the
     * same seed gives the same stream. */
    struct job *jobs = malloc(sizeof(*jobs) * (size_t)keys * 2);
    if (jobs == NULL)
        die("out of memory for %" PRIu64 " jobs", keys * 2);
    uint64_t n = 0, copies = 0;
    for (uint64_t k = 1; k <= keys; k++) {
        jobs[n++] = (struct job){ .key = (uint32_t)k, .copy = 1 };
        if (next_random(&seed) % 100 < percent) {
            jobs[n++] = (struct job){ .key = (uint32_t)k, .copy = 2 };
            copies++;
        }
    }
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = next_random(&seed) % (i + 1);
        struct job t = jobs[i];
        jobs[i] = jobs[j];
        jobs[j] = t;
    }

    amqp_connection_state_t conn = connect_url(argv[1]);
    declare(conn, queue, type);
    amqp_confirm_select(conn, CHANNEL);
    check_reply(amqp_get_rpc_reply(conn), "confirm.select");
    uint64_t confirmed = 0;
    unsigned char *acked = calloc(n + 1, 1);
    if (acked == NULL)
        die("out of memory for %" PRIu64 " confirms", n);
    for (uint64_t i = 0; i < n; i++) {
        publish(conn, queue, &jobs[i], argv[6]);
        if (i + 1 - confirmed >= WINDOW)
            wait_confirms(conn, acked, &confirmed, i + 1, i + 1 - WINDOW / 2);
    }
    wait_confirms(conn, acked, &confirmed, n, n);
    printf("published=%" PRIu64 " keys=%" PRIu64 " copies=%" PRIu64 "\n", n, keys, copies);

    free(acked);
    free(jobs);
    amqp_channel_close(conn, CHANNEL, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
    return 0;
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("chaos_producer: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void check_reply(amqp_rpc_reply_t reply, const char *what)
{
    switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        return;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        die("%s: %s", what, amqp_error_string2(reply.library_error));
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        die("%s: the broker refused (method 0x%08x)", what, reply.reply.id);
    default:
        die("%s: no reply", what);
    }
}

static amqp_connection_state_t connect_url(const char *url)
{
    char *copy = strdup(url);
    struct amqp_connection_info info;
    if (copy == NULL || amqp_parse_url(copy, &info) != AMQP_STATUS_OK)
        die("cannot parse AMQP URL %s", url);
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *socket = amqp_tcp_socket_new(conn);
    if (socket == NULL)
        die("amqp_tcp_socket_new failed");
    struct timeval timeout = { .tv_sec = 10 };
    int status = amqp_socket_open_noblock(socket, info.host, info.port, &timeout);
    if (status != AMQP_STATUS_OK)
        die("connect to %s:%d: %s", info.host, info.port, amqp_error_string2(status));
    amqp_set_rpc_timeout(conn, &timeout);
    check_reply(amqp_login(conn, info.vhost, 0, AMQP_DEFAULT_FRAME_SIZE, 0,
                           AMQP_SASL_METHOD_PLAIN, info.user, info.password),
                "amqp_login");
    amqp_channel_open(conn, CHANNEL);
    check_reply(amqp_get_rpc_reply(conn), "channel.open");
    free(copy);
    return conn;
}

/* Keep in step with sk_broker_declare() in src/adapters/broker_queue.c (a
 * classic or quorum queue with its dead-letter queue): a difference would
 * make sekalid's own declare fail with PRECONDITION_FAILED. */
static void declare(amqp_connection_state_t conn, const char *queue, const char *type)
{
    char dead[512];
    snprintf(dead, sizeof(dead), "%s.dead", queue);
    /* In a cluster a classic queue lives on one node: with that node down,
     * declaring it fails and no worker could consume the work queue again.
     * The dead letters get a quorum queue too (sekalid's own declare, with
     * no arguments, finds it and accepts it). */
    amqp_table_entry_t quorum_dead = {
        .key = amqp_cstring_bytes("x-queue-type"),
        .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("quorum") } };
    amqp_table_t dead_args = { .num_entries = 1, .entries = &quorum_dead };
    amqp_queue_declare(conn, CHANNEL, amqp_cstring_bytes(dead), 0, 1, 0, 0,
                       type != NULL ? dead_args : amqp_empty_table);
    check_reply(amqp_get_rpc_reply(conn), "queue.declare(dead letters)");
    amqp_table_entry_t args[6] = {
        { .key = amqp_cstring_bytes("x-dead-letter-exchange"),
          .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("") } },
        { .key = amqp_cstring_bytes("x-dead-letter-routing-key"),
          .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes(dead) } },
    };
    int n = 2;
    if (type != NULL) {
        uint64_t limit = 0;
        if (strncmp(type, "quorum", 6) != 0 || (type[6] != '\0' && type[6] != ':'))
            die("the queue type must be quorum or quorum:LIMIT, got %s", type);
        if (type[6] == ':')
            limit = parse_u32(type + 7, "LIMIT", 1000000);
        static const char *const quorum[][2] = {
            { "x-queue-type", "quorum" },
            { "x-dead-letter-strategy", "at-least-once" },
            { "x-overflow", "reject-publish" },
        };
        for (size_t i = 0; i < 3; i++)
            args[n++] = (amqp_table_entry_t){
                .key = amqp_cstring_bytes(quorum[i][0]),
                .value = { .kind = AMQP_FIELD_KIND_UTF8,
                           .value.bytes = amqp_cstring_bytes(quorum[i][1]) } };
        if (limit > 0)
            args[n++] = (amqp_table_entry_t){
                .key = amqp_cstring_bytes("x-delivery-limit"),
                .value = { .kind = AMQP_FIELD_KIND_I64, .value.i64 = (int64_t)limit } };
    }
    amqp_table_t table = { .num_entries = n, .entries = args };
    amqp_queue_declare(conn, CHANNEL, amqp_cstring_bytes(queue), 0, 1, 0, 0, table);
    check_reply(amqp_get_rpc_reply(conn), "queue.declare");
}

static void publish(amqp_connection_state_t conn, const char *queue, const struct job *job,
                    const char *body)
{
    char key[300], id[320], resource[320], tenant[32];
    snprintf(key, sizeof(key), "%s-%" PRIu32, queue, job->key);
    snprintf(id, sizeof(id), "%s/%" PRIu32, key, job->copy);
    snprintf(resource, sizeof(resource), "%s-r%" PRIu64, queue,
             resources > 0 ? job->key % resources : 0);
    snprintf(tenant, sizeof(tenant), "t%" PRIu64, tenants > 0 ? job->key % tenants : 0);
    amqp_table_entry_t headers[3] = {
        { .key = amqp_cstring_bytes("x-idempotency-key"),
          .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes(key) } },
    };
    size_t n = 1;
    if (resources > 0)
        headers[n++] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("x-resource-key"),
            .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes(resource) } };
    if (tenants > 0)
        headers[n++] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("x-tenant"),
            .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes(tenant) } };
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                  AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG,
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
        .message_id = amqp_cstring_bytes(id),
        .type = amqp_cstring_bytes("chaos"),
        .content_type = amqp_cstring_bytes("text/plain"),
        .headers = { .num_entries = (int)n, .entries = headers },
    };
    int status = amqp_basic_publish(conn, CHANNEL, amqp_empty_bytes, amqp_cstring_bytes(queue),
                                    1, 0, &props, amqp_cstring_bytes(body));
    if (status != AMQP_STATUS_OK)
        die("basic.publish to %s: %s", queue, amqp_error_string2(status));
}

/* Reads the broker's acks until every tag up to `below` is confirmed. Acks
 * may be "multiple" and may come out of order, so each tag is marked and
 * `confirmed` is the end of the unbroken run; a nack or a return is fatal. */
static void wait_confirms(amqp_connection_state_t conn, unsigned char *acked, uint64_t *confirmed,
                          uint64_t published, uint64_t below)
{
    while (*confirmed < below) {
        amqp_frame_t frame;
        struct timeval timeout = { .tv_sec = 60 };
        int status = amqp_simple_wait_frame_noblock(conn, &frame, &timeout);
        if (status != AMQP_STATUS_OK)
            die("waiting for publisher confirms (%" PRIu64 " of %" PRIu64 "): %s", *confirmed,
                published, amqp_error_string2(status));
        if (frame.frame_type != AMQP_FRAME_METHOD)
            continue;
        switch (frame.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
            amqp_basic_ack_t *ack = frame.payload.method.decoded;
            if (ack->delivery_tag > published)
                die("ack for tag %" PRIu64 " never published", ack->delivery_tag);
            uint64_t from = ack->multiple ? *confirmed + 1 : ack->delivery_tag;
            for (uint64_t t = from; t <= ack->delivery_tag; t++)
                acked[t] = 1;
            while (*confirmed < published && acked[*confirmed + 1])
                (*confirmed)++;
            break;
        }
        case AMQP_BASIC_NACK_METHOD:
            die("the broker nacked a message");
        case AMQP_BASIC_RETURN_METHOD:
            die("the broker returned a message (no queue?)");
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD:
            die("the broker closed the channel while we published");
        default:
            break;
        }
    }
}

static uint64_t parse_u32(const char *s, const char *what, uint64_t max)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v > max)
        die("%s must be an integer from 0 to %" PRIu64 ", got \"%s\"", what, max, s);
    return v;
}

/* xorshift64: reproducible from the seed, which is all a test stream needs. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}
