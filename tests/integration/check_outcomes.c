/* check_outcomes.c - what happens to jobs that do not simply succeed:
 * retries through delay queues, dead letters with their reasons, poison
 * messages, and a busy lock. Every dead letter is read back from
 * <queue>.dead with its headers; nothing may be lost or run twice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "harness.h"

/* Takes the one dead letter and checks its reason and error headers. */
static void expect_dead(struct h_run *r, const char *reason, const char *error_part,
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
    struct h_run r;
    h_run_open(&r, "retry");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = H_FAST_RETRIES });
    h_publish(r.b, r.queue, "test", "retry-1", "k-retry", NULL, "retry");
    H_WAIT(h_effects(&r, "k-retry") == 1, 20000, "the retried job should commit");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                      "'%s'", r.queue), 2);
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-retry"), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

static long long key_xmin(struct h_run *r, const char *key)
{
    return h_pg_count(r->pg, "SELECT xmin::text::bigint FROM sekali.idempotency_keys "
                             "WHERE queue = '%s' AND key = '%s'", r->queue, key);
}

/* batch: 4, and the deliveries waiting before the worker starts, so that
 * the first batch is [ok, fail, retry, ok] and the second [same, same, ok,
 * ok]. The first batch's fast way stops at the FAIL, which is settled; the
 * rest go the careful way, where the RETRY rolls back only its own
 * savepoint: both ok jobs around the failures commit, in one transaction;
 * the failed one is dead-lettered and recorded once, the retried one
 * commits once later. The same key twice in a batch runs once, and the second copy is
 * a counted duplicate (lock: false, or the lock would re-schedule it). */
START_TEST(test_failure_in_the_middle_of_a_batch_leaves_the_others_committed)
{
    struct h_run r;
    h_run_open(&r, "midbatch");
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    h_publish(r.b, r.queue, "test", "m-1", "k-ok-1", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-2", "k-fail", NULL, "fail");
    h_publish(r.b, r.queue, "test", "m-3", "k-retry", NULL, "retry");
    h_publish(r.b, r.queue, "test", "m-4", "k-ok-2", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-5", "k-same", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-6", "k-same", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-7", "k-ok-3", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-8", "k-ok-4", NULL, "ok");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = H_FAST_RETRIES
                                          "    batch: 4\n    batch_wait: 500ms\n"
                                          "    lock: false\n" });
    expect_dead(&r, "failed", "the job asked to fail", 1);
    H_WAIT(h_effects(&r, "k-retry") == 1, 20000, "the retried job should commit once");
    H_WAIT(h_effect_keys(&r) == 6, 20000, "6 keys should have their effect, have %lld",
           h_effect_keys(&r));
    H_WAIT(h_duplicates(&r) == 1, 20000, "the second k-same should be a duplicate");
    h_run_stop(&r);
    h_expect_once(&r, 6, 1);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-fail", status, sizeof(status)), "failed");
    ck_assert_int_eq(h_effects(&r, "k-fail"), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND idempotency_key = 'k-retry'", r.queue), 2);
    /* The two ok jobs around the failures committed together. */
    ck_assert_int_eq(key_xmin(&r, "k-ok-1"), key_xmin(&r, "k-ok-2"));
    ck_assert_int_ne(key_xmin(&r, "k-ok-1"), key_xmin(&r, "k-ok-3"));
    ck_assert_int_eq(key_xmin(&r, "k-ok-3"), key_xmin(&r, "k-ok-4"));
    h_run_close(&r);
}
END_TEST

/* Four jobs on one resource (account-1) and a copy of the first, all in
 * one batch with locks on: the first job takes the resource's lock and the
 * others run under it, after it, in the same transaction, instead of
 * finding it busy and going through a delay queue one batch at a time. The
 * copy is a counted duplicate; the lock is released once the batch is
 * done. */
