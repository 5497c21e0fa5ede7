/* check_rate.c - queues[].rate_limit on real servers: the limit holds over
 * the run, jobs over it wait in a delay queue without losing an attempt,
 * every worker of two sekalids shares one limit, a limit per resource
 * holds for each resource apart, workers killed in the middle run nothing
 * twice, and with Redis down the limit holds every job back (fails
 * closed) and loses none. A fault suite, since two of its tests kill
 * workers and stop Redis (tests/README.md: never beside another suite on
 * one server set).
 *
 * No test asserts a time that load could break. A limit of R a second with
 * a burst of B admits the N-th job no sooner than (N - B) / R seconds after
 * the first could start (rate.h: GCRA), so the run cannot end sooner: the
 * tests assert that lower bound on the run's length, measured with
 * PostgreSQL's clock from before the first job was published to the last
 * effect's transaction (which began after its job was admitted). A slow
 * machine only makes the run longer. What load cannot hold either way,
 * that the jobs do finish, is waited for with generous bounds. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis.h>

#include "harness.h"

enum { RATE = 20, BURST = 5, JOBS = 80 };

/* Milliseconds since 1970 by PostgreSQL's clock (the test's servers share
 * the machine's clock with Redis, whose TIME the limiter reads). */
static long long pg_now_ms(PGconn *pg)
{
    return h_pg_count(pg, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint");
}

/* When the last effect of r's queue (or of its keys starting with prefix)
 * began its transaction, in ms since 1970. */
static long long last_effect_ms(struct h_run *r, const char *prefix)
{
    return h_pg_count(r->pg, "SELECT (extract(epoch FROM max(created_at)) * 1000)::bigint "
                      "FROM sekali_test.effects WHERE queue = '%s' "
                      "AND idempotency_key LIKE '%s%%'", r->queue, prefix);
}

/* The shortest run n jobs can take under rate/s with burst, in ms, less
 * 20 ms for the two clocks' reading (both the machine's). */
static long long shortest_ms(int n, int rate, int burst)
{
    return (long long)(n - burst) * 1000 / rate - 20;
}

static void publish(struct h_run *r, const char *prefix, int n, const char *resource)
{
    for (int i = 0; i < n; i++) {
        char id[64], key[64];
        snprintf(id, sizeof(id), "%s-id-%d", prefix, i);
        snprintf(key, sizeof(key), "%s-%d", prefix, i);
        h_publish(r->b, r->queue, "test", id, key, resource != NULL ? resource : key, "ok");
    }
}

static char *settings(char *top, size_t size, int *port)
{
    *port = h_free_port();
    snprintf(top, size, "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 0s\n", *port);
    return top;
}

/* Opens r as name and starts sekalid with `workers` workers and the queue
 * settings yaml; returns its metrics port. */
static int start(struct h_run *r, const char *name, int workers, const char *yaml)
{
    char top[256];
    int port;
    h_run_open(r, name);
    h_run_start(r, &(struct h_run_opts){
        .workers = workers, .top_yaml = settings(top, sizeof(top), &port), .queue_yaml = yaml });
    return port;
}

/* Waits for `all` completed jobs, then asserts that the n keys starting
 * with prefix took no less than n jobs at rate/s with burst allow, from
 * t0. */
static void expect_no_faster(struct h_run *r, const char *prefix, long long t0, int all, int n,
                             int rate, int burst, const char *what)
{
    H_WAIT(h_completed(r) == all, 120000, "all %d jobs should complete, %lld did", all,
           h_completed(r));
    long long took = last_effect_ms(r, prefix) - t0;
    ck_assert_msg(took >= shortest_ms(n, rate, burst), "%s: %d jobs at %d/s (burst %d) took "
                  "%lld ms: faster than the limit allows (%lld ms)", what, n, rate, burst, took,
                  shortest_ms(n, rate, burst));
}

/* JOBS jobs at 20/s with a burst of 5, taken by 3 workers in batches: the
 * run lasts at least (80 - 5) / 20 = 3.75 s, every job runs once, none
 * fails, retries or dead-letters, and each key was claimed once (the wait
 * in the delay queue cost no attempt). The jobs over the limit are counted,
 * with their delay, and the event says so. */
START_TEST(test_a_queue_limit_holds_and_jobs_over_it_wait_without_failing)
{
    struct h_run r;
    int port = start(&r, "rate", 3, "    rate_limit: {rate: 20/s, burst: 5}\n");
    long long t0 = pg_now_ms(r.pg);
    publish(&r, "q", JOBS, NULL);
    expect_no_faster(&r, "q", t0, JOBS, JOBS, RATE, BURST, "one sekalid, 3 workers");
    double limited = h_metric(port, "sekali_rate_limited_total{queue=\"%s\",job_type=\"test\"}",
                              r.queue);
    double delay = h_metric(port, "sekali_rate_limit_delay_seconds_total{queue=\"%s\","
                            "job_type=\"test\"}", r.queue);
    ck_assert_msg(limited >= 1 && delay > 0, "the jobs over the limit should be counted "
                  "(%g, delayed %g s)", limited, delay);
    ck_assert_int_eq(h_metric(port, "sekali_retries_total{queue=\"%s\",job_type=\"test\"}",
                              r.queue), 0);
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys "
                                "WHERE queue = '%s' AND attempts > 1", r.queue), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters "
                                "WHERE queue = '%s'", r.queue), 0);
    ck_assert_int_ge(h_count_events(r.log, "worker", SK_EVENT_RATE_LIMITED, NULL), 1);
    h_expect_once(&r, JOBS, 0);
    h_run_close(&r);
}
END_TEST

