/* check_tracing.c - W3C trace context end to end, on real servers: a
 * producer's traceparent reaches the stock HTTP handler's request as a
 * child of the job's span (same trace, the job's span as parent, a new span
 * per attempt), every log line of the job carries trace_id and span_id,
 * a retry keeps the trace, a dead letter keeps the headers, a broken
 * traceparent is dropped and counted while the job still runs, the SQL
 * handler's statement reads the job's traceparent from its transaction,
 * and sekali.enqueue() (a producer's, or a handler's follow-up) carries the
 * trace through the outbox and the relay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "http_server.h"

#define TRACE  "4bf92f3577b34da6a3ce929d0e0e4736"
#define PARENT "00f067aa0ba902b7"
#define TP     "00-" TRACE "-" PARENT "-01"
#define STATE  "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"

static char *http_yaml(struct hs *s)
{
    char *yaml = NULL;
    ck_assert(asprintf(&yaml,
        "    mode: external\n    lease: 5s\n"
        "    retry:\n      max_attempts: 3\n      initial: 10ms\n      max: 1s\n"
        "    config:\n"
        "      url: \"http://127.0.0.1:%d/charge\"\n"
        "      timeout: 3s\n", hs_port(s)) > 0);
    return yaml;
}

#define OUTBOX "outbox:\n  relays: 1\n  poll_interval: 200ms\n"

/* Opens run r named name and starts sekalid with one worker of the HTTP
 * handler calling a new server, which it returns; top_yaml as
 * h_run_opts'. */
static struct hs *http_run(struct h_run *r, const char *name, const char *top_yaml)
{
    h_run_open(r, name);
    struct hs *s = hs_start();
    char *yaml = http_yaml(s);
    h_run_start(r, &(struct h_run_opts){ .handler = "handlers/http.so", .workers = 1,
                                         .queue_yaml = yaml, .top_yaml = top_yaml });
    free(yaml);
    return s;
}

static void publish(struct h_run *r, const char *id, const char *key, const char *traceparent,
                    const char *tracestate, const char *body)
{
    struct sk_header h[3];
    size_t n = 0;
    h[n++] = (struct sk_header){ .key = "x-idempotency-key", .text = key };
    if (traceparent != NULL)
        h[n++] = (struct sk_header){ .key = "traceparent", .text = traceparent };
    if (tracestate != NULL)
        h[n++] = (struct sk_header){ .key = "tracestate", .text = tracestate };
    h_publish_raw(r->b, r->queue, id, "charge", h, n, body, strlen(body));
}

/* Every line of the log that names job_id also carries trace_id; returns
 * how many there were. */
static int lines_of_job_carry_trace(const char *log, const char *job_id, const char *trace_id)
{
    char *text = h_read_file(log);
    ck_assert_ptr_nonnull(text);
    char id[300], trace[80];
    snprintf(id, sizeof(id), "\"job_id\":\"%s\"", job_id);
    snprintf(trace, sizeof(trace), "\"trace_id\":\"%s\"", trace_id);
    int n = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strstr(line, id) == NULL)
            continue;
        n++;
        ck_assert_msg(strstr(line, trace) != NULL && strstr(line, "\"span_id\":\"") != NULL,
                      "a line of job %s without its trace %s: %s", job_id, trace_id, line);
    }
    free(text);
    return n;
}

/* "00-<trace>-<span>-<flags>": the span, checked to be 16 lowercase hex. */
static void span_of(const char *traceparent, char span[17])
{
    ck_assert_msg(strlen(traceparent) == 55 && strncmp(traceparent, "00-", 3) == 0,
                  "not a version-00 traceparent: \"%s\"", traceparent);
    memcpy(span, traceparent + 36, 16);
    span[16] = '\0';
    ck_assert_uint_eq(strspn(span, "0123456789abcdef"), 16);
}

