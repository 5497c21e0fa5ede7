/* check_doctor_pages.c - doctor's verdict on the pages under PostgreSQL's
 * shared buffers (doctor_pages.c): the rule alone, since a test server
 * cannot be given gigabytes of shared buffers or huge pages; that doctor
 * asks a real server and passes its default 128 MB is check_doctor's. */
/* links: core doctor_report doctor_pages */
#include <string.h>

#include <check.h>

#include "doctor.h"
#include "suite.h"

#define GB (1LL << 30)

/* The one verdict sk_doctor_postgres_pages() gives, its level checked. */
static const struct sk_doctor_verdict *judge(struct sk_doctor *d, long long shared_buffers,
                                             const char *huge_pages, const char *status,
                                             enum sk_doctor_level level)
{
    sk_doctor_free(d);
    sk_doctor_postgres_pages(d, shared_buffers, huge_pages, status);
    ck_assert_uint_eq(d->n, 1);
    ck_assert_str_eq(d->v[0].check, "postgres.huge_pages");
    ck_assert_msg(d->v[0].level == level, "%s: %s, wanted %s", d->v[0].found,
                  sk_doctor_level_names[d->v[0].level], sk_doctor_level_names[level]);
    return &d->v[0];
}

START_TEST(test_large_shared_buffers_on_small_pages_warn_with_the_fix)
{
    struct sk_doctor d = { 0 };
    const struct sk_doctor_verdict *v = judge(&d, 6 * GB, "off", "", SK_DOCTOR_WARN);
    ck_assert_msg(strstr(v->found, "6.0 GB on 4 kB pages") != NULL, "%s", v->found);
    ck_assert_msg(strstr(v->fix, "shared_memory_size_in_huge_pages") != NULL, "%s", v->fix);
    /* PostgreSQL 17 says when try fell back. */
    judge(&d, 6 * GB, "try", "off", SK_DOCTOR_WARN);
    sk_doctor_free(&d);
}
END_TEST

/* Before 17, try may or may not have found them: only on is sure. */
START_TEST(test_try_before_postgresql_17_cannot_be_told_and_warns)
{
    struct sk_doctor d = { 0 };
    const struct sk_doctor_verdict *v = judge(&d, 2 * GB, "try", "", SK_DOCTOR_WARN);
    ck_assert_msg(strstr(v->found, "huge_pages = try") != NULL, "%s", v->found);
    sk_doctor_free(&d);
}
END_TEST

START_TEST(test_huge_pages_in_use_pass)
{
    struct sk_doctor d = { 0 };
    judge(&d, 6 * GB, "on", "", SK_DOCTOR_PASS);
    judge(&d, 6 * GB, "try", "on", SK_DOCTOR_PASS);
    sk_doctor_free(&d);
}
END_TEST

START_TEST(test_small_shared_buffers_pass_on_any_pages)
{
    struct sk_doctor d = { 0 };
    judge(&d, 128LL << 20, "try", "", SK_DOCTOR_PASS);
    judge(&d, 2 * GB - 8192, "off", "off", SK_DOCTOR_PASS);
    sk_doctor_free(&d);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_large_shared_buffers_on_small_pages_warn_with_the_fix,
        test_try_before_postgresql_17_cannot_be_told_and_warns,
        test_huge_pages_in_use_pass,
        test_small_shared_buffers_pass_on_any_pages,
        NULL,
    };
    return h_run_suite(h_suite("doctor_pages", 0, tests));
}
