/* check_pipeline.c - the pipeline end to end on real RabbitMQ, Redis and
 * PostgreSQL: unique jobs, concurrent duplicates, refused handlers and
 * configurations. Every test uses its own queue, so keys never collide. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

START_TEST(test_thousand_unique_jobs_have_one_effect_each)
{
    struct h_run r;
    h_run_open(&r, "unique");
    h_run_start(&r, &(struct h_run_opts){ .workers = 4 });
    for (int i = 0; i < 1000; i++) {
        char id[64];
        snprintf(id, sizeof(id), "job-%d", i);
        h_publish(r.b, r.queue, "test", id, NULL, NULL, "ok");
    }
    H_WAIT(h_completed(&r) == 1000, 60000, "expected 1000 completed keys, have %lld",
           h_completed(&r));
    h_run_stop(&r);
    h_expect_once(&r, 1000, 0);
    /* Every completion of one transaction has its xmin: one per job, or in
     * batch mode (SEKALI_TEST_BATCH) one per batch. */
    long long transactions = h_pg_count(r.pg, "SELECT count(DISTINCT xmin::text) FROM "
                                        "sekali.idempotency_keys WHERE queue = '%s'", r.queue);
    if (h_test_batch() == 1)
        ck_assert_int_eq(transactions, 1000);
    else
        ck_assert_msg(transactions < 1000, "batch %d: %lld transactions for 1000 jobs",
                      h_test_batch(), transactions);
    h_run_close(&r);
}
END_TEST

struct producer {
    const char *queue;
    int         index;
};

static void *produce(void *arg)
{
    const struct producer *p = arg;
    struct sk_broker *b = h_broker();
    /* 200 keys x 5 copies; copy c of key k goes to producer (5k + c) % 4,
     * so every producer sends copies of most keys, interleaved. */
    for (int n = p->index; n < 1000; n += 4) {
        int key = n / 5, copy = n % 5;
        char id[64], idem[64], body[32];
        snprintf(id, sizeof(id), "msg-%d-%d", key, copy);
        snprintf(idem, sizeof(idem), "order-%d", key);
        snprintf(body, sizeof(body), "ok");
        h_publish(b, p->queue, "test", id, idem, NULL, body);
    }
    sk_broker_close(b);
    return NULL;
}

START_TEST(test_concurrent_duplicates_run_once_and_are_counted)
{
    struct h_run r;
    h_run_open(&r, "dups");
    h_run_start(&r, &(struct h_run_opts){ .workers = 4 });
    pthread_t threads[4];
    struct producer producers[4];
    for (int i = 0; i < 4; i++) {
        producers[i] = (struct producer){ .queue = r.queue, .index = i };
        ck_assert_int_eq(pthread_create(&threads[i], NULL, produce, &producers[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);

    H_WAIT(h_completed(&r) == 200 && h_duplicates(&r) == 800, 60000,
           "expected 200 completed keys and 800 duplicates, have %lld and %lld",
           h_completed(&r), h_duplicates(&r));
    h_run_stop(&r);
    h_expect_once(&r, 200, 800);
    h_run_close(&r);
}
END_TEST

START_TEST(test_malformed_message_is_dead_lettered_not_dropped)
{
    struct h_run r;
    h_run_open(&r, "poison");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    h_publish(r.b, r.queue, "test", NULL, NULL, NULL, "no message id");
    h_publish(r.b, r.queue, "test", "good-1", NULL, NULL, "ok");
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "expected 1 dead letter in %s, have %u",
           r.dead, h_queue_depth(r.b, r.dead));
    H_WAIT(h_completed(&r) == 1, 20000,
           "the good job after the bad one should complete");
    h_run_stop(&r);

    ck_assert_int_eq(h_count_events(r.log, "worker", "malformed_message", NULL), 1);
    h_run_close(&r);
}
END_TEST

/* The job's session keeps the user's own options (PGOPTIONS here, as
 * from the conninfo), sekali's lock_timeout wins over theirs, and a
 * server whose default is synchronous_commit = off (the test servers')
 * still gets durable commits from sekali: an ack after a COMMIT that a
 * crash can undo would lose the job. */
START_TEST(test_job_session_keeps_user_options_and_commits_durably)
{
    struct h_run r;
    h_run_open(&r, "settings");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_settings WHERE name = "
                                      "'synchronous_commit' AND setting = 'off'"), 1);
    const char *env[] = { "PGOPTIONS=-c statement_timeout=12345 -c lock_timeout=999", NULL };
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .env = env });
    h_publish(r.b, r.queue, "test", "settings-1", NULL, NULL, "settings");
    H_WAIT(h_completed(&r) == 1, 20000, "the job should complete");
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND convert_from(result, 'UTF8') = "
                                      "'lock_timeout=5000;statement_timeout=12345;"
                                      "synchronous_commit=on'", r.queue), 1);
    h_run_close(&r);
}
END_TEST