START_TEST(test_jobs_on_one_resource_share_their_batchs_lock)
{
    struct h_run r;
    h_run_open(&r, "oneresource");
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    for (int i = 1; i <= 4; i++) {
        char id[16], key[16];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r.b, r.queue, "test", id, key, "account-1", "ok");
    }
    h_publish(r.b, r.queue, "test", "m-copy", "k-1", "account-1", "ok");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = H_FAST_RETRIES
                                          "    batch: 5\n    prefetch: 5\n"
                                          "    batch_wait: 500ms\n" });
    H_WAIT(h_effect_keys(&r) == 4 && h_duplicates(&r) == 1, 20000,
           "4 jobs and a duplicate, have %lld keys and %lld duplicates", h_effect_keys(&r),
           h_duplicates(&r));
    char lock[256];
    snprintf(lock, sizeof(lock), "sekali:lock:%s:account-1", r.queue);
    H_WAIT(!h_redis_exists(lock), 20000, "the resource's lock %s should be released", lock);
    h_run_stop(&r);
    h_expect_once(&r, 4, 1);
    ck_assert_int_eq(h_count_outcomes(r.log, "rescheduled", "lock_busy"), 0);
    /* One transaction: one now() (the copy's duplicate count has since
     * rewritten k-1's row, so its xmin cannot tell). */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT completed_at) FROM "
                                      "sekali.idempotency_keys WHERE queue = '%s'", r.queue), 1);
    h_run_close(&r);
}
END_TEST

/* One batch of 8 on one worker, waiting before it starts, with one slow
 * handler (200 ms against batch_close_after 50 ms) at position slow (keys
 * k-1 .. k-8; k-2 fails when fail is set): the batch commits once the slow
 * handler has run, the jobs after it go into a transaction of their own,
 * and every effect happens once. Returns the run, stopped, for the caller's
 * transaction checks. */
static void run_slow_batch(struct h_run *r, const char *name, int slow, bool fail)
{
    h_run_open(r, name);
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    for (int i = 1; i <= 8; i++) {
        char id[16], key[16];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r->b, r->queue, "test", id, key, NULL,
                  i == slow ? "sleep:200" : fail && i == 2 ? "fail" : "ok");
    }
    char top[128];
    int port = h_metrics_top(top, sizeof(top));
    h_run_start(r, &(struct h_run_opts){ .workers = 1, .top_yaml = top,
                                         .queue_yaml = H_FAST_RETRIES
                                         "    batch: 8\n    prefetch: 8\n"
                                         "    batch_wait: 500ms\n    batch_close_after: 50ms\n"
                                         "    lock: false\n" });
    if (fail)
        expect_dead(r, "failed", "the job asked to fail", 1);
    H_WAIT(h_effect_keys(r) == (fail ? 7 : 8), 20000, "the batch's jobs should commit, have %lld",
           h_effect_keys(r));
    /* The jobs after the slow one were given back unrun, once each. */
    H_WAIT(h_metric(port, "sekali_batch_deferred_total{queue=\"%s\",job_type=\"test\"}",
                    r->queue) == 8 - slow, 10000, "%d jobs should be counted deferred", 8 - slow);
    h_run_stop(r);
    h_expect_once(r, fail ? 7 : 8, 0);
    /* Every key given back was claimed again from the start: a fresh row. */
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                       "queue = '%s' AND status = 'completed' AND "
                                       "(fence <> 1 OR attempts <> 1)", r->queue), 0);
}

/* The fast way: k-1 and the slow k-2 commit together, k-3 .. k-8 after. */
START_TEST(test_slow_handler_closes_its_batch_early)
{
    struct h_run r;
    run_slow_batch(&r, "closeearly", 2, false);
    ck_assert_int_eq(key_xmin(&r, "k-1"), key_xmin(&r, "k-2"));
    ck_assert_int_ne(key_xmin(&r, "k-2"), key_xmin(&r, "k-3"));
    for (int i = 4; i <= 8; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k-%d", i);
        ck_assert_int_eq(key_xmin(&r, "k-3"), key_xmin(&r, key));
    }
    h_run_close(&r);
}
END_TEST

/* The careful way, after k-2 failed: k-1 and the slow k-3 commit in
 * their savepoints, k-4 .. k-8 in the next transaction. */
START_TEST(test_slow_handler_closes_a_careful_batch_early)
{
    struct h_run r;
    run_slow_batch(&r, "closecareful", 3, true);
    ck_assert_int_eq(key_xmin(&r, "k-1"), key_xmin(&r, "k-3"));
    ck_assert_int_ne(key_xmin(&r, "k-3"), key_xmin(&r, "k-4"));
    for (int i = 5; i <= 8; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k-%d", i);
        ck_assert_int_eq(key_xmin(&r, "k-4"), key_xmin(&r, key));
    }
    h_run_close(&r);
}
END_TEST

