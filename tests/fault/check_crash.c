/* check_crash.c - workers killed at the two moments that matter most:
 * in the middle of the handler, and after COMMIT but before the ack.
 * Each test first proves the worker really died there, then that the job's
 * effect exists exactly once and nothing is left in the queue. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "harness.h"

#define EFFECT "tests/plugins/effect.so"

static long long effects_for(PGconn *pg, const char *queue, const char *key)
{
    return h_pg_count(pg, "SELECT count(*) FROM sekali_test.effects "
                          "WHERE queue = '%s' AND idempotency_key = '%s'", queue, key);
}

static long long key_count(PGconn *pg, const char *queue, const char *key, const char *column)
{
    return h_pg_count(pg, "SELECT coalesce(sum(%s), 0) FROM sekali.idempotency_keys "
                          "WHERE queue = '%s' AND key = '%s' AND status = 'completed'",
                      column, queue, key);
}

START_TEST(test_worker_killed_mid_handler_job_runs_again_once)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "midkill");
    char *dir = h_tmpdir("midkill");
    char extra[1200];
    /* A short lease: the dead worker's lock must expire before the job can
     * run again, and the test should not wait the default 30 s for it. */
    snprintf(extra, sizeof(extra), "    lock_ttl: 2s\n    config:\n      marker_dir: %s\n",
             dir);
    char *config = h_write_config(dir, queue, EFFECT, 2, extra);
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);

    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    H_WAIT(h_consumers(b, queue) == 2, 20000, "two workers should consume %s", queue);
    h_publish(b, queue, "test", "stall-1", "order-stall", NULL, "stall");

    H_WAIT(h_stalled_pid(dir) != 0, 20000, "the handler never reached its stall point");
    pid_t victim = h_stalled_pid(dir);
    ck_assert_int_eq(effects_for(pg, queue, "order-stall"), 0);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead after SIGKILL", (long)victim);

    H_WAIT(effects_for(pg, queue, "order-stall") == 1, 30000,
           "the killed job should run again and commit once");
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = "
                                    "'%s' AND pid = %ld", queue, (long)victim), 0);
    h_stop_sekalid(sekalid, dir);

    ck_assert_int_eq(effects_for(pg, queue, "order-stall"), 1);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_int_ge(h_count_lines(log, "killed by signal 9"), 1);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_worker_killed_after_commit_before_ack_is_a_counted_duplicate)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "postcommit");
    char *dir = h_tmpdir("postcommit");
    char *config = h_write_config(dir, queue, EFFECT, 2, "    lock_ttl: 2s\n");
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);

    char mark[1024], armed[128], mark_env[1100];
    snprintf(mark, sizeof(mark), "%s/failpoint.mark", dir);
    snprintf(armed, sizeof(armed), "SEKALI_FAILPOINT=after_commit:order-42");
    snprintf(mark_env, sizeof(mark_env), "SEKALI_FAILPOINT_MARK=%s", mark);
    const char *env[] = { armed, mark_env, NULL };
    pid_t sekalid = h_start_sekalid("fault/sekalid", config, dir, env);
    H_WAIT(h_consumers(b, queue) == 2, 20000, "two workers should consume %s", queue);

    h_publish(b, queue, "test", "msg-42", "order-42", NULL, "ok");
    h_publish(b, queue, "test", "msg-43", "order-43", NULL, "ok");

    H_WAIT(access(mark, F_OK) == 0, 20000, "the after_commit failpoint never fired");
    char *text = h_read_file(mark);
    pid_t victim = (pid_t)atol(text);
    free(text);
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should have killed itself", (long)victim);

    /* The effect was committed before the death; the redelivery must find
     * the completed key and be acked as a duplicate. */
    H_WAIT(key_count(pg, queue, "order-42", "duplicates") == 1, 30000,
           "the redelivery of order-42 should be counted as one duplicate");
    ck_assert_int_eq(effects_for(pg, queue, "order-42"), 1);
    H_WAIT(effects_for(pg, queue, "order-43") == 1, 20000, "order-43 should run once");
    h_stop_sekalid(sekalid, dir);

    ck_assert_int_eq(effects_for(pg, queue, "order-42"), 1);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_job_over_its_timeout_is_killed_and_runs_again_once)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "timeout");
    char *dir = h_tmpdir("timeout");
    char extra[1200];
    snprintf(extra, sizeof(extra), "    job_timeout: 1s\n    lock_ttl: 2s\n    config:\n"
             "      marker_dir: %s\n", dir);
    char *config = h_write_config(dir, queue, EFFECT, 1, extra);
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);

    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    H_WAIT(h_consumers(b, queue) == 1, 20000, "a worker should consume %s", queue);
    h_publish(b, queue, "test", "slow-1", "order-slow", NULL, "stall");
    H_WAIT(h_stalled_pid(dir) != 0, 20000, "the handler never reached its stall point");
    pid_t victim = h_stalled_pid(dir);

    /* Nobody but the supervisor kills it: the stall lasts two minutes. */
    H_WAIT(h_process_gone(victim), 10000, "the supervisor should kill the overdue worker %ld",
           (long)victim);
    H_WAIT(effects_for(pg, queue, "order-slow") == 1, 30000,
           "the job should run again after the kill and commit once");
    h_stop_sekalid(sekalid, dir);

    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_int_eq(h_count_lines(log, "over its job_timeout of 1000 ms: killing it"), 1);
    ck_assert_int_eq(effects_for(pg, queue, "order-slow"), 1);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_quorum_delivery_limit_dead_letters_a_job_that_kills_its_worker)
{
    h_init();
    char queue[128], dead[160];
    h_unique_name(queue, sizeof(queue), "quorum");
    snprintf(dead, sizeof(dead), "%s.dead", queue);
    char *dir = h_tmpdir("quorum");
    /* No lock: the dead worker's lease would send the redelivery through a
     * delay queue first, and that hop would become the first death reason. */
    char *config = h_write_config(dir, queue, EFFECT, 1,
                                  "    queue_type: quorum\n    delivery_limit: 2\n"
                                  "    lock: false\n");
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    struct sk_queue_shape shape = { .quorum = true, .delivery_limit = 2 };
    ck_assert_int_eq(sk_broker_declare(b, queue, &shape, NULL), SK_OK);

    char mark[1024], mark_env[1100];
    snprintf(mark, sizeof(mark), "%s/failpoint.mark", dir);
    snprintf(mark_env, sizeof(mark_env), "SEKALI_FAILPOINT_MARK=%s", mark);
    const char *env[] = { "SEKALI_FAILPOINT=after_claim:order-poison", mark_env, NULL };
    pid_t sekalid = h_start_sekalid("fault/sekalid", config, dir, env);
    H_WAIT(h_consumers(b, queue) == 1, 20000, "a worker should consume %s", queue);

    h_publish(b, queue, "test", "poison-1", "order-poison", NULL, "ok");
    H_WAIT(h_queue_depth(b, dead) == 1, 60000,
           "past its delivery limit the job should be in %s, which has %u", dead,
           h_queue_depth(b, dead));
    ck_assert_int_ge(h_count_lines(mark, "after_claim"), 2);

    h_publish(b, queue, "test", "fine-1", "order-fine", NULL, "ok");
    H_WAIT(effects_for(pg, queue, "order-fine") == 1, 30000, "a healthy job should still run");
    ck_assert_int_eq(h_pg_count(pg, "SELECT attempt FROM sekali_test.effects WHERE queue = '%s' "
                                    "AND idempotency_key = 'order-fine'", queue), 1);
    h_stop_sekalid(sekalid, dir);

    ck_assert_int_eq(effects_for(pg, queue, "order-poison"), 0);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    amqp_message_t msg;
    ck_assert(h_get(b, dead, &msg));
    char reason[64];
    ck_assert_str_eq(h_header_text(&msg, "x-first-death-reason", reason, sizeof(reason)),
                     "delivery_limit");
    amqp_destroy_message(&msg);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

/* Two copies of one key on two workers, with a lease far shorter than the
 * job and renewal switched off: the first worker's lock really expires
 * while its handler runs, the second takes the lock (Redis shows a second
 * owner token), and PostgreSQL alone still makes the effect happen once. */
START_TEST(test_expired_lock_lets_a_second_worker_in_but_the_effect_happens_once)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "expiry");
    char *dir = h_tmpdir("expiry");
    char *config = h_write_config(dir, queue, EFFECT, 2, "    lock_ttl: 300ms\n");
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");

    const char *env[] = { "SEKALI_FAULTS=no_renew", NULL };
    pid_t sekalid = h_start_sekalid("fault/sekalid", config, dir, env);
    H_WAIT(h_consumers(b, queue) == 2, 20000, "two workers should consume %s", queue);
    h_publish(b, queue, "test", "expiry-1", "order-expiry", NULL, "sleep:3000");
    h_publish(b, queue, "test", "expiry-2", "order-expiry", NULL, "sleep:3000");

    char lock_key[256], first[64] = "", second[64] = "";
    snprintf(lock_key, sizeof(lock_key), "sekali:lock:%s:order-expiry", queue);
    int64_t deadline = h_now_ms() + h_ms(20000);
    while (second[0] == '\0' && h_now_ms() < deadline) {
        redisReply *reply = redisCommand(redis, "GET %s", lock_key);
        if (reply != NULL && reply->type == REDIS_REPLY_STRING) {
            if (first[0] == '\0')
                snprintf(first, sizeof(first), "%s", reply->str);
            else if (strcmp(first, reply->str) != 0)
                snprintf(second, sizeof(second), "%s", reply->str);
        }
        freeReplyObject(reply);
        h_nap();
    }
    ck_assert_msg(first[0] != '\0' && second[0] != '\0',
                  "Redis should show two owners of %s in turn (saw \"%s\" and \"%s\")",
                  lock_key, first, second);
    /* The second owner took over while the first handler still ran. */
    ck_assert_int_eq(effects_for(pg, queue, "order-expiry"), 0);

    H_WAIT(key_count(pg, queue, "order-expiry", "duplicates") == 1, 30000,
           "the second copy should end as a counted duplicate");
    h_stop_sekalid(sekalid, dir);
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_int_ge(h_count_lines(log, "lock had expired before release"), 1);
    ck_assert_int_eq(effects_for(pg, queue, "order-expiry"), 1);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    redisFree(redis);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

