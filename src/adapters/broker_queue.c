/* broker_queue.c - the queues sekali declares and what it asks about them:
 * a work queue with its dead-letter queue (classic or quorum, or only
 * checked when someone else declares it), a retry's delay queue, and a
 * queue's depth, with or without the queue having to exist.
 *
 * Apart from consuming and publishing because every kind of caller needs
 * it over either kind of connection: workers and the relay declare before
 * they start, reschedule.c declares delay queues on the publisher,
 * sekalictl probes. A declaration must carry what every other declarer
 * sends, or the broker refuses it: the arguments are spelled here only
 * (tests/bench and tests/chaos copy them, and say so). */
#include <stdio.h>
#include <string.h>

#include "amqp_lib.h"

#include "broker.h"
#include "broker_conn.h"
#include "lane.h"
#include "log.h"

static int declare_dead(struct sk_broker *b, const char *dead, bool quorum, struct sk_err *err);
static amqp_rpc_reply_t declare_delay_as(struct sk_broker *b, const char *name,
                                         const char *queue, uint32_t delay_ms, bool quorum);
static int declare_passive(struct sk_broker *b, const char *name, struct sk_err *err);
static int declare_work(struct sk_broker *b, const char *name, const char *dead,
                        const struct sk_queue_shape *shape, struct sk_err *err);
static bool channel_closed_with(amqp_rpc_reply_t reply, uint16_t code);
static int reopen_channel(struct sk_broker *b, struct sk_err *err);
static int work_args(const struct sk_broker *b, const char *dead,
                     const struct sk_queue_shape *shape, amqp_table_entry_t *args);
static bool unlimited_by_default(const struct sk_broker *b, const struct sk_queue_shape *shape);
static bool said(amqp_rpc_reply_t reply, const char *text);

#define WORK_ARGS_MAX 7

int sk_broker_dead_name(const char *queue, char *out, size_t size, struct sk_err *err)
{
    int n = snprintf(out, size, "%s.dead", queue);
    if (n < 0 || (size_t)n >= size)
        return sk_err_set(err, SK_ERR, "queue name too long: %s", queue);
    return SK_OK;
}

int sk_broker_declare(struct sk_broker *b, const char *name, const struct sk_queue_shape *shape,
                      struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    char dead[512];
    int rc = sk_broker_dead_name(name, dead, sizeof(dead), err);
    if (rc == SK_OK)
        rc = declare_dead(b, dead, shape != NULL && shape->quorum, err);
    if (rc != SK_OK)
        return rc;
    if (shape != NULL && shape->passive)
        rc = declare_passive(b, name, err);
    else
        rc = declare_work(b, name, dead, shape, err);
    /* A queue's lanes are the queue again, each: the same type and
     * arguments, and their rejected messages go to the queue's own
     * name.dead, where an operator looks for them. */
    for (unsigned i = 0; rc == SK_OK && shape != NULL && i < shape->lanes; i++) {
        char lane[512];
        if (sk_lane_name(name, i, lane, sizeof(lane)) != 0)
            return sk_err_set(err, SK_ERR, "queue name too long for its lanes: %s", name);
        rc = shape->passive ? declare_passive(b, lane, err)
                            : declare_work(b, lane, dead, shape, err);
    }
    return rc;
}

/* A quorum work queue gets quorum dead letters: in a cluster a classic
 * queue lives on one node, and while that node is down declaring it
 * fails, so no worker could consume the work queue on the nodes left.
 * One that exists is taken as it is (a classic one from before, or
 * one an operator declared): declaring it with another type would be
 * refused. */
