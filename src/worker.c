/* worker.c - one worker process: its connections and its loop.
 *
 * A worker consumes one queue, one job at a time (job.c runs each delivery
 * through the pipeline). It owns its RabbitMQ, Redis and PostgreSQL
 * connections, opened after fork, and reconnects to any server it loses,
 * with jittered backoff, logging once per outage. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "process.h"
#include "worker.h"
#include "worker_job.h"

#define POLL_MS 250  /* longest a stop request waits for an idle worker */


static int  setup(struct sk_worker *w, bool first, struct sk_err *err);
static int  check_logins(struct sk_worker *w, struct sk_err *err);
static void teardown(struct sk_worker *w);
static int  open_store(struct sk_worker *w, struct sk_err *err);
static void record_crash(struct sk_worker *w);
static void free_dead_lock(struct sk_worker *w);
static bool ensure_store(struct sk_worker *w);
static bool ensure_broker(struct sk_worker *w);

int sk_worker_run(const struct sk_conf *conf, const struct sk_queue_conf *queue,
                  const struct sk_plugin *plugin, struct sk_slot *slot,
                  struct sk_metrics_queue *metrics)
{
    struct sk_worker *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        sk_log_error("calloc(worker) failed");
        return SK_EXIT_RUNTIME;
    }
    w->conf = conf;
    w->queue = queue;
    w->slot = slot;
    w->metrics = metrics;
    w->shape = sk_conf_queue_shape(queue);
    w->handler = plugin->handler;
    w->broker_backoff = (struct sk_backoff){ .base_ms = 100, .cap_ms = 10000 };
    w->postgres_backoff = (struct sk_backoff){ .base_ms = 100, .cap_ms = 10000 };
    w->redis_backoff = (struct sk_backoff){ .base_ms = 200, .cap_ms = 5000 };

    /* The first worker of its slot (at start or in a new generation) has
     * never turned its loop. Only it treats a refused password as fatal: a
     * replacement after a crash, like a running worker, keeps retrying. */
    bool first = atomic_load(&slot->alive_ms) == 0;
    struct sk_err err = { 0 };
    int exit_code = SK_EXIT_OK;
    int rc = setup(w, first, &err);
    if (rc != SK_OK) {
        sk_log_error("worker for queue %s cannot start: %s", queue->name, err.msg);
        exit_code = rc == SK_ERR ? SK_EXIT_CONFIG : SK_EXIT_RUNTIME;
        goto out;
    }
    sk_log_info("worker for queue %s started (handler %s %s from %s)", queue->name,
                w->handler->name != NULL ? w->handler->name : "?",
                w->handler->version != NULL ? w->handler->version : "?", plugin->path);

    while (!sk_process_stopping()) {
        /* Liveness for the supervisor's watchdog: the loop turns at least
         * every POLL_MS while idle; a job in hand is covered by its start. */
        atomic_store(&w->slot->alive_ms, sk_now_ms());
        /* First, before anything is consumed: the redelivery of the dead
         * worker's job is waiting for that lock. But if the job killed that
         * worker, its crash is recorded first: a copy that took the freed
         * lock before the count was written would run the job uncounted. */
        bool job_died = atomic_load(&w->slot->died_in_job);
        if (!job_died && atomic_load(&w->slot->orphan_held))
            free_dead_lock(w);
        if (!ensure_store(w) || !ensure_broker(w))
            continue;
        if (job_died) {
            record_crash(w);
            if (atomic_load(&w->slot->orphan_held))
                free_dead_lock(w);
        }
        /* The publishing connection idles between retries and dead letters;
         * librabbitmq would let the broker drop it for want of heartbeats. */
        if (w->publisher != NULL && sk_broker_keepalive(w->publisher, &err) != SK_OK)
            sk_worker_drop_publisher(w, err.msg);
        amqp_envelope_t delivery;
        rc = sk_broker_next(w->broker, &delivery, POLL_MS, &err);
        if (rc == SK_AGAIN)
            continue;
        if (rc != SK_OK) {
            sk_worker_drop_broker(w, err.msg);
            continue;
        }
        /* The supervisor kills us if this outlives queue.job_timeout. The
         * key is the job's once parsed: never the previous job's. */
        w->slot->job_key[0] = '\0';
        atomic_store(&w->slot->phase, SK_PHASE_JOB);
        atomic_store(&w->slot->job_started_ms, sk_now_ms());
        sk_job_process(w, &delivery);
        atomic_store(&w->slot->job_started_ms, 0);
        atomic_store(&w->slot->phase, SK_PHASE_IDLE);
        /* Progress: the supervisor restarts this worker at once if it dies. */
        atomic_fetch_add(&w->slot->finished, 1);
        sk_broker_release(w->broker, &delivery);
    }
    sk_log_info("worker for queue %s stopping", queue->name);

out:
    teardown(w);
    free(w);
    return exit_code;
}

/* Returns SK_OK; SK_ERR when retrying cannot help (bad handler config,
 * missing schema); SK_AGAIN when a restart later may succeed. */
