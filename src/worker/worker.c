/* worker.c - one worker process: its loop.
 *
 * A worker consumes one queue, one job at a time: it takes a delivery,
 * stamps its scoreboard slot for the supervisor, and hands the delivery to
 * the pipeline (job.c). Its connections and their outages are links.c's;
 * this file assembles the pipeline after fork, runs the loop until a stop
 * is requested, and cleans up after a predecessor that died in its slot. */
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch.h"
#include "broker.h"
#include "clock.h"
#include "doctor.h"
#include "forward.h"
#include "heartbeat.h"
#include "job.h"
#include "links.h"
#include "log.h"
#include "pause.h"
#include "plugin.h"
#include "process.h"
#include "span_export.h"
#include "store.h"
#include "text.h"
#include "worker.h"

#define POLL_MS 250  /* longest a stop request waits for an idle worker */

static int  setup(struct sk_pipeline *p, bool first, struct sk_err *err);
static void teardown(struct sk_pipeline *p);
static bool prepare(struct sk_pipeline *p);
static bool handler_ready(struct sk_pipeline *p);
static void serve(struct sk_pipeline *p);
static void run_job(struct sk_pipeline *p, amqp_envelope_t *delivery);
static void record_crash(struct sk_pipeline *p, char *key, const char *who, const char *whose);
static void free_dead_locks(struct sk_pipeline *p);

int sk_worker_run(const struct sk_conf *conf, const struct sk_queue_conf *queue,
                  const struct sk_plugin *plugin, struct sk_slot *slot,
                  struct sk_metrics_queue *metrics, bool doctor)
{
    /* On the heap: the handler's context holds a whole saved result. */
    struct sk_pipeline *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        sk_log_error("calloc(worker) failed");
        return SK_EXIT_RUNTIME;
    }
    p->conf = conf;
    p->queue = queue;
    p->slot = slot;
    p->metrics = metrics;
    p->handler = plugin->handler;

    /* The first worker of its slot (at start or in a new generation) has
     * never turned its loop. Only it treats a refused password as fatal: a
     * replacement after a crash, like a running worker, keeps retrying. */
    bool first = atomic_load(&slot->alive_ms) == 0;
    struct sk_err err = { 0 };
    int exit_code = SK_EXIT_OK;
    int rc = setup(p, first, &err);
    if (rc != SK_OK) {
        sk_log_event(SK_LOG_ERROR, SK_EVENT_WORKER_CANNOT_START, NULL,
                     &(struct sk_log_job){ .queue = queue->name },
                     "worker for queue %s cannot start: %s", queue->name, err.msg);
        exit_code = rc == SK_ERR ? SK_EXIT_CONFIG : SK_EXIT_RUNTIME;
        goto out;
    }
    /* Connecting (SCRAM's key derivation, OpenSSL's set-up, the broker's
     * login) leaves some 200 KiB of freed heap behind that a job never needs
     * again: given back now, so that a worker's resident memory is what its
     * jobs use. */
    malloc_trim(0);
    const char *handler = p->handler->name != NULL ? p->handler->name : "?";
    const char *version = p->handler->version != NULL ? p->handler->version : "?";
    sk_log_event_fields(SK_LOG_INFO, SK_EVENT_STARTED, NULL,
                        &(struct sk_log_job){ .queue = queue->name },
                        (const struct sk_log_field[]){ { "handler", handler },
                                                       { "handler_version", version },
                                                       { "handler_path", plugin->path } }, 3,
                        "worker for queue %s started (handler %s %s from %s)", queue->name,
                        handler, version, plugin->path);
    /* Once a generation (at start, and after each reload): this worker is
     * its first, and only its first process asks; a restart after a crash
     * does not repeat what was logged. The schema, which refuses, was
     * checked by setup(). */
    if (doctor && first)
        sk_doctor_at_start(conf);

    serve(p);
    sk_log_event(SK_LOG_INFO, SK_EVENT_STOPPING, NULL,
                 &(struct sk_log_job){ .queue = queue->name }, "worker for queue %s stopping",
                 queue->name);

