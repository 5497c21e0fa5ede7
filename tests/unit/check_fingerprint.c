/* check_fingerprint.c - the error fingerprint that groups dead letters
 * (src/ctl/ctl_fingerprint.c): the same failure with other figures falls
 * into one group, different failures do not, and the result is always
 * valid UTF-8 within its size, whatever bytes the error held. */
/* links: ctl_fingerprint ctl_out broker_wire text */
#include <stdio.h>
#include <string.h>

#include "ctl_out.h"
#include "ctl_reports.h"
#include "suite.h"

static const char *fp(const char *error, size_t size)
{
    static char out[256];
    sk_ctl_fingerprint(error, out, size);
    return out;
}

static bool valid_utf8(const char *s)
{
    for (size_t i = 0, n, len = strlen(s); i < len; i += n)
        if ((n = sk_ctl_utf8_len((const unsigned char *)s + i, len - i)) == 0)
            return false;
    return true;
}

START_TEST(test_figures_and_ids_are_masked_so_one_failure_is_one_group)
{
    ck_assert_str_eq(fp("payment gateway 503 for order 1001 (req 8c1f2e9a-77aa-4b1c)", 256),
                     "payment gateway {n} for order {n} (req {id})");
    ck_assert_str_eq(fp("payment gateway 502 for order 77 (req 0e3f4a1c-99cc-6d3e)", 256),
                     "payment gateway {n} for order {n} (req {id})");
    ck_assert_str_eq(fp("job 123e4567-e89b-12d3-a456-426614174000 timed out", 256),
                     "job {id} timed out");
    ck_assert_str_eq(fp("a  \t\n b", 256), "a b");
    /* Words that merely look hexadecimal, or hold no digit, stay. */
    ck_assert_str_eq(fp("deadbeef facade decade", 256), "deadbeef facade decade");
    ck_assert_str_eq(fp("http2 v10x", 256), "http{n} v{n}x");
    char first[256];
    snprintf(first, sizeof(first), "%s", fp("timeout talking to ledger", 256));
    ck_assert_str_ne(first, fp("refused by ledger", 256));
}
END_TEST

START_TEST(test_bytes_that_are_not_utf8_become_replacement_characters)
{
    ck_assert_str_eq(fp("bytes \xff\xfe here", 256), "bytes \xef\xbf\xbd\xef\xbf\xbd here");
    ck_assert_str_eq(fp("caf\xc3\xa9 \xc3\x28", 256), "caf\xc3\xa9 \xef\xbf\xbd(");
    ck_assert(valid_utf8(fp("\xed\xa0\x80 surrogate", 256)));
}
END_TEST

START_TEST(test_a_long_error_is_cut_on_a_character_boundary)
{
    char error[600];
    for (size_t i = 0; i + 2 < sizeof(error); i += 2)
        memcpy(error + i, "\xc3\xa9", 2);  /* é, two bytes each */
    error[sizeof(error) - 2] = '\0';
    for (size_t size = 1; size < 40; size++) {
        const char *s = fp(error, size);
        ck_assert_uint_lt(strlen(s), size);
        ck_assert_msg(valid_utf8(s), "size %zu cut a character", size);
    }
    ck_assert_str_eq(fp("12345", 1), "");
    ck_assert_str_eq(fp("12345", 3), "");  /* "{n}" needs 4 bytes with its NUL */
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_figures_and_ids_are_masked_so_one_failure_is_one_group,
        test_bytes_that_are_not_utf8_become_replacement_characters,
        test_a_long_error_is_cut_on_a_character_boundary,
        NULL,
    };
    return h_run_suite(h_suite("fingerprint", 0, tests));
}