START_TEST(test_the_service_gets_a_child_of_each_attempts_span_in_the_producers_trace)
{
    struct h_run r;
    struct hs *s = http_run(&r, "trhttp", NULL);
    /* "500": the first attempt fails and is retried; the second gets 200. */
    publish(&r, "job-tr-1", "tr-1", TP, " " STATE " ,", "500");
    H_WAIT(h_completed(&r) == 1, 20000, "the job should complete on its second attempt");
    h_run_stop(&r);

    struct hs_request first, second;
    ck_assert(hs_get(s, "tr-1", 0, &first));
    ck_assert(hs_get(s, "tr-1", 1, &second));
    ck_assert_int_eq(first.attempt, 1);
    ck_assert_int_eq(second.attempt, 2);
    char span1[17], span2[17];
    span_of(first.traceparent, span1);
    span_of(second.traceparent, span2);
    /* Same trace, the job's span as parent (not the producer's), a new span
     * for the retry, the sampled flag kept, tracestate passed on. */
    ck_assert_str_eq(first.traceparent + 52, "-01");
    ck_assert(strncmp(first.traceparent, "00-" TRACE "-", 36) == 0);
    ck_assert(strncmp(second.traceparent, "00-" TRACE "-", 36) == 0);
    ck_assert_str_ne(span1, PARENT);
    ck_assert_str_ne(span1, span2);
    ck_assert_str_eq(first.tracestate, STATE);
    ck_assert_str_eq(second.tracestate, STATE);

    /* The log: each attempt's span, and the trace on every line of the job. */
    char needle[64];
    snprintf(needle, sizeof(needle), "\"span_id\":\"%s\"", span1);
    ck_assert_int_ge(h_count_lines(r.log, needle), 1);
    snprintf(needle, sizeof(needle), "\"span_id\":\"%s\"", span2);
    ck_assert_int_ge(h_count_lines(r.log, needle), 1);
    /* At least the retry's line and the completion's. */
    ck_assert_int_ge(lines_of_job_carry_trace(r.log, "job-tr-1", TRACE), 2);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

START_TEST(test_a_broken_traceparent_is_dropped_and_counted_and_the_job_runs_in_a_new_trace)
{
    struct h_run r;
    char top[128];
    int port = h_metrics_top(top, sizeof(top));
    struct hs *s = http_run(&r, "trbad", top);
    /* Uppercase hex: refused by the grammar. */
    const char *bad = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
    publish(&r, "job-bad-1", "bad-1", bad, STATE, "ok");
    publish(&r, "job-none-1", "none-1", NULL, NULL, "ok");
    H_WAIT(h_completed(&r) == 2, 20000, "both jobs should complete");
    H_WAIT(h_metric(port, "sekali_trace_context_dropped_total{queue=\"%s\",job_type=\"charge\"}",
                    r.queue) == 1, 10000, "the dropped traceparent should be counted once");
    h_run_stop(&r);

    struct hs_request q, none;
    ck_assert(hs_get(s, "bad-1", 0, &q));
    ck_assert(hs_get(s, "none-1", 0, &none));
    char span[17];
    span_of(q.traceparent, span);
    span_of(none.traceparent, span);
    /* A new trace each, and no tracestate of the dropped one. */
    ck_assert(strncasecmp(q.traceparent + 3, TRACE, 32) != 0);
    ck_assert(strncmp(q.traceparent + 3, none.traceparent + 3, 32) != 0);
    ck_assert_str_eq(q.tracestate, "");
    ck_assert_int_eq(h_count_lines(r.log, "\"event\":\"trace_context_dropped\""), 1);
    char trace[33];
    memcpy(trace, q.traceparent + 3, 32);
    trace[32] = '\0';
    ck_assert_int_ge(lines_of_job_carry_trace(r.log, "job-bad-1", trace), 0);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* A job that fails for good keeps the producer's trace context in its dead
 * letter: the copy in <queue>.dead and the row in sekali.dead_letters. */
START_TEST(test_a_dead_letter_keeps_the_trace_context)
{
    struct h_run r;
    struct hs *s = http_run(&r, "trdead", NULL);
    publish(&r, "job-dead-1", "dead-1", TP, STATE, "400");
    char dead[300];
    snprintf(dead, sizeof(dead), "%s.dead", r.queue);
    H_WAIT(h_queue_depth(r.b, dead) == 1, 20000, "the job should be dead-lettered");
    h_run_stop(&r);
    amqp_message_t msg;
    ck_assert(h_get(r.b, dead, &msg));
    char buf[600];
    ck_assert_str_eq(h_header_text(&msg, "traceparent", buf, sizeof(buf)), TP);
    ck_assert_str_eq(h_header_text(&msg, "tracestate", buf, sizeof(buf)), STATE);
    amqp_destroy_message(&msg);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE queue = "
                                      "'%s' AND headers->>'traceparent' = '%s'", r.queue, TP), 1);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* The SQL handler sets sekali.traceparent for the job's transaction: the
 * statement reads it, and its result (saved with the key) is the job's
 * span in the producer's trace. */
START_TEST(test_the_sql_handlers_statement_reads_the_jobs_traceparent)
{
    struct h_run r;
    h_run_open(&r, "trsql");
    const char *yaml =
        "    config:\n"
        "      statement: \"SELECT current_setting('sekali.traceparent', true) || ' ' || "
        "current_setting('sekali.tracestate', true)\"\n";
    h_run_start(&r, &(struct h_run_opts){ .handler = "handlers/sql.so", .workers = 1,
                                          .queue_yaml = yaml });
    publish(&r, "job-sql-1", "sql-1", TP, STATE, "{}");
    H_WAIT(h_completed(&r) == 1, 20000, "the job should complete");
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'sql-1' AND convert_from(result, "
                                      "'UTF8') ~ '^00-" TRACE "-[0-9a-f]{16}-01 " STATE "$' "
                                      "AND substr(convert_from(result, 'UTF8'), 37, 16) <> '"
                                      PARENT "'", r.queue), 1);
    /* Local to the job's transaction: nothing is left on the connection. */
    h_run_close(&r);
}
END_TEST

