/* suite.h - how every test binary builds and runs its check suite.
 *
 * Header-only, so that a unit suite can share it and still link nothing
 * but the module it tests; the integration and fault suites get it through
 * harness.h. */
#ifndef SK_SUITE_H
#define SK_SUITE_H

#include <stdlib.h>
#include <string.h>

#include <check.h>

/* Adds a test case named name to s: the tests of the NULL-terminated list,
 * each under timeout seconds (0: check's default, CK_DEFAULT_TIMEOUT).
 * SEKALI_TEST=TEXT keeps only the tests whose name contains TEXT: check's
 * CK_RUN_CASE goes no finer than a case, and a flaky test is run alone
 * many times. Returns it, for fixtures. */
static inline TCase *h_tcase(Suite *s, const char *name, double timeout,
                             const TTest *const *tests)
{
    TCase *tc = tcase_create(name);
    if (timeout > 0)
        tcase_set_timeout(tc, timeout);
    const char *only = getenv("SEKALI_TEST");
    for (const TTest *const *t = tests; *t != NULL; t++)
        if (only == NULL || strstr((*t)->name, only) != NULL)
            tcase_add_test(tc, *t);
    suite_add_tcase(s, tc);
    return tc;
}

/* A suite of one test case, both named name (as h_tcase()). */
static inline Suite *h_suite(const char *name, double timeout, const TTest *const *tests)
{
    Suite *s = suite_create(name);
    h_tcase(s, name, timeout, tests);
    return s;
}

/* Runs the suite with check's defaults (fork mode on, so a crash fails one
 * test) and returns the exit status for main(): failure if any test failed. */
static inline int h_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
