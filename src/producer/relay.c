/* relay.c - the outbox relay process: committed sekali.outbox rows to
 * RabbitMQ, each published before it is marked.
 *
 * A relay claims a batch of due rows with FOR UPDATE SKIP LOCKED (so several
 * relays share the table without blocking each other), publishes each as a
 * persistent, mandatory message, waits once for the broker's confirms of the
 * whole batch, and only then marks the confirmed rows published, in the same
 * transaction as the claim. A crash between a confirm and the mark leaves
 * the rows unpublished: they are published again, and the consumer side
 * absorbs the duplicates. A message the broker cannot route (no such queue)
 * is not lost either: its row keeps publish_error and is skipped until an
 * operator clears it. So is a row AMQP cannot carry at all (a queue name or
 * job type over 255 bytes, keys too long for a frame: sql/008 refuses them
 * at enqueue, but older rows or direct INSERTs may hold them): it is refused
 * before anything of it is sent, so it never costs the connection, and the
 * rest of its batch goes on. A row the broker refuses by closing the channel
 * (a body over its max_message_size) is found by relaying the batch again
 * one row at a time, and refused alike.
 *
 * The relay sleeps on LISTEN sekali_outbox (sekali.enqueue() notifies at
 * COMMIT) and wakes at least every poll_interval for jobs whose run_at came.
 * When metrics are served, one relay at a time also samples the backlog per
 * target queue (pending rows, lag of the oldest) every SAMPLE_EVERY_MS. */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "broker.h"
#include "failpoint.h"
#include "lane.h"
#include "log.h"
#include "outage.h"
#include "pg.h"
#include "process.h"
#include "relay.h"

/* Columns of sekali.claim_outbox()'s result (sql/012), and the row's
 * priority (sql/019) and later columns after them. */
enum { COL_ID, COL_JOB_ID, COL_QUEUE, COL_JOB_TYPE, COL_BODY, COL_KEY, COL_RESOURCE,
       COL_PRIORITY, COL_CONTENT_TYPE, COL_TRACEPARENT, COL_TRACESTATE, COL_TENANT };

/* How often one of the relays samples the backlog for the metrics. */
#define SAMPLE_EVERY_MS 2000

struct relay {
    const struct sk_conf *conf;
    struct sk_slot       *slot;
    struct sk_metrics    *metrics;
    bool                  sampling;    /* the metrics are served, so the backlog is sampled */
    PGconn               *pg;
    struct sk_broker     *broker;
    struct sk_publish    *publishes;   /* one per row of a batch */
    struct sk_outage      outage;      /* of either connection: both are dropped together */
    int                   singly;      /* rows still to relay one per batch */
    char                  refusal[256];  /* the broker's reason for a row's refusal */
};


static bool connect_all(struct relay *r);
static int declare_queues(struct relay *r, struct sk_err *err);
static void disconnect(struct relay *r, const char *server, const char *why);
static int relay_batch(struct relay *r, int *claimed);
static PGresult *claim_rows(struct relay *r);
static int publish_rows(struct relay *r, PGresult *rows, int n);
static int mark_rows(struct relay *r, PGresult *rows, int n);
static void count_rows(struct relay *r, PGresult *rows, int n);
static uint64_t row_id(PGresult *rows, int i);
static uint8_t  row_priority(PGresult *rows, int i);
static void sample_backlog(struct relay *r);
static void lost(struct relay *r, const char *what, const struct sk_err *err);
static void wait_for_work(struct relay *r);
static bool take_notifies(struct relay *r);

