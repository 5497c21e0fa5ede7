/* check_outcomes.c - what happens to jobs that do not simply succeed:
 * retries through delay queues, dead letters with their reasons, poison
 * messages, and a busy lock. Every dead letter is read back from
 * <queue>.dead with its headers; nothing may be lost or run twice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define EFFECT "tests/plugins/effect.so"
#define FAST_RETRIES "    retry:\n      max_attempts: 3\n      initial: 10ms\n      max: 50ms\n"

struct run {
    char              queue[128];
    char              dead[160];
    char             *dir;
    char             *config;
    PGconn           *pg;
    struct sk_broker *b;
    pid_t             sekalid;
};

/* heartbeat: the AMQP heartbeat to negotiate, or NULL for the harness's 30s. */
static void start_with(struct run *r, const char *name, int workers, const char *extra,
                       const char *heartbeat)
{
    h_init();
    h_unique_name(r->queue, sizeof(r->queue), name);
    snprintf(r->dead, sizeof(r->dead), "%s.dead", r->queue);
    r->dir = h_tmpdir(name);
    r->config = h_write_config(r->dir, r->queue, EFFECT, workers, extra);
    if (heartbeat != NULL) {
        char line[64];
        snprintf(line, sizeof(line), "heartbeat: %s", heartbeat);
        h_config_replace(r->config, "heartbeat: 30s", line);
    }
    r->pg = h_pg();
    r->b = h_broker();
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    r->sekalid = h_start_sekalid("sekalid", r->config, r->dir, NULL);
    H_WAIT(h_consumers(r->b, r->queue) == (uint32_t)workers, 20000,
           "%d workers should consume %s", workers, r->queue);
}

static void start(struct run *r, const char *name, int workers, const char *extra)
{
    start_with(r, name, workers, extra, NULL);
}

/* Stops sekalid cleanly and checks nothing was left in the work queue. The
 * connections stay open for the test's last checks, closed by done(). */
static void stop(struct run *r)
{
    h_stop_sekalid(r->sekalid, r->dir);
    ck_assert_int_eq(h_queue_depth(r->b, r->queue), 0);
}

static void done(struct run *r)
{
    sk_broker_close(r->b);
    PQfinish(r->pg);
    free(r->config);
    free(r->dir);
}

static long long effects(struct run *r, const char *key)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s' "
                             "AND idempotency_key = '%s'", r->queue, key);
}

static const char *key_status(struct run *r, const char *key, char *buf, size_t size)
{
    PGresult *res = PQexecParams(r->pg, "SELECT status FROM sekali.idempotency_keys "
                                        "WHERE queue = $1 AND key = $2", 2, NULL,
                                 (const char *[]){ r->queue, key }, NULL, NULL, 0);
    snprintf(buf, size, "%s", PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "absent");
    PQclear(res);
    return buf;
}

/* Takes the one dead letter and checks its reason and error headers. */
static void expect_dead(struct run *r, const char *reason, const char *error_part,
                        int64_t attempts)
{
    H_WAIT(h_queue_depth(r->b, r->dead) == 1, 20000, "expected 1 dead letter in %s, have %u",
           r->dead, h_queue_depth(r->b, r->dead));
    amqp_message_t msg;
    ck_assert(h_get(r->b, r->dead, &msg));
    char buf[600];
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", buf, sizeof(buf)), reason);
    ck_assert_msg(strstr(h_header_text(&msg, "x-sekali-error", buf, sizeof(buf)), error_part),
                  "x-sekali-error \"%s\" should contain \"%s\"", buf, error_part);
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-queue", buf, sizeof(buf)), r->queue);
    ck_assert_int_eq(strlen(h_header_text(&msg, "x-sekali-first-failure", buf, sizeof(buf))), 20);
    ck_assert_int_eq(strlen(h_header_text(&msg, "x-sekali-last-failure", buf, sizeof(buf))), 20);
    if (attempts > 0)
        ck_assert_int_eq(h_header_int(&msg, "x-sekali-attempts"), attempts);
    amqp_destroy_message(&msg);
}

START_TEST(test_retried_job_runs_again_and_commits_once)
{
    struct run r;
    start(&r, "retry", 2, FAST_RETRIES);
    h_publish(r.b, r.queue, "test", "retry-1", "k-retry", NULL, "retry");
    H_WAIT(effects(&r, "k-retry") == 1, 20000, "the retried job should commit");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                      "'%s'", r.queue), 2);
    stop(&r);
    ck_assert_int_eq(effects(&r, "k-retry"), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    done(&r);
}
END_TEST

