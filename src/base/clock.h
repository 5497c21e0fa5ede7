/* clock.h - the monotonic clock and the sleep that deadlines and retry
 * loops use. Kept apart from backoff so each file says what it owns. */
#ifndef SK_CLOCK_H
#define SK_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in milliseconds: for deadlines, never for dates. Any
 * thread may call it. */
int64_t sk_now_ms(void);

/* CLOCK_MONOTONIC in nanoseconds, for durations a metric records (read
 * through the vDSO, not a system call). Any thread may call it. */
uint64_t sk_now_ns(void);

/* A server's round trip, estimated as the least of the last
 * SK_RTT_SAMPLES measured: a lock wait or one slow answer among them does
 * not raise it; a server that stays far (or slow) does, within as many
 * round trips. Zeroed: no sample yet. One thread's. */
#define SK_RTT_SAMPLES 8
struct sk_rtt {
    uint64_t ns[SK_RTT_SAMPLES];  /* 0: no sample yet */
    unsigned next;
};

/* One round trip, begun at started_ns (sk_now_ns()), ended now. */
void sk_rtt_add(struct sk_rtt *r, uint64_t started_ns);
/* The estimate in ns; 0 before the first sample. */
uint64_t sk_rtt_least(const struct sk_rtt *r);

/* Sleeps ms milliseconds; returns early when a signal arrives. */
void sk_sleep_ms(uint32_t ms);

#endif
