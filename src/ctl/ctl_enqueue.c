/* ctl_enqueue.c - sekalictl enqueue: one job through the outbox
 * (sekali.enqueue(), which a relay publishes) or, with --direct, straight to
 * the broker with a publisher confirm. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "broker.h"
#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_out.h"
#include "lane.h"
#include "trace_context.h"

static bool read_body(const char *arg, struct sk_message *msg, char **body);
static int enqueue_direct(const struct sk_conf *conf, const char *queue,
                          const struct sk_message *msg, bool json);
static int enqueue_outbox(const struct sk_conf *conf, const char *queue,
                          const struct sk_message *msg, const char *dedupe, const char *run_at,
                          bool json);
static bool parse_priority(const char *text, uint8_t *out);
static bool trace_ok(const struct sk_message *msg, char *state, size_t size);
static void print_job_id(const char *id, bool json);

int sk_ctl_enqueue(const struct sk_conf *conf, int argc, char **argv)
{
    struct sk_message msg = { .content_type = "application/json" };
    char id[33];  /* 128 random bits in hex */
    static const struct option options[] = {
        { "key", required_argument, NULL, 'k' },
        { "resource", required_argument, NULL, 'r' },
        { "id", required_argument, NULL, 'i' },
        { "content-type", required_argument, NULL, 't' },
        { "dedupe", required_argument, NULL, 'd' },
        { "at", required_argument, NULL, 'a' },
        { "priority", required_argument, NULL, 'p' },
        { "traceparent", required_argument, NULL, 'T' },
        { "tracestate", required_argument, NULL, 'S' },
        { "tenant", required_argument, NULL, 'n' },
        { "direct", no_argument, NULL, 'D' },
        { "json", no_argument, NULL, 'j' },
        { NULL, 0, NULL, 0 },
    };
    const char *dedupe = NULL, *run_at = NULL;
    bool direct = false, json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'k': msg.idempotency_key = optarg; break;
        case 'r': msg.resource_key = optarg; break;
        case 'i': msg.message_id = optarg; break;
        case 't': msg.content_type = optarg; break;
        case 'd': dedupe = optarg; break;
        case 'a': run_at = optarg; break;
        case 'p':
            if (!parse_priority(optarg, &msg.priority))
                return SK_CTL_USAGE;
            break;
        case 'T': msg.traceparent = optarg; break;
        case 'S': msg.tracestate = optarg; break;
        case 'n': msg.tenant = optarg; break;
        case 'D': direct = true; break;
        case 'j': json = true; break;
        default: return SK_CTL_SHOW_USAGE;
        }
    }
    if (argc - optind < 2 || argc - optind > 3)
        return SK_CTL_SHOW_USAGE;
    char state[SK_TRACESTATE_MAX + 1];
    if (!trace_ok(&msg, state, sizeof(state)))
        return SK_CTL_USAGE;
    if (msg.tracestate != NULL)
        msg.tracestate = state;
    const char *queue = argv[optind];
    msg.type = argv[optind + 1];
    if (msg.message_id == NULL) {
        /* A fresh random id per call: a retried call is a new message, and
         * only an explicit --key makes two calls the same job. */
        sk_random_hex(id, sizeof(id) - 1);
        msg.message_id = id;
    }

    char *body = NULL;
    if (!read_body(argc - optind == 3 ? argv[optind + 2] : "-", &msg, &body))
        return 1;

    int code = direct ? enqueue_direct(conf, queue, &msg, json)
                      : enqueue_outbox(conf, queue, &msg, dedupe, run_at, json);
    free(body);
    return code;
}

/* The body is the argument, or stdin for "-"; *body is what the caller frees. */
static bool read_body(const char *arg, struct sk_message *msg, char **body)
{
    if (strcmp(arg, "-") != 0) {
        msg->body = arg;
        msg->body_len = strlen(arg);
        return true;
    }
    *body = sk_ctl_read_all(stdin, &msg->body_len);
    if (*body == NULL) {
        fprintf(stderr, "sekalictl: cannot read the body from stdin\n");
        return false;
    }
    msg->body = *body;
    return true;
}

