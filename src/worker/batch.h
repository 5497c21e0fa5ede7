/* batch.h - many deliveries in one transaction (queues[].batch > 1), as
 * one span through the pipeline's steps (batch.c). */
#ifndef SK_BATCH_H
#define SK_BATCH_H

#include <stddef.h>

#include "amqp_lib.h"

struct sk_pipeline;

/* Batch mode (queue->batch > 1): takes up to the worker's batch (the
 * queue's, grown by far servers: batch_size.h) of deliveries, the
 * first one given and the rest from the consumer's prefetch window (waiting
 * at most queue->batch_wait for them), and runs them in one transaction,
 * each handler in its own savepoint. Every delivery taken is settled and
 * released before it returns. Returns how many were taken. */
size_t sk_batch_run(struct sk_pipeline *p, amqp_envelope_t *first);

#endif
