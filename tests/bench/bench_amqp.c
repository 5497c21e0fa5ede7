/* bench_amqp.c - the benchmark's RabbitMQ side: declare, publish fast,
 * publish at a fixed rate, read queue depths, delete.
 *
 *   bench_amqp URL bulk  QUEUE N                 declare QUEUE, publish N jobs
 *   bench_amqp URL rate  QUEUE N RATE CONSUMERS  declare, wait for CONSUMERS
 *                                                consumers, publish N jobs at RATE/s
 *   bench_amqp URL depth QUEUE                   "ready dead consumers" of QUEUE
 *   bench_amqp URL delete QUEUE                  delete QUEUE and QUEUE.dead
 *
 * Every job is what a producer would send: persistent, mandatory, message_id
 * and x-idempotency-key "QUEUE-i" (unique), type "bench", and as body the
 * publish time (CLOCK_REALTIME, microseconds) for tests/bench/bench_handler.c.
 * With BENCH_RANDOM_KEYS set the keys are random UUIDs instead, what most
 * producers send: scattered over the primary key's B-tree rather than
 * appended to one corner of it (tests/bench/scale.sh). With BENCH_TENANT
 * each job carries it as header x-tenant, and with BENCH_TAG its keys are
 * "QUEUE-TAG-i", so that several publishes to one queue do not share keys
 * (tests/bench/fairness.sh). `delete` deletes QUEUE.lane.0 to
 * .lane.<BENCH_LANES - 1> too, and `depth` counts their ready messages as
 * the queue's (tests/chaos/run.sh's CHAOS_LANES).
 *
 * Publishing uses publisher confirms, but never waits for each one: up to
 * WINDOW messages are in flight, and the broker's acks (often "multiple")
 * are read as they come. So publishing is not what the benchmark measures,
 * and a message is only counted once the broker has taken responsibility.
 *
 * The queues are declared exactly as src/adapters/broker_queue.c's sk_broker_declare()
 * does, so that sekalid's own declare later finds them identical (a
 * difference would fail its declare with PRECONDITION_FAILED, and the run
 * would time out loudly rather than measure a differently configured queue).
 *
 * librabbitmq directly rather than src/adapters/broker_publish.c: sk_broker_publish()
 * waits for each confirm, which is what a producer wants and what a
 * benchmark cannot afford. Prints key=value lines on stdout for run.sh;
 * errors go to stderr with exit status 1. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "amqp_lib.h"

#define CHANNEL 1
#define WINDOW  1000  /* unconfirmed messages in flight, at most */
#define BATCH   500   /* read the acks that arrived after this many publishes */