out:
    teardown(p);
    free(p);
    return exit_code;
}

/* The worker's loop: one delivery at a time until a stop is asked for. */
static void serve(struct sk_pipeline *p)
{
    struct sk_err err = { 0 };
    while (!sk_process_stopping()) {
        /* Liveness for the supervisor's watchdog: the loop turns at least
         * every POLL_MS while idle; a job in hand is covered by its start. */
        atomic_store(&p->slot->alive_ms, sk_now_ms());
        if (!prepare(p))
            continue;
        /* Locks of settled jobs go with the next acquire; a worker about to
         * wait for its next delivery (or to hold in a pause) sends them now. */
        if (sk_span_releases_waiting(p) && !sk_broker_waiting(sk_links_consumer(p->links)))
            sk_span_release_locks(p);
        /* Between jobs only: a pause never interrupts the job in hand. */
        if (sk_pause_hold(p->pause, p->links, POLL_MS))
            continue;
        amqp_envelope_t delivery;
        int rc = sk_broker_next(sk_links_consumer(p->links), &delivery, POLL_MS, &err);
        if (rc == SK_OK) {
            if (!sk_forward_intake(p, &delivery))
                run_job(p, &delivery);
        } else if (rc != SK_AGAIN) {
            sk_links_drop(p->links, SK_LINK_CONSUMER, NULL, &err);
        }
    }
}

/* Returns SK_OK; SK_ERR when retrying cannot help (bad handler config,
 * missing schema, a first worker's password refused); SK_AGAIN when a
 * restart later may succeed. */
static int setup(struct sk_pipeline *p, bool first, struct sk_err *err)
{
    char host[64] = "localhost";
    gethostname(host, sizeof(host) - 1);
    snprintf(p->owner, sizeof(p->owner), "%s:%ld", host, (long)getpid());

    if (p->handler->init != NULL) {
        int status = p->handler->init(sk_host(), p->queue->handler_config, &p->handler_state);
        if (status == SEKALI_FAIL)
            return sk_err_set(err, SK_ERR, "handler init() failed: bad configuration");
        if (status != SEKALI_OK)
            return sk_err_set(err, SK_AGAIN, "handler init() asked to retry later");
    }

    p->pause = sk_pause_new(p->queue->name);
    if (p->pause == NULL)
        return sk_err_errno(err, SK_AGAIN, "calloc(pause)");
    int rc = sk_links_new(&p->links, p->conf, p->queue, p->slot, err);
    if (rc == SK_OK)
        rc = sk_links_open(p->links, first, err);
    if (rc != SK_OK)
        return rc;
    uint32_t tick = sk_heartbeat_tick(p->queue, &p->conf->amqp);
    if (tick != UINT32_MAX &&
        sk_heartbeat_start(&p->heartbeat, &p->conf->redis, &p->conf->postgres, tick, err) != SK_OK)
        return SK_AGAIN;
    /* Spans are an extra: a worker that cannot export still runs its jobs. */
    struct sk_err span_err = { 0 };
    if (sk_span_export_start(&p->conf->tracing, p->queue->name, &span_err) != SK_OK)
        sk_log_warn("queue %s: spans will not be exported: %s", p->queue->name, span_err.msg);
    return SK_OK;
}

/* Before each delivery: clean up after a predecessor that died in this
 * slot, and have the servers ready. False when the loop should turn again
 * first (a server is down: the links have slept its backoff). */