static int declare_dead(struct sk_broker *b, const char *dead, bool quorum, struct sk_err *err)
{
    bool dead_exists = false;
    if (quorum) {
        uint32_t messages, consumers;
        int rc = sk_broker_queue_probe(b, dead, &dead_exists, &messages, &consumers, err);
        if (rc != SK_OK)
            return rc;
    }
    if (dead_exists)
        return SK_OK;
    amqp_table_entry_t quorum_type = sk_broker_text_entry("x-queue-type", "quorum");
    amqp_table_t dead_args = { .num_entries = 1, .entries = &quorum_type };
    amqp_queue_declare(b->conn, SK_BROKER_CHANNEL, amqp_cstring_bytes(dead), 0, 1, 0, 0,
                       quorum ? dead_args : amqp_empty_table);
    return sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), "queue.declare(dead letters)", err);
}

static int declare_passive(struct sk_broker *b, const char *name, struct sk_err *err)
{
    amqp_queue_declare(b->conn, SK_BROKER_CHANNEL, amqp_cstring_bytes(name), 1, 0, 0, 0,
                       amqp_empty_table);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(b->conn);
    /* SK_AGAIN: the infrastructure tool may create it later. */
    if (channel_closed_with(reply, AMQP_NOT_FOUND))
        return sk_err_set(err, SK_AGAIN, "queue %s does not exist: with declare: passive "
                          "someone else must declare it (or set declare: auto)", name);
    return sk_broker_rpc_check(b, reply, "queue.declare(passive)", err);
}

/* The arguments of a work queue as sekali declares it, into args (room for
 * WORK_ARGS_MAX); returns how many. */
static int work_args(const struct sk_broker *b, const char *dead,
                     const struct sk_queue_shape *shape, amqp_table_entry_t *args)
{
    /* A rejected message goes to name.dead through the default exchange; the
     * broker moves it, so a dead letter cannot be lost between two queues. */
    int n_args = 0;
    args[n_args++] = sk_broker_text_entry("x-dead-letter-exchange", "");
    args[n_args++] = sk_broker_text_entry("x-dead-letter-routing-key", dead);
    if (shape != NULL && shape->quorum) {
        args[n_args++] = sk_broker_text_entry("x-queue-type", "quorum");
        /* Quorum queues drop dead letters unless told otherwise; at-least-once
         * dead-lettering requires reject-publish overflow. */
        args[n_args++] = sk_broker_text_entry("x-dead-letter-strategy", "at-least-once");
        args[n_args++] = sk_broker_text_entry("x-overflow", "reject-publish");
        if (shape->delivery_limit > 0)
            args[n_args++] = sk_broker_int_entry("x-delivery-limit", shape->delivery_limit);
        else if (unlimited_by_default(b, shape))
            args[n_args++] = sk_broker_int_entry("x-delivery-limit", -1);
    }
    /* Fixed when the queue is created: a queue that exists without it is
     * refused by the broker (see declare_work()). */
    if (shape != NULL && shape->max_priority > 0)
        args[n_args++] = sk_broker_int_entry("x-max-priority", shape->max_priority);
    return n_args;
}

/* RabbitMQ 4 limits a quorum queue to 20 deliveries unless told otherwise,
 * and would dead-letter a job handed back through an outage, or one whose
 * crashes sekali counts (max_crashes), behind sekali's back: a quorum queue
 * with no delivery_limit is declared with -1, the broker's "no limit"
 * (3.x refuses -1, and has no default). b->legacy_limit: this queue was
 * created without the argument (by an older sekali) and is taken as it is. */
static bool unlimited_by_default(const struct sk_broker *b, const struct sk_queue_shape *shape)
{
    return shape->quorum && shape->delivery_limit == 0 && sk_broker_major(b) >= 4 &&
           !b->legacy_limit;
}

/* queue.declare of a durable work queue with exactly sekali's arguments. */
static amqp_rpc_reply_t declare_as_sekali(struct sk_broker *b, const char *name,
                                          const char *dead, const struct sk_queue_shape *shape)
{
    amqp_table_entry_t args[WORK_ARGS_MAX];
    amqp_table_t table = { .num_entries = work_args(b, dead, shape, args), .entries = args };
    amqp_queue_declare(b->conn, SK_BROKER_CHANNEL, amqp_cstring_bytes(name), 0, 1, 0, 0, table);
    return amqp_get_rpc_reply(b->conn);
}