START_TEST(test_exhausted_retries_dead_letter_with_headers)
{
    struct run r;
    start(&r, "exhaust", 1, FAST_RETRIES);
    h_publish(r.b, r.queue, "test", "exhaust-1", "k-exhaust", NULL, "retry_always");
    expect_dead(&r, "retries exhausted", "always asks to be retried", 3);
    char status[32];
    ck_assert_str_eq(key_status(&r, "k-exhaust", status, sizeof(status)), "failed");
    ck_assert_int_eq(effects(&r, "k-exhaust"), 0);
    stop(&r);
    done(&r);
}
END_TEST

START_TEST(test_failed_job_is_dead_lettered_and_recorded)
{
    struct run r;
    start(&r, "fail", 1, FAST_RETRIES);
    h_publish(r.b, r.queue, "test", "fail-1", "k-fail", NULL, "fail");
    expect_dead(&r, "failed", "the job asked to fail", 1);
    char status[32];
    ck_assert_str_eq(key_status(&r, "k-fail", status, sizeof(status)), "failed");
    /* A later copy of a failed key is a duplicate, not a second attempt. */
    h_publish(r.b, r.queue, "test", "fail-2", "k-fail", NULL, "ok");
    H_WAIT(h_pg_count(r.pg, "SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys "
                      "WHERE queue = '%s'",
                      r.queue) == 1, 20000, "the copy of a failed key should be a duplicate");
    ck_assert_int_eq(effects(&r, "k-fail"), 0);
    stop(&r);
    done(&r);
}
END_TEST

/* With a 1 s AMQP heartbeat, RabbitMQ drops a connection that sends nothing
 * for about 2 s. A handler running 4 s keeps its worker away from the
 * consuming connection all that time; the connection must survive it: no
 * reconnect, no redelivery, so no duplicate to absorb. */
START_TEST(test_handler_longer_than_the_amqp_heartbeat_keeps_its_connection)
{
    struct run r;
    start_with(&r, "longjob", 1, NULL, "1s");
    h_publish(r.b, r.queue, "test", "long-1", "k-long", NULL, "sleep:4000");
    H_WAIT(effects(&r, "k-long") == 1, 30000, "the long job should commit");
    h_publish(r.b, r.queue, "test", "after-1", "k-after", NULL, "ok");
    H_WAIT(effects(&r, "k-after") == 1, 20000, "the next job should run");
    stop(&r);
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", r.dir);
    ck_assert_int_eq(h_count_lines(log, "lost the broker connection"), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT coalesce(sum(duplicates), 0) FROM "
                                      "sekali.idempotency_keys WHERE queue = '%s'", r.queue), 0);
    ck_assert_int_eq(effects(&r, "k-long"), 1);
    done(&r);
}
END_TEST

/* The connection for dead letters and retries is opened at the first one
 * and then sits idle. After 4 heartbeat intervals of idleness the next dead
 * letter must still go through it, with its reason headers (the broker's
 * own dead-lettering, the fallback, carries none). */
START_TEST(test_dead_letter_after_an_idle_spell_keeps_its_reason)
{
    struct run r;
    start_with(&r, "idlepub", 1, FAST_RETRIES, "1s");
    h_publish(r.b, r.queue, "test", "fail-1", "k-fail-1", NULL, "fail");
    expect_dead(&r, "failed", "the job asked to fail", 1);
    /* The idleness is the fault under test, so this is a plain sleep. */
    sleep(4);
    h_publish(r.b, r.queue, "test", "fail-2", "k-fail-2", NULL, "fail");
    expect_dead(&r, "failed", "the job asked to fail", 1);
    stop(&r);
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", r.dir);
    ck_assert_int_eq(h_count_lines(log, "publishing connection failed"), 0);
    done(&r);
}
END_TEST

START_TEST(test_poison_messages_are_dead_lettered_with_their_reason)
{
    struct run r;
    start(&r, "poison", 1, "    max_body: 64\n    job_types: [test]\n");
    char big[100];
    memset(big, 'x', sizeof(big));
    struct sk_header int_key = { .key = "x-idempotency-key", .number = 7 };
    struct sk_header bad_utf8 = { .key = "x-resource-key", .text = "bad\xff" "key" };
    static const struct {
        const char *expected;
    } cases[] = {
        { "missing message_id" },
        { "body of 100 bytes exceeds max_body 64" },
        { "unknown job type \"refund\"" },
        { "header x-idempotency-key must be a string" },
        { "x-resource-key is not valid UTF-8" },
    };
    h_publish_raw(r.b, r.queue, NULL, "test", NULL, 0, "{}", 2);
    h_publish_raw(r.b, r.queue, "p-big", "test", NULL, 0, big, sizeof(big));
    h_publish_raw(r.b, r.queue, "p-type", "refund", NULL, 0, "{}", 2);
    h_publish_raw(r.b, r.queue, "p-int", "test", &int_key, 1, "{}", 2);
    h_publish_raw(r.b, r.queue, "p-utf8", "test", &bad_utf8, 1, "{}", 2);
    h_publish(r.b, r.queue, "test", "good-1", NULL, NULL, "ok");
    H_WAIT(effects(&r, "good-1") == 1, 20000, "the good job after the poison should complete");
    H_WAIT(h_queue_depth(r.b, r.dead) == 5, 20000, "expected 5 dead letters, have %u",
           h_queue_depth(r.b, r.dead));

    for (size_t i = 0; i < SK_ARRAY_LEN(cases); i++) {
        amqp_message_t msg;
        ck_assert(h_get(r.b, r.dead, &msg));
        char buf[600];
        ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", buf, sizeof(buf)), "malformed");
        ck_assert_str_eq(h_header_text(&msg, "x-sekali-error", buf, sizeof(buf)),
                         cases[i].expected);
        amqp_destroy_message(&msg);
    }
    stop(&r);
    done(&r);
}
END_TEST