/* The first worker dies after COMMIT, before it could reply: the redelivery
 * is a duplicate, and it sends the saved result, once. */
START_TEST(test_reply_lost_in_a_crash_is_sent_by_the_duplicate)
{
    h_init();
    char queue[128], replies[160];
    h_unique_name(queue, sizeof(queue), "replycrash");
    snprintf(replies, sizeof(replies), "%s.replies", queue);
    char *dir = h_tmpdir("replycrash");
    char *config = h_write_config(dir, queue, EFFECT, 1, "    lock: false\n");
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);
    ck_assert_int_eq(sk_broker_declare(b, replies, NULL, NULL), SK_OK);

    char mark[1024], mark_env[1100];
    snprintf(mark, sizeof(mark), "%s/failpoint.mark", dir);
    snprintf(mark_env, sizeof(mark_env), "SEKALI_FAILPOINT_MARK=%s", mark);
    const char *env[] = { "SEKALI_FAILPOINT=after_commit:order-reply", mark_env, NULL };
    pid_t sekalid = h_start_sekalid("fault/sekalid", config, dir, env);
    H_WAIT(h_consumers(b, queue) == 1, 20000, "a worker should consume %s", queue);
    struct sk_message msg = { .message_id = "ask-1", .type = "test",
                              .idempotency_key = "order-reply", .reply_to = replies,
                              .correlation_id = "corr-9", .body = "ok", .body_len = 2 };
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_publish(b, queue, &msg, &err) == SK_OK, "%s", err.msg);

    H_WAIT(access(mark, F_OK) == 0, 20000, "the after_commit failpoint never fired");
    H_WAIT(key_count(pg, queue, "order-reply", "duplicates") == 1, 30000,
           "the redelivery should be a duplicate");
    H_WAIT(h_queue_depth(b, replies) == 1, 20000, "the duplicate should send the saved result");
    h_stop_sekalid(sekalid, dir);
    ck_assert_int_eq(effects_for(pg, queue, "order-reply"), 1);
    ck_assert_int_eq(h_queue_depth(b, replies), 1);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_production_binary_has_no_failpoints)
{
    h_init();
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "grep -q SEKALI_FAILPOINT %s/sekalid", h_build_dir());
    ck_assert_msg(system(cmd) != 0, "build/sekalid must not contain failpoints");
    snprintf(cmd, sizeof(cmd), "grep -q SEKALI_FAILPOINT %s/fault/sekalid", h_build_dir());
    ck_assert_msg(system(cmd) == 0, "the fault build should contain the failpoints");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("crash");
    TCase *tc = tcase_create("kill");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_worker_killed_mid_handler_job_runs_again_once);
    tcase_add_test(tc, test_worker_killed_after_commit_before_ack_is_a_counted_duplicate);
    tcase_add_test(tc, test_job_over_its_timeout_is_killed_and_runs_again_once);
    tcase_add_test(tc, test_quorum_delivery_limit_dead_letters_a_job_that_kills_its_worker);
    tcase_add_test(tc, test_expired_lock_lets_a_second_worker_in_but_the_effect_happens_once);
    tcase_add_test(tc, test_reply_lost_in_a_crash_is_sent_by_the_duplicate);
    tcase_add_test(tc, test_production_binary_has_no_failpoints);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