/* A handler built against the 1.2 header (tests/plugins/abi_1_2.c: init()
 * stashes the host, the nine-argument enqueue()) loads and runs unchanged:
 * its effects happen once each, and its follow-up jobs are enqueued. */
START_TEST(test_handler_built_for_abi_1_2_runs_unchanged)
{
    struct h_run r;
    h_run_open(&r, "abi12");
    h_run_start(&r, &(struct h_run_opts){ .handler = "tests/plugins/abi_1_2.so", .workers = 2,
                                          .top_yaml = H_RELAY });
    for (int i = 0; i < 10; i++) {
        char id[32];
        snprintf(id, sizeof(id), "old-%d", i);
        h_publish(r.b, r.queue, "test", id, NULL, NULL, i == 0 ? "chain:2" : "ok");
    }
    H_WAIT(h_effects(&r, NULL) == 12, 30000, "10 jobs and 2 follow-ups should run, ran %lld",
           h_effects(&r, NULL));
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, NULL), 12);
    ck_assert_int_eq(h_effect_keys(&r), 12);
    ck_assert_int_eq(h_effects(&r, "old-0++"), 1);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_STARTED, "handler", "abi_1_2",
                                         "handler_version", "1.2", NULL), 2);
    h_run_close(&r);
}
END_TEST

/* sekalid must refuse to start, with the exit code given, and say why. */
static void assert_refused(const char *handler, int code, const char *expected,
                           const char *queue_yaml)
{
    char queue[128];
    h_unique_name(queue, sizeof(queue), "abi");
    char *dir = h_tmpdir("abi");
    char *config = h_write_config(dir, queue, handler, 1, queue_yaml);
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    int status = h_wait_exit(sekalid, 10000, "sekalid with a broken handler");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == code,
                  "%s: expected exit %d, got status 0x%x", handler, code, status);
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_msg(h_count_events(log, "supervisor", "handler_refused", NULL) == 1,
                  "%s: the log should have one handler_refused line", handler);
    /* Which refusal it was is what the test is about. */
    ck_assert_msg(h_count_lines(log, expected) == 1, "%s: the log should say \"%s\"", handler,
                  expected);
    free(config);
    free(dir);
}

/* Exit 3 (rebuild the handler) only for a handler built for another ABI;
 * a file that is missing or no sekali handler is a configuration mistake. */
START_TEST(test_handler_with_wrong_abi_is_refused_at_start)
{
    h_init();
    assert_refused("tests/plugins/old_abi.so", 3,
                   "incompatible ABI: abi_major is 0, sekalid needs 1", NULL);
    assert_refused("tests/plugins/null_handle.so", 3, "mandatory callback handle is NULL", NULL);
    assert_refused("tests/plugins/no_symbol.so", 2, "no symbol sekali_handler_v1", NULL);
    assert_refused("tests/plugins/missing.so", 2, "cannot load", NULL);
}
END_TEST

/* The handler's check() runs before any worker: its message, exit 2. */
START_TEST(test_handler_config_rejected_by_check_stops_start_with_exit_2)
{
    h_init();
    assert_refused(H_EFFECT, 2, "rejects its config: check_fail: table 1x is not a table",
                   "    config:\n      check_fail: table 1x is not a table\n");
}
END_TEST

