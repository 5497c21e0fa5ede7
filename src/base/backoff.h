/* backoff.h - exponential backoff with full jitter, for every retry loop.
 *
 * Full jitter (a uniform delay between 0 and the capped exponential) keeps a
 * fleet of workers that lost the same server from reconnecting in lockstep. */
#ifndef SK_BACKOFF_H
#define SK_BACKOFF_H

#include <stdint.h>

/* Retry loops wait with sk_sleep_ms() and measure with sk_now_ms(): their
 * callers get the clock through this header. */
#include "clock.h"

struct sk_backoff {
    uint32_t base_ms;
    uint32_t cap_ms;
    uint32_t failures;
};

/* The delay before the next attempt, growing with each call. */
uint32_t sk_backoff_next(struct sk_backoff *b);
void     sk_backoff_reset(struct sk_backoff *b);

/* A uniform random value in [lo, hi]. */
uint32_t sk_jitter(uint32_t lo, uint32_t hi);

#endif
