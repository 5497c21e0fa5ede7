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

#define EFFECT "tests/plugins/effect.so"

static long long effects(PGconn *pg, const char *queue)
{
    return h_pg_count(pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'", queue);
}

static long long completed(PGconn *pg, const char *queue)
{
    return h_pg_count(pg, "SELECT count(*) FROM sekali.idempotency_keys "
                          "WHERE queue = '%s' AND status = 'completed'", queue);
}

static long long duplicates(PGconn *pg, const char *queue)
{
    return h_pg_count(pg, "SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys "
                          "WHERE queue = '%s'", queue);
}

static void wait_consumers(struct sk_broker *b, const char *queue, uint32_t n)
{
    H_WAIT(h_consumers(b, queue) == n, 20000, "expected %u consumers on %s, have %u", n, queue,
           h_consumers(b, queue));
}

START_TEST(test_thousand_unique_jobs_have_one_effect_each)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "unique");
    char *dir = h_tmpdir("unique");
    char *config = h_write_config(dir, queue, EFFECT, 4, NULL);
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);

    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    wait_consumers(b, queue, 4);
    for (int i = 0; i < 1000; i++) {
        char id[64];
        snprintf(id, sizeof(id), "job-%d", i);
        h_publish(b, queue, "test", id, NULL, NULL, "ok");
    }
    H_WAIT(completed(pg, queue) == 1000, 60000, "expected 1000 completed keys, have %lld",
           completed(pg, queue));
    h_stop_sekalid(sekalid, dir);

    /* After a clean stop anything unacked would be back in the queue. */
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    ck_assert_int_eq(effects(pg, queue), 1000);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM (SELECT idempotency_key FROM "
                                    "sekali_test.effects WHERE queue = '%s' GROUP BY 1 "
                                    "HAVING count(*) > 1) AS doubled", queue), 0);
    ck_assert_int_eq(duplicates(pg, queue), 0);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
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
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "dups");
    char *dir = h_tmpdir("dups");
    char *config = h_write_config(dir, queue, EFFECT, 4, NULL);
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);

    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    wait_consumers(b, queue, 4);
    pthread_t threads[4];
    struct producer producers[4];
    for (int i = 0; i < 4; i++) {
        producers[i] = (struct producer){ .queue = queue, .index = i };
        ck_assert_int_eq(pthread_create(&threads[i], NULL, produce, &producers[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);

    H_WAIT(completed(pg, queue) == 200 && duplicates(pg, queue) == 800, 60000,
           "expected 200 completed keys and 800 duplicates, have %lld and %lld",
           completed(pg, queue), duplicates(pg, queue));
    h_stop_sekalid(sekalid, dir);

    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    ck_assert_int_eq(effects(pg, queue), 200);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(DISTINCT idempotency_key) FROM "
                                    "sekali_test.effects WHERE queue = '%s'", queue), 200);
    ck_assert_int_eq(duplicates(pg, queue), 800);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_malformed_message_is_dead_lettered_not_dropped)
{
    h_init();
    char queue[128], dead[160];
    h_unique_name(queue, sizeof(queue), "poison");
    snprintf(dead, sizeof(dead), "%s.dead", queue);
    char *dir = h_tmpdir("poison");
    char *config = h_write_config(dir, queue, EFFECT, 1, NULL);
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);

    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    wait_consumers(b, queue, 1);
    h_publish(b, queue, "test", NULL, NULL, NULL, "no message id");
    h_publish(b, queue, "test", "good-1", NULL, NULL, "ok");
    H_WAIT(h_queue_depth(b, dead) == 1, 20000, "expected 1 dead letter in %s, have %u", dead,
           h_queue_depth(b, dead));
    H_WAIT(completed(pg, queue) == 1, 20000, "the good job after the bad one should complete");
    h_stop_sekalid(sekalid, dir);

    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_int_eq(h_count_lines(log, "malformed message: missing message_id"), 1);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
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
    char *config = h_write_config(dir, queue, EFFECT, 2, "    config:\n      fail_init: yes\n");
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
    char *config = h_write_config(dir, queue, EFFECT, 1, NULL);
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
    Suite *s = suite_create("pipeline");
    TCase *tc = tcase_create("end_to_end");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_thousand_unique_jobs_have_one_effect_each);
    tcase_add_test(tc, test_concurrent_duplicates_run_once_and_are_counted);
    tcase_add_test(tc, test_malformed_message_is_dead_lettered_not_dropped);
    suite_add_tcase(s, tc);

    TCase *refused = tcase_create("refused_start");
    tcase_set_timeout(refused, 300);
    tcase_add_test(refused, test_handler_with_wrong_abi_is_refused_at_start);
    tcase_add_test(refused, test_config_error_exits_2_with_position);
    tcase_add_test(refused, test_handler_config_failure_stops_without_restart_loop);
    tcase_add_test(refused, test_config_check_flag_reports_success);
    suite_add_tcase(s, refused);

    return h_run_suite(s);
}