START_TEST(test_config_error_exits_2_with_position)
{
    h_init();
    char *dir = h_tmpdir("badconf");
    char path[1024];
    snprintf(path, sizeof(path), "%s/bad.yaml", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "amqp:\n  url: amqp://x@127.0.0.1:1/\npostgres:\n  conninfo: \"host=x\"\n"
               "queues:\n  - name: q\n    handler: x.so\n    workers: 0\n");
    fclose(f);

    pid_t sekalid = h_start_sekalid("sekalid", path, dir, NULL);
    int status = h_wait_exit(sekalid, 10000, "sekalid with a bad config");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2, "expected exit 2, got 0x%x",
                  status);
    char log[1024], expected[1200];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    snprintf(expected, sizeof(expected), "%s:8:14: ", path);
    ck_assert_msg(h_count_lines(log, expected) == 1, "the log should point at %s", expected);
    free(dir);
}
END_TEST

START_TEST(test_handler_config_failure_stops_without_restart_loop)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "initfail");
    char *dir = h_tmpdir("initfail");
    char *config = h_write_config(dir, queue, H_EFFECT, 2, "    config:\n      fail_init: yes\n");
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    int status = h_wait_exit(sekalid, 20000, "sekalid whose handler rejects its config");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2, "expected exit 2, got 0x%x",
                  status);
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    /* The first worker to fail stops the supervisor, which may stop the
     * second before its own init() ran; either way no worker was respawned,
     * so there are at most as many init failures as workers. */
    int failures = h_count_events(log, "worker", "worker_cannot_start", NULL);
    ck_assert_int_eq(h_count_lines(log, "handler init() failed"), failures);
    ck_assert_msg(failures >= 1 && failures <= 2, "expected 1 or 2 init failures, got %d",
                  failures);
    ck_assert_int_ge(h_count_events(log, "supervisor", SK_EVENT_WORKER_CANNOT_RUN, NULL), 1);
    ck_assert_int_eq(h_count_events(log, NULL, SK_EVENT_CRASH_LOOP, NULL), 0);
    free(config);
    free(dir);
}
END_TEST

/* `sekalid -t` runs the handler's check(): exit 2 with its message. */
START_TEST(test_config_check_flag_runs_the_handlers_check)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "checkfail");
    char *dir = h_tmpdir("checkfail");
    char *config = h_write_config(dir, queue, H_EFFECT, 1,
                                  "    config:\n      check_fail: \"no table 'x'\"\n");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s/sekalid -t -c %s > %s/t.out 2>&1", h_build_dir(), config, dir);
    int status = system(cmd);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2, "expected exit 2, got 0x%x",
                  status);
    char out[1100];
    snprintf(out, sizeof(out), "%s/t.out", dir);
    ck_assert_int_eq(h_count_lines(out, "rejects its config: check_fail: no table 'x'"), 1);
    ck_assert_int_eq(h_count_lines(out, "test failed"), 1);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_config_check_flag_reports_success)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "check");
    char *dir = h_tmpdir("check");
    char *config = h_write_config(dir, queue, H_EFFECT, 1, NULL);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s/sekalid -t -c %s 2>&1 | grep -q 'test is successful'",
             h_build_dir(), config);
    ck_assert_int_eq(system(cmd), 0);
    free(config);
    free(dir);
}
END_TEST

int main(void)
{
    const TTest *end_to_end[] = {
        test_thousand_unique_jobs_have_one_effect_each,
        test_concurrent_duplicates_run_once_and_are_counted,
        test_malformed_message_is_dead_lettered_not_dropped,
        test_job_session_keeps_user_options_and_commits_durably,
        test_handler_built_for_abi_1_2_runs_unchanged,
        NULL,
    };
    const TTest *refused_start[] = {
        test_handler_with_wrong_abi_is_refused_at_start,
        test_config_error_exits_2_with_position,
        test_handler_config_failure_stops_without_restart_loop,
        test_config_check_flag_reports_success,
        test_handler_config_rejected_by_check_stops_start_with_exit_2,
        test_config_check_flag_runs_the_handlers_check,
        NULL,
    };
    Suite *s = suite_create("pipeline");
    h_tcase(s, "end_to_end", 600, end_to_end);
    h_tcase(s, "refused_start", 300, refused_start);
    return h_run_suite(s);
}
