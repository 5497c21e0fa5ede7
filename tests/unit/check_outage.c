/* check_outage.c - the outage tracker: an outage is logged once at its
 * start and once at its end, the server is not asked during its backoff,
 * the backoff grows while it lasts and starts over after it, and a failed
 * statement on a live server pauses without an outage.
 *
 * The backoffs are set so that a delay is either certainly long (base and
 * cap equal, 60 s: no test waits it out) or certainly over (0 ms). */
#include <stdbool.h>
#include <stdint.h>

#include <check.h>

#include "outage.h"
#include "suite.h"

#define LONG_MS 60000

START_TEST(test_only_the_first_failure_begins_the_outage)
{
    struct sk_outage o = SK_OUTAGE_INIT(10, 1000);
    ck_assert(sk_outage_failed(&o));
    for (int i = 0; i < 5; i++)
        ck_assert_msg(!sk_outage_failed(&o), "failure %d should not begin a second outage",
                      i + 2);
    ck_assert(!sk_outage_begin(&o));
    ck_assert_uint_eq(o.backoff.failures, 6);
}
END_TEST

START_TEST(test_only_the_first_success_after_an_outage_ends_it)
{
    struct sk_outage o = SK_OUTAGE_INIT(10, 1000);
    ck_assert_msg(!sk_outage_ok(&o), "a success with no outage should end nothing");
    sk_outage_failed(&o);
    sk_outage_failed(&o);
    ck_assert(sk_outage_ok(&o));
    ck_assert(!sk_outage_ok(&o));
    /* And the next failure is a new outage, from the base delay again. */
    ck_assert_uint_eq(o.backoff.failures, 0);
    ck_assert(sk_outage_failed(&o));
}
END_TEST

START_TEST(test_the_server_is_not_asked_until_the_backoff_ran_out)
{
    struct sk_outage o = SK_OUTAGE_INIT(LONG_MS, LONG_MS);
    ck_assert(!sk_outage_waiting(&o));
    ck_assert_uint_eq(sk_outage_wait_ms(&o), 0);
    /* Full jitter puts the retry anywhere in [0, 60 s]; a draw of 0 ms
     * (once in 60001) is spent at once, so the first of three that waits. */
    for (int i = 0; i < 3 && !sk_outage_waiting(&o); i++)
        sk_outage_failed(&o);
    ck_assert(sk_outage_waiting(&o));
    ck_assert_uint_le(sk_outage_wait_ms(&o), LONG_MS);
    sk_outage_ok(&o);
    ck_assert(!sk_outage_waiting(&o));
    ck_assert_uint_eq(sk_outage_wait_ms(&o), 0);

    struct sk_outage now = SK_OUTAGE_INIT(0, 0);
    sk_outage_failed(&now);
    ck_assert_msg(!sk_outage_waiting(&now), "a spent backoff should let the server be asked");
    ck_assert_uint_eq(sk_outage_wait_ms(&now), 0);
}
END_TEST

START_TEST(test_a_begun_outage_lets_the_next_attempt_go_at_once)
{
    struct sk_outage o = SK_OUTAGE_INIT(LONG_MS, LONG_MS);
    ck_assert(sk_outage_begin(&o));
    ck_assert(!sk_outage_waiting(&o));
    ck_assert_uint_eq(o.backoff.failures, 0);
    /* Its first real failure is inside the outage: not logged again. */
    ck_assert(!sk_outage_failed(&o));
    ck_assert_uint_eq(o.backoff.failures, 1);
    ck_assert_uint_le(sk_outage_wait_ms(&o), LONG_MS);
}
END_TEST

START_TEST(test_a_pause_delays_the_next_attempt_without_an_outage)
{
    struct sk_outage o = SK_OUTAGE_INIT(LONG_MS, LONG_MS);
    sk_outage_pause(&o);
    ck_assert_msg(!o.down, "a failed statement on a live server is no outage");
    ck_assert_msg(!sk_outage_waiting(&o), "waiting() is for outages only");
    ck_assert_uint_le(sk_outage_wait_ms(&o), LONG_MS);
    sk_outage_pause(&o);
    ck_assert_uint_eq(o.backoff.failures, 2);
    ck_assert(!sk_outage_ok(&o));
    ck_assert_uint_eq(o.backoff.failures, 0);
}
END_TEST

/* The ladder grows during one outage, as backoff.h's does: after many
 * failures the delays reach past the base. */
START_TEST(test_the_backoff_grows_while_the_outage_lasts)
{
    uint32_t largest = 0;
    for (int round = 0; round < 200; round++) {
        struct sk_outage o = SK_OUTAGE_INIT(10, 10000);
        for (int i = 0; i < 8; i++)
            sk_outage_failed(&o);
        uint32_t left = sk_outage_wait_ms(&o);
        ck_assert_uint_le(left, 1280);
        if (left > largest)
            largest = left;
    }
    ck_assert_msg(largest > 100, "the eighth delay should reach well past the base, the "
                  "largest of 200 was %u ms", largest);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_only_the_first_failure_begins_the_outage,
        test_only_the_first_success_after_an_outage_ends_it,
        test_the_server_is_not_asked_until_the_backoff_ran_out,
        test_a_begun_outage_lets_the_next_attempt_go_at_once,
        test_a_pause_delays_the_next_attempt_without_an_outage,
        test_the_backoff_grows_while_the_outage_lasts,
        NULL,
    };
    return h_run_suite(h_suite("outage", 0, tests));
}
