/* check_text.c - the gate for text sekali stores or sends (src/base/text.c):
 * what PostgreSQL accepts as UTF-8 is what sk_text_valid() accepts, a cut
 * never splits a character, every ill-formed sequence becomes one U+FFFD,
 * and whatever comes out passes sk_text_valid(). */
#include <string.h>

#include <check.h>

#include "suite.h"
#include "text.h"

#define FFFD SK_TEXT_REPLACEMENT

static void bound_eq(const char *in, size_t len, size_t size, const char *want)
{
    char out[256];
    ck_assert(size <= sizeof(out));
    size_t n = sk_text_bound(out, size, in, len);
    ck_assert_msg(strcmp(out, want) == 0, "bound of %zu bytes into %zu: got \"%s\", want \"%s\"",
                  len, size, out, want);
    ck_assert_uint_eq(n, strlen(want));
    ck_assert(sk_text_valid(out, n));
}

START_TEST(test_valid_accepts_what_postgresql_accepts)
{
    ck_assert(sk_text_valid("", 0));
    ck_assert(sk_text_valid("plain ascii", 11));
    ck_assert(sk_text_valid("\xc3\xa9", 2));                  /* é */
    ck_assert(sk_text_valid("\xe2\x82\xac", 3));              /* € */
    ck_assert(sk_text_valid("\xf0\x9f\x98\x80", 4));          /* U+1F600 */
    ck_assert(sk_text_valid("\xf4\x8f\xbf\xbf", 4));          /* U+10FFFF */
    ck_assert(sk_text_valid("\xed\x9f\xbf", 3));              /* U+D7FF */
    ck_assert(sk_text_valid("\xee\x80\x80", 3));              /* U+E000 */
}
END_TEST

START_TEST(test_valid_refuses_cut_overlong_surrogate_and_out_of_range)
{
    ck_assert(!sk_text_valid("\xc3", 1));                     /* é cut */
    ck_assert(!sk_text_valid("\xe2\x82", 2));                 /* € cut */
    ck_assert(!sk_text_valid("\xf0\x9f\x98", 3));
    ck_assert(!sk_text_valid("\x80", 1));                     /* lone continuation */
    ck_assert(!sk_text_valid("\xc0\xaf", 2));                 /* overlong '/' */
    ck_assert(!sk_text_valid("\xc1\xbf", 2));
    ck_assert(!sk_text_valid("\xe0\x80\xaf", 3));
    ck_assert(!sk_text_valid("\xf0\x80\x80\xaf", 4));
    ck_assert(!sk_text_valid("\xed\xa0\x80", 3));             /* U+D800 */
    ck_assert(!sk_text_valid("\xed\xbf\xbf", 3));             /* U+DFFF */
    ck_assert(!sk_text_valid("\xf4\x90\x80\x80", 4));         /* U+110000 */
    ck_assert(!sk_text_valid("\xf5\x80\x80\x80", 4));
    ck_assert(!sk_text_valid("\xff", 1));
    ck_assert(!sk_text_valid("a\0b", 3));                     /* PostgreSQL's text has no NUL */
}
END_TEST

/* The issue's text: 359 x, then 20 é, cut at 400 bytes by a handler. */
START_TEST(test_the_issues_cut_error_becomes_valid_and_keeps_every_whole_character)
{
    char in[400];
    memset(in, 'x', 359);
    for (int i = 0; i < 20 && 359 + 2 * i + 1 < 400; i++)
        memcpy(in + 359 + 2 * i, "\xc3\xa9", 2);
    in[399] = '\xc3';  /* the 21st byte pair, cut */
    ck_assert(!sk_text_valid(in, sizeof(in)));
    char out[512];
    size_t n = sk_text_bound(out, sizeof(out), in, sizeof(in));
    ck_assert(sk_text_valid(out, n));
    ck_assert_uint_eq(n, 399 + 3);
    ck_assert(memcmp(out, in, 399) == 0);
    ck_assert_str_eq(out + 399, FFFD);
}
END_TEST

START_TEST(test_a_cut_falls_on_a_character_boundary)
{
    /* "aé€" is 1 + 2 + 3 bytes. */
    const char *s = "a\xc3\xa9\xe2\x82\xac";
    bound_eq(s, 6, 1, "");
    bound_eq(s, 6, 2, "a");
    bound_eq(s, 6, 3, "a");                 /* é would need 2 bytes and the NUL */
    bound_eq(s, 6, 4, "a\xc3\xa9");
    bound_eq(s, 6, 6, "a\xc3\xa9");
    bound_eq(s, 6, 7, "a\xc3\xa9\xe2\x82\xac");
    /* A replacement is never cut either. */
    bound_eq("a\xff", 2, 4, "a");
    bound_eq("a\xff", 2, 5, "a" FFFD);
}
END_TEST

/* One U+FFFD per maximal ill-formed subpart: a cut character is one, a
 * run of stray bytes is one each. */
START_TEST(test_ill_formed_sequences_become_one_replacement_each)
{
    bound_eq("\xe2\x82" "x", 3, 64, FFFD "x");
    bound_eq("\xf0\x9f\x98" "x", 4, 64, FFFD "x");
    bound_eq("\x80\x80", 2, 64, FFFD FFFD);
    bound_eq("\xc0\xaf", 2, 64, FFFD FFFD);
    bound_eq("\xed\xa0\x80", 3, 64, FFFD FFFD FFFD);
    bound_eq("\xf4\x90\x80\x80", 4, 64, FFFD FFFD FFFD FFFD);
    bound_eq("a\0b", 3, 64, "a" FFFD "b");
    bound_eq("\xc3", 1, 64, FFFD);
    bound_eq(NULL, 5, 64, "");
}
END_TEST

START_TEST(test_copy_reads_a_c_string)
{
    char out[8];
    ck_assert_uint_eq(sk_text_copy(out, sizeof(out), "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"), 6);
    ck_assert_str_eq(out, "\xc3\xa9\xc3\xa9\xc3\xa9");
    ck_assert_uint_eq(sk_text_copy(out, sizeof(out), NULL), 0);
    ck_assert_str_eq(out, "");
}
END_TEST

/* Every input of up to three bytes drawn from the bytes that matter comes
 * out valid, and a valid one comes out unchanged. */
START_TEST(test_every_short_input_comes_out_valid_and_valid_text_unchanged)
{
    static const unsigned char bytes[] = { 0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0,
                                           0xbf, 0xc0, 0xc2, 0xdf, 0xe0, 0xed, 0xef, 0xf0,
                                           0xf4, 0xf5, 0xff };
    enum { N = sizeof(bytes) };
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++)
            for (int c = 0; c < N; c++) {
                char in[3] = { (char)bytes[a], (char)bytes[b], (char)bytes[c] };
                char out[16];
                size_t n = sk_text_bound(out, sizeof(out), in, 3);
                ck_assert(sk_text_valid(out, n));
                ck_assert_uint_eq(strlen(out), n);
                if (sk_text_valid(in, 3))
                    ck_assert(n == 3 && memcmp(out, in, 3) == 0);
            }
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_valid_accepts_what_postgresql_accepts,
        test_valid_refuses_cut_overlong_surrogate_and_out_of_range,
        test_the_issues_cut_error_becomes_valid_and_keeps_every_whole_character,
        test_a_cut_falls_on_a_character_boundary,
        test_ill_formed_sequences_become_one_replacement_each,
        test_copy_reads_a_c_string,
        test_every_short_input_comes_out_valid_and_valid_text_unchanged,
        NULL,
    };
    return h_run_suite(h_suite("text", 0, tests));
}
