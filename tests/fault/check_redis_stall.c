/* check_redis_stall.c - a lock's lease lives through a Redis that stops
 * answering for a second (SIGSTOP: a managed Redis's pause, a failover's
 * freeze, a long fork), and nothing runs twice.
 *
 * The worker's redis.timeout is short (100 ms: the job's path fails fast
 * over to on_redis_down), the lock's TTL 3 s, so the renewal thread ticks
 * every second. Redis is stopped for 1.2 s while the only job (4 s of
 * handler) holds its lock: some renewal is sent into the stall and waits
 * at least 0.2 s for its answer. With redis.timeout as the renewal's bound
 * (before), it gave up after 100 ms, dropped its connection and logged an
 * outage; its own bound, half the TTL (1.5 s), outlasts the stall: the
 * renewal is answered when Redis resumes, on the same connection.
 *
 * Real servers: the test stops the suite's own redis-server by the pid
 * tests/servers.sh keeps, and always continues it. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "harness.h"

static pid_t redis_pid(void)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/redis/redis.pid", getenv("SEKALI_SCRATCH"));
    char *text = h_read_file(path);
    ck_assert_msg(text != NULL, "no %s: is redis-server from tests/servers.sh running?", path);
    pid_t pid = (pid_t)atol(text);
    free(text);
    ck_assert_msg(pid > 1, "bad pid in %s", path);
    return pid;
}

static pid_t stopped = 0;

/* Redis must never stay stopped after a failed assertion: the other suites
 * share it. check runs each test in a forked child; this runs at its exit. */
static void continue_redis(void)
{
    if (stopped > 0)
        kill(stopped, SIGCONT);
}

static long long pttl(const char *key)
{
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    redisReply *reply = redisCommand(redis, "PTTL %s", key);
    ck_assert_msg(reply != NULL && reply->type == REDIS_REPLY_INTEGER, "redis PTTL failed");
    long long ms = reply->integer;
    freeReplyObject(reply);
    redisFree(redis);
    return ms;
}

START_TEST(test_a_lock_lease_outlives_a_one_second_redis_stall)
{
    struct h_run r;
    h_run_open(&r, "stall");
    r.config = h_write_config_top(r.dir, r.queue, H_EFFECT, 1,
                                  "    batch: 1\n    lock_ttl: 3s\n", NULL);
    h_config_replace(r.config, "redis:\n  host: 127.0.0.1\n",
                     "redis:\n  timeout: 100ms\n  host: 127.0.0.1\n");
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    h_publish(r.b, r.queue, "test", "stall-1", "k-stall", "r-stall", "sleep:4000");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);

    char lock_key[256];
    snprintf(lock_key, sizeof(lock_key), "sekali:lock:%s:r-stall", r.queue);
    H_WAIT(h_redis_exists(lock_key), 20000, "the job never took its lock %s", lock_key);

    /* The fault itself lasts 1.2 s: a duration, not a wait for an event. */
    pid_t pid = redis_pid();
    atexit(continue_redis);
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    stopped = pid;
    struct timespec stall = { .tv_sec = 1, .tv_nsec = 200 * 1000000L };
    while (nanosleep(&stall, &stall) != 0 && errno == EINTR)
        ;
    ck_assert_int_eq(kill(pid, SIGCONT), 0);
    stopped = 0;

    /* The job still runs (4 s) and its lease is alive. */
    ck_assert_int_eq(h_effects(&r, "k-stall"), 0);
    long long left = pttl(lock_key);
    ck_assert_msg(left > 0, "the lock %s should have outlived the stall (PTTL %lld)", lock_key,
                  left);
    H_WAIT(h_effects(&r, "k-stall") == 1, 30000, "the job should complete once");
    h_run_stop(&r);
    ck_assert_msg(h_count_lines(r.log, "lost while the job runs") == 0,
                  "the lock was reported lost (see %s)", r.log);
    ck_assert_msg(h_count_lines(r.log, "lock renewal failed") == 0,
                  "a renewal gave up during a 1.2 s stall (its bound was redis.timeout, "
                  "not the TTL's; see %s)", r.log);
    h_expect_once(&r, 1, 0);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_lock_lease_outlives_a_one_second_redis_stall,
        NULL,
    };
    return h_run_suite(h_suite("redis_stall", 90, tests));
}