/* Records the row updates of sekali.idempotency_keys for one queue, with
 * the status each updated row had before. */
static void count_key_updates(PGconn *pg, const char *queue)
{
    char sql[512];
    h_pg_exec(pg, "CREATE TABLE IF NOT EXISTS sekali_test.key_updates "
                  "(queue text, key text, old_status text)");
    h_pg_exec(pg, "CREATE OR REPLACE FUNCTION sekali_test.count_key_update() RETURNS trigger "
                  "LANGUAGE plpgsql AS $$ BEGIN INSERT INTO sekali_test.key_updates "
                  "VALUES (NEW.queue, NEW.key, OLD.status); RETURN NULL; END $$");
    snprintf(sql, sizeof(sql), "CREATE TRIGGER \"updates %s\" AFTER UPDATE ON "
             "sekali.idempotency_keys FOR EACH ROW WHEN (NEW.queue = '%s') "
             "EXECUTE FUNCTION sekali_test.count_key_update()", queue, queue);
    h_pg_exec(pg, sql);
}

static void stop_counting_key_updates(PGconn *pg, const char *queue)
{
    char sql[512];
    snprintf(sql, sizeof(sql), "DROP TRIGGER IF EXISTS \"updates %s\" ON sekali.idempotency_keys",
             queue);
    h_pg_exec(pg, sql);
}

/* A batch whose handlers all succeed goes the fast way: its keys are
 * written completed, in the batch's one transaction, and never pass
 * through 'processing' (the careful way claims 'processing', then
 * completes: an update from 'processing' per key). A key left 'processing'
 * by an earlier owner is taken over under the next fence, the one update
 * from 'processing' this test may see; a finished key's copy is a counted
 * duplicate. (The test handler saves a result: one more update per key,
 * from 'completed'.) */
START_TEST(test_a_batch_without_failures_claims_its_keys_completed)
{
    struct h_run r;
    h_run_open(&r, "fastbatch");
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    char sql[512];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, "
             "owner, attempts) VALUES ('%s', 'k-stale', 'processing', 3, 'gone:1', 1)", r.queue);
    h_pg_exec(r.pg, sql);
    count_key_updates(r.pg, r.queue);
    char key[32], id[32];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "k-fast-%d", i);
        snprintf(id, sizeof(id), "fast-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    h_publish(r.b, r.queue, "test", "stale", "k-stale", NULL, "ok");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    batch: 6\n"
                                          "    batch_wait: 500ms\n    lock: false\n    prefetch: 12\n" });
    H_WAIT(h_completed(&r) == 6, 20000, "6 keys should complete, have %lld", h_completed(&r));
    long long claims = h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.key_updates "
                                        "WHERE queue = '%s' AND old_status = 'processing'",
                                  r.queue);
    h_publish(r.b, r.queue, "test", "fast-0-again", "k-fast-0", NULL, "ok");
    H_WAIT(h_duplicates(&r) == 1, 20000, "the copy of k-fast-0 should be a duplicate");
    h_run_stop(&r);
    long long stale = h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.key_updates "
                                       "WHERE queue = '%s' AND old_status = 'processing' "
                                       "AND key = 'k-stale'", r.queue);
    stop_counting_key_updates(r.pg, r.queue);
    h_expect_once(&r, 6, 1);
    ck_assert_msg(claims == 1 && stale == 1, "only k-stale should have been updated from "
                  "'processing'; %lld rows were", claims);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT xmin::text) FROM "
                                      "sekali.idempotency_keys WHERE queue = '%s' AND key <> 'k-fast-0'",
                                      r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT fence * 10 + attempts FROM sekali.idempotency_keys "
                                      "WHERE queue = '%s' AND key = 'k-stale'", r.queue), 42);
    h_run_close(&r);
}
END_TEST

static bool lock_exists(redisContext *redis, const char *key)
{
    redisReply *reply = redisCommand(redis, "EXISTS %s", key);
    bool exists = reply != NULL && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
    freeReplyObject(reply);
    return exists;
}