/* Said before declaring, so that the worker names the broker's version
 * rather than passing on a bare "invalid arg". */
static int quorum_priorities_refused(const struct sk_broker *b, const char *name,
                                     struct sk_err *err)
{
    return sk_err_set(err, SK_ERR, "queue %s: max_priority on a quorum queue needs RabbitMQ "
                      "4.3 or later, and this broker is %s: use queue_type: classic for "
                      "strict priorities, or drop max_priority (RabbitMQ 4's quorum queues "
                      "then have two fixed levels, priority 5 and above high)", name,
                      b->version[0] != '\0' ? b->version : "older");
}

static int declare_work(struct sk_broker *b, const char *name, const char *dead,
                        const struct sk_queue_shape *shape, struct sk_err *err)
{
    bool quorum_priorities = shape != NULL && shape->quorum && shape->max_priority > 0;
    if (quorum_priorities && !sk_broker_quorum_priorities(b))
        return quorum_priorities_refused(b, name, err);
    amqp_rpc_reply_t reply = declare_as_sekali(b, name, dead, shape);
    if (channel_closed_with(reply, AMQP_PRECONDITION_FAILED) && shape != NULL &&
        unlimited_by_default(b, shape) && said(reply, "'x-delivery-limit'") &&
        said(reply, "current is none")) {
        /* Created without a limit before sekali declared -1: consumed as it
         * is, under the broker's default (doctor fails its arguments). */
        sk_log_warn("queue %s has no x-delivery-limit: RabbitMQ's default limit applies to "
                    "it; set delivery_limit, or a delivery-limit policy", name);
        int rc = reopen_channel(b, err);
        if (rc != SK_OK)
            return rc;
        b->legacy_limit = true;
        reply = declare_as_sekali(b, name, dead, shape);
        b->legacy_limit = false;
    }
    if (channel_closed_with(reply, AMQP_PRECONDITION_FAILED)) {
        amqp_channel_close_t *m = reply.reply.decoded;
        if (quorum_priorities && said(reply, "invalid arg"))
            return quorum_priorities_refused(b, name, err);  /* a broker that gave no version */
        /* The usual way to meet this: max_priority set (or changed) on a
         * queue that already exists. RabbitMQ cannot change a queue's
         * arguments, so only a new queue (or the old one drained and
         * deleted) can have them; say so rather than only "passive". */
        if (memmem(m->reply_text.bytes, m->reply_text.len, "x-max-priority", 14) != NULL)
            return sk_err_set(err, SK_ERR, "queue %s exists with another x-max-priority than "
                              "max_priority %u asks: a queue's priorities are fixed when it is "
                              "created, so drain and delete it (or use a new queue name) to "
                              "change them, or set max_priority to what it has (%.*s)", name,
                              shape != NULL ? shape->max_priority : 0,
                              (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        return sk_err_set(err, SK_ERR, "declared by someone else with other arguments: set "
                          "declare: passive to consume it as it is (%.*s)",
                          (int)m->reply_text.len, (const char *)m->reply_text.bytes);
    }
    return sk_broker_rpc_check(b, reply, "queue.declare", err);
}

static int conforms_one(struct sk_broker *b, const char *name, const char *dead,
                        const struct sk_queue_shape *shape, bool *conforms, char *why,
                        size_t why_size, struct sk_err *err)
{
    /* The broker compares a declaration's arguments with the queue's and
     * refuses one that differs, naming the argument: the one way to read
     * them over AMQP. Equal arguments make the declaration a no-op. */
    amqp_rpc_reply_t reply = declare_as_sekali(b, name, dead, shape);
    *conforms = true;
    if (channel_closed_with(reply, AMQP_PRECONDITION_FAILED)) {
        amqp_channel_close_t *m = reply.reply.decoded;
        snprintf(why, why_size, "%s: %.*s", name, (int)m->reply_text.len,
                 (const char *)m->reply_text.bytes);
        *conforms = false;
        return reopen_channel(b, err);
    }
    return sk_broker_rpc_check(b, reply, "queue.declare(conformity)", err);
}

/* The queue, and those of its lanes that exist (a lane not there yet is
 * declared by the first worker). */
int sk_broker_queue_conforms(struct sk_broker *b, const char *name,
                             const struct sk_queue_shape *shape, bool *conforms, char *why,
                             size_t why_size, struct sk_err *err)
{
    char dead[512];
    int rc = sk_broker_dead_name(name, dead, sizeof(dead), err);
    if (rc == SK_OK)
        rc = conforms_one(b, name, dead, shape, conforms, why, why_size, err);
    for (unsigned i = 0; rc == SK_OK && *conforms && shape != NULL && i < shape->lanes; i++) {
        char lane[512];
        bool exists;
        uint32_t messages, consumers;
        if (sk_lane_name(name, i, lane, sizeof(lane)) != 0)
            return sk_err_set(err, SK_ERR, "queue name too long for its lanes: %s", name);
        rc = sk_broker_queue_probe(b, lane, &exists, &messages, &consumers, err);
        if (rc == SK_OK && exists)
            rc = conforms_one(b, lane, dead, shape, conforms, why, why_size, err);
    }
    return rc;
}

int sk_broker_queue_depth(struct sk_broker *b, const char *name, uint32_t *messages,
                          uint32_t *consumers, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(b->conn, SK_BROKER_CHANNEL,
                                                     amqp_cstring_bytes(name), 1, 0, 0, 0,
                                                     amqp_empty_table);
    int rc = sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), "queue.declare(passive)", err);
    if (rc != SK_OK)
        return rc;
    if (messages != NULL)
        *messages = ok->message_count;
    if (consumers != NULL)
        *consumers = ok->consumer_count;
    return SK_OK;
}

