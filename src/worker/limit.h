/* limit.h - a queue's rate limit (queues[].rate_limit), applied to a
 * span's jobs after they are validated, in the round trip that takes their
 * locks: no Redis round trip of its own (one a span without locks),
 * whatever its size (rate.c). A job over the limit goes
 * to a delay queue until its slot (sk_job_later(), the path a busy lock
 * takes), at the same attempt: waiting for a slot is no failure, no crash
 * and no retry. Like the lock, the limit decides only when a job runs;
 * PostgreSQL still decides whether its effect happens. */
#ifndef SK_LIMIT_H
#define SK_LIMIT_H

#include "job.h"
#include "job_steps.h"
#include "lock.h"

/* Takes a start for each received job of s from the queue's limit, in a
 * round trip of its own (a queue without locks: sk_span_admit_lock()
 * carries the question otherwise); those refused are settled, re-scheduled for
 * when a slot is free. With Redis unreachable every received job is
 * re-scheduled (1-5 s): the limit fails closed (docs/rate-limits.md says
 * why). Nothing when the queue has no limit. Main thread only. */
void sk_limit_admit(struct sk_pipeline *p, struct sk_span *s);

/* The limit's question for s's received jobs, for the lock's round trip
 * to carry (sk_lock_swap_riding()): NULL when the queue has no limit or
 * no job asks (or, out of memory, every one was re-scheduled). The ride
 * is limit.c's until sk_limit_answer(), which must follow, sent or not. */
struct sk_lock_ride *sk_limit_ask(struct sk_pipeline *p, struct sk_span *s);

/* Settles the jobs that asked and are still live (received or locked)
 * from the ride's answers: those over the limit are re-scheduled, as by
 * sk_limit_admit(). A ride not answered (never sent: ride->rc is then
 * SK_AGAIN) re-schedules them all; dropped: the round trip's failure was
 * already reported to the links (else this reports it). */
void sk_limit_answer(struct sk_pipeline *p, struct sk_span *s, struct sk_lock_ride *ride,
                     bool dropped);

#endif
