/* pause.c - a worker obeys its queue's pause: see pause.h.
 *
 * Why the worker cancels its consumer instead of only not reading: the
 * deliveries in its prefetch window would stay unacked with it for the
 * whole pause (RabbitMQ's consumer_timeout closes the channel after 30
 * minutes by default), and `sekalictl pause` learns that every worker
 * obeyed from the queue's consumer count dropping to 0. The job in hand is
 * never interrupted: this is asked between jobs only. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "broker.h"
#include "clock.h"
#include "links.h"
#include "log.h"
#include "pause.h"
#include "pg.h"
#include "store.h"

/* The fallback for a NOTIFY lost with its connection (or a server that
 * dropped it): while paused, a resume is seen within a second even
 * without one; while running, a pause within a few. */
#define POLL_PAUSED_MS  1000
#define POLL_RUNNING_MS 5000

#define CHANNEL "sekali_pause"

struct sk_pause {
    const char *queue;
    bool        paused;       /* as PostgreSQL last said */
    bool        must_ask;     /* a fresh consumer waits for the row to be read */
    int         listen_pid;   /* the backend our LISTEN was sent to; 0: none */
    int64_t     next_poll_ms;
    int64_t     next_dial_ms; /* the store's connection is lost: when to dial again */
};

static PGconn *connection(struct sk_pause *pz, struct sk_store *store);
static bool told(struct sk_pause *pz, PGconn *pg);
static int  ask(struct sk_pause *pz, PGconn *pg, bool *paused);
static void obey(struct sk_pause *pz, struct sk_links *links);
static void wait_paused(struct sk_links *links, PGconn *pg, uint32_t wait_ms);

struct sk_pause *sk_pause_new(const char *queue)
{
    struct sk_pause *pz = calloc(1, sizeof(*pz));
    if (pz != NULL)
        pz->queue = queue;
    return pz;
}

void sk_pause_free(struct sk_pause *pz)
{
    free(pz);
}

bool sk_pause_hold(struct sk_pause *pz, struct sk_links *links, uint32_t wait_ms)
{
    PGconn *pg = connection(pz, sk_links_store(links));
    bool usable = pg != NULL && PQstatus(pg) == CONNECTION_OK &&
                  PQtransactionStatus(pg) == PQTRANS_IDLE;
    /* A consumer subscribed since we last looked (at start, after an
     * outage) must not take a delivery before the row is read: a pause
     * that began while it was away would not stop it otherwise. */
    pz->must_ask |= sk_links_fresh(links);
    if (usable) {
        bool force = told(pz, pg) || pz->must_ask;
        int64_t now = sk_now_ms();
        bool paused;
        if ((force || now >= pz->next_poll_ms) && ask(pz, pg, &paused) == SK_OK) {
            pz->paused = paused;
            pz->must_ask = false;
            pz->next_poll_ms = now + (paused ? POLL_PAUSED_MS : POLL_RUNNING_MS);
        }
    }
    if (pz->must_ask) {
        /* Not known yet: hold the deliveries (they stay prefetched) and
         * ask again at the next turn. */
        sk_sleep_ms(wait_ms);
        return true;
    }
    obey(pz, links);
    if (!pz->paused)
        return false;
    wait_paused(links, usable ? pg : NULL, wait_ms);
    return true;
}

/* The store's connection, dialled again if it was lost (PostgreSQL
 * restarted). While jobs run, the next claim does that; a paused worker
 * runs none, so it would never read the row again: it dials itself, at
 * most once per POLL_PAUSED_MS. NULL while PostgreSQL cannot be reached. */
static PGconn *connection(struct sk_pause *pz, struct sk_store *store)
{
    PGconn *pg = sk_store_conn(store);
    if (pg != NULL && PQstatus(pg) == CONNECTION_OK)
        return pg;
    int64_t now = sk_now_ms();
    if ((!pz->paused && !pz->must_ask) || now < pz->next_dial_ms)
        return NULL;
    pz->next_dial_ms = now + POLL_PAUSED_MS;
    struct sk_err err = { 0 };
    if (sk_store_reconnect(store, &err) != SK_OK) {
        sk_log_debug("queue %s: PostgreSQL not reachable to read the pause: %s", pz->queue,
                     err.msg);
        return NULL;
    }
    return sk_store_conn(store);
}

