/* check_lock_metrics.c - the two lock counters, as a scrape shows them, for
 * one job at a time and for a batch: sekali_locks_lost_total counts the job
 * whose lock another owner took while its handler ran (and only that job,
 * not its batch-mates), and sekali_lock_wait_seconds_total the time a job
 * waited for a lock someone else held. Before the pipeline had one driver
 * (job.c and batch.c each took and released locks), a batch counted
 * neither: its locks were marked released before the exit that counted a
 * lost one, and its lock wait never reported its time.
 *
 * Real servers: the test takes the lock over, or holds it, in Redis itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "harness.h"

enum { JOBS = 4 };

/* A test's settings at batch (1 or 16): metrics on a free port (returned),
 * no janitor, and a short lock_ttl, so that the heartbeat renews (and finds
 * a lock lost) within a third of it. */
static int settings(char *top, size_t top_size, char *yaml, size_t yaml_size, int batch)
{
    int port = h_free_port();
    snprintf(top, top_size, "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 0s\n",
             port);
    if (batch > 1)
        snprintf(yaml, yaml_size, "    batch: %d\n    prefetch: %d\n    batch_wait: 1s\n"
                 "    lock_ttl: 900ms\n", batch, 2 * batch);
    else
        snprintf(yaml, yaml_size, "    batch: 1\n    lock_ttl: 900ms\n");
    return port;
}

static redisContext *redis_open(void)
{
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    return redis;
}

static void redis_do(redisContext *redis, const char *cmd, const char *key, const char *value)
{
    redisReply *reply = value != NULL ? redisCommand(redis, cmd, key, value)
                                      : redisCommand(redis, cmd, key);
    ck_assert_msg(reply != NULL && reply->type != REDIS_REPLY_ERROR, "redis %s %s failed", cmd,
                  key);
    freeReplyObject(reply);
}

static bool redis_exists(redisContext *redis, const char *key)
{
    redisReply *reply = redisCommand(redis, "EXISTS %s", key);
    ck_assert_msg(reply != NULL && reply->type == REDIS_REPLY_INTEGER, "redis EXISTS failed");
    bool exists = reply->integer == 1;
    freeReplyObject(reply);
    return exists;
}

/* JOBS jobs, each on its own resource, published before sekalid starts so
 * that at batch 16 they make one batch; the first sleeps 4 s. While it runs,
 * the test overwrites its lock with another owner's token: the heartbeat's
 * next renewal finds the lock lost. Exactly that job is counted, and every
 * effect still happens once (the lock decides nothing). */
static void lock_taken_over_is_counted(int batch)
{
    struct h_run r;
    h_run_open(&r, batch > 1 ? "lostbatch" : "lostone");
    redisContext *redis = redis_open();
    char top[256], yaml[256];
    int port = settings(top, sizeof(top), yaml, sizeof(yaml), batch);
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    for (int i = 0; i < JOBS; i++) {
        char id[32], key[32], resource[32];
        snprintf(id, sizeof(id), "lost-%d", i);
        snprintf(key, sizeof(key), "k-lost-%d", i);
        snprintf(resource, sizeof(resource), "r-lost-%d", i);
        h_publish(r.b, r.queue, "test", id, key, resource, i == 0 ? "sleep:4000" : "ok");
    }
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = yaml, .top_yaml = top });

    char lock_key[256];
    snprintf(lock_key, sizeof(lock_key), "sekali:lock:%s:r-lost-0", r.queue);
    H_WAIT(redis_exists(redis, lock_key), 20000, "the slow job never took its lock %s",
           lock_key);
    redis_do(redis, "SET %s %s PX 60000", lock_key, "someone-else");

    H_WAIT(h_effect_keys(&r) == JOBS, 30000, "all %d jobs should complete, %lld did", JOBS,
           h_effect_keys(&r));
    H_WAIT(h_metric(port, "sekali_locks_lost_total{queue=\"%s\",job_type=\"test\"}", r.queue)
               >= 1, 10000, "sekali_locks_lost_total should count the lock taken over (is %g)",
           h_metric(port, "sekali_locks_lost_total{queue=\"%s\",job_type=\"test\"}", r.queue));
    /* The slow job's alone: its batch-mates kept their locks. */
    ck_assert_int_eq(h_metric(port, "sekali_locks_lost_total{queue=\"%s\",job_type=\"test\"}",
                              r.queue), 1);
    h_run_stop(&r);
    ck_assert_int_ge(h_count_lines(r.log, "lost while the job runs"), 1);
    h_expect_once(&r, JOBS, 0);
    redis_do(redis, "DEL %s", lock_key, NULL);
    redisFree(redis);
    h_run_close(&r);
}

