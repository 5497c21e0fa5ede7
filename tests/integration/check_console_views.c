/* check_console_views.c - the console's views of what /metrics' five
 * minutes and the overview's totals do not show (issue 39): the retries
 * waiting in each delay queue (/api/retries, and the buckets in
 * /api/status), and each queue's history from PostgreSQL
 * (/api/history, sekali.history written by the janitor). A real sekalid
 * runs tests/plugins/flaky.so; the console runs with console.open_reads
 * (loopback), so a read is one plain GET. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define FLAKY "tests/plugins/flaky.so"

struct console {
    int   port;
    pid_t pid;
    char  log[1100];
};

/* sekalid with flaky.so, whose retries wait a minute: a job whose body is
 * "retry" sits in a delay queue for the test to see. The janitor runs
 * every 200 ms, so its history rows come at once. */
static void start(struct h_run *r, struct console *c, const char *name)
{
    h_run_open(r, name);
    c->port = h_free_port();
    char queue_yaml[1500], top[400];
    snprintf(queue_yaml, sizeof(queue_yaml),
             "    retry:\n      max_attempts: 10\n      initial: 60s\n      max: 60s\n"
             "    job_types: [test]\n    lock: false\n    config:\n      marker_dir: %s\n",
             r->dir);
    snprintf(top, sizeof(top), "janitor:\n  interval: 200ms\n"
             "console:\n  listen: \"127.0.0.1:%d\"\n  open_reads: true\n", c->port);
    h_run_start(r, &(struct h_run_opts){ .handler = FLAKY, .workers = 1,
                                         .queue_yaml = queue_yaml, .top_yaml = top });
    snprintf(c->log, sizeof(c->log), "%s/serve.log", r->dir);
    c->pid = h_serve_console(r->config, c->log);
}

static void stop(struct h_run *r, struct console *c)
{
    ck_assert_int_eq(kill(c->pid, SIGTERM), 0);
    int st = h_wait_exit(c->pid, 10000, "sekalictl serve");
    ck_assert_msg(WIFEXITED(st) && !WEXITSTATUS(st), "serve should exit 0 (see %s)", c->log);
    h_run_close(r);
}

/* Whether GET path answers 200 with every one of the NULL-terminated
 * needles in its body; the body is kept in last (the caller frees). */
static bool answers(int port, const char *path, char **last, ...)
{
    free(*last);
    int status = h_http_get(port, path, last);
    if (status != 200)
        return false;
    va_list ap;
    va_start(ap, last);
    bool all = true;
    for (const char *n = va_arg(ap, const char *); n != NULL; n = va_arg(ap, const char *))
        all = all && strstr(*last, n) != NULL;
    va_end(ap);
    return all;
}

START_TEST(test_retries_lists_a_retry_waiting_in_its_delay_queue_by_bucket)
{
    struct h_run r;
    struct console c;
    start(&r, &c, "views-retries");
    h_publish(r.b, r.queue, "test", "m-retry", "k-retry", NULL, "retry");
    char *body = NULL, queue[300];
    snprintf(queue, sizeof(queue), "{\"name\":\"%s\",\"delayed\":1,", r.queue);
    /* The retry's delay is jittered below a minute: its bucket is any of
     * those that exist (a worker declares some as it starts). */
    H_WAIT(answers(c.port, "/api/retries", &body, queue, "\"messages\":1}", NULL), 30000,
           "/api/retries should list the retry in one delay queue; said: %s", body);
    ck_assert_msg(strstr(body, "\"delay_ms\":") != NULL, "%s", body);
    H_WAIT(answers(c.port, "/api/status", &body, "\"delay_buckets\":[{\"delay_ms\":",
                   "\"messages\":1}", NULL), 10000,
           "/api/status should list the bucket too; said: %s", body);
    free(body);
    stop(&r, &c);
}
END_TEST

static long long history_sum(struct h_run *r, const char *column)
{
    return h_pg_count(r->pg, "SELECT coalesce(sum(%s), 0) FROM sekali.history WHERE queue = '%s' "
                      "AND minute > now() - interval '1 day'", column, r->queue);
}

