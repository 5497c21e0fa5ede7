/* job.h - the pipeline of a delivery (span.c drives, job.c decides), as
 * the worker process calls it.
 *
 * The worker process (worker.c) assembles a struct sk_pipeline (pipeline.h)
 * once and hands it each delivery; the pipeline never calls back into the
 * worker. Everything it needs from the process is in that struct, and
 * everything it needs from the servers goes through the links. */
#ifndef SK_JOB_H
#define SK_JOB_H

#include "amqp_lib.h"

#include "pipeline.h"

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
