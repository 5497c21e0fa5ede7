/* links.c - one worker process's connections and their outages.
 *
 * Every server a worker needs can go away and come back. What to do then is
 * decided here, once for the whole process, with one outage tracker per
 * server (outage.h: logged when it starts and when it ends, jittered backoff
 * between attempts) and, for Redis, the queue's on_redis_down. The
 * connections are opened after fork (no socket is inherited) and only by
 * this file. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "broker.h"
#include "heartbeat.h"
#include "lane.h"
#include "links.h"
#include "lock.h"
#include "log.h"
#include "outage.h"
#include "schema.h"
#include "scoreboard.h"
#include "store.h"

/* The publisher has no outage of its own: it is opened only when a job
 * needs a copy, and that job handles a failure itself (its message goes
 * back to the queue after a pause), so each failure is logged. */
struct sk_links {
    const struct sk_conf       *conf;
    const struct sk_queue_conf *queue;
    struct sk_slot             *slot;
    struct sk_broker           *consumer;
    struct sk_broker           *publisher;
    struct sk_lock             *lock;
    struct sk_store            *store;
    struct sk_outage            consumer_outage;
    struct sk_outage            lock_outage;
    struct sk_outage            store_outage;
    bool                        lock_refused;  /* Redis refused our password or TLS */
    bool                        fresh;         /* subscribed since sk_links_fresh() asked */
    int                         prefetch;      /* the consumer's window, kept across reopenings */
    struct sk_queue_shape       shape;
};

static int  open_store(struct sk_links *l, struct sk_err *err);
static int  check_logins(struct sk_links *l, struct sk_err *err);
static bool ensure_store(struct sk_links *l);
static bool ensure_consumer(struct sk_links *l);
static int  consume(struct sk_links *l, struct sk_err *err);
static int  lock_down(struct sk_links *l, const struct sk_err *why);
static int  without_redis(struct sk_links *l, bool began, const char *why);
static void store_down(struct sk_links *l, const struct sk_log_job *job,
                       const struct sk_err *why);

int sk_links_new(struct sk_links **out, const struct sk_conf *conf,
                 const struct sk_queue_conf *queue, struct sk_slot *slot, struct sk_err *err)
{
    struct sk_links *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(links)");
    l->conf = conf;
    l->queue = queue;
    l->slot = slot;
    l->shape = sk_conf_queue_shape(queue);
    l->prefetch = queue->prefetch;
    l->consumer_outage = SK_OUTAGE_INIT(100, 10000);
    l->store_outage = SK_OUTAGE_INIT(100, 10000);
    l->lock_outage = SK_OUTAGE_INIT(200, 5000);
    *out = l;
    return SK_OK;
}

void sk_links_free(struct sk_links *l)
{
    if (l == NULL)
        return;
    sk_broker_close_consumer(l->consumer);
    sk_broker_close(l->publisher);
    sk_lock_close(l->lock);
    sk_store_close(l->store);
    free(l);
}

/* A missing schema fails here, once, with exit 2. A server that is merely
 * down is not fatal: the store and the lock reconnect at the next job, and
 * the broker is not consumed from until then. */
int sk_links_open(struct sk_links *l, bool first, struct sk_err *err)
{
    int rc = open_store(l, err);
    if (rc == SK_ERR)
        return rc;
    if (rc == SK_AGAIN && err->code == SK_AUTH && first) {
        struct sk_err why = *err;
        return sk_err_set(err, SK_ERR, "PostgreSQL refused sekali's credentials (check "
                          "postgres.conninfo and its password): %.180s", why.msg);
    }
    if (rc == SK_AGAIN && sk_outage_begin(&l->store_outage))
        sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, NULL,
                     "PostgreSQL %s at start, will retry: %s",
                     err->code == SK_AUTH ? "refused sekali's credentials" : "unavailable",
                     err->msg);
    return first ? check_logins(l, err) : SK_OK;
}

/* A wrong password would otherwise only show as a worker retrying for ever:
 * log in once to RabbitMQ, and to Redis if the queue locks, and give up with
 * SK_ERR (exit 2) if either refuses. A server that is merely down is left to
 * the loop's retries. The Redis connection is kept for the first job. */
