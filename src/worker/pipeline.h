/* pipeline.h - what the pipeline runs on: the struct sk_pipeline the
 * worker process (worker.c) assembles once and hands each delivery. Its
 * own header, so that the files a step calls (letter.c) read it without
 * including the steps' job.h. */
#ifndef SK_PIPELINE_H
#define SK_PIPELINE_H

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
/* A worker's batch as it goes (batch_size.c; zeroed: not started yet). */
struct sk_batch_size {
    int      now;      /* the batch this worker runs now */
    int      ceiling;  /* what it may grow to: batch_max, less after an early close */
    unsigned calm;     /* batches since the ceiling last moved */
    unsigned kept;     /* batches since now last changed */
};

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
    struct sk_batch_size         batch;          /* how many a batch takes now (batch_size.c) */
    uint32_t                     ready_delay_ms; /* handler->ready() refused: the backoff */
    int64_t                      ready_next_ms;  /* ... and when to ask it again */
};

#endif