int sk_relay_run(const struct sk_conf *conf, struct sk_slot *slot, struct sk_metrics *metrics)
{
    struct relay r = { .conf = conf, .slot = slot, .metrics = metrics,
                       .sampling = conf->metrics.listen_host != NULL,
                       .publishes = calloc((size_t)conf->outbox.batch, sizeof(*r.publishes)),
                       .outage = SK_OUTAGE_INIT(100, 10000) };
    if (r.publishes == NULL) {
        sk_log_error("outbox relay: out of memory for a batch of %d", conf->outbox.batch);
        return SK_EXIT_RUNTIME;
    }
    sk_log_event(SK_LOG_INFO, SK_EVENT_STARTED, NULL, NULL, "outbox relay started");
    while (!sk_process_stopping()) {
        atomic_store(&slot->alive_ms, sk_now_ms());
        if (!connect_all(&r))
            continue;
        int claimed = 0;
        int rc = relay_batch(&r, &claimed);
        if (rc == SK_AGAIN) {
            sk_outage_failed(&r.outage);
            sk_sleep_ms(sk_outage_wait_ms(&r.outage));
            continue;
        }
        sk_metrics_relay_round(metrics);
        if (r.sampling && sk_metrics_outbox_sample_due(metrics, SAMPLE_EVERY_MS))
            sample_backlog(&r);
        /* Between batches the broker hears nothing from librabbitmq. */
        struct sk_err err = { 0 };
        if (r.broker != NULL && sk_broker_keepalive(r.broker, &err) != SK_OK)
            disconnect(&r, SK_SERVER_RABBITMQ, err.msg);
        /* A full batch means more may be waiting: go on at once. */
        if (claimed < conf->outbox.batch && r.pg != NULL)
            wait_for_work(&r);
    }
    disconnect(&r, NULL, NULL);
    free(r.publishes);
    sk_log_event(SK_LOG_INFO, SK_EVENT_STOPPING, NULL, NULL, "outbox relay stopping");
    return SK_EXIT_OK;
}

static bool connect_all(struct relay *r)
{
    struct sk_err err = { 0 };
    if (r->pg == NULL) {
        r->pg = sk_pg_dial(&r->conf->postgres, "sekali outbox relay", &err);
        if (r->pg != NULL && sk_pg_run(r->pg, "LISTEN sekali_outbox", &err) != SK_OK) {
            PQfinish(r->pg);
            r->pg = NULL;
        }
    }
    if (r->pg != NULL && r->broker == NULL &&
        (sk_broker_open(&r->broker, &r->conf->amqp, &err) != SK_OK ||
         declare_queues(r, &err) != SK_OK ||
         sk_broker_confirm_select(r->broker, &err) != SK_OK)) {
        sk_broker_close(r->broker);
        r->broker = NULL;
    }
    if (r->pg != NULL && r->broker != NULL) {
        if (sk_outage_ok(&r->outage))
            sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, NULL, NULL,
                         "outbox relay connected again");
        atomic_store(&r->slot->consuming, 1);
        return true;
    }
    if (sk_outage_failed(&r->outage))
        sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN,
                     r->pg == NULL ? SK_SERVER_POSTGRES : SK_SERVER_RABBITMQ, NULL,
                     "outbox relay cannot connect, retrying with backoff: %s", err.msg);
    sk_sleep_ms(sk_outage_wait_ms(&r->outage));
    return false;
}

/* The configured queues are declared as their workers declare them, so a
 * job enqueued before any worker ran is routable; a queue sekalid does not
 * serve must exist already (else its rows get publish_error). */
static int declare_queues(struct relay *r, struct sk_err *err)
{
    for (size_t i = 0; i < r->conf->n_queues; i++) {
        const struct sk_queue_conf *q = &r->conf->queues[i];
        struct sk_queue_shape shape = sk_conf_queue_shape(q);
        int rc = sk_broker_declare(r->broker, q->name, &shape, err);
        if (rc != SK_OK)
            return rc;
    }
    return SK_OK;
}

/* why (and the server that failed, or NULL) when a connection failed: an
 * outage begins, and the caller backs off before connecting again. NULL at
 * the end: a plain close. */
static void disconnect(struct relay *r, const char *server, const char *why)
{
    if (why != NULL && sk_outage_begin(&r->outage))
        sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, server, NULL,
                     "outbox relay lost a connection: %s", why);
    atomic_store(&r->slot->consuming, 0);
    sk_broker_close(r->broker);
    r->broker = NULL;
    PQfinish(r->pg);
    r->pg = NULL;
}

/* One transaction: claim due rows, publish them all, wait once for the
 * broker's confirms, mark them. SK_OK (with *claimed rows), or SK_AGAIN
 * after a connection failed (the transaction rolled back; nothing marked,
 * everything published so far will be published again). */