static int check_logins(struct sk_links *l, struct sk_err *err)
{
    struct sk_broker *probe = NULL;
    struct sk_err why = { 0 };

    if (sk_broker_open(&probe, &l->conf->amqp, &why) == SK_OK)
        sk_broker_close(probe);
    else if (why.code == SK_AUTH)
        return sk_err_set(err, SK_ERR, "RabbitMQ refused sekali's credentials (user %s on vhost "
                          "%s; check amqp.url and its password): %.160s", l->conf->amqp.user,
                          l->conf->amqp.vhost, why.msg);
    if (l->queue->lock && sk_lock_open(&l->lock, &l->conf->redis, &why) != SK_OK &&
        why.code == SK_AUTH)
        return sk_err_set(err, SK_ERR, "Redis refused sekali's credentials (check "
                          "redis.password_env or password_file): %.180s", why.msg);
    return SK_OK;
}

bool sk_links_store_ready(struct sk_links *l)
{
    if (!ensure_store(l))
        return false;
    /* A failed claim handed its job back; pause before the next one. */
    uint32_t pause = sk_outage_wait_ms(&l->store_outage);
    if (pause > 0)
        sk_sleep_ms(pause);
    return true;
}

bool sk_links_ready(struct sk_links *l)
{
    if (!sk_links_store_ready(l))
        return false;
    if (!ensure_consumer(l))
        return false;
    /* The publishing connection idles between retries and dead letters;
     * librabbitmq would let the broker drop it for want of heartbeats. */
    struct sk_err err = { 0 };
    if (l->publisher != NULL && sk_broker_keepalive(l->publisher, &err) != SK_OK)
        sk_links_drop(l, SK_LINK_PUBLISHER, NULL, &err);
    return true;
}

struct sk_broker *sk_links_consumer(struct sk_links *l)
{
    return l->consumer;
}

struct sk_store *sk_links_store(struct sk_links *l)
{
    return l->store;
}

struct sk_broker *sk_links_publisher(struct sk_links *l, struct sk_err *err)
{
    if (l->publisher != NULL)
        return l->publisher;
    int rc = sk_broker_open(&l->publisher, &l->conf->amqp, err);
    if (rc == SK_OK)
        rc = sk_broker_confirm_select(l->publisher, err);
    if (rc == SK_OK)
        return l->publisher;
    sk_broker_close(l->publisher);
    l->publisher = NULL;
    return NULL;
}

int sk_links_lock(struct sk_links *l, struct sk_lock **out)
{
    *out = NULL;
    /* While Redis is down, ask it again only when the backoff allows: an
     * unreachable host would otherwise cost a connect timeout per job. */
    if (sk_outage_waiting(&l->lock_outage))
        return without_redis(l, false, NULL);
    struct sk_err err = { 0 };
    if (l->lock == NULL && sk_lock_open(&l->lock, &l->conf->redis, &err) != SK_OK)
        return lock_down(l, &err);
    *out = l->lock;
    return SK_OK;
}

uint64_t sk_links_redis_rtt_ns(const struct sk_links *l)
{
    return sk_lock_rtt_ns(l->lock);
}

int sk_links_free_orphans(struct sk_links *l, const struct sk_slot_lock *locks, size_t n,
                          size_t *freed)
{
    *freed = 0;
    struct sk_outage *o = &l->lock_outage;
    if (sk_outage_waiting(o))
        return SK_AGAIN;
    struct sk_err err = { 0 };
    /* One block for the round trip's arrays: n is at most a batch. */
    void *arrays = calloc(n, 2 * sizeof(char *) + sizeof(int));
    if (arrays == NULL)
        return SK_AGAIN;
    const char **keys = arrays, **tokens = keys + n;
    int *rcs = (int *)(void *)(tokens + n);
    for (size_t i = 0; i < n; i++) {
        keys[i] = locks[i].key;
        tokens[i] = locks[i].token;
    }
    int rc = l->lock != NULL ? SK_OK : sk_lock_open(&l->lock, &l->conf->redis, &err);
    if (rc == SK_OK)
        rc = sk_lock_release_many(l->lock, n, keys, tokens, rcs, &err);
    for (size_t i = 0; rc == SK_OK && i < n; i++)
        *freed += rcs[i] == SK_OK;
    free(arrays);
    if (rc != SK_OK && rc != SK_AGAIN)
        return SK_BUSY;  /* Redis refused the command itself: asking again would not help */
    if (rc == SK_AGAIN) {
        if (sk_outage_failed(o))
            sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_REDIS, NULL,
                         "cannot free the %zu lock(s) of a dead worker yet (%s first), will "
                         "retry: %s", n, locks[0].key, err.msg);
        return SK_AGAIN;
    }
    sk_links_up(l, SK_LINK_LOCK);
    return SK_OK;
}