/* A batch of three jobs whose handlers run 1 s each, with a 600 ms lock:
 * the heartbeat renews every lock of the batch, not just one, so the last
 * job's lock is still held 2 s in, and none has expired by its release. */
START_TEST(test_heartbeat_renews_every_lock_of_a_batch)
{
    struct h_run r;
    h_run_open(&r, "batchlocks");
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    char key[32], id[32];
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof(key), "k-slow-%d", i);
        snprintf(id, sizeof(id), "slow-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "sleep:1000");
    }
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    batch: 3\n"
                                          "    batch_wait: 500ms\n    lock_ttl: 600ms\n" });
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    char lock_key[256];
    snprintf(lock_key, sizeof(lock_key), "sekali:lock:%s:k-slow-2", r.queue);
    /* Taken at the start of the batch, it must still be there when the
     * third handler is running, some 2 s later: 3 lock_ttls. */
    H_WAIT(lock_exists(redis, lock_key), 20000, "the batch should take %s", lock_key);
    int64_t until = h_now_ms() + 2100;
    bool held = true;
    while (held && h_now_ms() < until && h_effects(&r, "k-slow-2") == 0) {
        held = lock_exists(redis, lock_key);
        h_nap();
    }
    ck_assert_msg(held, "the third job's lock %s expired while the batch ran", lock_key);
    H_WAIT(h_effect_keys(&r) == 3, 20000, "the batch should complete");
    h_run_stop(&r);
    h_expect_once(&r, 3, 0);
    ck_assert_int_eq(h_count_lines(r.log, "lock had expired before release"), 0);
    redisFree(redis);
    h_run_close(&r);
}
END_TEST

START_TEST(test_exhausted_retries_dead_letter_with_headers)
{
    struct h_run r;
    h_run_open(&r, "exhaust");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = H_FAST_RETRIES });
    h_publish(r.b, r.queue, "test", "exhaust-1", "k-exhaust", NULL, "retry_always");
    expect_dead(&r, "retries_exhausted", "always asks to be retried", 3);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-exhaust", status, sizeof(status)), "failed");
    ck_assert_int_eq(h_effects(&r, "k-exhaust"), 0);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_failed_job_is_dead_lettered_and_recorded)
{
    struct h_run r;
    h_run_open(&r, "fail");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = H_FAST_RETRIES });
    h_publish(r.b, r.queue, "test", "fail-1", "k-fail", NULL, "fail");
    expect_dead(&r, "failed", "the job asked to fail", 1);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-fail", status, sizeof(status)), "failed");
    /* A later copy of a failed key is a duplicate, not a second attempt. */
    h_publish(r.b, r.queue, "test", "fail-2", "k-fail", NULL, "ok");
    H_WAIT(h_duplicates(&r) == 1, 20000, "the copy of a failed key should be a duplicate");
    ck_assert_int_eq(h_effects(&r, "k-fail"), 0);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* With a 1 s AMQP heartbeat, RabbitMQ drops a connection that sends nothing
 * for about 2 s. A handler running 4 s keeps its worker away from the
 * consuming connection all that time; the connection must survive it: no
 * reconnect, no redelivery, so no duplicate to absorb. */
START_TEST(test_handler_longer_than_the_amqp_heartbeat_keeps_its_connection)
{
    struct h_run r;
    h_run_open(&r, "longjob");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .heartbeat = "1s" });
    h_publish(r.b, r.queue, "test", "long-1", "k-long", NULL, "sleep:4000");
    H_WAIT(h_effects(&r, "k-long") == 1, 30000, "the long job should commit");
    h_publish(r.b, r.queue, "test", "after-1", "k-after", NULL, "ok");
    H_WAIT(h_effects(&r, "k-after") == 1, 20000, "the next job should run");
    h_run_stop(&r);
    ck_assert_int_eq(h_count_events(r.log, "worker", "outage_begin", "rabbitmq"), 0);
    ck_assert_int_eq(h_duplicates(&r), 0);
    ck_assert_int_eq(h_effects(&r, "k-long"), 1);
    h_run_close(&r);
}
END_TEST

/* The connection for dead letters and retries is opened at the first one
 * and then sits idle. After 4 heartbeat intervals of idleness the next dead
 * letter must still go through it, with its reason headers (the broker's
 * own dead-lettering, the fallback, carries none). */