int sk_broker_lanes_probe(struct sk_broker *b, const char *name, unsigned lanes,
                          uint32_t *messages, uint32_t *consumers, struct sk_err *err)
{
    *messages = 0;
    *consumers = 0;
    for (unsigned i = 0; i < lanes; i++) {
        char lane[512];
        if (sk_lane_name(name, i, lane, sizeof(lane)) != 0)
            return sk_err_set(err, SK_ERR, "queue name too long for its lanes: %s", name);
        bool exists;
        uint32_t m = 0, c = 0;
        int rc = sk_broker_queue_probe(b, lane, &exists, &m, &c, err);
        if (rc != SK_OK)
            return rc;
        *messages += m;
        *consumers += c;
    }
    return SK_OK;
}

int sk_broker_queue_probe(struct sk_broker *b, const char *name, bool *exists,
                          uint32_t *messages, uint32_t *consumers, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(b->conn, SK_BROKER_CHANNEL,
                                                     amqp_cstring_bytes(name), 1, 0, 0, 0,
                                                     amqp_empty_table);
    amqp_rpc_reply_t reply = amqp_get_rpc_reply(b->conn);
    /* 404 closes only the channel: acknowledge that and open it again, so
     * that a tool can probe many names over one connection. */
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
        ((amqp_channel_close_t *)reply.reply.decoded)->reply_code == AMQP_NOT_FOUND) {
        int rc = reopen_channel(b, err);
        if (rc != SK_OK)
            return rc;
        *exists = false;
        *messages = *consumers = 0;
        return SK_OK;
    }
    int rc = sk_broker_rpc_check(b, reply, "queue.declare(passive)", err);
    if (rc != SK_OK)
        return rc;
    *exists = true;
    *messages = ok->message_count;
    *consumers = ok->consumer_count;
    return SK_OK;
}

