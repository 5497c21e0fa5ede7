/* check_cron.c - when schedules fire: cron expressions in two zones across
 * both DST changes, month ends, intervals, the missed policy after five
 * minutes of downtime, and the parser's errors with their columns.
 *
 * Expected times are UTC, worked out by hand from the zones' rules (2026:
 * Europe/Berlin springs forward on 29 March at 02:00 and falls back on 25
 * October at 03:00; America/New_York on 8 March at 02:00 and 1 November at
 * 02:00), so the table checks the search, not glibc against itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <check.h>

#include "cron.h"
#include "suite.h"
#include "ticks.h"
#include "tz.h"

static int64_t utc(const char *iso)
{
    struct tm tm = { 0 };
    ck_assert_msg(strptime(iso, "%Y-%m-%dT%H:%M:%SZ", &tm) != NULL, "bad time %s", iso);
    return (int64_t)timegm(&tm);
}

static const struct next_case {
    const char *expr, *zone, *after, *next;
    const char *why;
} next_cases[] = {
    /* Europe/Berlin, spring forward: 02:00-02:59 does not exist on 29 March. */
    { "0 3 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z",
      "03:00 CEST, the first hour after the gap" },
    { "30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-30T00:30:00Z",
      "02:30 is skipped on the day it does not exist" },
    { "0 * * * *", "Europe/Berlin", "2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z",
      "hourly: 01:00 CET is followed by 03:00 CEST, one hour later" },
    /* Europe/Berlin, fall back: 02:00-02:59 happens twice on 25 October. */
    { "30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", "2026-10-25T00:30:00Z",
      "02:30 runs at its first occurrence (CEST)" },
    { "30 2 * * *", "Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z",
      "and not again at its second (CET): next is the following day" },
    { "*/30 * * * *", "Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-25T02:00:00Z",
      "the repeated 02:00 and 02:30 CET are not run again; 03:00 CET is next" },
    /* America/New_York, spring forward on 8 March. */
    { "30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-09T06:30:00Z",
      "02:30 does not exist on 8 March" },
    { "0 3 * * *", "America/New_York", "2026-03-07T12:00:00Z", "2026-03-08T07:00:00Z",
      "03:00 EDT right after the gap" },
    /* America/New_York, fall back on 1 November. */
    { "30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", "2026-11-01T05:30:00Z",
      "01:30 EDT, the first of two" },
    { "30 1 * * *", "America/New_York", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z",
      "01:30 EST is the repeat: skipped" },
    { "0 * * * *", "America/New_York", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z",
      "hourly: the repeated 01:00 EST is not run; 02:00 EST is next" },
    /* A zone with a half-hour offset and no DST. */
    { "0 9 * * *", "Asia/Kolkata", "2026-06-01T00:00:00Z", "2026-06-01T03:30:00Z",
      "09:00 IST is 03:30 UTC" },
    /* Month ends. */
    { "0 0 31 * *", "UTC", "2026-04-01T00:00:00Z", "2026-05-31T00:00:00Z",
      "April has no 31st" },
    { "0 0 31 * *", "UTC", "2026-12-31T00:00:00Z", "2027-01-31T00:00:00Z",
      "over the year's end" },
    { "0 12 29 2 *", "UTC", "2026-01-01T00:00:00Z", "2028-02-29T12:00:00Z",
      "29 February waits for the leap year" },
    { "59 23 28-31 2 *", "Europe/Berlin", "2028-02-28T23:00:00Z", "2028-02-29T22:59:00Z",
      "the last minute of a leap February, local" },
    { "0 0 1 * *", "Europe/Berlin", "2026-10-30T12:00:00Z", "2026-10-31T23:00:00Z",
      "local midnight of 1 November is the evening before in UTC" },
    /* Day of month and day of week. */
    { "0 0 13 * 5", "UTC", "2026-11-01T00:00:00Z", "2026-11-06T00:00:00Z",
      "both restricted: the 13th or a Friday, whichever comes first" },
    { "0 0 */10 * 5", "UTC", "2026-11-01T00:00:00Z", "2026-12-11T00:00:00Z",
      "a day of month beginning with '*': both must match (1, 11, 21, 31 and a Friday)" },
    { "0 9 * jan-mar mon-fri", "UTC", "2026-03-31T10:00:00Z", "2027-01-01T09:00:00Z",
      "names, and the next weekday in January" },
    { "0 0 * * 7", "UTC", "2026-11-02T00:00:00Z", "2026-11-08T00:00:00Z", "7 is Sunday" },
    /* Steps and lists. */
    { "5/15 * * * *", "UTC", "2026-06-01T10:05:00Z", "2026-06-01T10:20:00Z",
      "5/15 is 5, 20, 35, 50" },
    { "5/15 * * * *", "UTC", "2026-06-01T10:50:00Z", "2026-06-01T11:05:00Z", "and wraps" },
    { "0,30 8-10/2 * * *", "UTC", "2026-06-01T08:30:00Z", "2026-06-01T10:00:00Z",
      "hours 8 and 10 only" },
    { "@daily", "UTC", "2026-06-01T00:00:00Z", "2026-06-02T00:00:00Z", "a macro" },
    { "* * * * *", "UTC", "2026-06-01T10:00:59Z", "2026-06-01T10:01:00Z", "every minute" },
};