START_TEST(test_dead_letter_after_an_idle_spell_keeps_its_reason)
{
    struct h_run r;
    h_run_open(&r, "idlepub");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = H_FAST_RETRIES,
                                          .heartbeat = "1s" });
    h_publish(r.b, r.queue, "test", "fail-1", "k-fail-1", NULL, "fail");
    expect_dead(&r, "failed", "the job asked to fail", 1);
    /* The idleness is the fault under test, so this is a plain sleep. */
    sleep(4);
    h_publish(r.b, r.queue, "test", "fail-2", "k-fail-2", NULL, "fail");
    expect_dead(&r, "failed", "the job asked to fail", 1);
    h_run_stop(&r);
    ck_assert_int_eq(h_count_events(r.log, "worker", "publish_failed", NULL), 0);
    h_run_close(&r);
}
END_TEST

START_TEST(test_poison_messages_are_dead_lettered_with_their_reason)
{
    struct h_run r;
    h_run_open(&r, "poison");
    h_run_start(&r, &(struct h_run_opts){
        .workers = 1, .queue_yaml = "    max_body: 64\n    job_types: [test]\n" });
    char big[100];
    memset(big, 'x', sizeof(big));
    struct sk_header int_key = { .key = "x-idempotency-key", .number = 7 };
    struct sk_header bad_utf8 = { .key = "x-resource-key", .text = "bad\xff" "key" };
    /* NULL: a body over max_body is refused unread, so the broker
     * dead-letters it (x-death) and sekali's reason is only in the log. */
    static const struct {
        const char *expected;
    } cases[] = {
        { "missing message_id" },
        { NULL },
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
    H_WAIT(h_effects(&r, "good-1") == 1, 20000,
           "the good job after the poison should complete");
    H_WAIT(h_queue_depth(r.b, r.dead) == 5, 20000, "expected 5 dead letters, have %u",
           h_queue_depth(r.b, r.dead));

    /* The broker's dead letter may overtake sekali's copies: it is taken
     * out wherever it is, the others come in order. */
    size_t next = 0, by_broker = 0;
    for (size_t i = 0; i < SK_ARRAY_LEN(cases); i++) {
        amqp_message_t msg;
        ck_assert(h_get(r.b, r.dead, &msg));
        char buf[600];
        if (h_header_text(&msg, "x-sekali-reason", buf, sizeof(buf))[0] == '\0') {
            ck_assert_uint_eq(msg.body.len, sizeof(big));
            by_broker++;
            amqp_destroy_message(&msg);
            continue;
        }
        while (cases[next].expected == NULL)
            next++;
        ck_assert_str_eq(buf, "malformed");
        ck_assert_str_eq(h_header_text(&msg, "x-sekali-error", buf, sizeof(buf)),
                         cases[next++].expected);
        amqp_destroy_message(&msg);
    }
    ck_assert_uint_eq(by_broker, 1);
    h_run_stop(&r);
    ck_assert_int_eq(h_count_lines(r.log, "body of 100 bytes exceeds max_body 64"), 2);
    h_run_close(&r);
}
END_TEST

START_TEST(test_busy_lock_reschedules_without_counting_an_attempt)
{
    struct h_run r;
    /* Two jobs for one resource, two workers: the second finds the lock
     * held for longer than busy_wait and must come back later. */
    h_run_open(&r, "busy");
    char top[128];
    int port = h_metrics_top(top, sizeof(top));
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = H_FAST_RETRIES,
                                          .top_yaml = top });
    h_publish(r.b, r.queue, "test", "busy-1", "k-busy-1", "account-7", "sleep:3000");
    char lock[256];
    snprintf(lock, sizeof(lock), "sekali:lock:%s:account-7", r.queue);
    H_WAIT(h_redis_exists(lock), 20000, "the first job should hold %s", lock);
    h_publish(r.b, r.queue, "test", "busy-2", "k-busy-2", "account-7", "ok");
    H_WAIT(h_effects(&r, "k-busy-1") == 1 && h_effects(&r, "k-busy-2") == 1, 30000,
           "both jobs on the busy resource should complete once");
    /* Counted: the busy lock is what sekali_lock_busy_total is for. */
    double busy = h_metric(port, "sekali_lock_busy_total{queue=\"%s\",job_type=\"test\"}",
                           r.queue);
    ck_assert_msg(busy >= 1, "sekali_lock_busy_total should count the busy lock, is %g", busy);
    h_run_stop(&r);

    ck_assert_msg(h_count_outcomes(r.log, "rescheduled", "lock_busy") >= 1,
                  "the second job should have been re-scheduled for the busy lock");
    /* Not a failed attempt: it ran as attempt 1. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND idempotency_key = 'k-busy-2'", r.queue), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

START_TEST(test_reply_is_sent_once_per_key_with_the_saved_result)
{
    struct h_run r;
    h_run_open(&r, "reply");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2 });
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
    H_WAIT(h_duplicates(&r) == 2, 20000, "two of the three copies should be duplicates");
    h_run_stop(&r);

    ck_assert_int_eq(h_effects(&r, "k-reply"), 1);
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
    h_run_close(&r);
}
END_TEST

/* A message stamped (AMQP timestamp) two hours ago on a queue that keeps
 * keys for one hour: its key may be gone, so it is dead-lettered as
 * beyond_retention, not run; a fresh one beside it runs. */
