/* worker.c - the job pipeline of one worker process.
 *
 *   deliver -> validate -> lock -> claim -> handler -> commit -> ack -> release
 *
 * The order is the whole design: the effect and the key's completion commit
 * in one PostgreSQL transaction, and the ack is sent only after that commit.
 * Dying anywhere before COMMIT rolls everything back and the broker
 * redelivers; dying after it leaves a completed key, and the redelivery is
 * acked as a duplicate without running the handler. The Redis lock only keeps
 * two workers from doing the same work at once; it decides nothing.
 *
 * Each worker owns its connections (opened after fork) and reconnects to any
 * server it loses, with jittered backoff, logging once per outage. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "broker.h"
#include "envelope.h"
#include "failpoint.h"
#include "heartbeat.h"
#include "host.h"
#include "lock.h"
#include "log.h"
#include "store.h"
#include "worker.h"

#define POLL_MS 250  /* longest a stop request waits for an idle worker */

/* A job's steps. Each transition goes through transition(), which logs it
 * and, in a fault build, is where a test can kill the worker. */
enum job_state {
    JOB_RECEIVED,
    JOB_LOCKED,
    JOB_CLAIMED,
    JOB_HANDLED,
    JOB_COMMITTED,
    JOB_ACKED,
};

static const char *const state_names[] = {
    [JOB_RECEIVED] = "received",
    [JOB_LOCKED] = "locked",
    [JOB_CLAIMED] = "claimed",
    [JOB_HANDLED] = "handled",
    [JOB_COMMITTED] = "committed",
    [JOB_ACKED] = "acked",
};

static const char *const state_failpoints[] = {
    [JOB_RECEIVED] = "after_receive",
    [JOB_LOCKED] = "after_lock",
    [JOB_CLAIMED] = "after_claim",
    [JOB_HANDLED] = "after_handler",
    [JOB_COMMITTED] = "after_commit",
    [JOB_ACKED] = "after_ack",
};

struct worker {
    const struct sk_conf        *conf;
    const struct sk_queue_conf  *queue;
    const struct sekali_handler *handler;
    void                        *handler_state;
    struct sk_broker            *broker;
    struct sk_lock              *lock;
    struct sk_store             *store;
    struct sk_heartbeat         *heartbeat;
    struct sk_backoff            broker_backoff;
    bool                         broker_down_logged;
    bool                         redis_down_logged;
    char                         owner[128];   /* host:pid, recorded with each claim */
    struct sekali_ctx            ctx;          /* reused for every job */
};

struct job {
    enum job_state     state;
    struct sk_envelope env;
    uint64_t           delivery_tag;
    char               lock_key[SK_KEY_MAX + 300];
    char               lock_token[SK_LOCK_TOKEN_LEN + 1];
    bool               locked;
    struct sk_claim    claim;
    struct sk_log_job  log;
};

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int signo);
static int  setup(struct worker *w, struct sk_err *err);
static void teardown(struct worker *w);
static bool ensure_broker(struct worker *w);
static void drop_broker(struct worker *w, const char *why);
static void process(struct worker *w, const amqp_envelope_t *delivery);
static int  take_lock(struct worker *w, struct job *j);
static void release_lock(struct worker *w, struct job *j);
static void run_handler(struct worker *w, struct job *j);
static void transition(struct job *j, enum job_state to);
static void finish(struct worker *w, struct job *j, bool ack, bool requeue,
                   const char *outcome);