START_TEST(test_next_tick_follows_the_table)
{
    const struct next_case *tc = &next_cases[_i];
    struct sk_cron c;
    size_t col = 0;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_cron_parse(tc->expr, &c, &col, &err) == SK_OK, "%s: %s", tc->expr, err.msg);
    snprintf(c.zone, sizeof(c.zone), "%s", tc->zone);
    int64_t got = sk_cron_next(&c, utc(tc->after));
    char iso[32];
    sk_ticks_iso(got, iso, sizeof(iso));
    ck_assert_msg(got == utc(tc->next), "\"%s\" in %s after %s: expected %s (%s), got %s",
                  tc->expr, tc->zone, tc->after, tc->next, tc->why, iso);
}
END_TEST

START_TEST(test_a_date_that_never_comes_has_no_tick)
{
    struct sk_cron c;
    size_t col;
    ck_assert_int_eq(sk_cron_parse("0 0 30 2 *", &c, &col, NULL), SK_OK);
    ck_assert_int_eq(sk_cron_next(&c, utc("2026-01-01T00:00:00Z")), -1);
}
END_TEST

START_TEST(test_intervals_are_aligned_to_the_epoch)
{
    struct sk_cron c;
    sk_cron_every(&c, 900);
    ck_assert_int_eq(sk_cron_next(&c, utc("2026-06-01T10:07:13Z")), utc("2026-06-01T10:15:00Z"));
    ck_assert_int_eq(sk_cron_next(&c, utc("2026-06-01T10:15:00Z")), utc("2026-06-01T10:30:00Z"));
    sk_cron_every(&c, 1);
    ck_assert_int_eq(sk_cron_next(&c, 1000), 1001);
}
END_TEST

static const struct bad_case {
    const char *expr;
    size_t      column;
    const char *says;
} bad_cases[] = {
    { "61 * * * *", 0, "minute 61 is out of range 0-59" },
    { "* 24 * * *", 2, "hour 24 is out of range 0-23" },
    { "* * 0 * *", 4, "day of month 0 is out of range 1-31" },
    { "* * * 13 *", 6, "month 13 is out of range 1-12" },
    { "* * * * 8", 8, "day of week 8 is out of range 0-7" },
    { "* * * *", 7, "has 4 fields, needs 5" },
    { "* * * * * *", 10, "more than 5 fields" },
    { "*/0 * * * *", 2, "minute step must be a number from 1 to 60" },
    { "* * * foo *", 6, "unknown month name \"foo\"" },
    { "10-5 * * * *", 3, "minute range 10-5 runs backwards" },
    { "1,,2 * * * *", 2, "expected a number in the minute field" },
    { "1, * * * *", 2, "the minute field ends with a comma" },
    { "1x * * * *", 1, "unexpected \"x\" in the minute field" },
    { "@sometimes", 0, "unknown cron macro \"@sometimes\"" },
    { "", 0, "has 0 fields, needs 5" },
};

START_TEST(test_bad_expressions_say_what_and_where)
{
    const struct bad_case *tc = &bad_cases[_i];
    struct sk_cron c;
    size_t col = 999;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_cron_parse(tc->expr, &c, &col, &err) == SK_ERR, "\"%s\" parsed", tc->expr);
    ck_assert_msg(strstr(err.msg, tc->says) != NULL, "\"%s\": expected \"%s\" in \"%s\"",
                  tc->expr, tc->says, err.msg);
    ck_assert_msg(col == tc->column, "\"%s\": column %zu, expected %zu", tc->expr, col,
                  tc->column);
}
END_TEST

START_TEST(test_zone_names_are_checked_against_the_database)
{
    ck_assert(sk_tz_known("Europe/Berlin"));
    ck_assert(sk_tz_known("America/New_York"));
    ck_assert(sk_tz_known("UTC"));
    ck_assert(!sk_tz_known("Mars/Olympus_Mons"));
    ck_assert(!sk_tz_known("Europe"));          /* a directory */
    ck_assert(!sk_tz_known("../../etc/passwd"));
    ck_assert(!sk_tz_known("/etc/localtime"));
    ck_assert(!sk_tz_known(""));
}
END_TEST

START_TEST(test_a_search_leaves_the_process_zone_as_it_was)
{
    setenv("TZ", "Asia/Tokyo", 1);
    struct sk_cron c;
    size_t col;
    ck_assert_int_eq(sk_cron_parse("0 3 * * *", &c, &col, NULL), SK_OK);
    snprintf(c.zone, sizeof(c.zone), "Europe/Berlin");
    sk_cron_next(&c, 0);
    ck_assert_str_eq(getenv("TZ"), "Asia/Tokyo");
    /* A walk over many ticks nests the search's scope in its own. */
    int64_t at[8];
    struct sk_ticks t = { .at = at, .cap = 8 };
    sk_ticks_due(&c, 0, 5 * 86400, 60, SK_MISSED_ALL, &t);
    ck_assert_uint_eq(t.n, 5);
    ck_assert_str_eq(getenv("TZ"), "Asia/Tokyo");
    unsetenv("TZ");
    sk_cron_next(&c, 0);
    ck_assert_ptr_null(getenv("TZ"));
}
END_TEST