/* Another owner holds the job's lock before sekalid starts: the job waits
 * lock.busy_wait (500 ms in the tests' config) for it, is re-scheduled as
 * lock busy, and runs once the test lets the lock go. The wait is counted,
 * and so is the refusal. */
static void lock_wait_is_counted(int batch)
{
    struct h_run r;
    h_run_open(&r, batch > 1 ? "waitbatch" : "waitone");
    redisContext *redis = redis_open();
    char top[256], yaml[256];
    int port = settings(top, sizeof(top), yaml, sizeof(yaml), batch);
    char lock_key[256];
    snprintf(lock_key, sizeof(lock_key), "sekali:lock:%s:r-wait", r.queue);
    redis_do(redis, "SET %s %s PX 60000", lock_key, "someone-else");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = yaml, .top_yaml = top });
    h_publish(r.b, r.queue, "test", "wait-1", "k-wait", "r-wait", "ok");

    H_WAIT(h_metric(port, "sekali_lock_busy_total{queue=\"%s\",job_type=\"test\"}", r.queue)
               >= 1, 20000, "the job should have been refused its lock");
    double waited = h_metric(port, "sekali_lock_wait_seconds_total{queue=\"%s\","
                             "job_type=\"test\"}", r.queue);
    /* Refused only after busy_wait: most of its 500 ms were spent waiting. */
    ck_assert_msg(waited >= 0.25, "sekali_lock_wait_seconds_total should count the wait, is %g",
                  waited);
    redis_do(redis, "DEL %s", lock_key, NULL);
    H_WAIT(h_effects(&r, "k-wait") == 1, 30000, "the job should run once the lock is free");
    h_run_stop(&r);
    h_expect_once(&r, 1, 0);
    redisFree(redis);
    h_run_close(&r);
}

START_TEST(test_a_lock_taken_over_mid_job_is_counted_lost_for_that_job)
{
    lock_taken_over_is_counted(1);
}
END_TEST

START_TEST(test_a_lock_taken_over_mid_batch_is_counted_lost_for_that_job_alone)
{
    lock_taken_over_is_counted(16);
}
END_TEST

START_TEST(test_the_wait_for_a_busy_lock_is_counted)
{
    lock_wait_is_counted(1);
}
END_TEST

START_TEST(test_the_wait_for_a_busy_lock_is_counted_in_a_batch)
{
    lock_wait_is_counted(16);
}
END_TEST

/* cmdstat_<name>'s calls in INFO commandstats (commands a script runs are
 * counted too). */
static long long redis_calls(redisContext *redis, const char *name)
{
    redisReply *reply = redisCommand(redis, "INFO commandstats");
    ck_assert_msg(reply != NULL && reply->type == REDIS_REPLY_STRING, "redis INFO failed");
    char want[64];
    snprintf(want, sizeof(want), "cmdstat_%s:calls=", name);
    const char *at = strstr(reply->str, want);
    long long calls = at != NULL ? atoll(at + strlen(want)) : 0;
    freeReplyObject(reply);
    return calls;
}

/* Reads what MONITOR saw until the line of marker: how many commands a
 * client sent (not those a script ran, shown as "[0 lua]") that name
 * needle, EVALSHA and SET each. */
static int client_commands(redisContext *monitor, const char *marker, const char *needle)
{
    int n = 0;
    for (;;) {
        redisReply *line = NULL;
        ck_assert_msg(redisGetReply(monitor, (void **)&line) == REDIS_OK && line != NULL,
                      "MONITOR ended before its marker");
        bool end = line->type == REDIS_REPLY_STATUS && strstr(line->str, marker) != NULL;
        if (line->type == REDIS_REPLY_STATUS && strstr(line->str, needle) != NULL &&
            strstr(line->str, " lua] ") == NULL &&
            (strcasestr(line->str, "] \"evalsha\"") != NULL ||
             strcasestr(line->str, "] \"set\"") != NULL))
            n++;
        freeReplyObject(line);
        if (end)
            return n;
    }
}