/* A producer's traced transaction: sekali.enqueue() takes the settings
 * sekali.traceparent and sekali.tracestate (sql/031), the relay publishes
 * them as headers, and the job runs in that trace. A later transaction of
 * the same connection, without them, enqueues an untraced job. */
START_TEST(test_a_job_enqueued_in_a_traced_transaction_runs_in_its_trace)
{
    struct h_run r;
    struct hs *s = http_run(&r, "trout", OUTBOX);
    h_pg_exec(r.pg, "BEGIN");
    h_pg_exec(r.pg, "SELECT set_config('sekali.traceparent', '" TP "', true), "
                    "set_config('sekali.tracestate', '" STATE "', true)");
    char sql[600];
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'charge', 'ok'::bytea, 'ob-1')",
             r.queue);
    h_pg_exec(r.pg, sql);
    h_pg_exec(r.pg, "COMMIT");
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'charge', 'ok'::bytea, 'ob-2')",
             r.queue);
    h_pg_exec(r.pg, sql);
    H_WAIT(h_completed(&r) == 2, 20000, "both enqueued jobs should complete");
    h_run_stop(&r);

    struct hs_request q, plain;
    ck_assert(hs_get(s, "ob-1", 0, &q));
    ck_assert(hs_get(s, "ob-2", 0, &plain));
    char span[17];
    span_of(q.traceparent, span);
    ck_assert(strncmp(q.traceparent, "00-" TRACE "-", 36) == 0);
    ck_assert_str_ne(span, PARENT);
    ck_assert_str_eq(q.tracestate, STATE);
    span_of(plain.traceparent, span);
    ck_assert(strncmp(plain.traceparent, "00-" TRACE "-", 36) != 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND idempotency_key = 'ob-2' AND traceparent IS NULL",
                                r.queue), 1);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* A follow-up job the SQL handler's statement enqueues continues the job's
 * trace, as a child of the job's span (not of the producer's). */
