/* limit.h - a queue's rate limit (queues[].rate_limit), applied to a
 * span's jobs after they are validated and before their locks: one Redis
 * round trip a span, whatever its size (rate.c). A job over the limit goes
 * to a delay queue until its slot (sk_job_later(), the path a busy lock
 * takes), at the same attempt: waiting for a slot is no failure, no crash
 * and no retry. Like the lock, the limit decides only when a job runs;
 * PostgreSQL still decides whether its effect happens. */
#ifndef SK_LIMIT_H
#define SK_LIMIT_H

#include "job.h"
#include "job_steps.h"

/* Takes a start for each received job of s from the queue's limit; those
 * refused are settled, re-scheduled for when a slot is free. With Redis
 * unreachable every received job is re-scheduled (1-5 s): the limit fails
 * closed (docs/rate-limits.md says why). Nothing when the queue has no
 * limit. Main thread only. */
void sk_limit_admit(struct sk_pipeline *p, struct sk_span *s);

#endif
