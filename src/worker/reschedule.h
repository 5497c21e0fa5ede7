/* reschedule.h - sends a delivery to run later, or to the dead letters.
 *
 * Either way a confirmed copy exists before the caller acks the original,
 * so a crash in between leaves two copies (absorbed by the idempotency key),
 * never none. Delays go through per-delay queues that the broker empties
 * back into the work queue, so a long delay never holds up a short one. */
#ifndef SK_RESCHEDULE_H
#define SK_RESCHEDULE_H

#include <stdint.h>

#include "amqp_lib.h"

#include "broker.h"
#include "config.h"
#include "envelope.h"

/* Delays are rounded up to a fixed ladder (each step 1.25 times the last,
 * from 10 ms), so that a queue needs a bounded number of delay queues. */
uint32_t sk_reschedule_bucket(uint32_t delay_ms);

/* The delay before attempt `next_attempt` (2 for the first retry): full
 * jitter, uniform in [0, min(retry.max, retry.initial * 2^(next_attempt-2))],
 * then bucketed. */
uint32_t sk_reschedule_retry_delay(const struct sk_retry_conf *retry, uint32_t next_attempt);

/* Publishes a copy of env to come back to `queue` after delay_ms (through a
 * delay queue of the same type as the work queue), scheduled
 * as attempt `next_attempt`; `error` (NULL when this is not a failure, e.g. a
 * busy lock) is recorded with the first failure's time, as sk_text_copy()
 * makes it (valid UTF-8, bounded). SK_OK once the
 * broker confirmed the copy; otherwise the caller must not ack: SK_AGAIN
 * when the broker could not be asked or could not take it yet (connection
 * lost, delay queue not declared, the copy nacked), SK_ERR when it refused
 * this copy or the copy cannot be sent at all (too large for a frame),
 * which no later attempt would change. */
int sk_reschedule_later(struct sk_broker *pub, const struct sk_queue_conf *queue,
                        const amqp_envelope_t *env,
                        const struct sk_envelope *parsed, uint32_t delay_ms,
                        uint32_t next_attempt, const char *error, struct sk_err *err);

/* Publishes a copy of env to `queue`.dead with headers saying why:
 * x-sekali-reason, x-sekali-error, x-sekali-attempts, x-sekali-queue,
 * x-sekali-first-failure, x-sekali-last-failure; reason and error as
 * sk_text_copy() makes them (valid UTF-8, bounded). parsed may be NULL (a
 * message too malformed to parse). SK_OK once confirmed. */
int sk_reschedule_dead(struct sk_broker *pub, const char *queue, const amqp_envelope_t *env,
                       const struct sk_envelope *parsed, const char *reason, const char *error,
                       struct sk_err *err);

#endif
