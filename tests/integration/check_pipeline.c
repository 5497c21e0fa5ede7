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

    ck_assert_int_eq(h_count_lines(r.log, "malformed message: missing message_id"), 1);
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

/* sekalid must refuse to start, exit 3 and say why, for each broken plugin. */
static void assert_refused(const char *handler, const char *expected)
{
    char queue[128];
    h_unique_name(queue, sizeof(queue), "abi");
    char *dir = h_tmpdir("abi");
    char *config = h_write_config(dir, queue, handler, 1, NULL);
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    int status = h_wait_exit(sekalid, 10000, "sekalid with a broken handler");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 3,
                  "%s: expected exit 3, got status 0x%x", handler, status);
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_msg(h_count_lines(log, expected) == 1, "%s: the log should say \"%s\"", handler,
                  expected);
    free(config);
    free(dir);
}

START_TEST(test_handler_with_wrong_abi_is_refused_at_start)
{
    h_init();
    assert_refused("tests/plugins/old_abi.so", "incompatible ABI: abi_major is 0, sekalid needs 1");
    assert_refused("tests/plugins/no_symbol.so", "no symbol sekali_handler_v1");
    assert_refused("tests/plugins/null_handle.so", "mandatory callback handle is NULL");
    assert_refused("tests/plugins/missing.so", "cannot load");
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
    int failures = h_count_lines(log, "handler init() failed");
    ck_assert_msg(failures >= 1 && failures <= 2, "expected 1 or 2 init failures, got %d",
                  failures);
    ck_assert_int_ge(h_count_lines(log, "not restarting it"), 1);
    ck_assert_int_eq(h_count_lines(log, "crash-looping"), 0);
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
        NULL,
    };
    const TTest *refused_start[] = {
        test_handler_with_wrong_abi_is_refused_at_start,
        test_config_error_exits_2_with_position,
        test_handler_config_failure_stops_without_restart_loop,
        test_config_check_flag_reports_success,
        NULL,
    };
    Suite *s = suite_create("pipeline");
    h_tcase(s, "end_to_end", 600, end_to_end);
    h_tcase(s, "refused_start", 300, refused_start);
    return h_run_suite(s);
}
