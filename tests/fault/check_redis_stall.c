/* check_redis_stall.c - a lock's lease lives through a Redis that stops
 * answering (SIGSTOP: a managed Redis's pause, a failover's freeze, a long
 * fork) and through a renewal lost on its connection, and nothing runs
 * twice.
 *
 * The worker's redis.timeout is short (100 ms: the job's path fails fast
 * over to on_redis_down). A renewal has its own bound, half the lock's TTL
 * but never past the lease it extends, and one that Redis did not answer
 * is tried again at once while the lease has time left (heartbeat.c):
 *
 * - lock_ttl 3 s (a tick of 1 s), Redis stopped for 1.2 s while the only
 *   job holds its lock: some renewal is sent into the stall and is answered
 *   when Redis resumes, on the same connection. With redis.timeout as its
 *   bound (before ca80d90) it gave up after 100 ms and reconnected.
 * - lock_ttl 6 s (a tick of 2 s), Redis behind tests/bench/delay_proxy.c,
 *   which for one second around a renewal holds what it reads for a minute:
 *   that renewal, on a connection gone bad as one a NAT or a load balancer
 *   dropped in silence, is never answered in time and gives up after its
 *   3 s bound, 1 s before the lease ends. Waiting a tick for the next try
 *   (before the retry) is 1 s past the lease: the key is gone. Retried at
 *   once on a new connection, the renewal lands inside the lease. (A
 *   SIGSTOP does not show it: the renewal given up on waits in Redis's
 *   socket and still runs when Redis resumes.)
 *
 * The stall's test proves it: a PING the test sent into it is answered only
 * after it. Real servers: the test stops the suite's own redis-server by
 * the pid tests/servers.sh keeps, and always continues it. */
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

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void nap_ms(long ms)
{
    struct timespec d = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
    while (nanosleep(&d, &d) != 0 && errno == EINTR)
        ;
}

static redisContext *redis_open(void)
{
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    return redis;
}

static long long pttl(redisContext *redis, const char *key)
{
    redisReply *reply = redisCommand(redis, "PTTL %s", key);
    ck_assert_msg(reply != NULL && reply->type == REDIS_REPLY_INTEGER, "redis PTTL failed");
    long long ms = reply->integer;
    freeReplyObject(reply);
    return ms;
}

/* The key's value into out ("" if it has none). */
static void get(redisContext *redis, const char *key, char *out, size_t size)
{
    redisReply *reply = redisCommand(redis, "GET %s", key);
    ck_assert_msg(reply != NULL && (reply->type == REDIS_REPLY_STRING ||
                                    reply->type == REDIS_REPLY_NIL), "redis GET failed");
    snprintf(out, size, "%s", reply->type == REDIS_REPLY_STRING ? reply->str : "");
    freeReplyObject(reply);
}

/* Waits for the job's lock on r-stall; its key into key, the worker's
 * token it holds into token. */
static void taken_lock(const struct h_run *r, redisContext *redis, char *key, size_t key_size,
                       char *token, size_t token_size)
{
    snprintf(key, key_size, "sekali:lock:%s:r-stall", r->queue);
    H_WAIT(h_redis_exists(key), 20000, "the job never took its lock %s", key);
    get(redis, key, token, token_size);
    ck_assert_msg(token[0] != '\0', "the lock %s holds no token", key);
}

/* Whether key's lease grew since *last (its PTTL, updated): a renewal. */
static bool renewed(redisContext *redis, const char *key, long long *last)
{
    long long ms = pttl(redis, key);
    bool grew = ms > *last + 300;
    *last = ms;
    return grew;
}

/* Stops Redis for ms (the fault's duration: a time, not a wait for an
 * event) and returns how long a PING sent into the stall, on a connection
 * opened before it, waited for its answer: the proof that Redis did not
 * answer meanwhile. */