int sk_links_drop(struct sk_links *l, enum sk_link which, const struct sk_log_job *job,
                  const struct sk_err *why)
{
    switch (which) {
    case SK_LINK_CONSUMER:
        /* Reopened at once by sk_links_ready(), which backs off from there. */
        if (sk_outage_begin(&l->consumer_outage))
            sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_RABBITMQ, NULL,
                         "lost the broker connection: %s", why->msg);
        atomic_store(&l->slot->consuming, 0);
        sk_broker_close_consumer(l->consumer);
        l->consumer = NULL;
        return SK_AGAIN;
    case SK_LINK_PUBLISHER:
        if (!sk_broker_broken(l->publisher))
            return SK_AGAIN;
        sk_log_event(SK_LOG_WARN, SK_EVENT_PUBLISH_FAILED, SK_SERVER_RABBITMQ, job,
                     "publishing connection failed: %s", why->msg);
        sk_broker_close(l->publisher);
        l->publisher = NULL;
        return SK_AGAIN;
    case SK_LINK_LOCK:
        return lock_down(l, why);
    case SK_LINK_STORE:
        store_down(l, job, why);
        return SK_AGAIN;
    }
    sk_assert(!"unknown link");
    return SK_ERR;
}

void sk_links_up(struct sk_links *l, enum sk_link which)
{
    sk_assert(which == SK_LINK_LOCK || which == SK_LINK_STORE);
    if (which == SK_LINK_STORE && sk_outage_ok(&l->store_outage))
        sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_POSTGRES, NULL,
                     "PostgreSQL reachable again");
    if (which == SK_LINK_LOCK && sk_outage_ok(&l->lock_outage))
        sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_REDIS, NULL,
                     "redis reachable again, locking resumed");
    if (which == SK_LINK_LOCK)
        l->lock_refused = false;
}

void sk_links_stand_down(struct sk_links *l)
{
    if (l->consumer == NULL)
        return;
    /* Closing the channel is what gives every prefetched delivery back, at
     * once and whole; the acks of finished jobs go first. Not an outage:
     * sk_links_ready() subscribes again when asked. */
    atomic_store(&l->slot->consuming, 0);
    sk_broker_close_consumer(l->consumer);
    l->consumer = NULL;
}

bool sk_links_fresh(struct sk_links *l)
{
    bool fresh = l->fresh;
    l->fresh = false;
    return fresh;
}

int sk_links_prefetch(const struct sk_links *l)
{
    return l->prefetch;
}

void sk_links_set_prefetch(struct sk_links *l, int prefetch)
{
    if (prefetch == l->prefetch)
        return;
    l->prefetch = prefetch;
    if (l->consumer == NULL)
        return;
    struct sk_err err = { 0 };
    if (sk_broker_set_prefetch(l->consumer, (uint16_t)prefetch, &err) != SK_OK)
        sk_links_drop(l, SK_LINK_CONSUMER, NULL, &err);
}

int sk_links_pause(struct sk_links *l, bool paused, size_t *returned, struct sk_err *err)
{
    *returned = 0;
    if (l->consumer == NULL)
        return SK_AGAIN;
    int rc = paused ? sk_broker_unsubscribe(l->consumer, returned, err)
                    : sk_broker_resubscribe(l->consumer, err);
    if (rc != SK_OK) {
        sk_links_drop(l, SK_LINK_CONSUMER, NULL, err);
        return SK_AGAIN;
    }
    /* A paused worker is as ready as a consuming one: the supervisor's
     * READY=1 and health count either (supervisor.c). */
    atomic_store(&l->slot->paused, paused);
    atomic_store(&l->slot->consuming, !paused);
    return SK_OK;
}

