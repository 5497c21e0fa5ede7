/* rate.h - rate limits counted in Redis (GCRA), shared by every worker of
 * every host that asks the same Redis.
 *
 * One key holds one limit's theoretical arrival time (TAT): when the next
 * job would be due if jobs came exactly at the rate. A job may start while
 * the TAT is at most the burst's tolerance ahead of now, and each start
 * moves the TAT on by one interval. Redis's clock (TIME, inside the
 * script) is the only clock: hosts' clocks never meet. The key expires
 * once the TAT has passed, so an idle limit costs no memory. */
#ifndef SK_RATE_H
#define SK_RATE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "lock.h"

/* One limit's arithmetic, in microseconds. */
struct sk_rate {
    uint64_t interval_us;   /* between two jobs at the rate: period / count */
    uint64_t tolerance_us;  /* how far ahead the TAT may run: (burst - 1) intervals */
};

/* count jobs per period_ms, burst at once (count, period_ms, burst >= 1). */
struct sk_rate sk_rate_of(uint32_t count, uint32_t period_ms, uint32_t burst);

/* Writes the Redis key of queue's limit into out: the queue's own, or
 * resource's within it when resource is not NULL. */
void sk_rate_key(char *out, size_t size, const char *queue, const char *resource);

/* Asks for counts[i] starts under keys[i] (distinct keys), for every i < n,
 * in one script and one round trip on the lock's connection. wait_ms holds
 * one answer a start, key by key in order: 0 admitted (counted against the
 * limit now), or how long until a slot is free for it (nothing counted: it
 * asks again then; the second refused of one key is told one interval
 * more than the first, and so on, so that they do not all come back at
 * once). SK_OK, or SK_AGAIN (Redis failed: nothing to trust in wait_ms).
 * Blocks at most the connection's command timeout. */
int sk_rate_take(struct sk_lock *l, const struct sk_rate *rate, size_t n,
                 const char *const *keys, const uint32_t *counts, uint32_t *wait_ms,
                 struct sk_err *err);

#endif