START_TEST(test_history_holds_the_minutes_of_jobs_run_and_the_api_returns_them)
{
    struct h_run r;
    struct console c;
    start(&r, &c, "views-history");
    /* A minute of the retention's past, which the janitor deletes. */
    char sql[600];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali.history (queue, minute, completed) "
             "VALUES ('%s', date_trunc('minute', now()) - interval '8 days', 99)", r.queue);
    h_pg_exec(r.pg, sql);
    h_publish(r.b, r.queue, "test", "m-1", "k-1", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-2", "k-2", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-3", "k-3", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-1b", "k-1", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-fail", "k-fail", NULL, "fail");
    h_publish(r.b, r.queue, "test", "m-retry", "k-retry", NULL, "retry");
    H_WAIT(history_sum(&r, "completed") == 3 && history_sum(&r, "duplicates") == 1 &&
           history_sum(&r, "dead_lettered") == 1 && history_sum(&r, "retried") == 1, 30000,
           "sekali.history should hold 3 completed, 1 duplicate, 1 dead-lettered and 1 retried "
           "in the last minutes; has %lld, %lld, %lld, %lld", history_sum(&r, "completed"),
           history_sum(&r, "duplicates"), history_sum(&r, "dead_lettered"),
           history_sum(&r, "retried"));
    char path[400], *body = NULL;
    snprintf(path, sizeof(path), "/api/history?queue=%s&hours=1", r.queue);
    ck_assert_int_eq(h_http_get(c.port, path, &body), 200);
    ck_assert_msg(strstr(body, "\"step_minutes\" : 1") != NULL, "%s", body);
    /* The jobs ran within a second: one minute, unless one just began. */
    if (h_pg_count(r.pg, "SELECT count(*) FROM sekali.history WHERE queue = '%s' AND "
                   "minute > now() - interval '1 day'", r.queue) == 1)
        ck_assert_msg(strstr(body, "\"completed\" : 3, \"retried\" : 1, \"dead_lettered\" : 1, "
                                   "\"duplicates\" : 1}") != NULL, "%s", body);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.history WHERE queue = '%s' AND "
                      "minute < now() - interval '7 days'", r.queue) == 0, 10000,
           "the janitor should delete the minutes older than history_retention (7 d)");
    /* A week asks for 28-minute steps, and the row 8 days old is gone. */
    snprintf(path, sizeof(path), "/api/history?queue=%s&hours=168", r.queue);
    free(body);
    ck_assert_int_eq(h_http_get(c.port, path, &body), 200);
    ck_assert_msg(strstr(body, "\"step_minutes\" : 28") != NULL && strstr(body, ": 99") == NULL,
                  "%s", body);
    free(body);
    stop(&r, &c);
}
END_TEST

START_TEST(test_history_refuses_an_unknown_queue_and_bad_hours_with_400)
{
    struct h_run r;
    struct console c;
    start(&r, &c, "views-history-bad");
    char path[400], *body = NULL;
    static const char *const bad_hours[] = { "0", "169", "-1", "1x", "99999999999999999999" };
    for (size_t i = 0; i < sizeof(bad_hours) / sizeof(*bad_hours); i++) {
        snprintf(path, sizeof(path), "/api/history?queue=%s&hours=%s", r.queue, bad_hours[i]);
        ck_assert_int_eq(h_http_get(c.port, path, &body), 400);
        ck_assert_msg(strstr(body, "hours: a whole number from 1 to 168") != NULL, "%s", body);
        free(body);
    }
    static const char *const bad_queues[] = { "/api/history", "/api/history?queue=",
                                             "/api/history?queue=no-such-queue&hours=1",
                                             "/api/history?queue=%27%3B%20DROP&hours=1" };
    for (size_t i = 0; i < sizeof(bad_queues) / sizeof(*bad_queues); i++) {
        ck_assert_int_eq(h_http_get(c.port, bad_queues[i], &body), 400);
        ck_assert_msg(strstr(body, "queue: not a queue of this configuration") != NULL, "%s",
                      body);
        free(body);
    }
    stop(&r, &c);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_retries_lists_a_retry_waiting_in_its_delay_queue_by_bucket,
        test_history_holds_the_minutes_of_jobs_run_and_the_api_returns_them,
        test_history_refuses_an_unknown_queue_and_bad_hours_with_400,
        NULL,
    };
    return h_run_suite(h_suite("console_views", 120, tests));
}
