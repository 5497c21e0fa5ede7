/* clock.c - monotonic milliseconds and a sleep (see clock.h). */
#include <stddef.h>
#include <time.h>

#include "clock.h"

int64_t sk_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

uint64_t sk_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void sk_sleep_ms(uint32_t ms)
{
    struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    nanosleep(&t, NULL);
}

void sk_rtt_add(struct sk_rtt *r, uint64_t started_ns)
{
    uint64_t took = sk_now_ns() - started_ns;
    r->ns[r->next++ % SK_RTT_SAMPLES] = took > 0 ? took : 1;
}

uint64_t sk_rtt_least(const struct sk_rtt *r)
{
    uint64_t least = 0;
    for (size_t i = 0; i < SK_RTT_SAMPLES; i++)
        if (r->ns[i] != 0 && (least == 0 || r->ns[i] < least))
            least = r->ns[i];
    return least;
}
