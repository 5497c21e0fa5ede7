/* backoff.c - capped exponential backoff with full jitter. */
#include <errno.h>
#include <sys/random.h>
#include <time.h>

#include "backoff.h"

uint32_t sk_backoff_next(struct sk_backoff *b)
{
    uint64_t ceiling = b->base_ms;
    for (uint32_t i = 0; i < b->failures && ceiling < b->cap_ms; i++)
        ceiling *= 2;
    if (ceiling > b->cap_ms)
        ceiling = b->cap_ms;
    b->failures++;
    return sk_jitter(0, (uint32_t)ceiling);
}

void sk_backoff_reset(struct sk_backoff *b)
{
    b->failures = 0;
}

uint32_t sk_jitter(uint32_t lo, uint32_t hi)
{
    if (hi <= lo)
        return lo;
    uint32_t r;
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
        r = (uint32_t)clock();
    return lo + r % (hi - lo + 1);
}

int64_t sk_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void sk_sleep_ms(uint32_t ms)
{
    struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    nanosleep(&t, NULL);
}