START_TEST(test_a_message_older_than_the_retention_is_dead_lettered_not_run)
{
    struct h_run r;
    h_run_open(&r, "retention");
    char top[128];
    int port = h_metrics_top(top, sizeof(top));
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    retention: 1h\n",
                                          .top_yaml = top });
    amqp_envelope_t old;
    memset(&old, 0, sizeof(old));
    amqp_basic_properties_t *p = &old.message.properties;
    p->_flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
    p->message_id = amqp_cstring_bytes("old-1");
    p->type = amqp_cstring_bytes("test");
    uint64_t stamped = (uint64_t)time(NULL) - 2 * 3600;
    p->timestamp = stamped;
    old.message.body = amqp_cstring_bytes("ok");
    const struct sk_header key = { .key = "x-idempotency-key", .text = "k-old" };
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_republish(r.b, r.queue, &old, &key, 1, &err) == SK_OK, "%s",
                  err.msg);
    h_publish(r.b, r.queue, "test", "new-1", "k-new", NULL, "ok");

    H_WAIT(h_effects(&r, "k-new") == 1, 20000, "the fresh job should run");
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "expected 1 dead letter in %s, have %u",
           r.dead, h_queue_depth(r.b, r.dead));
    amqp_message_t msg;
    ck_assert(h_get(r.b, r.dead, &msg));
    char buf[600];
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", buf, sizeof(buf)),
                     "beyond_retention");
    ck_assert_msg(strstr(h_header_text(&msg, "x-sekali-error", buf, sizeof(buf)), "retention"),
                  "x-sekali-error: %s", buf);
    ck_assert_str_eq(h_header_text(&msg, "x-idempotency-key", buf, sizeof(buf)), "k-old");
    /* The dead letter keeps the original stamp. */
    ck_assert(msg.properties._flags & AMQP_BASIC_TIMESTAMP_FLAG);
    ck_assert_uint_eq(msg.properties.timestamp, stamped);
    amqp_destroy_message(&msg);
    H_WAIT(h_metric(port, "sekali_dead_letters_total{queue=\"%s\",job_type=\"test\","
                          "reason=\"beyond_retention\"}", r.queue) == 1, 10000,
           "the dead letter should be counted with reason beyond_retention");
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-old"), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'k-old'", r.queue), 0);
    h_run_close(&r);
}
END_TEST

/* A failure PostgreSQL refuses for good (here a check of the operator's,
 * SQLSTATE 23514, on this one key; before, text cut inside a character,
 * 22021) used to hand the message back: it came straight back, ran again
 * about twice a second, and the job behind it never ran. Now it ends after
 * its one run: dead-lettered, reason unrecorded, its key left as it stood,
 * and the next job runs. */