static int setup(struct sk_worker *w, bool first, struct sk_err *err)
{
    char host[64] = "localhost";
    gethostname(host, sizeof(host) - 1);
    snprintf(w->owner, sizeof(w->owner), "%s:%ld", host, (long)getpid());

    if (w->handler->init != NULL) {
        int status = w->handler->init(sk_host(), w->queue->handler_config, &w->handler_state);
        if (status == SEKALI_FAIL)
            return sk_err_set(err, SK_ERR, "handler init() failed: bad configuration");
        if (status != SEKALI_OK)
            return sk_err_set(err, SK_AGAIN, "handler init() asked to retry later");
    }

    /* A missing schema fails here, once, with exit 2. A server that is
     * merely down is not fatal: the store and the lock reconnect at the
     * next job, and the broker is not consumed from until then. */
    int rc = open_store(w, err);
    if (rc == SK_ERR)
        return rc;
    if (rc == SK_AGAIN && err->code == SK_AUTH && first)
        return sk_err_set(err, SK_ERR, "PostgreSQL refused sekali's credentials (check "
                          "postgres.conninfo and its password): %.180s", err->msg);
    if (rc == SK_AGAIN) {
        sk_log_warn("PostgreSQL %s at start, will retry: %s",
                    err->code == SK_AUTH ? "refused sekali's credentials" : "unavailable",
                    err->msg);
        w->postgres_down_logged = true;
    }
    if (first && (rc = check_logins(w, err)) != SK_OK)
        return rc;
    /* The thread's tick: a third of the lock's and the lease's time, and
     * often enough to keep the broker connections of a long handler alive. */
    uint32_t tick = UINT32_MAX;
    if (w->queue->lock)
        tick = w->queue->lock_ttl_ms / 3;
    if (w->queue->mode == SK_MODE_EXTERNAL && w->queue->lease_ms / 3 < tick)
        tick = w->queue->lease_ms / 3;
    uint32_t keepalive = sk_broker_keepalive_period_ms(&w->conf->amqp);
    if (keepalive > 0 && keepalive < tick)
        tick = keepalive;
    if (tick != UINT32_MAX && sk_heartbeat_start(&w->heartbeat, w->conf, tick, err) != SK_OK)
        return SK_AGAIN;
    return SK_OK;
}

/* A wrong password would otherwise only show as a worker retrying for ever:
 * log in once to RabbitMQ, and to Redis if the queue locks, and give up with
 * SK_ERR (exit 2) if either refuses. A server that is merely down is left to
 * the loop's retries. The Redis connection is kept for the first job. */
static int check_logins(struct sk_worker *w, struct sk_err *err)
{
    struct sk_broker *probe = NULL;
    struct sk_err why = { 0 };

    if (sk_broker_open(&probe, &w->conf->amqp, &why) == SK_OK)
        sk_broker_close(probe);
    else if (why.code == SK_AUTH)
        return sk_err_set(err, SK_ERR, "RabbitMQ refused sekali's credentials (user %s on vhost "
                          "%s; check amqp.url and its password): %.160s", w->conf->amqp.user,
                          w->conf->amqp.vhost, why.msg);
    if (w->queue->lock && sk_lock_open(&w->lock, &w->conf->redis, &why) != SK_OK &&
        why.code == SK_AUTH)
        return sk_err_set(err, SK_ERR, "Redis refused sekali's credentials (check "
                          "redis.password_env or password_file): %.180s", why.msg);
    return SK_OK;
}

static void teardown(struct sk_worker *w)
{
    sk_heartbeat_stop(w->heartbeat);
    sk_host_ctx_free(&w->ctx);
    sk_broker_close(w->broker);
    sk_broker_close(w->publisher);
    sk_lock_close(w->lock);
    sk_store_close(w->store);
    if (w->handler->fini != NULL && w->handler_state != NULL)
        w->handler->fini(w->handler_state);
}

/* The worker this one replaces died running a job: count it against the
 * job's key (sql/006), so that a job that keeps killing its workers is
 * dead-lettered when it comes back (job.c). Before this worker takes a job
 * of its own, which would overwrite the key; tried once, since a count
 * lost is one crash more before the job is stopped, never a wrong outcome. */
static void record_crash(struct sk_worker *w)
{
    int crashes = 0;
    struct sk_err err = { 0 };
    if (sk_store_record_crash(w->store, w->queue->name, w->slot->job_key, &crashes, &err) ==
        SK_OK)
        sk_log_warn("the previous worker died running the job with key %s: crash %d of it%s",
                    w->slot->job_key, crashes,
                    w->queue->max_crashes > 0 && crashes >= w->queue->max_crashes
                        ? ", so it will be dead-lettered when it comes back" : "");
    else
        sk_log_warn("the previous worker died running the job with key %s; the crash is not "
                    "counted: %s", w->slot->job_key, err.msg);
    w->slot->job_key[0] = '\0';
    atomic_store(&w->slot->died_in_job, 0);
}

/* A worker of this slot died holding a Redis lock (the supervisor moved it
 * to orphan_key): delete it if its token still owns it, so the dead
 * worker's redelivered job runs now rather than after lock_ttl. Its owner
 * is provably dead, and the compare by token cannot delete a lock a live
 * worker took since. While Redis is unreachable the orphan stays recorded
 * and is tried again when the Redis backoff allows; the worker consumes in
 * the meantime, as it would without the orphan. */
