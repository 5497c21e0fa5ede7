/* worker_job.h - what worker.c (one process's connections and loop) and
 * job.c (one delivery's pipeline) share. Private to those two files. */
#ifndef SK_WORKER_JOB_H
#define SK_WORKER_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include <amqp.h>

#include "backoff.h"
#include "broker.h"
#include "config.h"
#include "heartbeat.h"
#include "host.h"
#include "lock.h"
#include "metrics.h"
#include "scoreboard.h"
#include "store.h"

/* One worker process's state. Owned by worker.c's sk_worker_run(); job.c
 * uses the connections but opens and closes none except through the
 * sk_worker_* functions below. */
struct sk_worker {
    const struct sk_conf        *conf;
    const struct sk_queue_conf  *queue;
    const struct sekali_handler *handler;
    void                        *handler_state;
    struct sk_broker            *broker;
    struct sk_broker            *publisher;    /* confirmed copies: retries, dead letters */
    struct sk_lock              *lock;
    struct sk_store             *store;
    struct sk_heartbeat         *heartbeat;
    struct sk_backoff            broker_backoff;
    bool                         broker_down_logged;
    bool                         redis_down;
    bool                         redis_refused;  /* down because it refused our password */
    bool                         postgres_down_logged;
    int64_t                      redis_retry_at_ms;
    struct sk_backoff            redis_backoff;
    struct sk_backoff            postgres_backoff;
    char                         owner[128];   /* host:pid, recorded with each claim */
    struct sk_slot              *slot;         /* ours in the supervisor's scoreboard */
    struct sk_metrics_queue     *metrics;      /* our queue's shared counters */
    struct sk_queue_shape        shape;
    struct sekali_ctx            ctx;          /* reused for every job */
};

/* Runs one delivery through the pipeline, to its ack, requeue or dead
 * letter. The delivery stays owned by the caller. */
void sk_job_process(struct sk_worker *w, const amqp_envelope_t *delivery);

/* Provided by worker.c for the pipeline. */
bool sk_worker_publisher(struct sk_worker *w, struct sk_err *err);
void sk_worker_drop_publisher(struct sk_worker *w, const char *why);
void sk_worker_drop_broker(struct sk_worker *w, const char *why);

#endif
