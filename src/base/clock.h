/* clock.h - the monotonic clock and the sleep that deadlines and retry
 * loops use. Kept apart from backoff so each file says what it owns. */
#ifndef SK_CLOCK_H
#define SK_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in milliseconds: for deadlines, never for dates. Any
 * thread may call it. */
int64_t sk_now_ms(void);

/* CLOCK_MONOTONIC in nanoseconds, for durations (read through the vDSO, not
 * a syscall). Any thread may call it. */
uint64_t sk_now_ns(void);

/* Sleeps ms milliseconds; returns early when a signal arrives. */
void sk_sleep_ms(uint32_t ms);

#endif