static void free_dead_lock(struct sk_worker *w)
{
    if (w->redis_down && sk_now_ms() < w->redis_retry_at_ms)
        return;
    struct sk_err err = { 0 };
    int rc = w->lock != NULL ? SK_OK : sk_lock_open(&w->lock, &w->conf->redis, &err);
    if (rc == SK_OK)
        rc = sk_lock_release(w->lock, w->slot->orphan_key, w->slot->orphan_token, &err);
    if (rc == SK_AGAIN) {
        w->redis_retry_at_ms = sk_now_ms() + sk_backoff_next(&w->redis_backoff);
        if (!w->redis_down)
            sk_log_warn("cannot free the lock %s of a dead worker yet, will retry: %s",
                        w->slot->orphan_key, err.msg);
        w->redis_down = true;
        return;
    }
    if (rc == SK_OK) {
        sk_metrics_lock_released_for_dead(w->metrics);
        sk_log_info("freed the lock %s that a dead worker held", w->slot->orphan_key);
    } else {
        sk_log_debug("the dead worker's lock %s had already expired or changed hands",
                     w->slot->orphan_key);
    }
    atomic_store(&w->slot->orphan_held, 0);
}

/* Named for pg_stat_activity, where an operator looks for a stuck worker. */
static int open_store(struct sk_worker *w, struct sk_err *err)
{
    char app_name[256];
    snprintf(app_name, sizeof(app_name), "sekali worker %s", w->queue->name);
    return sk_store_open(&w->store, &w->conf->postgres, app_name, err);
}

/* Until PostgreSQL answers, the worker does not consume: deliveries would
 * only go back to the broker. */
static bool ensure_store(struct sk_worker *w)
{
    if (w->store != NULL)
        return true;
    struct sk_err err = { 0 };
    if (open_store(w, &err) == SK_OK) {
        sk_log_info("PostgreSQL reachable again");
        w->postgres_down_logged = false;
        sk_backoff_reset(&w->postgres_backoff);
        return true;
    }
    if (!w->postgres_down_logged && err.code == SK_AUTH)
        sk_log_error("PostgreSQL refused sekali's credentials, retrying with backoff until "
                     "the password is fixed: %s", err.msg);
    else if (!w->postgres_down_logged)
        sk_log_warn("PostgreSQL unavailable, retrying with backoff: %s", err.msg);
    w->postgres_down_logged = true;
    sk_sleep_ms(sk_backoff_next(&w->postgres_backoff));
    return false;
}

static bool ensure_broker(struct sk_worker *w)
{
    if (w->broker != NULL)
        return true;
    struct sk_err err = { 0 };
    int rc = sk_broker_open(&w->broker, &w->conf->amqp, &err);
    if (rc == SK_OK)
        rc = sk_broker_declare(w->broker, w->queue->name, &w->shape, &err);
    if (rc == SK_OK)
        rc = sk_broker_consume(w->broker, w->queue->name, (uint16_t)w->queue->prefetch,
                               w->queue->max_body, &err);
    if (rc == SK_OK) {
        if (w->broker_down_logged)
            sk_log_info("consuming %s again", w->queue->name);
        w->broker_down_logged = false;
        sk_backoff_reset(&w->broker_backoff);
        atomic_store(&w->slot->consuming, 1);
        atomic_store(&w->slot->ready, 1);
        return true;
    }
    sk_broker_close(w->broker);
    w->broker = NULL;
    uint32_t delay = sk_backoff_next(&w->broker_backoff);
    if (!w->broker_down_logged && err.code == SK_AUTH)
        sk_log_error("RabbitMQ refused sekali's credentials for %s, retrying with backoff "
                     "until the password is fixed: %s", w->queue->name, err.msg);
    else if (!w->broker_down_logged)
        sk_log_warn("cannot consume %s, retrying with backoff: %s", w->queue->name, err.msg);
    w->broker_down_logged = true;
    sk_sleep_ms(delay);
    return false;
}

void sk_worker_drop_broker(struct sk_worker *w, const char *why)
{
    sk_log_warn("lost the broker connection: %s", why);
    atomic_store(&w->slot->consuming, 0);
    w->broker_down_logged = true;
    sk_broker_close(w->broker);
    w->broker = NULL;
}

bool sk_worker_publisher(struct sk_worker *w, struct sk_err *err)
{
    if (w->publisher != NULL)
        return true;
    int rc = sk_broker_open(&w->publisher, &w->conf->amqp, err);
    if (rc == SK_OK)
        rc = sk_broker_confirm_select(w->publisher, err);
    if (rc == SK_OK)
        return true;
    sk_broker_close(w->publisher);
    w->publisher = NULL;
    return false;
}

void sk_worker_drop_publisher(struct sk_worker *w, const char *why)
{
    sk_log_warn("publishing connection failed: %s", why);
    sk_broker_close(w->publisher);
    w->publisher = NULL;
}

