/* outbox.c - an outbox relay process: committed sekali.outbox rows to
 * RabbitMQ, each published before it is marked.
 *
 * A relay claims due rows with FOR UPDATE SKIP LOCKED (so several relays
 * share the table without blocking each other), publishes each as a
 * persistent, mandatory message and waits for the broker's confirm, and only
 * then marks the batch published, in the same transaction as the claim. A
 * crash between a confirm and the mark leaves the rows unpublished: they are
 * published again, and the consumer side absorbs the duplicate. A message
 * the broker cannot route (no such queue) is not lost either: its row keeps
 * publish_error and is skipped until an operator clears it.
 *
 * The relay sleeps on LISTEN sekali_outbox (sekali.enqueue() notifies at
 * COMMIT) and wakes at least every poll_interval for jobs whose run_at came. */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "backoff.h"
#include "broker.h"
#include "failpoint.h"
#include "log.h"
#include "outbox.h"
#include "store.h"

struct relay {
    const struct sk_conf *conf;
    struct sk_slot       *slot;
    PGconn               *pg;
    struct sk_broker     *broker;
    struct sk_backoff     backoff;
    bool                  down_logged;
};

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int signo);
static bool connect_all(struct relay *r);
static int declare_queues(struct relay *r, struct sk_err *err);
static void disconnect(struct relay *r, const char *why);
static int relay_batch(struct relay *r, int *published);
static void wait_for_work(struct relay *r);