/* Defect 5.7: a lock release travels with the next acquire. RELEASED jobs,
 * each on its own resource, wait in the queue before sekalid starts; each
 * costs about one command and one round trip to Redis (the script that
 * releases the previous job's lock and takes its own), never the two (SET,
 * then EVALSHA to release) it cost before. A count, not a time: a job costs
 * one more only when the worker finds no delivery waiting and releases on
 * its own. Every lock is gone at the end, and each effect happened once. */
enum { RELEASED = 200 };
START_TEST(test_a_lock_release_travels_with_the_next_acquire)
{
    struct h_run r;
    h_run_open(&r, "piggyback");
    redisContext *redis = redis_open();
    redisContext *monitor = redis_open();
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    for (int i = 0; i < RELEASED; i++) {
        char id[32], key[32], resource[32];
        snprintf(id, sizeof(id), "pb-%d", i);
        snprintf(key, sizeof(key), "k-pb-%d", i);
        snprintf(resource, sizeof(resource), "r-pb-%d", i);
        h_publish(r.b, r.queue, "test", id, key, resource, "ok");
    }
    redisReply *ok = redisCommand(monitor, "MONITOR");
    ck_assert_msg(ok != NULL && ok->type == REDIS_REPLY_STATUS, "MONITOR refused");
    freeReplyObject(ok);
    long long evalsha = redis_calls(redis, "evalsha"), set = redis_calls(redis, "set");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = "janitor:\n  interval: 0s\n" });
    H_WAIT(h_effect_keys(&r) == RELEASED, 60000, "all %d jobs should complete, %lld did",
           RELEASED, h_effect_keys(&r));
    h_run_stop(&r);
    evalsha = redis_calls(redis, "evalsha") - evalsha;
    set = redis_calls(redis, "set") - set;
    char marker[200];
    snprintf(marker, sizeof(marker), "end-of-%s", r.queue);
    freeReplyObject(redisCommand(redis, "ECHO %s", marker));
    int sent = client_commands(monitor, marker, r.queue);
    char pattern[256];
    snprintf(pattern, sizeof(pattern), "sekali:lock:%s:*", r.queue);
    redisReply *left = redisCommand(redis, "KEYS %s", pattern);
    ck_assert_msg(left != NULL && left->type == REDIS_REPLY_ARRAY, "redis KEYS failed");
    size_t n_left = left->elements;
    freeReplyObject(left);
    fprintf(stderr, "piggyback: %d jobs: commandstats EVALSHA %lld, SET %lld (scripts' too); "
            "lock commands the worker sent: %d, %.2f a job\n", RELEASED, evalsha, set, sent,
            (double)sent / RELEASED);
    ck_assert_msg(n_left == 0, "%zu locks left in Redis after a clean stop", n_left);
    /* One script a span: a job at batch 1, a whole batch of them at
     * sekali's default (up to the harness's window of 4). */
    int batch = h_test_batch() > 0 ? h_test_batch() : 4;
    ck_assert_msg(sent >= RELEASED / batch && sent <= RELEASED * 3 / 2,
                  "%d lock commands for %d jobs at batch %d: a release should travel with the "
                  "next acquire (before: 2 a job)", sent, RELEASED, batch);
    h_expect_once(&r, RELEASED, 0);
    redisFree(monitor);
    redisFree(redis);
    h_run_close(&r);
}
END_TEST

/* Issue 42: a busy lock costs no more broker traffic than waiting for it
 * would. COPIES producers publish each of KEYS keys at once (the mix of
 * docs/benchmark.md, "Busy locks at batch 16"), so the copies of a key sit
 * in several workers' batches together. A copy whose lock another worker's
 * batch holds waits for it (after its own batch-mates committed, holding
 * nothing) and then finds its key completed; before, it went round a delay
 * queue as soon as any other lock of its batch was taken, 79 per 1,000 jobs.
 * sekali_lock_busy_total counts each copy re-scheduled for a busy lock. The
 * tests' lock.busy_wait is 500 ms (the default 2 s). */
