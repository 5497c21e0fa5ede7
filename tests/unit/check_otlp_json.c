/* check_otlp_json.c - a batch of job runs as OTLP/HTTP JSON
 * (src/worker/otlp_json.c): every byte a message may carry is escaped, a
 * span without a parent has no parentSpanId, a failed run is an ERROR,
 * the message's tracestate and flags are the span's,
 * and the body is JSON that python3's parser reads back to the same
 * values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>

#include "otlp_json.h"
#include "suite.h"

static char *encode(const struct sk_span_rec *recs, size_t n)
{
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert(sk_otlp_encode(f, "svc", "invoices", recs, n));
    ck_assert_int_eq(fclose(f), 0);
    return body;
}

static struct sk_span_rec rec(const char *key, const char *outcome, bool error)
{
    struct sk_span_rec r = { .error = error, .attempt = 2, .start_ns = 1700000000000000001ull,
                             .end_ns = 1700000000500000002ull };
    strcpy(r.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    strcpy(r.span_id, "00f067aa0ba902b7");
    strcpy(r.parent_id, "b7ad6b7169203331");
    strcpy(r.job_id, "job-1");
    snprintf(r.idempotency_key, sizeof(r.idempotency_key), "%s", key);
    strcpy(r.job_type, "charge");
    snprintf(r.outcome, sizeof(r.outcome), "%s", outcome);
    return r;
}

START_TEST(test_every_control_character_quote_and_backslash_is_escaped)
{
    char key[40];
    size_t k = 0;
    key[k++] = '"';
    key[k++] = '\\';
    for (int c = 1; c < 0x20; c += 5)
        key[k++] = (char)c;
    key[k++] = 0x7f;
    key[k] = '\0';
    struct sk_span_rec r = rec(key, "completed", false);
    char *body = encode(&r, 1);
    ck_assert_ptr_nonnull(strstr(body, "\"stringValue\":\"\\\"\\\\\\u0001\\u0006\\u000b\\u0010"
                                       "\\u0015\\u001a\\u001f\\u007f\""));
    for (const char *p = body; *p != '\0'; p++)
        ck_assert_msg((unsigned char)*p >= 0x20 && *p != 0x7f, "a raw control byte at %td",
                      p - body);
    free(body);
}
END_TEST

START_TEST(test_a_span_has_its_ids_times_kind_and_status)
{
    struct sk_span_rec r[2] = { rec("k-1", "retry", true), rec("k-2", "completed", false) };
    r[1].parent_id[0] = '\0';
    strcpy(r[0].reason, "handler_retry");
    char *body = encode(r, 2);
    ck_assert_ptr_nonnull(strstr(body, "{\"resourceSpans\":[{\"resource\":{\"attributes\":"
                                       "[{\"key\":\"service.name\",\"value\":{\"stringValue\":"
                                       "\"svc\"}}]}"));
    ck_assert_ptr_nonnull(strstr(body, "\"traceId\":\"4bf92f3577b34da6a3ce929d0e0e4736\","
                                       "\"spanId\":\"00f067aa0ba902b7\",\"parentSpanId\":"
                                       "\"b7ad6b7169203331\",\"flags\":768,"
                                       "\"name\":\"invoices process\","
                                       "\"kind\":5,\"startTimeUnixNano\":\"1700000000000000001\","
                                       "\"endTimeUnixNano\":\"1700000000500000002\""));
    ck_assert_ptr_nonnull(strstr(body, "\"status\":{\"code\":2,\"message\":\"handler_retry\"}"));
    ck_assert_ptr_nonnull(strstr(body, "{\"key\":\"sekali.attempt\",\"value\":{\"intValue\":"
                                       "\"2\"}}"));
    /* One parentSpanId and one status: the second span has neither. */
    ck_assert_ptr_null(strstr(strstr(body, "parentSpanId") + 1, "parentSpanId"));
    ck_assert_ptr_null(strstr(strstr(body, "\"status\"") + 1, "\"status\""));
    free(body);
}
END_TEST

/* The message's tracestate and sampled flag go on as the span's
 * traceState and flags, with "the parent is remote" set where the parent
 * is the producer's span; none without a tracestate. */
START_TEST(test_a_span_carries_the_messages_tracestate_and_flags)
{
    struct sk_span_rec r[2] = { rec("k-1", "completed", false), rec("k-2", "completed", false) };
    strcpy(r[0].tracestate, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
    r[0].trace_flags = 0x01;
    r[1].parent_id[0] = '\0';
    char *body = encode(r, 2);
    ck_assert_ptr_nonnull(strstr(body, "\"parentSpanId\":\"b7ad6b7169203331\",\"traceState\":"
                                       "\"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7\","
                                       "\"flags\":769,\"name\""));
    ck_assert_ptr_nonnull(strstr(body, "\"spanId\":\"00f067aa0ba902b7\",\"flags\":0,\"name\""));
    ck_assert_ptr_null(strstr(strstr(body, "traceState") + 1, "traceState"));
    free(body);
}
END_TEST

/* A real parser reads it back: the key with every hostile byte, as sent. */
START_TEST(test_python3_reads_the_body_back_to_the_same_values)
{
    const char *key = "a\"b\\c\td\x01\xc3\xa9\xe2\x80\xa8z";
    struct sk_span_rec r = rec(key, "dead", true);
    char *body = encode(&r, 1);
    char path[] = "/tmp/sk-otlp-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs(body, f);
    fclose(f);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
             "s=d[\"resourceSpans\"][0][\"scopeSpans\"][0][\"spans\"][0]; "
             "a={x[\"key\"]: x[\"value\"] for x in s[\"attributes\"]}; "
             "print(a[\"sekali.idempotency_key\"][\"stringValue\"].encode().hex(), "
             "s[\"status\"][\"code\"], a[\"sekali.outcome\"][\"stringValue\"])' %s", path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char out[256] = "";
    ck_assert_ptr_nonnull(fgets(out, sizeof(out), p));
    ck_assert_int_eq(pclose(p), 0);
    char want[256];
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)key; *c != '\0'; c++)
        n += (size_t)sprintf(want + n, "%02x", *c);
    strcat(want, " 2 dead\n");
    ck_assert_str_eq(out, want);
    unlink(path);
    free(body);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_every_control_character_quote_and_backslash_is_escaped,
        test_a_span_has_its_ids_times_kind_and_status,
        test_a_span_carries_the_messages_tracestate_and_flags,
        test_python3_reads_the_body_back_to_the_same_values,
        NULL,
    };
    return h_run_suite(h_suite("otlp_json", 10, tests));
}
