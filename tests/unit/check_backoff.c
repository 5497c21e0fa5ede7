/* check_backoff.c - the retry ladder: a ceiling that doubles per failure up to
 * its cap, full jitter under it, and the clock retry loops measure with.
 *
 * Jitter is random, so each ladder test draws many delays: every one must
 * stay under the ceiling, and the largest must come near it (the chance that
 * 500 uniform draws all fall below 90% of it is 0.9^500, about 1e-23). */
#include <stdbool.h>
#include <stdint.h>

#include <check.h>

#include "backoff.h"
#include "suite.h"

#define DRAWS 500

/* The largest of DRAWS delays after `failures` failures, each of which
 * must be at most `ceiling`. */
static uint32_t largest_delay(uint32_t base_ms, uint32_t cap_ms, uint32_t failures,
                              uint32_t ceiling)
{
    uint32_t largest = 0;
    for (int i = 0; i < DRAWS; i++) {
        struct sk_backoff b = { .base_ms = base_ms, .cap_ms = cap_ms, .failures = failures };
        uint32_t d = sk_backoff_next(&b);
        ck_assert_msg(d <= ceiling, "after %u failures a delay of %u ms is over the ceiling %u",
                      failures, d, ceiling);
        if (d > largest)
            largest = d;
    }
    return largest;
}

START_TEST(test_ceiling_doubles_with_each_failure_from_the_base)
{
    uint32_t ceiling = 100;
    for (uint32_t failures = 0; failures < 6; failures++, ceiling *= 2) {
        uint32_t largest = largest_delay(100, 100000, failures, ceiling);
        ck_assert_msg(largest >= ceiling * 9 / 10,
                      "after %u failures the delays should reach near %u ms, the largest "
                      "was %u", failures, ceiling, largest);
    }
}
END_TEST

START_TEST(test_ceiling_stops_at_the_cap_however_many_failures)
{
    for (uint32_t failures = 4; failures < 200; failures += 13) {
        uint32_t largest = largest_delay(100, 1000, failures, 1000);
        ck_assert_msg(largest >= 900, "capped delays should reach near 1000 ms, largest %u",
                      largest);
    }
    /* A count that would overflow any doubling still ends at the cap. */
    ck_assert_uint_le(largest_delay(100, 1000, UINT32_MAX - 1, 1000), 1000);
    /* A base above its cap is held to the cap from the first failure. */
    ck_assert_uint_le(largest_delay(5000, 1000, 0, 1000), 1000);
}
END_TEST

START_TEST(test_next_counts_failures_and_reset_starts_the_ladder_over)
{
    struct sk_backoff b = { .base_ms = 10, .cap_ms = 1000 };
    for (uint32_t i = 1; i <= 5; i++) {
        sk_backoff_next(&b);
        ck_assert_uint_eq(b.failures, i);
    }
    sk_backoff_reset(&b);
    ck_assert_uint_eq(b.failures, 0);
    for (int i = 0; i < DRAWS; i++) {
        b.failures = 0;
        ck_assert_uint_le(sk_backoff_next(&b), 10);
    }
}
END_TEST

START_TEST(test_jitter_stays_within_its_bounds_and_reaches_both)
{
    bool seen[3] = { false, false, false };
    for (int i = 0; i < DRAWS; i++) {
        uint32_t v = sk_jitter(5, 7);
        ck_assert_msg(v >= 5 && v <= 7, "sk_jitter(5, 7) gave %u", v);
        seen[v - 5] = true;
    }
    ck_assert_msg(seen[0] && seen[1] && seen[2], "sk_jitter(5, 7) should give 5, 6 and 7");
    ck_assert_uint_eq(sk_jitter(9, 9), 9);
    /* An empty range is its lower end. */
    ck_assert_uint_eq(sk_jitter(9, 3), 9);
}
END_TEST

/* [0, UINT32_MAX] has 2^32 values: the span no longer fits in 32 bits. */
START_TEST(test_jitter_over_the_whole_range_does_not_divide_by_zero)
{
    for (int i = 0; i < DRAWS; i++)
        (void)sk_jitter(0, UINT32_MAX);
    uint32_t v = sk_jitter(1, UINT32_MAX);
    ck_assert_uint_ge(v, 1);
}
END_TEST

START_TEST(test_clock_is_monotonic_and_sleep_waits_at_least_as_asked)
{
    int64_t before = sk_now_ms();
    sk_sleep_ms(30);
    int64_t after = sk_now_ms();
    ck_assert_msg(after - before >= 30, "sk_sleep_ms(30) returned after %lld ms",
                  (long long)(after - before));
    ck_assert_int_ge(sk_now_ms(), after);
    uint64_t ns = sk_now_ns();
    sk_sleep_ms(2);
    ck_assert_uint_ge(sk_now_ns() - ns, 2000000);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_ceiling_doubles_with_each_failure_from_the_base,
        test_ceiling_stops_at_the_cap_however_many_failures,
        test_next_counts_failures_and_reset_starts_the_ladder_over,
        test_jitter_stays_within_its_bounds_and_reaches_both,
        test_jitter_over_the_whole_range_does_not_divide_by_zero,
        test_clock_is_monotonic_and_sleep_waits_at_least_as_asked,
        NULL,
    };
    return h_run_suite(h_suite("backoff", 0, tests));
}
