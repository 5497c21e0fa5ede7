/* check_trace_context.c - W3C Trace Context as sekali reads and writes it
 * (src/base/trace_context.c): the specification's valid values pass, each
 * kind of broken one is refused with a reason, tracestate is bounded at
 * whole members, and whatever passes holds only what the grammar allows.
 * The last cases are fuzz-style: every one-byte change of a valid value,
 * and random bytes, never pass as something the grammar refuses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "common.h"
#include "suite.h"
#include "trace_context.h"

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static bool parse(const char *s, const char **why)
{
    char trace[SK_TRACE_ID_LEN + 1], parent[SK_SPAN_ID_LEN + 1];
    uint8_t flags;
    *why = NULL;
    return sk_trace_parse_parent(s, strlen(s), trace, parent, &flags, why);
}

static void refused(const char *s, const char *reason_part)
{
    const char *why;
    ck_assert_msg(!parse(s, &why), "accepted \"%s\"", s);
    ck_assert_msg(why != NULL && strstr(why, reason_part) != NULL,
                  "\"%s\": reason \"%s\", want one with \"%s\"", s, why ? why : "(none)",
                  reason_part);
}

static void state_is(const char *in, size_t size, const char *want, bool want_cut)
{
    char out[SK_TRACESTATE_MAX + 1];
    bool cut;
    const char *why = NULL;
    ck_assert(size <= sizeof(out));
    ck_assert_msg(sk_trace_check_state(in, strlen(in), out, size, &cut, &why),
                  "\"%s\" refused: %s", in, why);
    ck_assert_msg(strcmp(out, want) == 0, "\"%s\" -> \"%s\", want \"%s\"", in, out, want);
    ck_assert_int_eq(cut, want_cut);
}

static void state_refused(const char *in)
{
    char out[SK_TRACESTATE_MAX + 1];
    bool cut;
    const char *why = NULL;
    ck_assert_msg(!sk_trace_check_state(in, strlen(in), out, sizeof(out), &cut, &why),
                  "\"%s\" accepted as \"%s\"", in, out);
    ck_assert(why != NULL);
    ck_assert_str_eq(out, "");
}

START_TEST(test_a_valid_traceparent_gives_its_ids_and_flags)
{
    char trace[SK_TRACE_ID_LEN + 1], parent[SK_SPAN_ID_LEN + 1];
    uint8_t flags = 0;
    const char *why = NULL;
    ck_assert(sk_trace_parse_parent(TP, strlen(TP), trace, parent, &flags, &why));
    ck_assert_str_eq(trace, "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(parent, "00f067aa0ba902b7");
    ck_assert_uint_eq(flags, 1);
    /* A later version may be longer, after a '-'; its first fields are read. */
    const char *v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes";
    ck_assert(sk_trace_parse_parent(v1, strlen(v1), trace, parent, &flags, &why));
    ck_assert_uint_eq(flags, 0);
    ck_assert(parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09", &why));
}
END_TEST