static long long stall_redis(long ms)
{
    redisContext *probe = redis_open();
    pid_t pid = redis_pid();
    atexit(continue_redis);
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    stopped = pid;
    long long sent = now_ms();
    ck_assert_int_eq(redisAppendCommand(probe, "PING"), REDIS_OK);
    int done = 0;
    while (!done)
        ck_assert_int_eq(redisBufferWrite(probe, &done), REDIS_OK);
    nap_ms(ms);
    ck_assert_int_eq(kill(pid, SIGCONT), 0);
    stopped = 0;
    redisReply *reply = NULL;
    ck_assert_int_eq(redisGetReply(probe, (void **)&reply), REDIS_OK);
    long long waited = now_ms() - sent;
    ck_assert_msg(reply != NULL && reply->type == REDIS_REPLY_STATUS &&
                  strcmp(reply->str, "PONG") == 0, "PING through the stall got no PONG");
    freeReplyObject(reply);
    redisFree(probe);
    return waited;
}

/* sekalid for one job of sleep_ms on resource r-stall with lock_ttl, its
 * redis.timeout 100 ms, metrics on a free port (returned), and the config's
 * first `from` replaced by `to` unless from is NULL. */
static int start_one_job(struct h_run *r, const char *lock_ttl, int sleep_ms, const char *from,
                         const char *to)
{
    char top[256], yaml[128], body[32];
    int port = h_metrics_top(top, sizeof(top));
    snprintf(yaml, sizeof(yaml), "    batch: 1\n    lock_ttl: %s\n", lock_ttl);
    r->config = h_write_config_top(r->dir, r->queue, H_EFFECT, 1, yaml, top);
    h_config_replace(r->config, "redis:\n  host: 127.0.0.1\n",
                     "redis:\n  timeout: 100ms\n  host: 127.0.0.1\n");
    if (from != NULL)
        h_config_replace(r->config, from, to);
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    snprintf(body, sizeof(body), "sleep:%d", sleep_ms);
    h_publish(r->b, r->queue, "test", "stall-1", "k-stall", "r-stall", body);
    r->sekalid = h_start_sekalid("sekalid", r->config, r->dir, NULL);
    return port;
}

/* The job completed once, no lock was counted or logged lost. */
static void expect_kept(struct h_run *r, int port)
{
    H_WAIT(h_effects(r, "k-stall") == 1, 30000, "the job should complete once");
    H_WAIT(h_metric(port, "sekali_locks_lost_total{queue=\"%s\",job_type=\"test\"}", r->queue)
               >= 0, 10000, "no sekali_locks_lost_total for the queue");
    ck_assert_int_eq(h_metric(port, "sekali_locks_lost_total{queue=\"%s\",job_type=\"test\"}",
                              r->queue), 0);
    h_run_stop(r);
    ck_assert_msg(h_count_lines(r->log, "lost while the job runs") == 0,
                  "the lock was reported lost (see %s)", r->log);
    h_expect_once(r, 1, 0);
}

START_TEST(test_a_lock_lease_outlives_a_one_second_redis_stall)
{
    struct h_run r;
    h_run_open(&r, "stall");
    int port = start_one_job(&r, "3s", 4000, NULL, NULL);
    redisContext *redis = redis_open();
    char lock_key[256], token[128], after[128];
    taken_lock(&r, redis, lock_key, sizeof(lock_key), token, sizeof(token));

    long long waited = stall_redis(1200);
    ck_assert_msg(waited >= 1100, "Redis answered a PING after %lld ms: no stall", waited);

    /* The job still runs (4 s) and its lease is alive, the worker's own. */
    ck_assert_int_eq(h_effects(&r, "k-stall"), 0);
    long long left = pttl(redis, lock_key);
    ck_assert_msg(left > 0, "the lock %s should have outlived the stall (PTTL %lld)", lock_key,
                  left);
    get(redis, lock_key, after, sizeof(after));
    ck_assert_str_eq(after, token);
    redisFree(redis);
    expect_kept(&r, port);
    ck_assert_msg(h_count_lines(r.log, "lock renewal failed") == 0,
                  "a renewal gave up during a 1.2 s stall (its bound was redis.timeout, "
                  "not the TTL's; see %s)", r.log);
    h_run_close(&r);
}
END_TEST