int sk_outbox_run(const struct sk_conf *conf, struct sk_slot *slot)
{
    struct sigaction sa = { .sa_handler = on_stop_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct relay r = { .conf = conf, .slot = slot,
                       .backoff = { .base_ms = 100, .cap_ms = 10000 } };
    sk_log_info("outbox relay started");
    while (!stop_requested) {
        atomic_store(&slot->alive_ms, sk_now_ms());
        if (!connect_all(&r))
            continue;
        int published = 0;
        int rc = relay_batch(&r, &published);
        if (rc == SK_AGAIN) {
            sk_sleep_ms(sk_backoff_next(&r.backoff));
            continue;
        }
        /* A full batch means more may be waiting: go on at once. */
        if (published < conf->outbox.batch)
            wait_for_work(&r);
    }
    disconnect(&r, NULL);
    sk_log_info("outbox relay stopping");
    return SK_EXIT_OK;
}

static void on_stop_signal(int signo)
{
    (void)signo;
    stop_requested = 1;
}

static bool connect_all(struct relay *r)
{
    struct sk_err err = { 0 };
    if (r->pg == NULL) {
        r->pg = sk_store_dial(&r->conf->postgres, "sekali outbox relay", &err);
        if (r->pg != NULL) {
            PGresult *res = PQexec(r->pg, "LISTEN sekali_outbox");
            if (PQresultStatus(res) != PGRES_COMMAND_OK)
                sk_err_set(&err, SK_AGAIN, "LISTEN: %s", PQresultErrorMessage(res));
            PQclear(res);
            if (err.msg[0] != '\0') {
                PQfinish(r->pg);
                r->pg = NULL;
            }
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
        if (r->down_logged)
            sk_log_info("outbox relay connected again");
        r->down_logged = false;
        sk_backoff_reset(&r->backoff);
        atomic_store(&r->slot->consuming, 1);
        return true;
    }
    if (!r->down_logged)
        sk_log_warn("outbox relay cannot connect, retrying with backoff: %s", err.msg);
    r->down_logged = true;
    sk_sleep_ms(sk_backoff_next(&r->backoff));
    return false;
}

/* The configured queues are declared as their workers declare them, so a
 * job enqueued before any worker ran is routable; a queue sekalid does not
 * serve must exist already (else its rows get publish_error). */
static int declare_queues(struct relay *r, struct sk_err *err)
{
    for (size_t i = 0; i < r->conf->n_queues; i++) {
        const struct sk_queue_conf *q = &r->conf->queues[i];
        struct sk_queue_shape shape = sk_broker_shape(q);
        int rc = sk_broker_declare(r->broker, q->name, &shape, err);
        if (rc != SK_OK)
            return rc;
    }
    return SK_OK;
}

static void disconnect(struct relay *r, const char *why)
{
    if (why != NULL) {
        sk_log_warn("outbox relay lost a connection: %s", why);
        r->down_logged = true;
    }
    atomic_store(&r->slot->consuming, 0);
    sk_broker_close(r->broker);
    r->broker = NULL;
    PQfinish(r->pg);
    r->pg = NULL;
}

/* One transaction: claim due rows, publish each with a confirm, mark them.
 * SK_OK (with *published rows), or SK_AGAIN after a connection failed (the
 * transaction rolled back; nothing marked, everything published so far will
 * be published again). */
static int relay_batch(struct relay *r, int *published)
{
    char limit[16];
    snprintf(limit, sizeof(limit), "%d", r->conf->outbox.batch);
    const char *params[] = { limit };
    PGresult *begin = PQexec(r->pg, "BEGIN");
    bool ok = PQresultStatus(begin) == PGRES_COMMAND_OK;
    PQclear(begin);
    PGresult *rows = ok ? PQexecParams(r->pg,
        "SELECT id, job_id, queue, job_type, body, idempotency_key, resource_key "
        "FROM sekali.outbox WHERE published_at IS NULL AND publish_error IS NULL "
        "AND run_at <= now() ORDER BY run_at, id LIMIT $1 FOR UPDATE SKIP LOCKED",
        1, NULL, params, NULL, NULL, 1) : NULL;
    if (rows == NULL || PQresultStatus(rows) != PGRES_TUPLES_OK) {
        char why[300];
        snprintf(why, sizeof(why), "claiming outbox rows: %s", PQerrorMessage(r->pg));
        PQclear(rows);
        disconnect(r, why);
        return SK_AGAIN;
    }

    /* Binary results: ids are int8 in network order, texts as they are. */
    int n = PQntuples(rows);
    for (int i = 0; i < n; i++) {
        char id[24];
        uint64_t raw;
        memcpy(&raw, PQgetvalue(rows, i, 0), sizeof(raw));
        snprintf(id, sizeof(id), "%llu", (unsigned long long)be64toh(raw));
        struct sk_message msg = {
            .message_id = PQgetvalue(rows, i, 1),
            .type = PQgetvalue(rows, i, 3),
            .content_type = "application/octet-stream",
            .idempotency_key = PQgetvalue(rows, i, 5),
            .resource_key = PQgetisnull(rows, i, 6) ? NULL : PQgetvalue(rows, i, 6),
            .body = PQgetvalue(rows, i, 4),
            .body_len = (size_t)PQgetlength(rows, i, 4),
        };
        const char *queue = PQgetvalue(rows, i, 2);
        struct sk_err err = { 0 };
        int rc = sk_broker_publish(r->broker, queue, &msg, &err);
        if (rc == SK_AGAIN) {
            PQclear(rows);
            disconnect(r, err.msg);
            return SK_AGAIN;
        }
        const char *mark[] = { id, rc == SK_OK ? NULL : err.msg };
        if (rc != SK_OK)
            sk_log_error("outbox row %s for queue %s not published: %s", id, queue, err.msg);
        sk_failpoint("after_publish", msg.idempotency_key);
        PGresult *res = PQexecParams(r->pg,
            "UPDATE sekali.outbox SET published_at = CASE WHEN $2::text IS NULL THEN now() END, "
            "publish_error = $2 WHERE id = $1", 2, NULL, mark, NULL, NULL, 0);
        bool marked = PQresultStatus(res) == PGRES_COMMAND_OK;
        PQclear(res);
        if (!marked) {
            char why[300];
            snprintf(why, sizeof(why), "marking outbox row %s: %s", id, PQerrorMessage(r->pg));
            PQclear(rows);
            disconnect(r, why);
            return SK_AGAIN;
        }
    }
    PQclear(rows);
    PGresult *commit = PQexec(r->pg, "COMMIT");
    ok = PQresultStatus(commit) == PGRES_COMMAND_OK;
    PQclear(commit);
    if (!ok) {
        char why[300];
        snprintf(why, sizeof(why), "COMMIT of published rows: %s", PQerrorMessage(r->pg));
        disconnect(r, why);
        return SK_AGAIN;
    }
    *published = n;
    return SK_OK;
}

/* Sleeps until a NOTIFY, the poll interval, or a stop request. */
static void wait_for_work(struct relay *r)
{
    struct pollfd pfd = { .fd = PQsocket(r->pg), .events = POLLIN };
    int ready = poll(&pfd, 1, (int)r->conf->outbox.poll_interval_ms);
    if (ready <= 0)
        return;
    if (PQconsumeInput(r->pg) != 1) {
        disconnect(r, PQerrorMessage(r->pg));
        return;
    }
    PGnotify *note;
    while ((note = PQnotifies(r->pg)) != NULL)
        PQfreemem(note);
}