/* Two sekalids (two workers each) on one queue, as two hosts would be:
 * the limit is the one in Redis, not one per process, so together they
 * take as long as one would. */
START_TEST(test_two_sekalids_share_one_limit)
{
    struct h_run r;
    char top2[256];
    int port2;
    const char *yaml = "    rate_limit: {rate: 20/s, burst: 5}\n";
    int port = start(&r, "rateshared", 2, yaml);
    char *dir2 = h_tmpdir("rateshared2");
    char *config2 = h_write_config_top(dir2, r.queue, H_EFFECT, 2, yaml,
                                       settings(top2, sizeof(top2), &port2));
    pid_t second = h_start_sekalid("sekalid", config2, dir2, NULL);
    H_WAIT(h_consumers(r.b, r.queue) == 4, 30000, "4 workers should consume (%u do)",
           h_consumers(r.b, r.queue));

    long long t0 = pg_now_ms(r.pg);
    publish(&r, "s", JOBS, NULL);
    expect_no_faster(&r, "s", t0, JOBS, JOBS, RATE, BURST, "two sekalids (a limit of their own?)");
    /* Both took part: each ran some of the jobs. */
    ck_assert_msg(h_metric(port, "sekali_completions_total{queue=\"%s\",job_type=\"test\"}",
                           r.queue) >= 1 &&
                  h_metric(port2, "sekali_completions_total{queue=\"%s\",job_type=\"test\"}",
                           r.queue) >= 1, "both sekalids should have run jobs");
    h_stop_sekalid(second, dir2);
    h_run_stop(&r);
    h_expect_once(&r, JOBS, 0);
    free(config2);
    free(dir2);
    h_run_close(&r);
}
END_TEST

/* per: resource: 10/s with a burst of 2 for each resource. Two resources'
 * 20 jobs each: each resource's jobs take at least (20 - 2) / 10 = 1.8 s,
 * and a job of a third resource, published last, is not held behind them
 * (it has a limit of its own): it runs before the others are done. */
START_TEST(test_a_limit_per_resource_holds_for_each_resource_apart)
{
    struct h_run r;
    start(&r, "rateres", 2, "    rate_limit: {rate: 10/s, burst: 2, per: resource}\n");
    long long t0 = pg_now_ms(r.pg);
    publish(&r, "a", 20, "res-a");
    publish(&r, "b", 20, "res-b");
    publish(&r, "c", 1, "res-c");
    expect_no_faster(&r, "a", t0, 41, 20, 10, 2, "resource a");
    expect_no_faster(&r, "b", t0, 41, 20, 10, 2, "resource b");
    ck_assert_msg(last_effect_ms(&r, "c") < last_effect_ms(&r, "a") &&
                  last_effect_ms(&r, "c") < last_effect_ms(&r, "b"),
                  "the third resource's job should not wait for the other resources' limits");
    h_run_stop(&r);
    h_expect_once(&r, 41, 0);
    h_run_close(&r);
}
END_TEST

/* Workers SIGKILLed while the limit holds jobs back (some in delay
 * queues, some admitted, some mid-batch): every job still runs exactly
 * once, and the run is still no faster than the limit (a killed worker's
 * admitted jobs used their slots; their redeliveries ask again). */
START_TEST(test_workers_killed_under_a_limit_run_nothing_twice)
{
    struct h_run r;
    start(&r, "ratekill", 3, "    rate_limit: {rate: 20/s, burst: 5}\n");
    long long t0 = pg_now_ms(r.pg);
    publish(&r, "k", JOBS, NULL);
    int kills = 0;
    while (kills < 6 && h_completed(&r) < JOBS - 10) {
        pid_t pids[16];
        size_t n = h_children(r.sekalid, pids, 16);
        if (n > 0) {
            pid_t victim = pids[(size_t)rand() % n];
            if (kill(victim, SIGKILL) == 0) {
                H_WAIT(h_process_gone(victim), 10000, "child %ld should be dead", (long)victim);
                kills++;
            }
        }
        struct timespec t = { 0, 300 * 1000000L };
        nanosleep(&t, NULL);
    }
    ck_assert_int_ge(kills, 1);
    expect_no_faster(&r, "k", t0, JOBS, JOBS, RATE, BURST, "workers killed");
    h_run_stop(&r);
    h_expect_once(&r, JOBS, H_ANY_DUPS);
    h_run_close(&r);
}
END_TEST