/* A new backend (the store reconnected) has no LISTEN: sent again, and
 * the row read at once, since a NOTIFY may have gone with the old one.
 * Otherwise the notifications that arrived are read from the socket
 * without a round trip. True when the row must be read now. */
static bool told(struct sk_pause *pz, PGconn *pg)
{
    bool again = false;
    int pid = PQbackendPID(pg);
    if (pid != pz->listen_pid) {
        struct sk_err err = { 0 };
        if (sk_pg_run(pg, "LISTEN " CHANNEL, &err) != SK_OK) {
            sk_log_debug("LISTEN " CHANNEL " failed, polling instead: %s", err.msg);
            return false;
        }
        pz->listen_pid = pid;
        again = true;
    }
    PQconsumeInput(pg);
    PGnotify *n;
    while ((n = PQnotifies(pg)) != NULL) {
        again |= strcmp(n->relname, CHANNEL) == 0 && strcmp(n->extra, pz->queue) == 0;
        PQfreemem(n);
    }
    return again;
}

static int ask(struct sk_pause *pz, PGconn *pg, bool *paused)
{
    const char *values[] = { pz->queue };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.is_paused($1)", .n_params = 1, .values = values,
        .one_row = true, .what = "sekali.is_paused",
    };
    PGresult *res;
    struct sk_err err = { 0 };
    int rc = sk_pg_exec(pg, &st, &res, &err);
    if (rc != SK_OK) {
        sk_log_debug("queue %s: cannot read its pause, keeping the state last read: %s",
                     pz->queue, err.msg);
        return rc;
    }
    *paused = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    return SK_OK;
}

/* Brings the consumer in line with the state: cancelled while paused,
 * subscribed while not. A failure drops the consumer, and the links open
 * it again (subscribed, so the next call looks again). */
static void obey(struct sk_pause *pz, struct sk_links *links)
{
    struct sk_broker *consumer = sk_links_consumer(links);
    if (consumer == NULL || sk_broker_subscribed(consumer) == !pz->paused)
        return;
    size_t returned = 0;
    struct sk_err err = { 0 };
    if (sk_links_pause(links, pz->paused, &returned, &err) != SK_OK)
        return;
    if (pz->paused)
        sk_log_event(SK_LOG_INFO, SK_EVENT_PAUSED, NULL, NULL,
                     "queue %s is paused: consumer cancelled, %zu prefetched deliver%s given "
                     "back to the queue", pz->queue, returned, returned == 1 ? "y" : "ies");
    else
        sk_log_event(SK_LOG_INFO, SK_EVENT_RESUMED, NULL, NULL,
                     "queue %s resumed: consuming again", pz->queue);
}

/* Sleeps until a NOTIFY arrives or wait_ms pass, and keeps the idle
 * consumer's connection read: the broker's heartbeats, or its closing, are
 * noticed as while consuming. A delivery cannot arrive on a cancelled
 * consumer; one that does all the same goes straight back. */
static void wait_paused(struct sk_links *links, PGconn *pg, uint32_t wait_ms)
{
    if (pg != NULL && PQsocket(pg) >= 0) {
        struct pollfd fd = { .fd = PQsocket(pg), .events = POLLIN };
        poll(&fd, 1, (int)wait_ms);
    } else {
        sk_sleep_ms(wait_ms);
    }
    struct sk_broker *consumer = sk_links_consumer(links);
    if (consumer == NULL)
        return;
    amqp_envelope_t stray;
    struct sk_err err = { 0 };
    int rc = sk_broker_next(consumer, &stray, 0, &err);
    bool lost = rc == SK_ERR;
    if (rc == SK_OK) {
        lost = sk_broker_reject(consumer, stray.delivery_tag, true, &err) != SK_OK;
        sk_broker_release(consumer, &stray);
    }
    if (!lost)
        lost = sk_broker_keepalive(consumer, &err) != SK_OK;
    if (lost)
        sk_links_drop(links, SK_LINK_CONSUMER, NULL, &err);
}