START_TEST(test_a_job_the_sql_handler_enqueues_continues_the_jobs_trace)
{
    struct h_run r;
    h_run_open(&r, "trnext");
    char *yaml = NULL;
    ck_assert(asprintf(&yaml,
        "    config:\n"
        "      statement: \"SELECT sekali.enqueue('%s-next', 'x', '{}'::bytea, "
        "'next-' || :idempotency_key::text)\"\n", r.queue) > 0);
    h_run_start(&r, &(struct h_run_opts){ .handler = "handlers/sql.so", .workers = 1,
                                          .queue_yaml = yaml });
    publish(&r, "job-next-1", "n-1", TP, STATE, "{}");
    H_WAIT(h_completed(&r) == 1, 20000, "the job should complete");
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = "
                                      "'%s-next' AND idempotency_key = 'next-n-1' AND "
                                      "traceparent ~ '^00-" TRACE "-[0-9a-f]{16}-01$' AND "
                                      "substr(traceparent, 37, 16) <> '" PARENT "' AND "
                                      "tracestate = '" STATE "'", r.queue), 1);
    h_pg_exec(r.pg, "DELETE FROM sekali.outbox WHERE queue LIKE 'trnext-%-next'");
    free(yaml);
    h_run_close(&r);
}
END_TEST

/* sekalictl enqueue --traceparent: through the outbox and --direct, the
 * job runs in the given trace; a broken value is refused, exit 2, with
 * nothing enqueued. */
START_TEST(test_sekalictl_enqueue_sends_the_trace_it_is_given_and_refuses_a_broken_one)
{
    struct h_run r;
    struct hs *s = http_run(&r, "trctl", OUTBOX);
    char *out = NULL;
    const char *outbox[] = { "enqueue", r.queue, "charge", "--key", "ctl-1", "--traceparent", TP,
                             "--tracestate", STATE, "ok", NULL };
    ck_assert_int_eq(h_sekalictl(&r, &out, outbox), 0);
    free(out);
    const char *direct[] = { "enqueue", r.queue, "charge", "--key", "ctl-2", "--traceparent", TP,
                             "--direct", "ok", NULL };
    ck_assert_int_eq(h_sekalictl(&r, &out, direct), 0);
    free(out);
    const char *bad[] = { "enqueue", r.queue, "charge", "--key", "ctl-3", "--traceparent",
                          "00-" TRACE "-0000000000000000-01", "ok", NULL };
    ck_assert_int_eq(h_sekalictl(&r, &out, bad), 2);
    free(out);
    H_WAIT(h_completed(&r) == 2, 20000, "both enqueued jobs should complete");
    h_run_stop(&r);
    struct hs_request q;
    ck_assert(hs_get(s, "ctl-1", 0, &q));
    ck_assert(strncmp(q.traceparent, "00-" TRACE "-", 36) == 0);
    ck_assert_str_eq(q.tracestate, STATE);
    ck_assert(hs_get(s, "ctl-2", 0, &q));
    ck_assert(strncmp(q.traceparent, "00-" TRACE "-", 36) == 0);
    ck_assert_str_eq(q.tracestate, "");
    ck_assert_int_eq(hs_count(s, "ctl-3"), 0);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_the_service_gets_a_child_of_each_attempts_span_in_the_producers_trace,
        test_a_broken_traceparent_is_dropped_and_counted_and_the_job_runs_in_a_new_trace,
        test_a_dead_letter_keeps_the_trace_context,
        test_the_sql_handlers_statement_reads_the_jobs_traceparent,
        test_a_job_enqueued_in_a_traced_transaction_runs_in_its_trace,
        test_a_job_the_sql_handler_enqueues_continues_the_jobs_trace,
        test_sekalictl_enqueue_sends_the_trace_it_is_given_and_refuses_a_broken_one,
        NULL,
    };
    return h_run_suite(h_suite("tracing", 120, tests));
}
