/* job.h - the pipeline of a delivery (span.c drives, job.c decides), and
 * what it runs on.
 *
 * The worker process (worker.c) assembles a struct sk_pipeline once and
 * hands it each delivery; the pipeline never calls back into the worker.
 * Everything it needs from the process is in this struct, and everything it
 * needs from the servers goes through the links. */
#ifndef SK_JOB_H
#define SK_JOB_H

#include "amqp_lib.h"

#include "config.h"
#include "host.h"

struct sk_heartbeat;
struct sk_links;
struct sk_pause;
struct sk_metrics_queue;
struct sk_slot;
struct sk_span;

/* Owned by the worker process for its whole life; sk_span_process() reads
 * it and uses its parts, and writes only ctx and its scoreboard slot. */
struct sk_pipeline {
    const struct sk_conf        *conf;
    const struct sk_queue_conf  *queue;
    const struct sekali_handler *handler;
    void                        *handler_state;  /* what handler->init() gave */
    struct sk_links             *links;          /* the servers, and their outages */
    struct sk_pause             *pause;          /* the queue's pause, obeyed between jobs */
    struct sk_heartbeat         *heartbeat;      /* NULL when nothing needs renewing */
    struct sk_metrics_queue     *metrics;        /* our queue's shared counters */
    struct sk_slot              *slot;           /* ours in the supervisor's scoreboard */
    char                         owner[128];     /* host:pid, recorded with each claim */
    struct sekali_ctx            ctx;            /* reused for every job */
    struct sk_span              *span;           /* jobs in flight: span.c's, made on first use */
    uint32_t                     ready_delay_ms; /* handler->ready() refused: the backoff */
    int64_t                      ready_next_ms;  /* ... and when to ask it again */
};

/* Runs one delivery through the pipeline, as a span of one, to its ack,
 * requeue or dead letter. The delivery stays owned by the caller. Blocks
 * for the job's length; the worker process's main thread only. */
void sk_span_process(struct sk_pipeline *p, const amqp_envelope_t *delivery);
/* Releases now the locks of settled jobs that wait to travel with the next
 * acquire: the worker calls it before it waits for a delivery, and before
 * it stops. One Redis round trip when there are any; a failure is logged
 * (the locks expire by their TTL). */
void sk_span_release_locks(struct sk_pipeline *p);
/* Whether any such lock waits (cheap: asked before the broker is). */
bool sk_span_releases_waiting(const struct sk_pipeline *p);
/* Frees what the pipeline kept between spans (p->span); accepts NULL. */
void sk_span_free(struct sk_span *s);

#endif