enum { KEYS = 2000, COPIES = 3, WORKERS = 16, BUSY_PER_1000 = 10 };

/* One producer: every key once, in order, on a connection of its own. */
static void publish_copies(const char *queue, int producer)
{
    struct sk_broker *b = h_broker();
    char id[48], key[32];
    for (int i = 0; i < KEYS; i++) {
        snprintf(id, sizeof(id), "copy-%d-%d", producer, i);
        snprintf(key, sizeof(key), "k-copy-%d", i);
        h_publish(b, queue, "test", id, key, NULL, "ok");
    }
    sk_broker_close(b);
}

START_TEST(test_copies_of_a_key_in_other_batches_wait_for_its_lock_not_the_delay_queue)
{
    struct h_run r;
    h_run_open(&r, "copies");
    int port = h_free_port();
    char top[256], yaml[128];
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 0s\n",
             port);
    snprintf(yaml, sizeof(yaml), "    batch: 16\n    prefetch: 32\n");
    h_run_start(&r, &(struct h_run_opts){ .workers = WORKERS, .queue_yaml = yaml,
                                          .top_yaml = top });
    int64_t start = h_now_ms();
    pid_t producers[COPIES];
    for (int c = 0; c < COPIES; c++) {
        producers[c] = fork();
        ck_assert_int_ge(producers[c], 0);
        if (producers[c] == 0) {
            publish_copies(r.queue, c);
            _exit(0);
        }
    }
    for (int c = 0; c < COPIES; c++) {
        int status = 0;
        ck_assert_int_eq(waitpid(producers[c], &status, 0), producers[c]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "producer %d failed", c);
    }
    H_WAIT(h_effect_keys(&r) == KEYS, 300000, "every key should have its effect, %lld have",
           h_effect_keys(&r));
    int64_t effects_ms = h_now_ms() - start;
    /* Every copy ends as the key's effect or as a duplicate of it. */
    H_WAIT(h_duplicates(&r) == (COPIES - 1) * KEYS, 300000,
           "every copy should be done: %lld keys with an effect, %lld duplicates of %d",
           h_effect_keys(&r), h_duplicates(&r), (COPIES - 1) * KEYS);
    double busy = h_metric(port, "sekali_lock_busy_total{queue=\"%s\",job_type=\"test\"}",
                           r.queue);
    double deliveries = h_metric(port, "sekali_deliveries_total{queue=\"%s\","
                                 "job_type=\"test\"}", r.queue);
    int64_t copies_ms = h_now_ms() - start;
    h_run_stop(&r);
    fprintf(stderr, "copies: %d jobs (%d keys x %d), %d workers at batch 16: %.0f deliveries, "
            "%.0f re-scheduled for a busy lock, %.1f per 1,000 jobs; every effect after %lld ms, "
            "every copy after %lld ms (%.0f jobs/s)\n", KEYS * COPIES, KEYS, COPIES, WORKERS,
            deliveries, busy, busy * 1000 / (KEYS * COPIES), (long long)effects_ms,
            (long long)copies_ms, KEYS * COPIES * 1000.0 / (double)copies_ms);
    ck_assert_msg(busy >= 0 && busy * 1000 <= (double)BUSY_PER_1000 * KEYS * COPIES,
                  "%.0f copies re-scheduled for a busy lock, %.1f per 1,000 jobs (at most %d)",
                  busy, busy * 1000 / (KEYS * COPIES), BUSY_PER_1000);
    h_expect_once(&r, KEYS, (COPIES - 1) * KEYS);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_lock_taken_over_mid_job_is_counted_lost_for_that_job,
        test_a_lock_taken_over_mid_batch_is_counted_lost_for_that_job_alone,
        test_the_wait_for_a_busy_lock_is_counted,
        test_the_wait_for_a_busy_lock_is_counted_in_a_batch,
        test_a_lock_release_travels_with_the_next_acquire,
        NULL,
    };
    const TTest *mixes[] = {
        test_copies_of_a_key_in_other_batches_wait_for_its_lock_not_the_delay_queue,
        NULL,
    };
    Suite *s = h_suite("lock_metrics", 120, tests);
    h_tcase(s, "copies", 400, mixes);
    return h_run_suite(s);
}
