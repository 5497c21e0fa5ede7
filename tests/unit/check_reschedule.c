/* check_reschedule.c - the pure half of rescheduling: the ladder that delays
 * are rounded up to (one delay queue per step), and the retry delay drawn
 * under a ceiling that doubles per attempt. Publishing the copies is
 * tested end to end (check_outcomes, check_dlq). */
/* links: core reschedule broker */
#include <stdint.h>

#include <check.h>

#include "reschedule.h"
#include "suite.h"

#define DRAWS 500

START_TEST(test_bucket_rounds_up_to_the_ladder_starting_at_ten_ms)
{
    ck_assert_uint_eq(sk_reschedule_bucket(0), 10);
    ck_assert_uint_eq(sk_reschedule_bucket(1), 10);
    ck_assert_uint_eq(sk_reschedule_bucket(10), 10);
    /* Each step is 1.25 times the last, plus one: 10, 13, 17, 22, 28. */
    ck_assert_uint_eq(sk_reschedule_bucket(11), 13);
    ck_assert_uint_eq(sk_reschedule_bucket(13), 13);
    ck_assert_uint_eq(sk_reschedule_bucket(14), 17);
    ck_assert_uint_eq(sk_reschedule_bucket(18), 22);
    ck_assert_uint_eq(sk_reschedule_bucket(23), 28);
}
END_TEST

/* Never shorter than asked, at most a quarter (and a millisecond) longer,
 * a step rounds to itself, and a longer delay never gets a shorter step. */
START_TEST(test_bucket_is_the_nearest_step_at_or_above_the_delay)
{
    uint32_t last = 0;
    for (uint32_t d = 0; d <= 200000; d += d < 1000 ? 1 : 97) {
        uint32_t b = sk_reschedule_bucket(d);
        ck_assert_msg(b >= d, "bucket(%u) = %u is shorter than the delay", d, b);
        ck_assert_msg(d < 10 || (uint64_t)b <= (uint64_t)d * 5 / 4 + 1,
                      "bucket(%u) = %u is more than a step above the delay", d, b);
        ck_assert_uint_eq(sk_reschedule_bucket(b), b);
        ck_assert_uint_ge(b, last);
        last = b;
    }
}
END_TEST

/* What keeps the delay queues few: every delay up to a day shares fewer
 * than a hundred steps. */
START_TEST(test_a_day_of_delays_needs_fewer_than_a_hundred_delay_queues)
{
    uint32_t steps = 0, last = 0;
    const uint32_t day = 24u * 3600 * 1000;
    for (uint32_t d = 0; d <= day; d = last + 1) {
        last = sk_reschedule_bucket(d);
        steps++;
    }
    ck_assert_msg(steps < 100, "%u delay queues for delays up to a day", steps);
}
END_TEST

START_TEST(test_bucket_of_the_longest_delay_saturates)
{
    ck_assert_uint_eq(sk_reschedule_bucket(UINT32_MAX), UINT32_MAX);
    ck_assert_uint_ge(sk_reschedule_bucket(UINT32_MAX - 1), UINT32_MAX - 1);
}
END_TEST

/* The largest of DRAWS retry delays before next_attempt, each of which must
 * be at most the ceiling's bucket. */
static uint32_t largest_retry_delay(const struct sk_retry_conf *retry, uint32_t next_attempt,
                                    uint32_t ceiling)
{
    uint32_t largest = 0, limit = sk_reschedule_bucket(ceiling);
    for (int i = 0; i < DRAWS; i++) {
        uint32_t d = sk_reschedule_retry_delay(retry, next_attempt);
        ck_assert_msg(d <= limit, "attempt %u: delay %u ms over the ceiling's step %u",
                      next_attempt, d, limit);
        ck_assert_uint_eq(sk_reschedule_bucket(d), d);
        if (d > largest)
            largest = d;
    }
    return largest;
}

START_TEST(test_retry_ceiling_starts_at_initial_and_doubles_per_attempt)
{
    struct sk_retry_conf retry = { .max_attempts = 10, .initial_ms = 1000, .max_ms = 60000 };
    uint32_t ceiling = 1000;
    for (uint32_t attempt = 2; attempt <= 6; attempt++, ceiling *= 2) {
        uint32_t largest = largest_retry_delay(&retry, attempt, ceiling);
        ck_assert_msg(largest >= ceiling * 9 / 10,
                      "attempt %u should draw delays near %u ms, the largest was %u", attempt,
                      ceiling, largest);
    }
}
END_TEST

START_TEST(test_retry_delay_is_capped_at_max)
{
    struct sk_retry_conf retry = { .max_attempts = 100, .initial_ms = 1000, .max_ms = 5000 };
    for (uint32_t attempt = 5; attempt < 100; attempt += 7)
        ck_assert_uint_ge(largest_retry_delay(&retry, attempt, 5000), 4500);
    ck_assert_uint_le(largest_retry_delay(&retry, UINT32_MAX, 5000), 5000 * 5 / 4 + 1);
    /* initial above max: max wins from the first retry. */
    struct sk_retry_conf inverted = { .max_attempts = 3, .initial_ms = 9000, .max_ms = 2000 };
    largest_retry_delay(&inverted, 2, 2000);
}
END_TEST

/* Attempt 2 is the first retry; 0 and 1 (no retry yet) take the same
 * ceiling rather than a smaller or wrapped one. */
START_TEST(test_first_retry_and_earlier_attempts_use_the_initial_ceiling)
{
    struct sk_retry_conf retry = { .max_attempts = 3, .initial_ms = 200, .max_ms = 60000 };
    for (uint32_t attempt = 0; attempt <= 2; attempt++)
        ck_assert_uint_ge(largest_retry_delay(&retry, attempt, 200), 180);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_bucket_rounds_up_to_the_ladder_starting_at_ten_ms,
        test_bucket_is_the_nearest_step_at_or_above_the_delay,
        test_a_day_of_delays_needs_fewer_than_a_hundred_delay_queues,
        test_bucket_of_the_longest_delay_saturates,
        test_retry_ceiling_starts_at_initial_and_doubles_per_attempt,
        test_retry_delay_is_capped_at_max,
        test_first_retry_and_earlier_attempts_use_the_initial_ceiling,
        NULL,
    };
    return h_run_suite(h_suite("reschedule", 0, tests));
}