START_TEST(test_busy_lock_reschedules_without_counting_an_attempt)
{
    struct run r;
    /* Two jobs for one resource, two workers: the second finds the lock
     * held for longer than busy_wait and must come back later. */
    start(&r, "busy", 2, FAST_RETRIES);
    h_publish(r.b, r.queue, "test", "busy-1", "k-busy-1", "account-7", "sleep:3000");
    char lock[256];
    snprintf(lock, sizeof(lock), "sekali:lock:%s:account-7", r.queue);
    H_WAIT(h_redis_exists(lock), 20000, "the first job should hold %s", lock);
    h_publish(r.b, r.queue, "test", "busy-2", "k-busy-2", "account-7", "ok");
    H_WAIT(effects(&r, "k-busy-1") == 1 && effects(&r, "k-busy-2") == 1, 30000,
           "both jobs on the busy resource should complete once");
    stop(&r);

    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", r.dir);
    ck_assert_msg(h_count_lines(log, "lock busy: re-scheduled") >= 1,
                  "the second job should have been re-scheduled for the busy lock");
    /* Not a failed attempt: it ran as attempt 1. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND idempotency_key = 'k-busy-2'", r.queue), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    done(&r);
}
END_TEST

START_TEST(test_reply_is_sent_once_per_key_with_the_saved_result)
{
    struct run r;
    start(&r, "reply", 2, NULL);
    char replies[160];
    snprintf(replies, sizeof(replies), "%s.replies", r.queue);
    ck_assert_int_eq(sk_broker_declare(r.b, replies, NULL, NULL), SK_OK);
    for (int copy = 0; copy < 3; copy++) {
        char id[32];
        snprintf(id, sizeof(id), "ask-%d", copy);
        struct sk_message msg = {
            .message_id = id, .type = "test", .idempotency_key = "k-reply",
            .reply_to = replies, .correlation_id = "corr-1", .body = "ok", .body_len = 2,
        };
        struct sk_err err = { 0 };
        ck_assert_msg(sk_broker_publish(r.b, r.queue, &msg, &err) == SK_OK, "%s", err.msg);
    }
    H_WAIT(h_pg_count(r.pg, "SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys "
                      "WHERE queue = '%s'",
                      r.queue) == 2, 20000, "two of the three copies should be duplicates");
    stop(&r);

    ck_assert_int_eq(effects(&r, "k-reply"), 1);
    ck_assert_int_eq(h_queue_depth(r.b, replies), 1);
    amqp_message_t msg;
    ck_assert(h_get(r.b, replies, &msg));
    ck_assert_uint_eq(msg.properties._flags & AMQP_BASIC_CORRELATION_ID_FLAG,
                      AMQP_BASIC_CORRELATION_ID_FLAG);
    ck_assert_int_eq((int)msg.properties.correlation_id.len, 6);
    ck_assert_int_eq(memcmp(msg.properties.correlation_id.bytes, "corr-1", 6), 0);
    char body[64];
    snprintf(body, sizeof(body), "%.*s", (int)msg.body.len, (const char *)msg.body.bytes);
    ck_assert_msg(strncmp(body, "done by ", 8) == 0, "the reply should carry the result, got %s",
                  body);
    amqp_destroy_message(&msg);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND replied_at IS NOT NULL", r.queue), 1);
    done(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("outcomes");
    TCase *tc = tcase_create("outcomes");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_retried_job_runs_again_and_commits_once);
    tcase_add_test(tc, test_exhausted_retries_dead_letter_with_headers);
    tcase_add_test(tc, test_failed_job_is_dead_lettered_and_recorded);
    tcase_add_test(tc, test_handler_longer_than_the_amqp_heartbeat_keeps_its_connection);
    tcase_add_test(tc, test_dead_letter_after_an_idle_spell_keeps_its_reason);
    tcase_add_test(tc, test_poison_messages_are_dead_lettered_with_their_reason);
    tcase_add_test(tc, test_busy_lock_reschedules_without_counting_an_attempt);
    tcase_add_test(tc, test_reply_is_sent_once_per_key_with_the_saved_result);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