static bool prepare(struct sk_pipeline *p)
{
    struct sk_slot *slot = p->slot;
    /* First, before anything is consumed: the redeliveries of the dead
     * worker's jobs (a whole batch's) are waiting for those locks. But if
     * a job killed that worker, its crash is recorded first: a copy that
     * took the freed lock before the count was written would run the job
     * uncounted. The orphans' count is read before the crash flags: a
     * retired worker's are handed to this live one crash first. */
    bool orphans = atomic_load(&slot->n_orphans) > 0;
    bool crashes = atomic_load(&slot->died_in_job) || atomic_load(&slot->crash_handed);
    if (!crashes && orphans)
        free_dead_locks(p);
    if (!sk_links_store_ready(p->links))
        return false;
    if (crashes) {
        if (atomic_load(&slot->died_in_job)) {
            record_crash(p, slot->job_key, "the previous worker", "replaced");
            atomic_store(&slot->died_in_job, 0);
        }
        if (atomic_load(&slot->crash_handed)) {
            record_crash(p, slot->handed_crash_key, "a retired worker", "retired");
            atomic_store(&slot->crash_handed, 0);
        }
        if (atomic_load(&slot->n_orphans) > 0)
            free_dead_locks(p);
    }
    /* Before subscribing: a worker whose handler cannot run holds none of
     * the queue's deliveries, which other hosts' workers may take. */
    return handler_ready(p) && sk_links_ready(p->links);
}

#define READY_FIRST_MS 1000
#define READY_MAX_MS   30000

/* A handler that depends on the database (ABI 1.4's ready(): the stock SQL
 * handler's statement) says whether jobs can run. Until it does, this
 * worker holds no delivery (it gives back what it had and does not
 * subscribe), says why in its slot, and asks again after a backoff: a
 * function not deployed yet keeps the jobs in the broker, never
 * dead-letters them, never turns into a crash loop, and fails /readyz,
 * STATUS=, `sekalictl status` and doctor until it is fixed. */
static bool handler_ready(struct sk_pipeline *p)
{
    if (!sk_plugin_has_ready(p->handler))
        return true;
    const struct sk_log_job job = { .queue = p->queue->name };
    int64_t now = sk_now_ms();
    if (now < p->ready_next_ms) {
        int64_t left = p->ready_next_ms - now;
        sk_sleep_ms(left < POLL_MS ? (uint32_t)left : POLL_MS);
        return false;
    }
    char why[512] = "";
    int status = p->handler->ready(p->handler_state, sk_store_conn(sk_links_store(p->links)),
                                   why, sizeof(why));
    if (status == SEKALI_OK) {
        if (p->ready_delay_ms > 0)
            sk_log_event(SK_LOG_INFO, SK_EVENT_HANDLER_READY, NULL, &job,
                         "queue %s: the handler is ready: taking jobs again", p->queue->name);
        p->ready_delay_ms = 0;
        atomic_store(&p->slot->blocked, 0);
        return true;
    }
    why[sizeof(why) - 1] = '\0';
    if (why[0] == '\0')
        snprintf(why, sizeof(why), "(no reason given)");
    bool began = p->ready_delay_ms == 0;
    p->ready_delay_ms = began ? READY_FIRST_MS
                        : p->ready_delay_ms >= READY_MAX_MS / 2 ? READY_MAX_MS
                        : p->ready_delay_ms * 2;
    p->ready_next_ms = now + p->ready_delay_ms;
    /* The slot is shown by status and the console: cut on a character. */
    sk_text_copy(p->slot->blocked_why, sizeof(p->slot->blocked_why), why);
    atomic_store(&p->slot->blocked, 1);
    sk_links_stand_down(p->links);
    sk_log_event(SK_LOG_ERROR, began ? SK_EVENT_HANDLER_NOT_READY : NULL, NULL, &job,
                 "queue %s: the handler is not ready, taking no jobs (next check in %u ms): %s",
                 p->queue->name, (unsigned)p->ready_delay_ms, why);
    return false;
}

static void run_job(struct sk_pipeline *p, amqp_envelope_t *delivery)
{
    struct sk_slot *slot = p->slot;
    /* The supervisor kills us if this outlives queue.job_timeout. The
     * key is the job's once parsed: never the previous job's. */
    sk_slot_publish_job(slot, "", "", 0, "");
    atomic_store(&slot->phase, SK_PHASE_JOB);
    atomic_store(&slot->job_started_ms, sk_now_ms());
    size_t n = 1;
    if (p->queue->batch > 1) {
        n = sk_batch_run(p, delivery);  /* settles and releases the whole batch */
    } else {
        sk_span_process(p, delivery);
        sk_broker_release(sk_links_consumer(p->links), delivery);
    }
    atomic_store(&slot->job_started_ms, 0);
    atomic_store(&slot->phase, SK_PHASE_IDLE);
    /* Progress: the supervisor restarts this worker at once if it dies. */
    atomic_fetch_add(&slot->finished, n);
}