/* --direct: publish with confirms, bypassing the outbox. */
static int enqueue_direct(const struct sk_conf *conf, const char *queue,
                          const struct sk_message *msg, bool json)
{
    struct sk_broker *b = NULL;
    struct sk_err err = { 0 };
    /* A queue of the configuration is declared as sekalid declares it; any
     * other must already exist (the mandatory publish reports it if not). */
    const struct sk_queue_conf *q = sk_conf_queue(conf, queue);
    /* A tenant travels in the queue's tenant_header, and a queue with lanes
     * takes the job straight into the tenant's lane (lane.h), as the relay
     * does: no hop through the intake. */
    struct sk_message with_tenant = *msg;
    with_tenant.tenant_header = q != NULL ? q->tenant_header : SK_TENANT_HEADER_DEFAULT;
    msg = &with_tenant;
    char lane[512];
    const char *to = sk_lane_route(queue, q != NULL ? (unsigned)q->lanes : 0, msg->tenant, lane,
                                   sizeof(lane));
    int rc = sk_broker_open(&b, &conf->amqp, &err);
    if (rc == SK_OK && q != NULL) {
        struct sk_queue_shape shape = sk_conf_queue_shape(q);
        rc = sk_broker_declare(b, queue, &shape, &err);
    }
    if (rc == SK_OK)
        rc = sk_broker_confirm_select(b, &err);
    if (rc == SK_OK)
        rc = sk_broker_publish(b, to, msg, &err);
    sk_broker_close(b);
    if (rc != SK_OK) {
        fprintf(stderr, "sekalictl: enqueue to %s failed: %s\n", queue, err.msg);
        return 1;
    }
    print_job_id(msg->message_id, json);
    return 0;
}

static int enqueue_outbox(const struct sk_conf *conf, const char *queue,
                          const struct sk_message *msg, const char *dedupe, const char *run_at,
                          bool json)
{
    PGconn *pg = sk_ctl_pg_connect(conf);
    if (pg == NULL)
        return 1;
    char priority[8];
    snprintf(priority, sizeof(priority), "%u", (unsigned)msg->priority);
    /* The trace, if given, as sekali.enqueue() takes it (sql/031): set
     * first, by the materialised CTE. */
    const char *values[] = { queue, msg->type, msg->body, msg->idempotency_key, dedupe,
                             msg->resource_key, run_at, msg->priority > 0 ? priority : NULL,
                             msg->content_type,
                             msg->traceparent != NULL ? msg->traceparent : "",
                             msg->tracestate != NULL ? msg->tracestate : "", msg->tenant };
    const int lengths[] = { 0, 0, (int)msg->body_len, 0, 0, 0, 0, 0, 0, 0, 0, 0 };
    const int formats[] = { 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0 };
    const struct sk_pg_stmt st = {
        .sql = "WITH t AS MATERIALIZED (SELECT set_config('sekali.traceparent', $10, true), "
               "set_config('sekali.tracestate', $11, true)) "
               "SELECT sekali.enqueue($1, $2, $3, $4, $5, $6, coalesce($7::timestamptz, now()), "
               "p_priority => $8::int, p_content_type => $9, p_tenant => $12) FROM t",
        .n_params = 12, .values = values, .lengths = lengths, .formats = formats,
        .one_row = true, .what = "sekali.enqueue",
    };
    PGresult *res;
    int code = 1;
    if (sk_ctl_pg_exec(pg, &st, &res)) {
        print_job_id(PQgetvalue(res, 0, 0), json);
        PQclear(res);
        code = 0;
    }
    PQfinish(pg);
    return code;
}

/* 0..255, AMQP's octet; a queue honours up to its max_priority (RabbitMQ
 * treats a higher one as its maximum). */
static bool parse_priority(const char *text, uint8_t *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 0 || v > 255) {
        fprintf(stderr, "sekalictl: enqueue --priority: ");
        sk_ctl_put_tstr(stderr, text);
        fprintf(stderr, " is not a number from 0 to 255\n");
        return false;
    }
    *out = (uint8_t)v;
    return true;
}

static void print_job_id(const char *id, bool json)
{
    if (json) {
        printf("{\"job_id\":");
        sk_ctl_put_jstr(stdout, id);
        printf("}\n");
    } else {
        printf("%s\n", id);
    }
}

/* --traceparent and --tracestate are checked as a worker checks them, but
 * refused here rather than dropped: the operator can fix them. The
 * tracestate is replaced by its checked form (blanks and empty members
 * gone), kept in state. */
static bool trace_ok(const struct sk_message *msg, char *state, size_t size)
{
    char trace_id[SK_TRACE_ID_LEN + 1], parent_id[SK_SPAN_ID_LEN + 1];
    uint8_t flags;
    const char *why = NULL;
    bool cut = false;
    if (msg->tracestate != NULL && msg->traceparent == NULL)
        why = "--tracestate needs --traceparent";
    else if (msg->traceparent != NULL &&
             !sk_trace_parse_parent(msg->traceparent, strlen(msg->traceparent), trace_id,
                                    parent_id, &flags, &why))
        ;
    else if (msg->tracestate != NULL &&
             (!sk_trace_check_state(msg->tracestate, strlen(msg->tracestate), state, size, &cut,
                                    &why) || cut))
        why = why != NULL ? why : "tracestate is over 512 bytes";
    if (why != NULL) {
        fprintf(stderr, "sekalictl: enqueue: %s\n", why);
        return false;
    }
    return true;
}
