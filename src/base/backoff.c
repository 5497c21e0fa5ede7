/* backoff.c - capped exponential backoff with full jitter. */
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
    /* In 64 bits: [0, UINT32_MAX] spans 2^32 values, which wraps to 0 in 32. */
    uint64_t span = (uint64_t)hi - lo + 1;
    return lo + (uint32_t)(r % span);
}