int sk_worker_run(const struct sk_conf *conf, const struct sk_queue_conf *queue,
                  const struct sk_plugin *plugin)
{
    struct worker *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        sk_log_error("calloc(worker) failed");
        return SK_EXIT_RUNTIME;
    }
    w->conf = conf;
    w->queue = queue;
    w->handler = plugin->handler;
    w->broker_backoff = (struct sk_backoff){ .base_ms = 100, .cap_ms = 10000 };

    struct sk_err err = { 0 };
    int exit_code = SK_EXIT_OK;
    int rc = setup(w, &err);
    if (rc != SK_OK) {
        sk_log_error("worker for queue %s cannot start: %s", queue->name, err.msg);
        exit_code = rc == SK_ERR ? SK_EXIT_CONFIG : SK_EXIT_RUNTIME;
        goto out;
    }
    sk_log_info("worker for queue %s started (handler %s %s)", queue->name,
                w->handler->name != NULL ? w->handler->name : "?",
                w->handler->version != NULL ? w->handler->version : "?");

    while (!stop_requested) {
        if (!ensure_broker(w))
            continue;
        amqp_envelope_t delivery;
        rc = sk_broker_next(w->broker, &delivery, POLL_MS, &err);
        if (rc == SK_AGAIN)
            continue;
        if (rc != SK_OK) {
            drop_broker(w, err.msg);
            continue;
        }
        process(w, &delivery);
        sk_broker_release(w->broker, &delivery);
    }
    sk_log_info("worker for queue %s stopping", queue->name);

out:
    teardown(w);
    free(w);
    return exit_code;
}

static void on_stop_signal(int signo)
{
    (void)signo;
    stop_requested = 1;
}

/* Returns SK_OK; SK_ERR when retrying cannot help (bad handler config,
 * missing schema); SK_AGAIN when a restart later may succeed. */
static int setup(struct worker *w, struct sk_err *err)
{
    /* No SA_RESTART: a stop request must interrupt sleeps and waits. */
    struct sigaction sa = { .sa_handler = on_stop_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

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

    char app_name[256];
    snprintf(app_name, sizeof(app_name), "sekali worker %s", w->queue->name);
    int rc = sk_store_open(&w->store, &w->conf->postgres, app_name, err);
    if (rc != SK_OK)
        return rc;

    if (w->queue->lock) {
        struct sk_err lock_err = { 0 };
        /* Redis may be down now and back later: the lock connects lazily. */
        if (sk_lock_open(&w->lock, &w->conf->redis, &lock_err) != SK_OK) {
            sk_log_warn("redis unavailable at start, continuing on PostgreSQL alone: %s",
                        lock_err.msg);
            w->redis_down_logged = true;
        }
        rc = sk_heartbeat_start(&w->heartbeat, &w->conf->redis, w->queue->lock_ttl_ms, err);
        if (rc != SK_OK)
            return SK_AGAIN;
    }
    return SK_OK;
}

static void teardown(struct worker *w)
{
    sk_heartbeat_stop(w->heartbeat);
    sk_broker_close(w->broker);
    sk_lock_close(w->lock);
    sk_store_close(w->store);
    if (w->handler->fini != NULL && w->handler_state != NULL)
        w->handler->fini(w->handler_state);
}

static bool ensure_broker(struct worker *w)
{
    if (w->broker != NULL)
        return true;
    struct sk_err err = { 0 };
    int rc = sk_broker_open(&w->broker, &w->conf->amqp, &err);
    if (rc == SK_OK)
        rc = sk_broker_declare(w->broker, w->queue->name, &err);
    if (rc == SK_OK)
        rc = sk_broker_consume(w->broker, w->queue->name, (uint16_t)w->queue->prefetch, &err);
    if (rc == SK_OK) {
        if (w->broker_down_logged)
            sk_log_info("consuming %s again", w->queue->name);
        w->broker_down_logged = false;
        sk_backoff_reset(&w->broker_backoff);
        return true;
    }
    sk_broker_close(w->broker);
    w->broker = NULL;
    uint32_t delay = sk_backoff_next(&w->broker_backoff);
    if (!w->broker_down_logged)
        sk_log_warn("cannot consume %s, retrying with backoff: %s", w->queue->name, err.msg);
    w->broker_down_logged = true;
    sk_sleep_ms(delay);
    return false;
}

static void drop_broker(struct worker *w, const char *why)
{
    sk_log_warn("lost the broker connection: %s", why);
    w->broker_down_logged = true;
    sk_broker_close(w->broker);
    w->broker = NULL;
}

static void process(struct worker *w, const amqp_envelope_t *delivery)
{
    struct job j = { .state = JOB_RECEIVED, .delivery_tag = delivery->delivery_tag };
    struct sk_err err = { 0 };

    j.log.queue = w->queue->name;
    if (sk_envelope_parse(delivery, w->queue, &j.env, &err) != SK_OK) {
        /* Poison: the broker moves it to <queue>.dead; the reason is logged
         * here because a reject cannot carry it. */
        sk_log_job(SK_LOG_WARN, &j.log, "malformed message dead-lettered: %s", err.msg);
        if (sk_broker_reject(w->broker, j.delivery_tag, false, &err) != SK_OK)
            drop_broker(w, err.msg);
        return;
    }
    j.log.job_id = j.env.job_id;
    j.log.idempotency_key = j.env.idempotency_key;
    j.log.resource_key = j.env.resource_key;
    j.log.delivery_attempt = j.env.delivery_attempt;
    transition(&j, JOB_RECEIVED);

    if (w->queue->lock) {
        int rc = take_lock(w, &j);
        if (rc == SK_BUSY) {
            finish(w, &j, false, true, "lock busy, handed back to the broker");
            return;
        }
    }

    int rc = sk_store_claim(w->store, w->queue->name, j.env.idempotency_key, w->owner,
                            j.env.job_id, j.env.job_type, &j.claim, &err);
    if (rc == SK_DUP) {
        finish(w, &j, true, false, "duplicate suppressed");
        return;
    }
    if (rc != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j.log, "claim failed: %s", err.msg);
        /* Not acked: a later delivery claims again. The pause keeps a
         * database outage from turning into a hot redelivery loop. */
        sk_sleep_ms(sk_jitter(100, 1000));
        finish(w, &j, false, true, "claim failed, handed back to the broker");
        return;
    }
    j.log.fence = j.claim.fence;
    transition(&j, JOB_CLAIMED);
    run_handler(w, &j);
}

