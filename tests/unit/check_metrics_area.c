/* check_metrics_area.c - the shared metrics area (src/shared/metrics.c): type
 * names claimed without a lock, counts that cross fork(), and the text that
 * Prometheus reads. (The endpoint and the workers' counting are tested end
 * to end in tests/integration/check_metrics.c.) */
/* links: core metrics metrics_text */
#include "metrics.h"
#include "metrics_text.h"
#include "suite.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sekali/handler.h>

#define MS UINT64_C(1000000)

static struct sk_queue_conf queues[2];
static struct sk_conf conf;

static struct sk_metrics *area(void)
{
    queues[0] = (struct sk_queue_conf){ .name = "invoices", .lock = true, .lock_ttl_ms = 30000,
                                        .job_timeout_ms = 1500 };
    queues[1] = (struct sk_queue_conf){ .name = "mail", .lock = false };
    conf = (struct sk_conf){ .queues = queues, .n_queues = 2 };
    struct sk_metrics *m = NULL;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_metrics_create(&m, 2, 0, &err) == SK_OK, "%s", err.msg);
    return m;
}

/* The rendered text; the caller frees it. */
static char *render(struct sk_metrics *m)
{
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(sk_metrics_render(m, &conf, &text, &len), SK_OK);
    ck_assert_uint_eq(strlen(text), len);
    return text;
}

/* Asserts that text has the line `line` exactly once. */
static void has_line(const char *text, const char *line)
{
    int n = 0;
    size_t len = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p += len)
        n += (p == text || p[-1] == '\n') && (p[len] == '\n' || p[len] == '\0');
    ck_assert_msg(n == 1, "expected the line \"%s\" once, found it %d times in:\n%s", line, n,
                  text);
}

static int count_lines_starting(const char *text, const char *prefix)
{
    int n = 0;
    for (const char *line = text; *line != '\0';) {
        n += strncmp(line, prefix, strlen(prefix)) == 0;
        const char *end = strchr(line, '\n');
        if (end == NULL)
            break;
        line = end + 1;
    }
    return n;
}