/* Five minutes of downtime for a minutely schedule: last tick at T0, the
 * scheduler back at T0 + 5m + lag. */
static const struct missed_case {
    enum sk_missed missed;
    int            lag_s, grace_s;
    size_t         n;
    int            first_min;   /* the first tick enqueued, minutes after T0 */
    size_t         dropped;
} missed_cases[] = {
    { SK_MISSED_SKIP, 30, 10, 0, 0, 5 },
    { SK_MISSED_ONCE, 30, 10, 1, 5, 4 },
    { SK_MISSED_ALL,  30, 10, 5, 1, 0 },
    /* The tick of 5m is 5 s old: on time under a 10 s grace. */
    { SK_MISSED_SKIP, 5, 10, 1, 5, 4 },
    { SK_MISSED_ONCE, 5, 10, 2, 4, 3 },
    { SK_MISSED_ALL,  5, 10, 5, 1, 0 },
};

START_TEST(test_missed_ticks_after_five_minutes_of_downtime)
{
    const struct missed_case *tc = &missed_cases[_i];
    struct sk_cron c;
    size_t col;
    ck_assert_int_eq(sk_cron_parse("* * * * *", &c, &col, NULL), SK_OK);
    int64_t t0 = utc("2026-06-01T10:00:00Z"), at[16];
    struct sk_ticks t = { .at = at, .cap = 16 };
    sk_ticks_due(&c, t0, t0 + 300 + tc->lag_s, (uint32_t)tc->grace_s, tc->missed, &t);
    ck_assert_msg(t.n == tc->n, "case %d: %zu ticks, expected %zu", _i, t.n, tc->n);
    ck_assert_msg(t.dropped == tc->dropped, "case %d: %zu dropped, expected %zu", _i,
                  t.dropped, tc->dropped);
    ck_assert_int_eq(t.latest, t0 + 300);
    if (tc->n > 0)
        ck_assert_int_eq(at[0], t0 + 60 * tc->first_min);
    for (size_t i = 1; i < t.n; i++)
        ck_assert_int_eq(at[i], at[i - 1] + 60);
}
END_TEST

START_TEST(test_catching_up_keeps_the_newest_ticks_within_the_bound)
{
    struct sk_cron c;
    sk_cron_every(&c, 1);
    int64_t at[100];
    struct sk_ticks t = { .at = at, .cap = 100 };
    sk_ticks_due(&c, 1000, 1300, 0, SK_MISSED_ALL, &t);
    ck_assert_uint_eq(t.n, 100);
    ck_assert_uint_eq(t.dropped, 200);
    ck_assert_int_eq(at[0], 1201);
    ck_assert_int_eq(at[99], 1300);
    ck_assert_int_eq(t.latest, 1300);
    /* Ten days down: nothing older than the week's lookback comes back. */
    sk_cron_every(&c, 86400);
    sk_ticks_due(&c, 0, 10 * 86400, 0, SK_MISSED_ALL, &t);
    ck_assert_uint_eq(t.n, 7);
    ck_assert_int_eq(at[0], 4 * 86400);
    ck_assert_uint_ge(t.dropped, 1);
    sk_cron_every(&c, 1);
    /* Nothing due: the last tick stands. */
    sk_ticks_due(&c, 1300, 1300, 0, SK_MISSED_ALL, &t);
    ck_assert_uint_eq(t.n, 0);
    ck_assert_int_eq(t.latest, 1300);
}
END_TEST

START_TEST(test_iso_times_are_utc_to_the_second)
{
    char buf[32];
    sk_ticks_iso(utc("2026-12-01T03:00:00Z"), buf, sizeof(buf));
    ck_assert_str_eq(buf, "2026-12-01T03:00:00Z");
    sk_ticks_iso(0, buf, sizeof(buf));
    ck_assert_str_eq(buf, "1970-01-01T00:00:00Z");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cron");
    TCase *tc = tcase_create("cron");
    tcase_add_loop_test(tc, test_next_tick_follows_the_table, 0,
                        (int)(sizeof(next_cases) / sizeof(next_cases[0])));
    tcase_add_loop_test(tc, test_bad_expressions_say_what_and_where, 0,
                        (int)(sizeof(bad_cases) / sizeof(bad_cases[0])));
    tcase_add_loop_test(tc, test_missed_ticks_after_five_minutes_of_downtime, 0,
                        (int)(sizeof(missed_cases) / sizeof(missed_cases[0])));
    tcase_add_test(tc, test_a_date_that_never_comes_has_no_tick);
    tcase_add_test(tc, test_intervals_are_aligned_to_the_epoch);
    tcase_add_test(tc, test_zone_names_are_checked_against_the_database);
    tcase_add_test(tc, test_a_search_leaves_the_process_zone_as_it_was);
    tcase_add_test(tc, test_catching_up_keeps_the_newest_ticks_within_the_bound);
    tcase_add_test(tc, test_iso_times_are_utc_to_the_second);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
