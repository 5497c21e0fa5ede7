/* forward.h - a queue's intake, when it has lanes (queues[].lanes): each
 * delivery taken from `<queue>` itself is forwarded to its tenant's lane,
 * not run (docs/rate-limits.md, "Fairness between tenants"). */
#ifndef SK_FORWARD_H
#define SK_FORWARD_H

#include <stdbool.h>

#include "amqp_lib.h"

struct sk_pipeline;

/* Whether env, just taken with sk_broker_next(), was the intake's and is
 * done with, with the intake's deliveries that followed it in the
 * worker's buffers (up to 64): each forwarded to its lane (a confirmed
 * copy, then acked) or handed back to the intake when its copy could not
 * be confirmed, and released here. False for a lane's delivery and every
 * delivery of a queue without lanes, and for an intake delivery of which
 * no copy can be made (its body over max_body, its properties too large):
 * env then holds a delivery for the caller to run as a job, the one it
 * gave or one that followed (the forwards before it are settled). Acks
 * and rejects are sent at once, one delivery each, so that a batch's
 * unsettled deliveries taken before are never settled with them. Worker
 * process; blocks one confirm round trip per 64 forwards. */
bool sk_forward_intake(struct sk_pipeline *p, amqp_envelope_t *env);

#endif