START_TEST(test_each_type_has_its_own_counters_and_empty_is_a_type)
{
    struct sk_metrics *m = area();
    struct sk_metrics_queue *q = sk_metrics_queue(m, 0);
    struct sk_metrics_type *a = sk_metrics_lookup(q, "create");
    ck_assert_ptr_eq(sk_metrics_lookup(q, "create"), a);
    ck_assert_ptr_ne(sk_metrics_lookup(q, "void"), a);
    ck_assert_ptr_ne(sk_metrics_lookup(q, ""), a);
    ck_assert_ptr_ne(sk_metrics_lookup(sk_metrics_queue(m, 1), "create"), a);
    sk_metrics_inc(a, SK_METRIC_DELIVERIES);
    sk_metrics_inc(a, SK_METRIC_DELIVERIES);
    sk_metrics_inc(sk_metrics_lookup(q, ""), SK_METRIC_DELIVERIES);

    char *text = render(m);
    has_line(text, "sekali_deliveries_total{queue=\"invoices\",job_type=\"create\"} 2");
    has_line(text, "sekali_deliveries_total{queue=\"invoices\",job_type=\"void\"} 0");
    has_line(text, "sekali_deliveries_total{queue=\"invoices\",job_type=\"\"} 1");
    has_line(text, "sekali_deliveries_total{queue=\"mail\",job_type=\"create\"} 0");
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_types_past_the_table_or_too_long_count_as_other)
{
    struct sk_metrics *m = area();
    struct sk_metrics_queue *q = sk_metrics_queue(m, 0);
    char name[80];
    memset(name, 'x', SK_METRICS_TYPE_MAX);
    name[SK_METRICS_TYPE_MAX] = '\0';
    struct sk_metrics_type *longest = sk_metrics_lookup(q, name);
    name[SK_METRICS_TYPE_MAX] = 'x';
    name[SK_METRICS_TYPE_MAX + 1] = '\0';
    struct sk_metrics_type *other = sk_metrics_lookup(q, name);
    ck_assert_ptr_ne(longest, other);

    for (int i = 1; i < SK_METRICS_TYPES; i++) {
        snprintf(name, sizeof(name), "type-%d", i);
        ck_assert_ptr_ne(sk_metrics_lookup(q, name), other);
    }
    ck_assert_ptr_eq(sk_metrics_lookup(q, "one-too-many"), other);
    ck_assert_ptr_eq(sk_metrics_lookup(q, "type-1"), sk_metrics_lookup(q, "type-1"));
    sk_metrics_inc(sk_metrics_lookup(q, "one-too-many"), SK_METRIC_DELIVERIES);
    sk_metrics_inc(sk_metrics_lookup(q, "and-another"), SK_METRIC_DELIVERIES);

    char *text = render(m);
    has_line(text, "sekali_deliveries_total{queue=\"invoices\",job_type=\"other\"} 2");
    ck_assert_int_eq(count_lines_starting(text, "sekali_deliveries_total{queue=\"invoices\""),
                     SK_METRICS_TYPES + 1);
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

/* Many processes meeting one new type at once, as the workers of a queue
 * do: whatever slots they claim, one series comes out with every count. */
START_TEST(test_counts_from_many_processes_add_up_in_one_series)
{
    enum { CHILDREN = 8, EACH = 5000 };
    struct sk_metrics *m = area();
    pid_t pids[CHILDREN];
    for (int i = 0; i < CHILDREN; i++) {
        pids[i] = fork();
        ck_assert_int_ge(pids[i], 0);
        if (pids[i] == 0) {
            struct sk_metrics_queue *q = sk_metrics_queue(m, 1);
            for (int k = 0; k < EACH; k++)
                sk_metrics_inc(sk_metrics_lookup(q, k % 2 ? "send" : "bounce"),
                               SK_METRIC_COMPLETIONS);
            /* Only this process's mapping and handle go; under valgrind a
             * child must leave nothing behind either. */
            sk_metrics_destroy(m);
            _exit(0);
        }
    }
    for (int i = 0; i < CHILDREN; i++) {
        int status;
        ck_assert_int_eq(waitpid(pids[i], &status, 0), pids[i]);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    char *text = render(m);
    char line[128];
    snprintf(line, sizeof(line), "sekali_completions_total{queue=\"mail\",job_type=\"send\"} %d",
             CHILDREN * EACH / 2);
    has_line(text, line);
    snprintf(line, sizeof(line),
             "sekali_completions_total{queue=\"mail\",job_type=\"bounce\"} %d",
             CHILDREN * EACH / 2);
    has_line(text, line);
    ck_assert_int_eq(count_lines_starting(text, "sekali_completions_total{queue=\"mail\""), 2);
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_label_values_are_escaped)
{
    struct sk_metrics *m = area();
    sk_metrics_inc(sk_metrics_lookup(sk_metrics_queue(m, 0), "a\"b\\c\nd"),
                   SK_METRIC_DELIVERIES);
    char *text = render(m);
    has_line(text, "sekali_deliveries_total{queue=\"invoices\",job_type=\"a\\\"b\\\\c\\nd\"} 1");
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_histogram_is_cumulative_with_inclusive_bounds)
{
    struct sk_metrics *m = area();
    struct sk_metrics_type *t = sk_metrics_lookup(sk_metrics_queue(m, 0), "create");
    sk_metrics_duration(t, 5 * MS);        /* exactly on 0.005: counted there */
    sk_metrics_duration(t, 5 * MS + 1);    /* just past it */
    sk_metrics_duration(t, 700 * MS);
    sk_metrics_duration(t, 61000 * MS);    /* only +Inf */
    char *text = render(m);
    static const char *const lines[] = {
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"create\",le=\"0.005\"} 1",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"create\",le=\"0.01\"} 2",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"create\",le=\"0.5\"} 2",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"create\",le=\"1\"} 3",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"create\",le=\"60\"} 3",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"create\",le=\"+Inf\"} 4",
        "sekali_job_duration_seconds_sum{queue=\"invoices\",job_type=\"create\"} 61.710000001",
        "sekali_job_duration_seconds_count{queue=\"invoices\",job_type=\"create\"} 4",
        "# TYPE sekali_job_duration_seconds histogram",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        has_line(text, lines[i]);
    ck_assert_int_eq(count_lines_starting(text, "sekali_job_duration_seconds_bucket{"), 14);
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_histogram_reaches_the_queues_longest_lock_ttl_or_job_timeout)
{
    /* A queue whose lease is 10 minutes: its buckets go on past 60 s up to
     * the first bound at or over 600 s, so a job near its TTL is seen; a
     * queue of short limits keeps the 14 buckets ending at 60 s. */
    struct sk_metrics *m = area();
    queues[0].lock_ttl_ms = 600000;
    queues[0].job_timeout_ms = 450000;
    struct sk_metrics_type *t = sk_metrics_lookup(sk_metrics_queue(m, 0), "long");
    sk_metrics_duration(t, 90000 * MS);
    sk_metrics_duration(t, 590000 * MS);
    sk_metrics_duration(t, 700000 * MS);
    sk_metrics_inc(sk_metrics_lookup(sk_metrics_queue(m, 1), "short"), SK_METRIC_DELIVERIES);
    sk_metrics_duration(sk_metrics_lookup(sk_metrics_queue(m, 1), "short"), 1000 * MS);
    char *text = render(m);
    static const char *const lines[] = {
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"long\",le=\"60\"} 0",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"long\",le=\"120\"} 1",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"long\",le=\"300\"} 1",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"long\",le=\"600\"} 2",
        "sekali_job_duration_seconds_bucket{queue=\"invoices\",job_type=\"long\",le=\"+Inf\"} 3",
        "sekali_job_duration_seconds_bucket{queue=\"mail\",job_type=\"short\",le=\"60\"} 1",
        "sekali_job_duration_seconds_bucket{queue=\"mail\",job_type=\"short\",le=\"+Inf\"} 1",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        has_line(text, lines[i]);
    ck_assert_int_eq(
        count_lines_starting(text, "sekali_job_duration_seconds_bucket{queue=\"invoices\""), 17);
    ck_assert_int_eq(
        count_lines_starting(text, "sekali_job_duration_seconds_bucket{queue=\"mail\""), 14);
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_dead_letters_lock_waits_and_outcomes_are_rendered)
{
    struct sk_metrics *m = area();
    struct sk_metrics_type *t = sk_metrics_lookup(sk_metrics_queue(m, 0), "create");
    sk_metrics_dead_letter(t, SK_METRICS_RETRIES_EXHAUSTED);
    sk_metrics_dead_letter(t, SK_METRICS_MALFORMED);
    sk_metrics_dead_letter(t, SK_METRICS_MALFORMED);
    sk_metrics_lock_wait(t, 1500 * MS);
    sk_metrics_lock_wait(t, 250);
    for (int c = 0; c < SK_METRIC_COUNT; c++)
        for (int k = 0; k <= c; k++)
            sk_metrics_inc(t, (enum sk_metric)c);
    char *text = render(m);
    static const char *const lines[] = {
        "sekali_dead_letters_total{queue=\"invoices\",job_type=\"create\",reason=\"malformed\"} 2",
        "sekali_dead_letters_total{queue=\"invoices\",job_type=\"create\",reason=\"failed\"} 0",
        "sekali_dead_letters_total{queue=\"invoices\",job_type=\"create\","
        "reason=\"retries_exhausted\"} 1",
        "sekali_lock_wait_seconds_total{queue=\"invoices\",job_type=\"create\"} 1.500000250",
        "sekali_deliveries_total{queue=\"invoices\",job_type=\"create\"} 1",
        "sekali_redeliveries_total{queue=\"invoices\",job_type=\"create\"} 2",
        "sekali_executions_total{queue=\"invoices\",job_type=\"create\"} 3",
        "sekali_completions_total{queue=\"invoices\",job_type=\"create\"} 4",
        "sekali_duplicates_total{queue=\"invoices\",job_type=\"create\"} 5",
        "sekali_retries_total{queue=\"invoices\",job_type=\"create\"} 6",
        "sekali_lock_busy_total{queue=\"invoices\",job_type=\"create\"} 7",
        "sekali_locks_lost_total{queue=\"invoices\",job_type=\"create\"} 8",
        "sekali_fenced_out_total{queue=\"invoices\",job_type=\"create\"} 9",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        has_line(text, lines[i]);
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

/* The relays' figures: counters per target queue, a backlog sample that
 * zeroes the queues it no longer lists, and one relay sampling per period. */
/* The header job.c writes and the label rendered here are one name. */
START_TEST(test_dead_letter_reasons_have_one_name_for_header_and_label)
{
    ck_assert_str_eq(sk_metrics_reason_name(SK_METRICS_MALFORMED), "malformed");
    ck_assert_str_eq(sk_metrics_reason_name(SK_METRICS_FAILED), "failed");
    ck_assert_str_eq(sk_metrics_reason_name(SK_METRICS_RETRIES_EXHAUSTED), "retries_exhausted");
    ck_assert_str_eq(sk_metrics_reason_name(SK_METRICS_CRASHED), "crashed");
    ck_assert_str_eq(sk_metrics_reason_name(SK_METRICS_BEYOND_RETENTION), "beyond_retention");
    ck_assert_str_eq(sk_metrics_reason_name(SK_METRICS_UNRECORDED), "unrecorded");
    struct sk_metrics *m = area();
    char *text = render(m);
    has_line(text, "# HELP sekali_dead_letters_total Jobs sekali dead-lettered to "
                   "<queue>.dead, by reason: malformed, failed, retries_exhausted, crashed, "
                   "beyond_retention, unrecorded.");
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_outbox_figures_per_target_queue)
{
    struct sk_metrics *m = area();
    conf.outbox.relays = 1;
    struct sk_metrics_outq *invoices = sk_metrics_outbox_lookup(m, "invoices");
    ck_assert_ptr_eq(sk_metrics_outbox_lookup(m, "invoices"), invoices);
    ck_assert_ptr_ne(sk_metrics_outbox_lookup(m, "elsewhere"), invoices);
    sk_metrics_outbox_published(invoices);
    sk_metrics_outbox_published(invoices);
    sk_metrics_outbox_unroutable(sk_metrics_outbox_lookup(m, "nowhere"));
    struct sk_outbox_backlog first[] = {
        { .queue = "invoices", .pending = 7, .failed_rows = 0, .lag_ms = 2500 },
        { .queue = "nowhere", .pending = 0, .failed_rows = 1, .lag_ms = 0 },
    };
    sk_metrics_outbox_backlog(m, first, 2);
    char *text = render(m);
    has_line(text, "sekali_outbox_published_total{queue=\"invoices\"} 2");
    has_line(text, "sekali_outbox_published_total{queue=\"nowhere\"} 0");
    has_line(text, "sekali_outbox_unroutable_total{queue=\"nowhere\"} 1");
    has_line(text, "sekali_outbox_pending{queue=\"invoices\"} 7");
    has_line(text, "sekali_outbox_failed_rows{queue=\"nowhere\"} 1");
    has_line(text, "sekali_outbox_lag_seconds{queue=\"nowhere\"} 0.000000000");
    has_line(text, "# TYPE sekali_outbox_lag_seconds gauge");
    /* Rendered a moment after the sample, the lag has grown by that moment. */
    const char *lag = strstr(text, "sekali_outbox_lag_seconds{queue=\"invoices\"} ");
    ck_assert_ptr_nonnull(lag);
    double seconds = strtod(strchr(lag, ' ') + 1, NULL);
    ck_assert_msg(seconds >= 2.5 && seconds < 10, "lag %g", seconds);
    free(text);

    /* The next sample no longer lists invoices: its backlog is gone. */
    struct sk_outbox_backlog second[] = { { .queue = "nowhere", .failed_rows = 1 } };
    sk_metrics_outbox_backlog(m, second, 1);
    text = render(m);
    has_line(text, "sekali_outbox_pending{queue=\"invoices\"} 0");
    has_line(text, "sekali_outbox_lag_seconds{queue=\"invoices\"} 0.000000000");
    has_line(text, "sekali_outbox_failed_rows{queue=\"nowhere\"} 1");
    free(text);

    ck_assert(sk_metrics_outbox_sample_due(m, 60000));
    ck_assert(!sk_metrics_outbox_sample_due(m, 60000));

    /* Without relays there is nothing to say about an outbox. */
    conf.outbox.relays = 0;
    text = render(m);
    ck_assert_ptr_null(strstr(text, "sekali_outbox_"));
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_outbox_queues_past_the_table_or_too_long_count_as_other)
{
    struct sk_metrics *m = area();
    char name[SK_METRICS_NAME_MAX + 2];
    memset(name, 'q', SK_METRICS_NAME_MAX);
    name[SK_METRICS_NAME_MAX] = '\0';
    struct sk_metrics_outq *longest = sk_metrics_outbox_lookup(m, name);
    for (int i = 1; i < SK_METRICS_OUTBOX_QUEUES; i++) {
        snprintf(name, sizeof(name), "queue-%d", i);
        sk_metrics_outbox_lookup(m, name);
    }
    struct sk_metrics_outq *other = sk_metrics_outbox_lookup(m, "one-too-many");
    ck_assert_ptr_ne(other, longest);
    ck_assert_ptr_eq(sk_metrics_outbox_lookup(m, "and-another"), other);
    memset(name, 'q', SK_METRICS_NAME_MAX + 1);
    name[SK_METRICS_NAME_MAX + 1] = '\0';
    ck_assert_ptr_eq(sk_metrics_outbox_lookup(m, name), other);
    ck_assert_ptr_eq(sk_metrics_outbox_lookup(m, "queue-3"), sk_metrics_outbox_lookup(m, "queue-3"));
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_queue_gauges_come_from_the_supervisor_and_the_config)
{
    struct sk_metrics *m = area();
    sk_metrics_worker_started(m, 0, false);
    sk_metrics_worker_started(m, 0, false);
    sk_metrics_worker_exited(m, 0);
    sk_metrics_worker_started(m, 0, true);
    sk_metrics_worker_started(m, 1, false);
    char *text = render(m);
    static const char *const lines[] = {
        "sekali_workers_up{queue=\"invoices\"} 2",
        "sekali_workers_up{queue=\"mail\"} 1",
        "sekali_worker_restarts_total{queue=\"invoices\"} 1",
        "sekali_worker_restarts_total{queue=\"mail\"} 0",
        "sekali_lock_ttl_seconds{queue=\"invoices\"} 30.000000000",
        "sekali_job_timeout_seconds{queue=\"invoices\"} 1.500000000",
        "sekali_job_timeout_seconds{queue=\"mail\"} 0.000000000",
        "# TYPE sekali_workers_up gauge",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        has_line(text, lines[i]);
    /* mail takes no lock: it has no lease to compare durations with. */
    ck_assert_ptr_null(strstr(text, "sekali_lock_ttl_seconds{queue=\"mail\"}"));
    /* No job type seen yet: no per-type series, only the families. */
    ck_assert_ptr_null(strstr(text, "sekali_deliveries_total{"));
    ck_assert_ptr_nonnull(strstr(text, "# TYPE sekali_deliveries_total counter\n"));
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

START_TEST(test_destroy_accepts_null)
{
    sk_metrics_destroy(NULL);
}
END_TEST

/* Dashboards mark deploys with the version and the start time: one series
 * each, the version sekalid was built as, a start no later than now. */
START_TEST(test_build_info_and_start_time_are_rendered)
{
    time_t before = time(NULL);
    struct sk_metrics *m = area();
    char *text = render(m);
    char line[128];
    snprintf(line, sizeof(line), "sekali_build_info{version=\"%s\",abi=\"%d.%d\"} 1", SK_VERSION,
             SEKALI_HANDLER_ABI_MAJOR, SEKALI_HANDLER_ABI_MINOR);
    has_line(text, line);
    const char *start = strstr(text, "\nprocess_start_time_seconds ");
    ck_assert_msg(start != NULL, "no process_start_time_seconds in:\n%s", text);
    long long at = atoll(start + strlen("\nprocess_start_time_seconds "));
    ck_assert_msg(at > 1600000000 && at <= (long long)before, "start time %lld, now %lld", at,
                  (long long)before);
    free(text);
    sk_metrics_destroy(m);
}
END_TEST

int main(void)
{
    const TTest *types[] = {
        test_each_type_has_its_own_counters_and_empty_is_a_type,
        test_types_past_the_table_or_too_long_count_as_other,
        test_counts_from_many_processes_add_up_in_one_series,
        NULL,
    };
    const TTest *text[] = {
        test_label_values_are_escaped,
        test_histogram_is_cumulative_with_inclusive_bounds,
        test_histogram_reaches_the_queues_longest_lock_ttl_or_job_timeout,
        test_dead_letters_lock_waits_and_outcomes_are_rendered,
        test_queue_gauges_come_from_the_supervisor_and_the_config,
        test_dead_letter_reasons_have_one_name_for_header_and_label,
        test_outbox_figures_per_target_queue,
        test_outbox_queues_past_the_table_or_too_long_count_as_other,
        test_destroy_accepts_null,
        test_build_info_and_start_time_are_rendered,
        NULL,
    };
    Suite *s = suite_create("metrics_area");
    h_tcase(s, "types", 0, types);
    h_tcase(s, "text", 0, text);
    return h_run_suite(s);
}
