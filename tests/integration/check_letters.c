/* check_letters.c - hostile dead letters before an operator: published
 * straight into <queue>.dead with sekali's header names, terminal control
 * sequences (ESC, a one-byte C1 CSI, OSC 52) and a bidi override in them.
 * sekalictl dlq must print none of it raw, in text or in JSON, must show
 * the letter as unverified and where it came from, and replay must refuse
 * it (it would re-arm the key with the injector's body). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define DLQ(r, out, ...) \
    h_sekalictl((r), (out), (const char *const[]){ "dlq", __VA_ARGS__, NULL })

/* Whether out holds a byte or sequence a terminal acts on. */
static const char *raw_control(const char *out)
{
    for (const unsigned char *p = (const unsigned char *)out; *p != '\0'; p++) {
        if (*p == 0x1b || *p == 0x07)
            return "ESC or BEL";
        if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
            return "a C1 control";
        if (p[0] == 0xe2 && p[1] == 0x80 && p[2] >= 0xaa && p[2] <= 0xae)
            return "a bidi override";
    }
    return NULL;
}

START_TEST(test_a_forged_dead_letter_is_escaped_unverified_and_not_replayed)
{
    struct h_run r;
    h_run_open(&r, "letters");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    struct sk_header forged[] = {
        { .key = "x-idempotency-key", .text = "k-victim" },
        { .key = "x-sekali-reason", .text = "failed\x1b[2J" },
        { .key = "x-sekali-queue", .text = r.queue },
        { .key = "x-sekali-error", .text = "see \xe2\x80\xae" "exe.txt\x1b]52;c;ZXZpbA==\x07" },
        { .key = "x-sekali-first-failure", .text = "\xc2\x9b" "31mred" },
    };
    h_publish_raw(r.b, r.dead, "forged-1", "test", forged, sizeof(forged) / sizeof(forged[0]),
                  "evil", 4);
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 10000, "the forged letter should be in %s", r.dead);
    h_run_stop(&r);

    /* sekali never reads <queue>.dead for its own state: the letter
     * reaches the table only by import, which judges it. */
    char *out = NULL;
    ck_assert_int_eq(DLQ(&r, &out, "import", r.queue), 0);
    ck_assert_msg(raw_control(out) == NULL, "dlq import printed %s raw: %s", raw_control(out),
                  out);
    free(out);
    ck_assert_int_eq(DLQ(&r, &out, "list", r.queue), 0);
    ck_assert_msg(raw_control(out) == NULL, "dlq list printed %s raw: %s", raw_control(out), out);
    free(out);
    ck_assert_int_eq(DLQ(&r, &out, "show", r.queue, "k-victim"), 0);
    ck_assert_msg(raw_control(out) == NULL, "dlq show printed %s raw: %s", raw_control(out), out);
    ck_assert_msg(strstr(out, "recorded by:    unverified") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "\\u202e") != NULL && strstr(out, "\\u001b") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(DLQ(&r, &out, "show", r.queue, "k-victim", "--json"), 0);
    ck_assert_msg(raw_control(out) == NULL, "dlq show --json printed %s raw: %s",
                  raw_control(out), out);
    ck_assert_msg(strstr(out, "\\u009b") != NULL && strstr(out, "\\u202e") != NULL, "%s", out);
    free(out);
    /* A key pasted from such a letter, as show's argument: its summary
     * line escapes it too. */
    ck_assert_int_eq(DLQ(&r, &out, "show", r.queue, "k-\x1b]52;c;ZXZpbA==\x07\xc2\x9b"), 4);
    ck_assert_msg(raw_control(out) == NULL, "dlq show's summary printed %s raw: %s",
                  raw_control(out), out);
    ck_assert_msg(strstr(out, "0 dead letters for k-\\x1b]52;c;ZXZpbA==\\x07") != NULL, "%s",
                  out);
    free(out);
    DLQ(&r, &out, "replay", r.queue, "--all");
    ck_assert_msg(raw_control(out) == NULL, "dlq replay printed %s raw: %s", raw_control(out),
                  out);
    ck_assert_msg(strstr(out, "refused") != NULL, "replay should refuse the letter: %s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE queue = "
                                      "'%s' AND recorded_by = 'unverified'", r.queue), 1);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_forged_dead_letter_is_escaped_unverified_and_not_replayed,
        NULL,
    };
    return h_run_suite(h_suite("letters", 120, tests));
}