/* SK_OK once locked or when going on without Redis; SK_BUSY when another
 * owner kept the resource for all of lock.busy_wait. */
static int take_lock(struct worker *w, struct job *j)
{
    snprintf(j->lock_key, sizeof(j->lock_key), "sekali:lock:%s:%s", w->queue->name,
             j->env.resource_key);
    sk_lock_new_token(j->lock_token);

    struct sk_err err = { 0 };
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int rc = w->lock != NULL ? SK_OK : sk_lock_open(&w->lock, &w->conf->redis, &err);
        if (rc == SK_OK)
            rc = sk_lock_acquire(w->lock, j->lock_key, j->lock_token, w->queue->lock_ttl_ms,
                                 &err);
        if (rc == SK_OK) {
            if (w->redis_down_logged)
                sk_log_info("redis reachable again, locking resumed");
            w->redis_down_logged = false;
            j->locked = true;
            j->log.lock_owner = j->lock_token;
            sk_heartbeat_watch(w->heartbeat, j->lock_key, j->lock_token);
            transition(j, JOB_LOCKED);
            return SK_OK;
        }
        if (rc == SK_AGAIN) {
            /* PostgreSQL's row lock still serialises the key; the Redis lock
             * only saves duplicate work, so an outage costs speed, not safety. */
            if (!w->redis_down_logged)
                sk_log_warn("redis unavailable, going on without locks: %s", err.msg);
            w->redis_down_logged = true;
            return SK_OK;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t waited_ms = (now.tv_sec - start.tv_sec) * 1000 +
                            (now.tv_nsec - start.tv_nsec) / 1000000;
        if (waited_ms >= w->conf->lock.busy_wait_ms || stop_requested)
            return SK_BUSY;
        sk_sleep_ms(sk_jitter(5, 50));
    }
}

static void release_lock(struct worker *w, struct job *j)
{
    if (!j->locked)
        return;
    sk_heartbeat_unwatch(w->heartbeat);
    j->locked = false;
    struct sk_err err = { 0 };
    int rc = sk_lock_release(w->lock, j->lock_key, j->lock_token, &err);
    if (rc == SK_BUSY)
        sk_log_job(SK_LOG_WARN, &j->log, "lock had expired before release");
    else if (rc != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "lock release failed (it will expire): %s", err.msg);
}