static int relay_batch(struct relay *r, int *claimed)
{
    PGresult *rows = claim_rows(r);
    if (rows == NULL)
        return SK_AGAIN;
    int n = PQntuples(rows);
    int rc = publish_rows(r, rows, n);
    if (rc == SK_OK)
        rc = mark_rows(r, rows, n);
    if (rc == SK_OK)
        count_rows(r, rows, n);
    PQclear(rows);
    /* Nacked rows come back at the next claim: not before the backoff,
     * or a queue electing its leader would be asked in a loop. */
    int nacked = 0;
    for (int i = 0; rc == SK_OK && i < n; i++)
        nacked += r->publishes[i].rc == SK_AGAIN;
    if (nacked > 0) {
        sk_log_warn("%d outbox rows nacked by the broker (a quorum queue without a leader, or "
                    "a full queue), left to publish again", nacked);
        sk_outage_pause(&r->outage);
        sk_sleep_ms(sk_outage_wait_ms(&r->outage));
    }
    if (rc == SK_OK && r->singly > 0)
        r->singly = n > 0 ? r->singly - n : 0;
    /* One at a time, a batch is never full: yet more may be waiting. */
    *claimed = r->singly > 0 ? r->conf->outbox.batch : n;
    return rc;
}

/* BEGIN, and the due rows locked for this relay alone, in one round trip;
 * NULL after a failure (disconnected). Results are binary: ids are int8 in
 * network order, texts as they are. */
static PGresult *claim_rows(struct relay *r)
{
    char limit[16];
    snprintf(limit, sizeof(limit), "%d", r->singly > 0 ? 1 : r->conf->outbox.batch);
    const char *params[] = { limit };
    const struct sk_pg_stmt steps[] = {
        { .sql = "BEGIN" },
        /* The priority, content type and trace context are read beside
         * claim_outbox()'s columns rather than added to them: the function
         * keeps its signature, and its rows their order (a projection of
         * the function scan). Through volatile functions, not subqueries:
         * see sql/019. */
        { .sql = "SELECT c.*, sekali.outbox_priority(c.id), sekali.outbox_content_type(c.id), "
                 "sekali.outbox_traceparent(c.id), sekali.outbox_tracestate(c.id), "
                 "sekali.outbox_tenant(c.id) "
                 "FROM sekali.claim_outbox($1) c",
          .n_params = 1, .values = params,
          .binary = 1, .what = "sekali.claim_outbox" },
    };
    struct sk_err err = { 0 };
    PGresult *rows = NULL;
    if (sk_pg_pipeline(r->pg, steps, 2, &rows, &err) == SK_OK && rows != NULL)
        return rows;
    PQclear(rows);
    lost(r, "claiming outbox rows", &err);
    return NULL;
}

/* Publishes every row, then waits for all their confirms at once: the
 * broker writes a batch of persistent messages to disk together, which one
 * confirm at a time would spread over one disk write each. Fills
 * r->publishes[i] with row i's outcome. */
static int publish_rows(struct relay *r, PGresult *rows, int n)
{
    struct sk_err err = { 0 };
    for (int i = 0; i < n; i++) {
        const char *tenant = PQgetisnull(rows, i, COL_TENANT) ? NULL
                                                                : PQgetvalue(rows, i, COL_TENANT);
        /* A queue with lanes served here takes the row straight into its
         * tenant's lane, as the intake's forward would, without the hop. */
        const char *queue = PQgetvalue(rows, i, COL_QUEUE);
        const struct sk_queue_conf *q = sk_conf_queue(r->conf, queue);
        char lane[512];
        const char *to = sk_lane_route(queue, q != NULL ? (unsigned)q->lanes : 0, tenant, lane,
                                       sizeof(lane));
        struct sk_message msg = {
            .message_id = PQgetvalue(rows, i, COL_JOB_ID),
            .type = PQgetvalue(rows, i, COL_JOB_TYPE),
            /* NULL: what every row was published as before sql/032. */
            .content_type = PQgetisnull(rows, i, COL_CONTENT_TYPE)
                                ? "application/octet-stream"
                                : PQgetvalue(rows, i, COL_CONTENT_TYPE),
            .idempotency_key = PQgetvalue(rows, i, COL_KEY),
            .resource_key = PQgetisnull(rows, i, COL_RESOURCE) ? NULL
                                                                : PQgetvalue(rows, i, COL_RESOURCE),
            .body = PQgetvalue(rows, i, COL_BODY),
            .body_len = (size_t)PQgetlength(rows, i, COL_BODY),
            .priority = row_priority(rows, i),
            .traceparent = PQgetisnull(rows, i, COL_TRACEPARENT)
                ? NULL : PQgetvalue(rows, i, COL_TRACEPARENT),
            .tracestate = PQgetisnull(rows, i, COL_TRACESTATE)
                ? NULL : PQgetvalue(rows, i, COL_TRACESTATE),
            .tenant = tenant,
            .tenant_header = q != NULL ? q->tenant_header : SK_TENANT_HEADER_DEFAULT,
        };
        /* A row AMQP cannot carry is refused, not retried: it would fail
         * the same way on every connection, and hold up every row after it. */
        int rc = sk_broker_publish_async(r->broker, to, &msg, &r->publishes[i], &err);
        if (rc == SK_AGAIN) {
            disconnect(r, SK_SERVER_RABBITMQ, err.msg);
            return SK_AGAIN;
        }
    }
    if (n > 0 && sk_broker_await_confirms(r->broker, r->publishes, n, &err) != SK_OK) {
        if (!sk_broker_channel_refused(r->broker)) {
            disconnect(r, SK_SERVER_RABBITMQ, err.msg);
            return SK_AGAIN;
        }
        /* The broker refused one of the rows by closing the channel, which
         * does not say which. Alone in its batch, it is that row: refused,
         * and its transaction goes on to mark it. Otherwise the rows of the
         * batch are relayed again one at a time, to find it (those it took
         * before closing arrive twice, which consumers absorb). */
        if (n == 1) {
            sk_log_event(SK_LOG_WARN, SK_EVENT_RELAY_REFUSED, SK_SERVER_RABBITMQ, NULL,
                         "outbox relay: the broker refused row %" PRIu64 ": %s",
                         row_id(rows, 0), err.msg);
            snprintf(r->refusal, sizeof(r->refusal), "%s", err.msg);
            r->publishes[0].settled = true;
            r->publishes[0].rc = SK_ERR;
            r->publishes[0].why = r->refusal;
            sk_broker_close(r->broker);  /* its channel is gone; PostgreSQL stays */
            r->broker = NULL;
            return SK_OK;
        }
        r->singly = n;
        disconnect(r, SK_SERVER_RABBITMQ, err.msg);
        return SK_AGAIN;
    }
    return SK_OK;
}