int sk_broker_declare_delay(struct sk_broker *b, const char *queue, bool quorum,
                            uint32_t delay_ms, char *name, size_t size, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    int n = snprintf(name, size, "%s.delay.%u", queue, delay_ms);
    if (n < 0 || (size_t)n >= size)
        return sk_err_set(err, SK_ERR, "queue name too long: %s", queue);
    amqp_rpc_reply_t reply = declare_delay_as(b, name, queue, delay_ms, quorum);
    /* A classic delay queue from before they followed their work queue's
     * type: taken as it is, since a declaration with another type is
     * refused and the queue lives as long as retries keep using it. */
    if (quorum && channel_closed_with(reply, AMQP_PRECONDITION_FAILED)) {
        int rc = reopen_channel(b, err);
        if (rc != SK_OK)
            return rc;
        reply = declare_delay_as(b, name, queue, delay_ms, false);
    }
    return sk_broker_rpc_check(b, reply, "queue.declare(delay)", err);
}

/* A delay queue of a quorum work queue is a quorum queue too: a classic
 * one lives on the node that declared it, and while that node is down
 * every retry through it is refused (404, home node down) and handed back,
 * each time counted against the work queue's delivery_limit. Its expired
 * messages go back at least once, as the work queue's dead letters do. */
static amqp_rpc_reply_t declare_delay_as(struct sk_broker *b, const char *name,
                                         const char *queue, uint32_t delay_ms, bool quorum)
{
    amqp_table_entry_t args[7];
    int n = 0;
    args[n++] = sk_broker_text_entry("x-dead-letter-exchange", "");
    args[n++] = sk_broker_text_entry("x-dead-letter-routing-key", queue);
    args[n++] = sk_broker_int_entry("x-message-ttl", delay_ms);
    args[n++] = sk_broker_int_entry("x-expires", (int64_t)delay_ms + 10 * 60 * 1000);
    if (quorum) {
        args[n++] = sk_broker_text_entry("x-queue-type", "quorum");
        args[n++] = sk_broker_text_entry("x-dead-letter-strategy", "at-least-once");
        args[n++] = sk_broker_text_entry("x-overflow", "reject-publish");
    }
    amqp_table_t table = { .num_entries = n, .entries = args };
    amqp_queue_declare(b->conn, SK_BROKER_CHANNEL, amqp_cstring_bytes(name), 0, 1, 0, 0, table);
    return amqp_get_rpc_reply(b->conn);
}

/* After the broker closed the channel over a refused declaration: answer
 * close-ok and open it again, so that a tool can go on over one
 * connection. */
static int reopen_channel(struct sk_broker *b, struct sk_err *err)
{
    amqp_channel_close_ok_t close_ok = { 0 };
    if (amqp_send_method(b->conn, SK_BROKER_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok) !=
        AMQP_STATUS_OK) {
        b->broken = true;
        return sk_err_set(err, SK_AGAIN, "channel.close-ok failed");
    }
    amqp_channel_open(b->conn, SK_BROKER_CHANNEL);
    int rc = sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), "amqp_channel_open", err);
    if (rc != SK_OK)
        return rc;
    /* A new channel starts without confirms and counts its deliveries
     * from 1 again: a publisher's must be as it was. */
    if (b->confirming) {
        b->next_publish_tag = 1;
        rc = sk_broker_confirm_select(b, err);
    }
    return rc;
}

/* Whether the broker answered by closing the channel with this reply code. */
static bool channel_closed_with(amqp_rpc_reply_t reply, uint16_t code)
{
    return reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
           reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
           ((amqp_channel_close_t *)reply.reply.decoded)->reply_code == code;
}

/* Whether the broker's reply text holds text. */
static bool said(amqp_rpc_reply_t reply, const char *text)
{
    const amqp_channel_close_t *m = reply.reply.decoded;
    return memmem(m->reply_text.bytes, m->reply_text.len, text, strlen(text)) != NULL;
}