void sk_links_lend(struct sk_links *l, struct sk_heartbeat *hb)
{
    if (hb != NULL)
        sk_heartbeat_lend_brokers(hb, l->consumer, l->publisher);
}

void sk_links_take_back(struct sk_links *l, struct sk_heartbeat *hb)
{
    (void)l;
    if (hb != NULL)
        sk_heartbeat_return_brokers(hb);
}

/* Named for pg_stat_activity, where an operator looks for a stuck worker. */
/* The schema is checked on every new connection: a database without this
 * build's migrations (never migrated, or restored from an old backup) is a
 * deployment mistake, refused with SK_ERR (exit 2 at the first open; a
 * reload's new workers exiting 2 keep the old generation) instead of jobs
 * handed back for ever. A server error while asking proves nothing. */
static int open_store(struct sk_links *l, struct sk_err *err)
{
    char app_name[256];
    snprintf(app_name, sizeof(app_name), "sekali worker %s", l->queue->name);
    int rc = sk_store_open(&l->store, &l->conf->postgres, app_name, err);
    if (rc != SK_OK)
        return rc;
    struct sk_schema_state st;
    if (sk_schema_read(sk_store_conn(l->store), &st, err) != SK_OK || st.n_missing == 0)
        return SK_OK;
    sk_store_close(l->store);
    l->store = NULL;
    return sk_err_set(err, SK_ERR, "the database lacks %zu migration%s of this build: run "
                      "sekalictl migrate (%s)", st.n_missing, st.n_missing == 1 ? "" : "s",
                      st.missing);
}

/* Until PostgreSQL answers, the worker does not consume: deliveries would
 * only go back to the broker. */
static bool ensure_store(struct sk_links *l)
{
    if (l->store != NULL)
        return true;
    struct sk_outage *o = &l->store_outage;
    struct sk_err err = { 0 };
    if (open_store(l, &err) == SK_OK) {
        if (sk_outage_ok(o))
            sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_POSTGRES, NULL,
                         "PostgreSQL reachable again");
        return true;
    }
    bool began = sk_outage_failed(o);
    if (began && err.code == SK_AUTH)
        sk_log_event(SK_LOG_ERROR, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, NULL,
                     "PostgreSQL refused sekali's credentials, retrying with backoff until "
                     "the password is fixed: %s", err.msg);
    else if (began)
        sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, NULL,
                     "PostgreSQL unavailable, retrying with backoff: %s", err.msg);
    sk_sleep_ms(sk_outage_wait_ms(o));
    return false;
}

static bool ensure_consumer(struct sk_links *l)
{
    if (l->consumer != NULL)
        return true;
    struct sk_outage *o = &l->consumer_outage;
    struct sk_err err = { 0 };
    int rc = sk_broker_open(&l->consumer, &l->conf->amqp, &err);
    if (rc == SK_OK)
        rc = sk_broker_declare(l->consumer, l->queue->name, &l->shape, &err);
    if (rc == SK_OK)
        rc = consume(l, &err);
    if (rc == SK_OK) {
        if (sk_outage_ok(o))
            sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_RABBITMQ, NULL,
                         "consuming %s again", l->queue->name);
        atomic_store(&l->slot->consuming, 1);
        atomic_store(&l->slot->ready, 1);
        atomic_store(&l->slot->paused, 0);
        l->fresh = true;
        return true;
    }
    sk_broker_close(l->consumer);
    l->consumer = NULL;
    bool began = sk_outage_failed(o);
    if (began && err.code == SK_AUTH)
        sk_log_event(SK_LOG_ERROR, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_RABBITMQ, NULL,
                     "RabbitMQ refused sekali's credentials for %s, retrying with backoff "
                     "until the password is fixed: %s", l->queue->name, err.msg);
    else if (began)
        sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_RABBITMQ, NULL,
                     "cannot consume %s, retrying with backoff: %s", l->queue->name, err.msg);
    sk_sleep_ms(sk_outage_wait_ms(o));
    return false;
}