static void run_handler(struct worker *w, struct job *j)
{
    struct sekali_job job = {
        .struct_size = sizeof(job),
        .queue = w->queue->name,
        .job_id = j->env.job_id,
        .job_type = j->env.job_type,
        .idempotency_key = j->env.idempotency_key,
        .resource_key = j->env.resource_key,
        .content_type = j->env.content_type,
        .body = j->env.body,
        .body_len = j->env.body_len,
        .delivery_attempt = j->env.delivery_attempt,
        .fence = j->claim.fence,
    };
    struct sekali_ctx *ctx = &w->ctx;
    sk_host_ctx_reset(ctx);
    ctx->pg = sk_store_conn(w->store);
    ctx->log = &j->log;
    ctx->lock_lost = w->heartbeat != NULL && j->locked ? sk_heartbeat_lost(w->heartbeat) : NULL;

    int status = w->handler->handle(w->handler_state, &job, ctx);
    transition(j, JOB_HANDLED);

    struct sk_err err = { 0 };
    if (status == SEKALI_OK) {
        int rc = sk_store_complete(w->store, w->queue->name, j->env.idempotency_key,
                                   j->claim.fence, ctx->result, ctx->result_len, &err);
        if (rc == SK_OK) {
            transition(j, JOB_COMMITTED);
            finish(w, j, true, false, "completed");
            return;
        }
        sk_log_job(SK_LOG_ERROR, &j->log, "commit failed%s: %s",
                   rc == SK_AGAIN ? " (outcome unknown, redelivery will tell)" : "", err.msg);
        sk_sleep_ms(sk_jitter(100, 1000));
        finish(w, j, false, true, "not committed, handed back to the broker");
        return;
    }

    if (sk_store_rollback(w->store, &err) != SK_OK)
        sk_log_job(SK_LOG_WARN, &j->log, "rollback failed: %s", err.msg);
    if (status == SEKALI_RETRY) {
        sk_log_job(SK_LOG_INFO, &j->log, "handler asked to retry: %s", ctx->error);
        sk_sleep_ms(sk_jitter(50, 500));
        finish(w, j, false, true, "retry, handed back to the broker");
        return;
    }

    char reason[600];
    if (status == SEKALI_FAIL)
        snprintf(reason, sizeof(reason), "%s", ctx->error[0] ? ctx->error : "handler failed");
    else
        snprintf(reason, sizeof(reason), "handler returned invalid status %d", status);
    int rc = sk_store_fail(w->store, w->queue->name, j->env.idempotency_key, w->owner,
                           j->env.job_id, j->env.job_type, reason, &err);
    if (rc != SK_OK) {
        /* Without the failed row a redelivery would run it again; better to
         * keep the message than to drop the record of why it failed. */
        sk_log_job(SK_LOG_ERROR, &j->log, "recording failure failed: %s", err.msg);
        finish(w, j, false, true, "failure not recorded, handed back to the broker");
        return;
    }
    sk_log_job(SK_LOG_WARN, &j->log, "job failed: %s", reason);
    finish(w, j, false, false, "failed, dead-lettered");
}

static void transition(struct job *j, enum job_state to)
{
    j->state = to;
    sk_log_job(SK_LOG_DEBUG, &j->log, "%s", state_names[to]);
    sk_failpoint(state_failpoints[to], j->env.idempotency_key);
}

/* The only exit of a delivered job: ack it (effect durable or duplicate), or
 * reject it back to the queue or to the dead letters; then drop the lock.
 * The lock is released after the ack so that no other worker can start on
 * this resource while our outcome is still in flight. */
static void finish(struct worker *w, struct job *j, bool ack, bool requeue,
                   const char *outcome)
{
    struct sk_err err = { 0 };
    int rc = ack ? sk_broker_ack(w->broker, j->delivery_tag, &err)
                 : sk_broker_reject(w->broker, j->delivery_tag, requeue, &err);
    if (ack && rc == SK_OK)
        transition(j, JOB_ACKED);
    release_lock(w, j);
    sk_log_job(SK_LOG_INFO, &j->log, "%s", outcome);
    if (rc != SK_OK)
        drop_broker(w, err.msg);
}