START_TEST(test_failure_postgresql_refuses_is_dead_lettered_unrecorded_and_the_next_job_runs)
{
    struct h_run r;
    h_run_open(&r, "unrec");
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "CREATE FUNCTION sekali_test.\"refuse_%s\"() RETURNS trigger LANGUAGE plpgsql AS $$ "
             "BEGIN RAISE EXCEPTION 'no failure for %%', NEW.key USING ERRCODE = '23514'; END $$",
             r.queue);
    h_pg_exec(r.pg, sql);
    snprintf(sql, sizeof(sql),
             "CREATE TRIGGER \"refuse_%s\" BEFORE INSERT OR UPDATE ON sekali.idempotency_keys "
             "FOR EACH ROW WHEN (NEW.queue = '%s' AND NEW.key = 'k-refused' AND "
             "NEW.status = 'failed') EXECUTE FUNCTION sekali_test.\"refuse_%s\"()",
             r.queue, r.queue, r.queue);
    h_pg_exec(r.pg, sql);
    char top[128];
    int port = h_metrics_top(top, sizeof(top));
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top,
                                          .queue_yaml = "    prefetch: 1\n" H_FAST_RETRIES });
    h_publish(r.b, r.queue, "test", "refused-1", "k-refused", NULL, "fail");
    h_publish(r.b, r.queue, "test", "next-1", "k-next", NULL, "ok");

    H_WAIT(h_effects(&r, "k-next") == 1, 20000,
           "the job behind the unrecordable failure should run (%d hand-backs so far)",
           h_count_outcomes(r.log, "handed_back", NULL));
    expect_dead(&r, "unrecorded", "its failure could not be recorded", 1);
    H_WAIT(h_metric(port, "sekali_dead_letters_total{queue=\"%s\",job_type=\"test\","
                          "reason=\"unrecorded\"}", r.queue) == 1, 10000,
           "the dead letter should be counted with reason unrecorded");
    h_run_stop(&r);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-refused", status, sizeof(status)), "absent");
    ck_assert_int_eq(h_count_outcomes(r.log, "handed_back", "failure_not_recorded"), 0);
    snprintf(sql, sizeof(sql), "DROP TRIGGER \"refuse_%s\" ON sekali.idempotency_keys", r.queue);
    h_pg_exec(r.pg, sql);
    snprintf(sql, sizeof(sql), "DROP FUNCTION sekali_test.\"refuse_%s\"()", r.queue);
    h_pg_exec(r.pg, sql);
    h_run_close(&r);
}
END_TEST

/* Every job sekali publishes is stamped with when: what the check above
 * reads. */
START_TEST(test_published_jobs_carry_their_publish_time)
{
    struct h_run r;
    h_run_open(&r, "stamp");
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    uint64_t before = (uint64_t)time(NULL);
    h_publish(r.b, r.queue, "test", "s-1", "k-s", NULL, "ok");
    amqp_message_t msg;
    H_WAIT(h_get(r.b, r.queue, &msg), 5000, "the message should be in %s", r.queue);
    ck_assert(msg.properties._flags & AMQP_BASIC_TIMESTAMP_FLAG);
    ck_assert_uint_ge(msg.properties.timestamp, before);
    ck_assert_uint_le(msg.properties.timestamp, (uint64_t)time(NULL));
    amqp_destroy_message(&msg);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_retried_job_runs_again_and_commits_once,
        test_exhausted_retries_dead_letter_with_headers,
        test_failure_in_the_middle_of_a_batch_leaves_the_others_committed,
        test_a_batch_without_failures_claims_its_keys_completed,
        test_slow_handler_closes_its_batch_early,
        test_jobs_on_one_resource_share_their_batchs_lock,
        test_slow_handler_closes_a_careful_batch_early,
        test_heartbeat_renews_every_lock_of_a_batch,
        test_failed_job_is_dead_lettered_and_recorded,
        test_handler_longer_than_the_amqp_heartbeat_keeps_its_connection,
        test_dead_letter_after_an_idle_spell_keeps_its_reason,
        test_poison_messages_are_dead_lettered_with_their_reason,
        test_busy_lock_reschedules_without_counting_an_attempt,
        test_reply_is_sent_once_per_key_with_the_saved_result,
        test_failure_postgresql_refuses_is_dead_lettered_unrecorded_and_the_next_job_runs,
        NULL,
    };
    Suite *s = h_suite("outcomes", 300, tests);
    const TTest *retention[] = {
        test_a_message_older_than_the_retention_is_dead_lettered_not_run,
        test_published_jobs_carry_their_publish_time,
        NULL,
    };
    h_tcase(s, "retention", 120, retention);
    return h_run_suite(s);
}