/* A delay_proxy in front of the test Redis whose fault (SIGUSR1) holds
 * what it reads for a minute: a renewal sent then is as good as lost, as on
 * a connection a NAT or a load balancer dropped in silence, while a new
 * connection opened after the fault (SIGUSR2) gets through at once. Returns
 * its pid; *port is where it listens. */
static pid_t lossy_proxy(const char *dir, int *port)
{
    char map[128], out[1024];
    snprintf(map, sizeof(map), "0:127.0.0.1:%d:0:0:60000", h_redis_port());
    snprintf(out, sizeof(out), "%s/proxy.out", dir);
    const char *args[] = { map, NULL };
    pid_t pid = h_spawn_start(&(struct h_spawn){ .binary = "tests/delay_proxy", .args = args,
                                                 .out = out });
    H_WAIT(h_count_lines(out, "ready ") == 1, 10000, "delay_proxy did not start (%s)", out);
    char *text = h_read_file(out);
    ck_assert_msg(text != NULL && sscanf(text, "ready %d", port) == 1, "no port in %s", out);
    free(text);
    return pid;
}

START_TEST(test_a_renewal_lost_on_its_connection_is_retried_inside_the_lease)
{
    struct h_run r;
    h_run_open(&r, "stallretry");
    int proxy_port;
    pid_t proxy = lossy_proxy(r.dir, &proxy_port);
    char from[64], to[64];
    snprintf(from, sizeof(from), "  port: %d\n", h_redis_port());
    snprintf(to, sizeof(to), "  port: %d\n", proxy_port);
    int port = start_one_job(&r, "6s", 14000, from, to);
    redisContext *redis = redis_open();
    char lock_key[256], token[128], after[128];
    taken_lock(&r, redis, lock_key, sizeof(lock_key), token, sizeof(token));

    /* A renewal is seen when the lease grows back towards 6 s; the next one
     * is sent a tick (2 s) after it, inside the fault's second around it. */
    long long last = pttl(redis, lock_key);
    H_WAIT(renewed(redis, lock_key, &last), 10000, "no renewal of %s seen", lock_key);
    long long renewed_at = now_ms();
    nap_ms(1500);
    ck_assert_int_eq(kill(proxy, SIGUSR1), 0);
    nap_ms(1000);
    ck_assert_int_eq(kill(proxy, SIGUSR2), 0);
    /* The lease the lost renewal would have extended ended 6 s after the
     * renewal seen; wait past that: the key is still the worker's only if
     * another renewal reached Redis in time. */
    long long past = renewed_at + 6500 - now_ms();
    if (past > 0)
        nap_ms((long)past);
    ck_assert_int_eq(h_effects(&r, "k-stall"), 0);
    get(redis, lock_key, after, sizeof(after));
    ck_assert_msg(strcmp(after, token) == 0,
                  "the lock %s should still hold the worker's token %s after the lost "
                  "renewal, holds '%s' (PTTL %lld)", lock_key, token, after,
                  pttl(redis, lock_key));
    redisFree(redis);
    expect_kept(&r, port);
    ck_assert_msg(h_count_lines(r.log, "lock renewal failed") == 1,
                  "the renewal sent into the fault should have failed once (see %s)", r.log);
    kill(proxy, SIGTERM);
    h_wait_exit(proxy, 10000, "delay_proxy");
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_lock_lease_outlives_a_one_second_redis_stall,
        test_a_renewal_lost_on_its_connection_is_retried_inside_the_lease,
        NULL,
    };
    return h_run_suite(h_suite("redis_stall", 90, tests));
}
