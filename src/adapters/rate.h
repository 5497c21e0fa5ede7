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

/* A batch's question to the limits, sent by sk_lock_swap_riding() (with
 * the batch's locks, or alone): ride is what it sends, the rest its
 * arguments' storage. */
struct sk_rate_call {
    struct sk_lock_ride ride;
    char              (*text)[24];
    const char        **args;
    long long          *out;
    size_t              total;   /* starts asked: answers expected */
};

/* Fills c to ask for counts[i] starts under keys[i] (distinct keys), for
 * every i < n, in one script (keys and counts borrowed: they must outlive
 * the call), with c->ride.rc SK_AGAIN until it is answered. SK_OK, or
 * SK_AGAIN out of memory (c then holds nothing). */
int  sk_rate_ask(struct sk_rate_call *c, const struct sk_rate *rate, size_t n,
                 const char *const *keys, const uint32_t *counts, struct sk_err *err);
/* c's answers into wait_ms, when c->ride.rc is SK_OK (else wait_ms is left
 * as it was): one a start, key by key in order: 0 admitted (counted
 * against the limit now), or how long until a slot is free for it
 * (nothing counted: it asks again then; the second refused of one key is
 * told one interval more than the first, and so on, so that they do not
 * all come back at once). */
void sk_rate_answers(const struct sk_rate_call *c, uint32_t *wait_ms);
/* Frees what sk_rate_ask() took; c may be freed twice. */
void sk_rate_call_free(struct sk_rate_call *c);

#endif