/* Marks the confirmed rows published with one UPDATE, each refused row with
 * its publish_error, and commits. A nacked row is neither: its claim ends
 * with the COMMIT and the next poll publishes it again (the broker's
 * queue could not take it yet; nothing is wrong with the row). */
static int mark_rows(struct relay *r, PGresult *rows, int n)
{
    /* "{id,id,...}": at most 20 digits and a comma per id, and the braces. */
    char *ids = malloc((size_t)n * 21 + 3);
    if (ids == NULL) {
        disconnect(r, NULL, "out of memory marking outbox rows");
        return SK_AGAIN;
    }
    size_t len = 0;
    int confirmed = 0;
    ids[len++] = '{';
    for (int i = 0; i < n; i++) {
        sk_failpoint("after_publish", PQgetvalue(rows, i, COL_KEY));
        if (r->publishes[i].rc != SK_OK)
            continue;
        len += (size_t)sprintf(ids + len, "%s%" PRIu64, confirmed++ > 0 ? "," : "",
                               row_id(rows, i));
    }
    memcpy(ids + len, "}", 2);

    struct sk_err err = { 0 };
    bool ok = true;
    if (confirmed > 0) {
        const char *params[] = { ids };
        const struct sk_pg_stmt mark = { .sql = "SELECT sekali.mark_outbox($1)", .n_params = 1,
                                         .values = params, .what = "sekali.mark_outbox" };
        ok = sk_pg_exec(r->pg, &mark, NULL, &err) == SK_OK;
    }
    free(ids);
    for (int i = 0; ok && i < n; i++) {
        if (r->publishes[i].rc != SK_ERR)
            continue;
        char id[24];
        snprintf(id, sizeof(id), "%" PRIu64, row_id(rows, i));
        sk_log_error("outbox row %s for queue %s not published: %s", id,
                     PQgetvalue(rows, i, COL_QUEUE), r->publishes[i].why);
        const char *params[] = { id, r->publishes[i].why };
        const struct sk_pg_stmt refuse = { .sql = "SELECT sekali.refuse_outbox($1, $2)",
                                           .n_params = 2, .values = params,
                                           .what = "sekali.refuse_outbox" };
        ok = sk_pg_exec(r->pg, &refuse, NULL, &err) == SK_OK;
    }
    if (ok)
        ok = sk_pg_run(r->pg, "COMMIT", &err) == SK_OK;
    if (!ok) {
        lost(r, "marking published outbox rows", &err);
        return SK_AGAIN;
    }
    return SK_OK;
}

/* Counted once committed: a row published again after a failed commit is
 * counted once, when it is marked. */