/* Redis stopped under a limited queue whose lock would proceed without it
 * (on_redis_down: proceed): the limit fails closed. No job runs while
 * Redis is provably down (the workers logged the outage and re-scheduled
 * jobs for it); none fails or dead-letters; all run once after Redis is
 * back. */
START_TEST(test_a_limit_fails_closed_while_redis_is_down)
{
    struct h_run r;
    h_servers("start");
    int port = start(&r, "ratedown", 2,
                     "    on_redis_down: proceed\n    rate_limit: 1000/s\n");
    h_servers("stop-redis");
    publish(&r, "d", 20, NULL);
    H_WAIT(h_count_lines(r.log, "rate limit unknown (redis down): re-scheduled") >= 4, 60000,
           "the workers should hold jobs back while Redis is gone");
    ck_assert_int_ge(h_count_events(r.log, "worker", SK_EVENT_OUTAGE_BEGIN, SK_SERVER_REDIS), 1);
    ck_assert_int_eq(h_completed(&r), 0);
    h_servers("start-redis");
    H_WAIT(h_completed(&r) == 20, 120000, "all 20 jobs should complete once Redis is back, "
           "%lld did", h_completed(&r));
    ck_assert_int_ge(h_metric(port, "sekali_rate_limited_total{queue=\"%s\",job_type=\"test\"}",
                              r.queue), 4);
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters "
                                "WHERE queue = '%s'", r.queue), 0);
    h_expect_once(&r, 20, H_ANY_DUPS);
    h_run_close(&r);
}
END_TEST

/* Redis's count of reads from its clients (INFO stats): a client's
 * pipelined write is one read, so that the reads a worker caused are its
 * round trips. This command's own read is counted before it answers. */
static long long redis_reads(redisContext *redis)
{
    redisReply *reply = redisCommand(redis, "INFO stats");
    ck_assert_msg(reply != NULL && reply->type == REDIS_REPLY_STRING, "INFO stats failed");
    const char *at = strstr(reply->str, "total_reads_processed:");
    ck_assert_msg(at != NULL, "INFO stats has no total_reads_processed");
    long long n = atoll(at + strlen("total_reads_processed:"));
    freeReplyObject(reply);
    return n;
}

static bool redis_has(redisContext *redis, const char *key)
{
    redisReply *reply = redisCommand(redis, "EXISTS %s", key);
    bool has = reply != NULL && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
    freeReplyObject(reply);
    return has;
}

/* One job a batch, each waited for and its lock's release (sent when the
 * worker idles) seen: with a limit far above the rate and a lock, a batch
 * asks the limit and takes its lock in one round trip, so each job costs
 * Redis two reads (that one and the release), not three (the limit's, the
 * lock's, the release). Counted by Redis, every client's reads: this
 * test's own commands are taken off, and the lock's lease is long, so
 * that no renewal falls inside. */
START_TEST(test_a_limit_rides_the_locks_round_trip)
{
    enum { ROUNDS = 10 };
    struct h_run r;
    start(&r, "raterides", 1, "    rate_limit: 1000000/s\n    lock_ttl: 120s\n");
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    long long mine = 0, before = 0;
    for (int i = 0; i <= ROUNDS; i++) {
        char id[32], key[32], lock[256];
        snprintf(id, sizeof(id), "w-id-%d", i);
        snprintf(key, sizeof(key), "w-%d", i);
        snprintf(lock, sizeof(lock), "sekali:lock:%s:%s", r.queue, key);
        h_publish(r.b, r.queue, "test", id, key, key, "ok");
        H_WAIT(h_completed(&r) == i + 1, 60000, "job %d should complete", i);
        H_WAIT((mine++, !redis_has(redis, lock)), 60000, "job %d's lock should be released", i);
        if (i == 0) {  /* the first loads the scripts and opens the links */
            before = redis_reads(redis);
            mine = 0;
        }
    }
    long long reads = redis_reads(redis) - before - mine - 1;
    redisFree(redis);
    printf("%d jobs, one a batch: %lld Redis reads\n", ROUNDS, reads);
    ck_assert_msg(reads <= ROUNDS * 2 + ROUNDS / 2, "%d jobs, one a batch, cost Redis %lld "
                  "reads (%.1f a job): a batch's limit and locks should share one round "
                  "trip (2 a job with the release)", ROUNDS, reads, (double)reads / ROUNDS);
    h_run_stop(&r);
    h_expect_once(&r, ROUNDS + 1, 0);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_queue_limit_holds_and_jobs_over_it_wait_without_failing,
        test_two_sekalids_share_one_limit,
        test_a_limit_per_resource_holds_for_each_resource_apart,
        test_workers_killed_under_a_limit_run_nothing_twice,
        test_a_limit_fails_closed_while_redis_is_down,
        test_a_limit_rides_the_locks_round_trip,
        NULL,
    };
    return h_run_suite(h_suite("rate", 300, tests));
}
