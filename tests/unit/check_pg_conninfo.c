/* check_pg_conninfo.c - postgres.conninfo through libpq's parser
 * (src/adapters/pg_conninfo.c): a password moves out of it, and no error
 * ever quotes the password, whatever way the string is mistyped. */
/* links: common pg_conninfo */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pg_conninfo.h"

#define SECRET "s3cr3t-PW"

START_TEST(test_a_password_moves_out_of_keyword_pairs_and_uris)
{
    static const struct { const char *in, *conninfo; } cases[] = {
        { "host=db dbname=sekali password=" SECRET, "host='db' dbname='sekali'" },
        { "postgresql://sekali:" SECRET "@db/sekali", "user='sekali' host='db' dbname='sekali'" },
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(cases); i++) {
        char *conninfo, *password, why[256];
        ck_assert_int_eq(sk_pg_conninfo_split(cases[i].in, &conninfo, &password, why,
                                              sizeof(why)), SK_OK);
        ck_assert_str_eq(password, SECRET);
        ck_assert_msg(strstr(conninfo, SECRET) == NULL, "%s", conninfo);
        ck_assert_msg(strstr(conninfo, "host='db'") != NULL, "%s", conninfo);
        free(conninfo);
        free(password);
    }
    char *conninfo, *password, why[256];
    ck_assert_int_eq(sk_pg_conninfo_split("dbname=sekali", &conninfo, &password, why,
                                          sizeof(why)), SK_OK);
    ck_assert_str_eq(conninfo, "dbname=sekali");
    ck_assert_ptr_null(password);
    free(conninfo);
}
END_TEST

/* The three: libpq reads each as keyword=value pairs and quoted the
 * whole string, password and all, in its error. */
START_TEST(test_a_mistyped_scheme_never_echoes_the_password)
{
    static const char *const cases[] = {
        " postgresql://sekali:" SECRET "@db/sekali",
        "PostgreSQL://sekali:" SECRET "@db/sekali",
        "postgresql:/sekali:" SECRET "@db/sekali",
        "postgres//sekali:" SECRET "@db/sekali",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(cases); i++) {
        char *conninfo = NULL, *password = NULL, why[400];
        ck_assert_int_eq(sk_pg_conninfo_split(cases[i], &conninfo, &password, why,
                                              sizeof(why)), SK_ERR);
        ck_assert_ptr_null(conninfo);
        ck_assert_msg(strstr(why, SECRET) == NULL, "case %zu echoes the password: %s", i, why);
        ck_assert_msg(strstr(why, "quoted text left out") != NULL, "case %zu: %s", i, why);
    }
    char *conninfo = NULL, *password = NULL, why[400];
    ck_assert_int_eq(sk_pg_conninfo_split(cases[0], &conninfo, &password, why, sizeof(why)),
                     SK_ERR);
    ck_assert_msg(strstr(why, "must start with exactly postgresql://") != NULL, "%s", why);
}
END_TEST

/* Without anything that could be a password, libpq's message stays whole:
 * it names what is wrong. */
START_TEST(test_an_error_without_a_password_is_libpqs_own)
{
    char *conninfo = NULL, *password = NULL, why[400];
    ck_assert_int_eq(sk_pg_conninfo_split("dbname", &conninfo, &password, why, sizeof(why)),
                     SK_ERR);
    ck_assert_str_eq(why, "missing \"=\" after \"dbname\" in connection info string");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pg_conninfo");
    TCase *tc = tcase_create("split");
    tcase_add_test(tc, test_a_password_moves_out_of_keyword_pairs_and_uris);
    tcase_add_test(tc, test_a_mistyped_scheme_never_echoes_the_password);
    tcase_add_test(tc, test_an_error_without_a_password_is_libpqs_own);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