static void count_rows(struct relay *r, PGresult *rows, int n)
{
    for (int i = 0; i < n; i++) {
        struct sk_metrics_outq *oq =
            sk_metrics_outbox_lookup(r->metrics, PQgetvalue(rows, i, COL_QUEUE));
        if (r->publishes[i].rc == SK_OK)
            sk_metrics_outbox_published(oq);
        else if (r->publishes[i].rc == SK_ERR)
            sk_metrics_outbox_unroutable(oq);
    }
}

/* sekali.enqueue() keeps it within 0..255; NULL is none (0 to the broker). */
static uint8_t row_priority(PGresult *rows, int i)
{
    if (PQgetisnull(rows, i, COL_PRIORITY) || PQgetlength(rows, i, COL_PRIORITY) != 4)
        return 0;
    uint32_t raw;
    memcpy(&raw, PQgetvalue(rows, i, COL_PRIORITY), sizeof(raw));
    uint32_t v = be32toh(raw);
    return v > UINT8_MAX ? UINT8_MAX : (uint8_t)v;
}

static uint64_t row_id(PGresult *rows, int i)
{
    uint64_t raw;
    memcpy(&raw, PQgetvalue(rows, i, COL_ID), sizeof(raw));
    return be64toh(raw);
}

/* The backlog per target queue, for the lag and pending gauges. Cheap while
 * the outbox keeps up (see sekali.outbox_backlog(), sql/012). */
static void sample_backlog(struct relay *r)
{
    const struct sk_pg_stmt st = { .sql = "SELECT * FROM sekali.outbox_backlog()" };
    struct sk_err err = { 0 };
    PGresult *res;
    if (sk_pg_exec(r->pg, &st, &res, &err) != SK_OK) {
        lost(r, "sampling the outbox backlog", &err);
        return;
    }
    int n = PQntuples(res);
    struct sk_outbox_backlog *backlog = calloc((size_t)n + 1, sizeof(*backlog));
    if (backlog != NULL) {
        for (int i = 0; i < n; i++)
            backlog[i] = (struct sk_outbox_backlog){
                .queue = PQgetvalue(res, i, 0),
                .pending = strtoull(PQgetvalue(res, i, 1), NULL, 10),
                .failed_rows = strtoull(PQgetvalue(res, i, 2), NULL, 10),
                .lag_ms = strtoull(PQgetvalue(res, i, 3), NULL, 10),
            };
        sk_metrics_outbox_backlog(r->metrics, backlog, (size_t)n);
    }
    free(backlog);
    PQclear(res);
}

/* Drops both connections after a PostgreSQL failure, saying what failed. */
static void lost(struct relay *r, const char *what, const struct sk_err *err)
{
    char why[400];
    snprintf(why, sizeof(why), "%s: %s", what, err->msg);
    disconnect(r, SK_SERVER_POSTGRES, why);
}

/* Sleeps until a NOTIFY, the poll interval, or a stop request. */
static void wait_for_work(struct relay *r)
{
    /* A NOTIFY that arrived during the batch was read by libpq along with
     * the batch's results: it waits in libpq's queue, not on the socket,
     * and poll() would sleep through it. */
    if (take_notifies(r))
        return;
    /* While the backlog is sampled, wake for the samples as well: rows whose
     * run_at came are due, and lagging, without any NOTIFY. And wake in time
     * to keep the broker connection alive (sk_broker_keepalive() sends at
     * half the heartbeat). */
    int64_t timeout = r->conf->outbox.poll_interval_ms;
    if (r->sampling && timeout > SAMPLE_EVERY_MS)
        timeout = SAMPLE_EVERY_MS;
    uint32_t keepalive = sk_broker_keepalive_period_ms(&r->conf->amqp);
    if (keepalive > 0 && timeout > keepalive)
        timeout = keepalive;
    struct pollfd pfd = { .fd = PQsocket(r->pg), .events = POLLIN };
    int ready = poll(&pfd, 1, (int)timeout);
    if (ready <= 0)
        return;
    if (PQconsumeInput(r->pg) != 1) {
        disconnect(r, SK_SERVER_POSTGRES, PQerrorMessage(r->pg));
        return;
    }
    take_notifies(r);
}

/* Frees the notifications libpq holds; whether there were any. */
static bool take_notifies(struct relay *r)
{
    bool any = false;
    PGnotify *note;
    while ((note = PQnotifies(r->pg)) != NULL) {
        PQfreemem(note);
        any = true;
    }
    return any;
}