START_TEST(test_each_broken_traceparent_is_refused_with_its_reason)
{
    refused("", "shorter");
    refused("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", "shorter");
    refused("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", "length");
    refused("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", "length");
    refused("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", "length");
    refused("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version");
    refused("0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version");
    refused("0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version");
    refused("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "lowercase");
    refused("00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01", "lowercase");
    refused("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0X", "lowercase");
    refused("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "all-zero");
    refused("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "all-zero");
    refused("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version-traceid");
    refused("00-4bf92f3577b34da6a3ce929d0e0e473600-f067aa0ba902b7-01", "version-traceid");
    refused("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7.01", "version-traceid");
    refused(" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version");
}
END_TEST

START_TEST(test_a_valid_tracestate_comes_out_without_blanks_or_empty_members)
{
    state_is("rojo=00f067aa0ba902b7", SK_TRACESTATE_MAX + 1, "rojo=00f067aa0ba902b7", false);
    state_is(" rojo=1 ,\tcongo=t61rcWkgMzE ,, ", SK_TRACESTATE_MAX + 1,
             "rojo=1,congo=t61rcWkgMzE", false);
    state_is("", SK_TRACESTATE_MAX + 1, "", false);
    state_is("tenant1@vendor=x y,a*b/c_d-e=!", SK_TRACESTATE_MAX + 1,
             "tenant1@vendor=x y,a*b/c_d-e=!", false);
    state_is("0t@sys-14chars_ok=v", SK_TRACESTATE_MAX + 1, "0t@sys-14chars_ok=v", false);
}
END_TEST

START_TEST(test_each_broken_tracestate_is_refused)
{
    state_refused("rojo");                   /* no '=' */
    state_refused("Rojo=1");                 /* uppercase key */
    state_refused("1rojo=1");                /* a simple key begins with a letter */
    state_refused("rojo=");                  /* empty value */
    state_refused("rojo=a,b");               /* b has no '=' */
    state_refused("rojo=a=b");               /* '=' in a value */
    state_refused("rojo=a\x01");             /* a control character */
    state_refused("rojo=caf\xc3\xa9");       /* not ASCII */
    state_refused("rojo=1,rojo=2");          /* a key twice */
    state_refused("t@=1");                   /* empty system */
    state_refused("@s=1");                   /* empty tenant */
    state_refused("t@1s=1");                 /* a system begins with a letter */
    state_refused("t@abcdefghijklmno=1");    /* a system of 15 characters */
    state_refused("a@b@c=1");                /* '@' twice */
    char many[33 * 6 + 1] = "";
    for (int i = 0; i < 33; i++) {
        char m[8] = { 'k', (char)('a' + i / 26), (char)('a' + i % 26), '=', '1', ',', 0 };
        strcat(many, m);
    }
    state_refused(many);                     /* 33 members */
    many[strlen(many) - 7] = '\0';  /* 32 members, no trailing comma: the limit */
    state_is(many, SK_TRACESTATE_MAX + 1, many, false);
}
END_TEST

START_TEST(test_a_long_tracestate_is_cut_at_whole_members_the_long_ones_first)
{
    char big[200];
    memset(big, 'v', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    char in[600];
    snprintf(in, sizeof(in), "a=1,long=%s,b=2,c=3", big);
    /* Room for 20 bytes: the long member goes, the rest fits. */
    state_is(in, 21, "a=1,b=2,c=3", true);
    /* Room for 8: then from the end. */
    state_is(in, 9, "a=1,b=2", true);
    state_is("abc=1", 3, "", true);
    /* Long members are kept when there is room. */
    char out[SK_TRACESTATE_MAX + 1];
    bool cut;
    const char *why;
    ck_assert(sk_trace_check_state(in, strlen(in), out, sizeof(out), &cut, &why));
    ck_assert(!cut);
    ck_assert_str_eq(out, in);
}
END_TEST

START_TEST(test_begin_keeps_the_trace_and_makes_a_new_span_each_run)
{
    struct sk_trace a, b;
    const char *state = "rojo=1";
    ck_assert_ptr_null(sk_trace_begin(&a, TP, strlen(TP), state, strlen(state)));
    ck_assert_ptr_null(sk_trace_begin(&b, TP, strlen(TP), state, strlen(state)));
    ck_assert_str_eq(a.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(a.parent_id, "00f067aa0ba902b7");
    ck_assert_str_eq(a.tracestate, "rojo=1");
    ck_assert_str_ne(a.span_id, b.span_id);
    ck_assert_str_ne(a.span_id, a.parent_id);
    ck_assert_uint_eq(strlen(a.traceparent), SK_TRACEPARENT_LEN);
    ck_assert(strncmp(a.traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-", 36) == 0);
    ck_assert(strncmp(a.traceparent + 36, a.span_id, SK_SPAN_ID_LEN) == 0);
    ck_assert_str_eq(a.traceparent + 52, "-01");
    /* The child is a valid traceparent again. */
    const char *why;
    ck_assert(parse(a.traceparent, &why));
    /* Flags other than sampled are not passed on under version 00. */
    const char *other = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe";
    ck_assert_ptr_null(sk_trace_begin(&a, other, strlen(other), NULL, 0));
    ck_assert_str_eq(a.traceparent + 52, "-00");
}
END_TEST

START_TEST(test_begin_starts_a_new_trace_when_what_came_is_dropped)
{
    struct sk_trace t, u;
    ck_assert_ptr_null(sk_trace_begin(&t, NULL, 0, NULL, 0));
    ck_assert_ptr_null(sk_trace_begin(&u, NULL, 0, NULL, 0));
    ck_assert_uint_eq(strlen(t.trace_id), SK_TRACE_ID_LEN);
    ck_assert_str_ne(t.trace_id, u.trace_id);
    ck_assert_str_eq(t.parent_id, "");
    ck_assert_str_eq(t.traceparent + 52, "-01");
    const char *why;
    ck_assert(parse(t.traceparent, &why));

    const char *bad = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
    const char *reason = sk_trace_begin(&t, bad, strlen(bad), "rojo=1", 6);
    ck_assert_ptr_nonnull(reason);
    ck_assert(strstr(reason, "all-zero") != NULL);
    ck_assert_str_ne(t.trace_id, "00000000000000000000000000000000");
    ck_assert_str_eq(t.tracestate, "");  /* it belonged to the dropped trace */

    reason = sk_trace_begin(&t, NULL, 0, "rojo=1", 6);
    ck_assert_ptr_nonnull(reason);
    ck_assert_str_eq(t.tracestate, "");

    /* A bad tracestate goes alone: the trace stays. */
    reason = sk_trace_begin(&t, TP, strlen(TP), "Rojo=1", 6);
    ck_assert_ptr_nonnull(reason);
    ck_assert_str_eq(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(t.tracestate, "");
}
END_TEST

static bool hex_or_dash_only(const char *s)
{
    for (; *s != '\0'; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') || *s == '-'))
            return false;
    return true;
}

/* Every byte value at every position of a valid traceparent: what passes
 * differs from the original only where the grammar allows (a hex digit for
 * a hex digit), and never has an all-zero id or version ff. */
START_TEST(test_every_one_byte_change_of_a_traceparent_passes_only_if_valid)
{
    for (size_t pos = 0; pos < SK_TRACEPARENT_LEN; pos++)
        for (int c = 0; c < 256; c++) {
            char s[SK_TRACEPARENT_LEN + 1];
            memcpy(s, TP, sizeof(s));
            s[pos] = (char)c;
            char trace[SK_TRACE_ID_LEN + 1], parent[SK_SPAN_ID_LEN + 1];
            uint8_t flags;
            const char *why = NULL;
            bool ok = sk_trace_parse_parent(s, SK_TRACEPARENT_LEN, trace, parent, &flags, &why);
            bool want = (pos == 2 || pos == 35 || pos == 52) ? c == '-'
                : ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) &&
                      !(pos == 1 && s[0] == 'f' && c == 'f');
            if (pos < 2 && ok)
                want = want && memcmp(s, "00", 2) == 0;  /* a later version needs no exact length */
            ck_assert_msg(ok == want || (pos < 2 && ok && memcmp(s, "ff", 2) != 0),
                          "position %zu byte %d: %s (%s)", pos, c, ok ? "accepted" : "refused",
                          why ? why : "");
            if (ok) {
                ck_assert(why == NULL);
                ck_assert(hex_or_dash_only(s));
                ck_assert(strlen(trace) == SK_TRACE_ID_LEN && strlen(parent) == SK_SPAN_ID_LEN);
            } else {
                ck_assert(why != NULL);
            }
        }
}
END_TEST

/* Random bytes and random cuts of valid values: never a crash, a read past
 * the length (ASan builds) or an output outside the grammar. */
START_TEST(test_random_input_never_passes_as_something_the_grammar_refuses)
{
    unsigned seed = 43;
    static const char alphabet[] = "0123456789abcdefAF-=,@ \t*/_xyz\x01\xff";
    for (int round = 0; round < 20000; round++) {
        size_t len = (size_t)(rand_r(&seed) % 80);
        char *in = malloc(len ? len : 1);  /* exactly len bytes: ASan sees overreads */
        ck_assert_ptr_nonnull(in);
        for (size_t i = 0; i < len; i++)
            in[i] = round % 2 ? alphabet[rand_r(&seed) % (sizeof(alphabet) - 1)]
                              : (char)(rand_r(&seed) & 0xff);
        if (round % 3 == 0 && len >= SK_TRACEPARENT_LEN)
            memcpy(in, TP, SK_TRACEPARENT_LEN);
        struct sk_trace t;
        const char *why = sk_trace_begin(&t, in, len, in, len);
        ck_assert(why != NULL || len == SK_TRACEPARENT_LEN || len > SK_TRACEPARENT_LEN);
        const char *again;
        ck_assert(parse(t.traceparent, &again));
        ck_assert(hex_or_dash_only(t.trace_id) && hex_or_dash_only(t.span_id));
        for (const char *p = t.tracestate; *p != '\0'; p++)
            ck_assert(*p >= 0x20 && *p <= 0x7e);
        char out[64];
        bool cut;
        if (sk_trace_check_state(in, len, out, sizeof(out), &cut, &why)) {
            bool cut2;
            char out2[64];
            /* What passed passes again unchanged. */
            ck_assert(sk_trace_check_state(out, strlen(out), out2, sizeof(out2), &cut2, &why));
            ck_assert_str_eq(out, out2);
            ck_assert(!cut2);
        }
        free(in);
    }
}
END_TEST

/* Span ids come from a pool of random bytes drawn ahead: a worker forked
 * from the supervisor must not hand out the supervisor's pooled bytes, or
 * two workers would give the same span ids (and lock-token prefixes). */
START_TEST(test_a_forked_child_draws_other_ids_than_its_parent)
{
    char before[SK_SPAN_ID_LEN + 1], parent[65], child[65] = "";
    sk_trace_random_id(before, SK_SPAN_ID_LEN);  /* the pool now holds bytes */
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char id[65];
        sk_random_hex(id, 64);
        _exit(write(fds[1], id, 64) == 64 ? 0 : 1);
    }
    close(fds[1]);
    sk_random_hex(parent, 64);
    ck_assert_int_eq(read(fds[0], child, 64), 64);
    child[64] = '\0';
    close(fds[0]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_msg(strcmp(parent, child) != 0, "parent and child drew the same bytes: %s", child);
    ck_assert_str_ne(parent, before);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_valid_traceparent_gives_its_ids_and_flags,
        test_each_broken_traceparent_is_refused_with_its_reason,
        test_a_valid_tracestate_comes_out_without_blanks_or_empty_members,
        test_each_broken_tracestate_is_refused,
        test_a_long_tracestate_is_cut_at_whole_members_the_long_ones_first,
        test_begin_keeps_the_trace_and_makes_a_new_span_each_run,
        test_begin_starts_a_new_trace_when_what_came_is_dropped,
        test_every_one_byte_change_of_a_traceparent_passes_only_if_valid,
        test_random_input_never_passes_as_something_the_grammar_refuses,
        test_a_forked_child_draws_other_ids_than_its_parent,
        NULL,
    };
    return h_run_suite(h_suite("trace_context", 0, tests));
}
