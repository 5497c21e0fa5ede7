/* forward.h - a queue's intake, when it has lanes (queues[].lanes): each
 * delivery taken from `<queue>` itself is forwarded to its tenant's lane,
 * not run (docs/rate-limits.md, "Fairness between tenants"). */
#ifndef SK_FORWARD_H
#define SK_FORWARD_H

#include <stdbool.h>

#include "amqp_lib.h"

struct sk_pipeline;

/* Whether env, just taken with sk_broker_next(), was the intake's and is
 * done with: forwarded to its lane (a confirmed copy, then acked), or
 * handed back to the intake when the copy could not be confirmed. Then env
 * is released here. False for a lane's delivery, for every delivery of a
 * queue without lanes, and for an intake delivery that cannot be copied
 * (its body over max_body, its properties too large): those the caller
 * runs as jobs. Acks and rejects are sent at once, one delivery each, so
 * that a batch's unsettled deliveries taken before this one are never
 * settled with it. Worker process; blocks one publish round trip. */
bool sk_forward_intake(struct sk_pipeline *p, amqp_envelope_t *env);

#endif