/* The queue, and with lanes its lanes too: the queue is then their intake,
 * whose deliveries are forwarded, not run (forward.c). A forward is a
 * publish and an ack, far cheaper than a job, so the intake keeps a window
 * of its own at least SK_LANE_INTAKE_WINDOW wide, not changed with the
 * batch's: with the jobs' window it would be forwarded at the jobs' pace,
 * one for each job run, and a light tenant's job would wait behind the
 * heavy one's intake backlog. */
static int consume(struct sk_links *l, struct sk_err *err)
{
    const struct sk_queue_conf *q = l->queue;
    struct sk_broker_sub subs[SK_BROKER_SUBS_MAX];
    char lanes[SK_LANES_MAX][256];
    uint16_t window = (uint16_t)l->prefetch;
    subs[0] = (struct sk_broker_sub){
        .queue = q->name, .fixed = q->lanes > 0,
        .prefetch = q->lanes > 0 ? (uint16_t)sk_lane_intake_window(window) : window };
    for (int i = 0; i < q->lanes; i++) {
        if (sk_lane_name(q->name, (unsigned)i, lanes[i], sizeof(lanes[i])) != 0)
            return sk_err_set(err, SK_ERR, "queue name too long for its lanes: %s", q->name);
        subs[1 + i] = (struct sk_broker_sub){ .queue = lanes[i], .prefetch = window };
    }
    return sk_broker_consume(l->consumer, subs, 1 + (size_t)q->lanes, q->max_body, err);
}

/* Redis failed: ask it again only after the backoff, and say what the
 * queue does meanwhile. */
static int lock_down(struct sk_links *l, const struct sk_err *why)
{
    bool began = sk_outage_failed(&l->lock_outage);
    bool refused = why->code == SK_AUTH || why->code == SK_SETTING;
    if (refused && !l->lock_refused)
        sk_log_event(SK_LOG_ERROR, SK_EVENT_LINK_REFUSED, SK_SERVER_REDIS, NULL,
                     "%s: holding jobs back whatever on_redis_down says, until %s is "
                     "fixed: %s", why->code == SK_AUTH ? "redis refused sekali's credentials"
                     : "redis cannot be reached as configured",
                     why->code == SK_AUTH ? "its password or ACL" : "redis.tls or the server's "
                     "certificate", why->msg);
    l->lock_refused = refused;
    return without_redis(l, began, why->msg);
}

/* PostgreSQL's row lock still serialises each key; the Redis lock only saves
 * duplicate work, so with `proceed` an outage costs speed, not safety, and
 * `wait` keeps the work itself serialised. Logged when the outage began. */
static int without_redis(struct sk_links *l, bool began, const char *why)
{
    /* A refused password or TLS set-up is a configuration error, not an
     * outage: going on without locks would hide it for as long as nobody
     * reads the log, and run the jobs unlocked against docs/tls.md. */
    if (l->lock_refused)
        return SK_AGAIN;
    bool proceed = l->queue->on_redis_down == SK_REDIS_DOWN_PROCEED;
    if (began)
        sk_log_event_fields(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_REDIS, NULL,
                            (const struct sk_log_field[]){
                                { "on_redis_down", proceed ? "proceed" : "wait" } }, 1,
                            "redis unavailable, %s: %s",
                            proceed ? "going on without locks" : "holding jobs back",
                            why != NULL ? why : "");
    return proceed ? SK_OK : SK_AGAIN;
}

/* An outage is not the job's failure, and the backoff keeps it from turning
 * into a hot redelivery loop. Only a lost server makes an outage that is
 * logged once; a statement that failed on a live server is logged each time. */
static void store_down(struct sk_links *l, const struct sk_log_job *job,
                       const struct sk_err *why)
{
    struct sk_outage *o = &l->store_outage;
    if (why->code != SK_AGAIN && why->code != SK_AUTH) {
        sk_outage_pause(o);
        sk_log_job(SK_LOG_ERROR, job, "claim failed, backing off: %s", why->msg);
    } else if (sk_outage_failed(o)) {
        sk_log_event(SK_LOG_ERROR, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, job,
                     "claim failed, backing off: %s", why->msg);
    }
}