static void teardown(struct sk_pipeline *p)
{
    if (p->links != NULL)
        sk_span_release_locks(p);
    sk_heartbeat_stop(p->heartbeat);
    sk_span_export_stop();
    sk_host_ctx_free(&p->ctx);
    sk_span_free(p->span);
    sk_links_free(p->links);
    sk_pause_free(p->pause);
    if (p->handler->fini != NULL && p->handler_state != NULL)
        p->handler->fini(p->handler_state);
}

/* The worker this one replaces (or a retired one, whose crash the
 * supervisor handed here) died running a job: count it against the job's
 * key (sql/006), so that a job that keeps killing its workers is
 * dead-lettered when it comes back (job.c). Before this worker takes a job
 * of its own, which would overwrite job_key; tried once, since a count
 * lost is one crash more before the job is stopped, never a wrong outcome. */
/* whose is the event's field: "replaced" (this slot's previous worker) or
 * "retired" (a crash handed down). */
static void record_crash(struct sk_pipeline *p, char *key, const char *who, const char *whose)
{
    int crashes = 0;
    struct sk_err err = { 0 };
    const struct sk_log_job job = { .queue = p->queue->name, .idempotency_key = key };
    char count[16];
    if (sk_store_record_crash(sk_links_store(p->links), p->queue->name, key, &crashes,
                              &err) == SK_OK) {
        snprintf(count, sizeof(count), "%d", crashes);
        sk_log_event_fields(SK_LOG_WARN, SK_EVENT_CRASH_RECORDED, NULL, &job,
                            (const struct sk_log_field[]){ { "crashes", count },
                                                           { "worker", whose } }, 2,
                            "%s died running the job with key %s: crash %d of it%s", who, key,
                            crashes,
                            p->queue->max_crashes > 0 && crashes >= p->queue->max_crashes
                                ? ", so it will be dead-lettered when it comes back" : "");
    } else
        sk_log_job(SK_LOG_WARN, &job, "%s died running the job with key %s; the crash is not "
                   "counted: %s", who, key, err.msg);
    key[0] = '\0';
}

/* A worker of this slot died holding Redis locks (the supervisor moved
 * them to the slot's orphans): delete each whose token still owns it, all
 * in one round trip, so the dead worker's redelivered jobs run now rather
 * than after lock_ttl. Their owner is provably dead, and the compare by
 * token cannot delete a lock a live worker took since. While Redis is
 * unreachable the orphans stay recorded and are tried again when the
 * Redis backoff allows; the worker consumes in the meantime, as it would
 * without them. */
static void free_dead_locks(struct sk_pipeline *p)
{
    size_t n, freed;
    const struct sk_slot_lock *orphans = sk_slot_orphans(p->slot, &n);
    int rc = sk_links_free_orphans(p->links, orphans, n, &freed);
    if (rc == SK_AGAIN)
        return;
    if (freed > 0) {
        sk_metrics_locks_released_for_dead(p->metrics, freed);
        char count[24];
        snprintf(count, sizeof(count), "%zu", freed);
        sk_log_event_fields(SK_LOG_INFO, SK_EVENT_LOCKS_FREED, NULL,
                            &(struct sk_log_job){ .queue = p->queue->name },
                            (const struct sk_log_field[]){ { "count", count } }, 1,
                            "freed %zu of the %zu locks that a dead worker held (the first %s)",
                            freed, n, orphans[0].key);
    }
    if (freed < n)
        sk_log_debug("%zu of the %zu locks that a dead worker held had already expired or "
                     "changed hands", n - freed, n);
    sk_slot_forget_orphans(p->slot);
}