struct publisher {
    amqp_connection_state_t conn;
    const char             *queue;
    uint64_t                published;   /* delivery tags 1..published are sent */
    uint64_t                confirmed;   /* tags 1..confirmed are all acked */
    unsigned char          *acked;       /* per tag, for acks that come out of order */
    uint64_t                capacity;
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void random_uuid(char *out, size_t size);
static void check_reply(amqp_rpc_reply_t reply, const char *what);
static amqp_connection_state_t connect_url(const char *url);
static void declare(amqp_connection_state_t conn, const char *queue);
static bool depth(amqp_connection_state_t conn, const char *queue, uint32_t *ready,
                  uint32_t *consumers);
static void publish_one(struct publisher *p, uint64_t i);
static void read_acks(struct publisher *p, bool block);
static int64_t now_us(clockid_t clock);
static uint64_t parse_count(const char *s, const char *what);

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_amqp URL bulk QUEUE N | rate QUEUE N RATE CONSUMERS |"
                        " depth QUEUE | delete QUEUE\n");
        return 2;
    }
    const char *cmd = argv[2], *queue = argv[3];
    amqp_connection_state_t conn = connect_url(argv[1]);
    char dead[512];
    snprintf(dead, sizeof(dead), "%s.dead", queue);

    if (strcmp(cmd, "depth") == 0) {
        uint32_t ready = 0, dead_ready = 0, consumers = 0, unused;
        if (!depth(conn, queue, &ready, &consumers))
            die("queue %s does not exist", queue);
        if (!depth(conn, dead, &dead_ready, &unused))
            die("queue %s does not exist", dead);
        /* A lane's messages are the queue's, not yet run. */
        const char *lanes = getenv("BENCH_LANES");
        for (int i = 0; lanes != NULL && i < atoi(lanes); i++) {
            char lane[600];
            uint32_t in_lane = 0;
            snprintf(lane, sizeof(lane), "%s.lane.%d", queue, i);
            if (!depth(conn, lane, &in_lane, &unused))
                die("queue %s does not exist", lane);
            ready += in_lane;
        }
        printf("ready=%" PRIu32 " dead=%" PRIu32 " consumers=%" PRIu32 "\n", ready,
               dead_ready, consumers);
    } else if (strcmp(cmd, "delete") == 0) {
        amqp_queue_delete(conn, CHANNEL, amqp_cstring_bytes(queue), 0, 0);
        check_reply(amqp_get_rpc_reply(conn), "queue.delete");
        amqp_queue_delete(conn, CHANNEL, amqp_cstring_bytes(dead), 0, 0);
        check_reply(amqp_get_rpc_reply(conn), "queue.delete(dead letters)");
        const char *lanes = getenv("BENCH_LANES");
        for (int i = 0; lanes != NULL && i < atoi(lanes); i++) {
            char lane[600];
            snprintf(lane, sizeof(lane), "%s.lane.%d", queue, i);
            amqp_queue_delete(conn, CHANNEL, amqp_cstring_bytes(lane), 0, 0);
            check_reply(amqp_get_rpc_reply(conn), "queue.delete(lane)");
        }
    } else if ((strcmp(cmd, "bulk") == 0 && argc == 5) ||
               (strcmp(cmd, "rate") == 0 && argc == 7)) {
        bool paced = strcmp(cmd, "rate") == 0;
        uint64_t n = parse_count(argv[4], "N");
        double rate = paced ? strtod(argv[5], NULL) : 0;
        if (paced && !(rate > 0))
            die("RATE must be a positive number of messages per second");
        declare(conn, queue);

        if (paced) {
            /* Open loop from the first message on: publishing before the
             * workers consume would measure the backlog, not the pipeline. */
            uint32_t want = (uint32_t)parse_count(argv[6], "CONSUMERS"), ready, consumers = 0;
            int64_t give_up = now_us(CLOCK_MONOTONIC) + 60 * 1000000LL;
            while (depth(conn, queue, &ready, &consumers) && consumers < want) {
                if (now_us(CLOCK_MONOTONIC) > give_up)
                    die("queue %s has %" PRIu32 " consumers after 60 s, expected %" PRIu32
                        " (did sekalid start? see its log)", queue, consumers, want);
                struct timespec nap = { 0, 20 * 1000000L };
                nanosleep(&nap, NULL);
            }
        }

        amqp_confirm_select(conn, CHANNEL);
        check_reply(amqp_get_rpc_reply(conn), "confirm.select");
        struct publisher p = { .conn = conn, .queue = queue, .capacity = n + 1 };
        p.acked = calloc(n + 1, 1);
        if (p.acked == NULL)
            die("calloc(%" PRIu64 ") failed", n + 1);

        int64_t start = now_us(CLOCK_MONOTONIC), max_lag = 0;
        for (uint64_t i = 1; i <= n; i++) {
            if (paced) {
                /* Absolute deadlines, so a late message does not delay the
                 * whole schedule: the load stays at RATE on average. */
                int64_t due = start + (int64_t)((double)(i - 1) * 1e6 / rate);
                struct timespec t = { .tv_sec = due / 1000000, .tv_nsec = (due % 1000000) * 1000 };
                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
                    ;
                int64_t lag = now_us(CLOCK_MONOTONIC) - due;
                if (lag > max_lag)
                    max_lag = lag;
            }
            publish_one(&p, i);
            if (p.published - p.confirmed >= WINDOW)
                read_acks(&p, true);
            else if (paced || i % BATCH == 0)
                read_acks(&p, false);
        }
        while (p.confirmed < p.published)
            read_acks(&p, true);
        double secs = (double)(now_us(CLOCK_MONOTONIC) - start) / 1e6;
        printf("published=%" PRIu64 " seconds=%.3f rate=%.0f max_lag_ms=%.1f\n", n, secs,
               secs > 0 ? (double)n / secs : 0.0, (double)max_lag / 1000.0);
        free(p.acked);
    } else {
        die("unknown command or wrong arguments: %s", cmd);
    }

    amqp_channel_close(conn, CHANNEL, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
    return 0;
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_amqp: ", stderr);
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
        if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            amqp_channel_close_t *m = reply.reply.decoded;
            die("%s: broker closed the channel: %u %.*s", what, m->reply_code,
                (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        }
        if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            amqp_connection_close_t *m = reply.reply.decoded;
            die("%s: broker closed the connection: %u %.*s", what, m->reply_code,
                (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        }
        die("%s: unexpected server method 0x%08x", what, reply.reply.id);
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

/* Keep in step with sk_broker_declare() in src/adapters/broker_queue.c. */
static void declare(amqp_connection_state_t conn, const char *queue)
{
    char dead[512];
    snprintf(dead, sizeof(dead), "%s.dead", queue);
    amqp_queue_declare(conn, CHANNEL, amqp_cstring_bytes(dead), 0, 1, 0, 0, amqp_empty_table);
    check_reply(amqp_get_rpc_reply(conn), "queue.declare(dead letters)");

    amqp_table_entry_t args[2];
    args[0].key = amqp_cstring_bytes("x-dead-letter-exchange");
    args[0].value.kind = AMQP_FIELD_KIND_UTF8;
    args[0].value.value.bytes = amqp_cstring_bytes("");
    args[1].key = amqp_cstring_bytes("x-dead-letter-routing-key");
    args[1].value.kind = AMQP_FIELD_KIND_UTF8;
    args[1].value.value.bytes = amqp_cstring_bytes(dead);
    amqp_table_t table = { .num_entries = 2, .entries = args };
    amqp_queue_declare(conn, CHANNEL, amqp_cstring_bytes(queue), 0, 1, 0, 0, table);
    check_reply(amqp_get_rpc_reply(conn), "queue.declare");
}

/* A passive declare: false if the queue does not exist. That closes the
 * channel, so it is reopened for the caller's next command. */
static bool depth(amqp_connection_state_t conn, const char *queue, uint32_t *ready,
                  uint32_t *consumers)
{
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(conn, CHANNEL, amqp_cstring_bytes(queue),
                                                     1, 0, 0, 0, amqp_empty_table);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn);
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_ok_t close_ok = { 0 };
        amqp_send_method(conn, CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok);
        amqp_channel_open(conn, CHANNEL);
        check_reply(amqp_get_rpc_reply(conn), "channel.open");
        return false;
    }
    check_reply(reply, "queue.declare(passive)");
    *ready = ok->message_count;
    *consumers = ok->consumer_count;
    return true;
}

/* A version 4 UUID's shape from /dev/urandom: no two runs share a key. */
static void random_uuid(char *out, size_t size)
{
    static FILE *urandom;
    unsigned char b[16];
    if ((urandom == NULL && (urandom = fopen("/dev/urandom", "rb")) == NULL) ||
        fread(b, 1, sizeof(b), urandom) != sizeof(b))
        die("reading /dev/urandom: %s", strerror(errno));
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, size, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

static void publish_one(struct publisher *p, uint64_t i)
{
    char key[600], body[32];
    const char *tag = getenv("BENCH_TAG"), *tenant = getenv("BENCH_TENANT");
    if (getenv("BENCH_RANDOM_KEYS") != NULL)
        random_uuid(key, sizeof(key));
    else if (tag != NULL)
        snprintf(key, sizeof(key), "%s-%s-%" PRIu64, p->queue, tag, i);
    else
        snprintf(key, sizeof(key), "%s-%" PRIu64, p->queue, i);
    snprintf(body, sizeof(body), "%" PRId64, now_us(CLOCK_REALTIME));

    amqp_table_entry_t headers[2] = {
        { .key = amqp_cstring_bytes("x-idempotency-key"),
          .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes(key) } },
        { .key = amqp_cstring_bytes("x-tenant"),
          .value = { .kind = AMQP_FIELD_KIND_UTF8,
                     .value.bytes = amqp_cstring_bytes(tenant != NULL ? tenant : "") } },
    };
    amqp_basic_properties_t props = {
        ._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                  AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG,
        .delivery_mode = AMQP_DELIVERY_PERSISTENT,
        .message_id = amqp_cstring_bytes(key),
        .type = amqp_cstring_bytes("bench"),
        .content_type = amqp_cstring_bytes("text/plain"),
        .headers = { .num_entries = tenant != NULL ? 2 : 1, .entries = headers },
    };
    int status = amqp_basic_publish(p->conn, CHANNEL, amqp_empty_bytes,
                                    amqp_cstring_bytes(p->queue), 1, 0, &props,
                                    amqp_cstring_bytes(body));
    if (status != AMQP_STATUS_OK)
        die("basic.publish to %s: %s", p->queue, amqp_error_string2(status));
    p->published++;
}

/* Reads the frames that are there (or, if block, at least one), recording
 * acks; a nack or a returned message (no such queue) is fatal. */
static void read_acks(struct publisher *p, bool block)
{
    for (;;) {
        amqp_frame_t frame;
        struct timeval timeout = { .tv_sec = block ? 30 : 0 };
        int status = amqp_simple_wait_frame_noblock(p->conn, &frame, &timeout);
        if (status == AMQP_STATUS_TIMEOUT && !block)
            return;
        if (status != AMQP_STATUS_OK)
            die("waiting for publisher confirms (%" PRIu64 " of %" PRIu64 " confirmed): %s",
                p->confirmed, p->published, amqp_error_string2(status));
        if (frame.frame_type != AMQP_FRAME_METHOD)
            continue;
        switch (frame.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
            amqp_basic_ack_t *ack = frame.payload.method.decoded;
            if (ack->delivery_tag > p->published)
                die("ack for tag %" PRIu64 " never published", ack->delivery_tag);
            uint64_t from = ack->multiple ? p->confirmed + 1 : ack->delivery_tag;
            for (uint64_t t = from; t <= ack->delivery_tag; t++)
                p->acked[t] = 1;
            while (p->confirmed < p->published && p->acked[p->confirmed + 1])
                p->confirmed++;
            break;
        }
        case AMQP_BASIC_NACK_METHOD:
            die("the broker nacked a message on %s", p->queue);
        case AMQP_BASIC_RETURN_METHOD:
            die("the broker returned a message: no queue %s", p->queue);
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD:
            die("the broker closed the channel while we published to %s", p->queue);
        default:
            break;
        }
        /* Blocking was only needed until some progress is made. */
        if (block && p->published - p->confirmed < WINDOW)
            block = false;
    }
}

static int64_t now_us(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static uint64_t parse_count(const char *s, const char *what)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v == 0)
        die("%s must be a positive integer, got \"%s\"", what, s);
    return v;
}
