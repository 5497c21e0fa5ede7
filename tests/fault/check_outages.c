/* check_outages.c - each server going away in the middle of a run.
 *
 * Every test first proves the outage really happened (the server's process
 * was stopped or restarted by tests/servers.sh, and the workers logged it:
 * their outage lines are found by event name, SK_EVENT_OUTAGE_*),
 * then that every key's effect exists exactly once and nothing is left in
 * the queue. The servers are shared with the other suites, so each test
 * starts by making sure all three run, and restores the one it stopped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define JOBS   300

static void start(struct h_run *r, const char *name, const char *queue_yaml)
{
    h_servers("start");
    h_run_open(r, name);
    h_run_start(r, &(struct h_run_opts){ .workers = 4, .queue_yaml = queue_yaml });
}

/* Publishes jobs [from, to): the second half of each test goes out after
 * the fault, so some jobs must be done while or after it happens. */
static void publish_jobs(struct h_run *r, int from, int to, const char *body)
{
    for (int i = from; i < to; i++) {
        char id[64];
        snprintf(id, sizeof(id), "job-%d", i);
        h_publish(r->b, r->queue, "test", id, NULL, NULL, body);
    }
}

/* Starts the run and publishes the first half of the jobs; returns once 50
 * are done, so that the fault (before what) comes mid-run. */
static void start_mid_run(struct h_run *r, const char *name, const char *queue_yaml,
                          const char *what)
{
    start(r, name, queue_yaml);
    publish_jobs(r, 0, JOBS / 2, "sleep:5");
    H_WAIT(h_completed(r) >= 50, 30000, "50 jobs should complete before %s", what);
}

/* Exactly once: JOBS keys completed, JOBS effects, none doubled, queue
 * empty. Copies that an outage had redelivered may be duplicates. */
static void expect_exactly_once(struct h_run *r)
{
    H_WAIT(h_completed(r) == JOBS, 90000, "expected %d completed keys, have %lld", JOBS,
           h_completed(r));
    h_run_stop(r);
    h_expect_once(r, JOBS, H_ANY_DUPS);
    h_run_close(r);
}

START_TEST(test_redis_stopped_mid_run_with_proceed_policy)
{
    struct h_run r;
    start_mid_run(&r, "redis-proceed", "    on_redis_down: proceed\n", "the outage");
    h_servers("stop-redis");
    publish_jobs(&r, JOBS / 2, JOBS, "sleep:5");
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_OUTAGE_BEGIN, SK_SERVER_REDIS) >= 1, 30000,
           "the workers should notice that Redis is gone");
    H_WAIT(h_completed(&r) == JOBS, 60000, "every job should complete without Redis, %lld did",
           h_completed(&r));
    h_servers("start-redis");
    expect_exactly_once(&r);
}
END_TEST

START_TEST(test_redis_stopped_mid_run_with_wait_policy)
{
    struct h_run r;
    start(&r, "redis-wait", "    on_redis_down: wait\n");
    h_servers("stop-redis");
    publish_jobs(&r, 0, JOBS, "ok");
    H_WAIT(h_count_outcomes(r.log, "rescheduled", "redis_down") >= 4, 30000,
           "the workers should hold jobs back while Redis is gone");
    /* Redis is provably down here, and no job may run without its lock. */
    ck_assert_int_eq(h_completed(&r), 0);
    ck_assert_int_ge(h_count_event_where(r.log, SK_EVENT_OUTAGE_BEGIN, "server", SK_SERVER_REDIS,
                                         "on_redis_down", "wait", NULL), 1);
    h_servers("start-redis");
    expect_exactly_once(&r);
}
END_TEST

START_TEST(test_postgres_restarted_mid_run)
{
    struct h_run r;
    start_mid_run(&r, "pg-restart", NULL, "the restart");
    PQfinish(r.pg);
    h_servers("restart-postgres");
    r.pg = h_pg();
    publish_jobs(&r, JOBS / 2, JOBS, "sleep:5");
    /* A worker busy when PostgreSQL stopped finds it gone (a failed claim
     * or connect) and logs the outage and its end; one that was idle (on a
     * loaded machine the first half is often done before the restart) is
     * told by the server's FATAL to its idle session, and reconnects at its
     * next job. Either is the workers noticing; the second half, published
     * after the restart, all running once is their coming back. */
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_OUTAGE_END, SK_SERVER_POSTGRES) >= 1 ||
           h_count_lines(r.log, "terminating connection due to administrator command") >= 1,
           30000, "the workers should notice that PostgreSQL went away");
    expect_exactly_once(&r);
}
END_TEST

START_TEST(test_rabbitmq_connections_closed_mid_run)
{
    struct h_run r;
    start_mid_run(&r, "amqp-close", NULL, "the connections close");
    sk_broker_close(r.b);
    ck_assert_int_eq(system("\"$SEKALI_RABBITMQCTL\" close_all_connections test "
                            ">/dev/null 2>&1"), 0);
    r.b = h_broker();
    publish_jobs(&r, JOBS / 2, JOBS, "sleep:5");
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_OUTAGE_BEGIN, SK_SERVER_RABBITMQ) >= 4,
           30000, "every worker should lose its connection");
    H_WAIT(h_consumers(r.b, r.queue) == 4, 30000, "the workers should consume again");
    expect_exactly_once(&r);
}
END_TEST

START_TEST(test_rabbitmq_restarted_mid_run)
{
    struct h_run r;
    start_mid_run(&r, "amqp-restart", NULL, "the restart");
    sk_broker_close(r.b);
    h_servers("restart-rabbitmq");
    r.b = h_broker();
    publish_jobs(&r, JOBS / 2, JOBS, "sleep:5");
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_OUTAGE_BEGIN, SK_SERVER_RABBITMQ) >= 4,
           30000, "every worker should lose its connection");
    H_WAIT(h_consumers(r.b, r.queue) == 4, 60000, "the workers should consume again");
    expect_exactly_once(&r);
}
END_TEST

static void broker_env(const char *key, long value)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "\"$SEKALI_RABBITMQCTL\" eval "
             "'application:set_env(rabbit, %s, %ld).' >/dev/null 2>&1", key, value);
    ck_assert_msg(system(cmd) == 0, "rabbitmqctl eval set_env %s failed", key);
}

/* The broker gives up on an unacked delivery after consumer_timeout and
 * hands it to another consumer while the first worker is still running it.
 * The redelivered copy must not run while the first is alive: the Redis
 * lock (and under it the key's row) keeps it out, and once the first
 * commits, the copy is a duplicate. Channels read the timeout when they
 * open, so the broker's setting is lowered before sekalid starts and
 * restored after. */
START_TEST(test_job_outliving_consumer_timeout_runs_once)
{
    h_init();
    h_servers("start");
    broker_env("consumer_timeout", 2000);
    broker_env("channel_tick_interval", 500);
    struct h_run r;
    start(&r, "ackout", "    lock_ttl: 3s\n");
    h_publish(r.b, r.queue, "test", "slow-1", "k-slow", NULL, "sleep:6000");
    H_WAIT(h_count_lines(r.log, "delivery acknowledgement on channel") >= 1, 30000,
           "the broker should close the slow worker's channel for its late ack");
    broker_env("consumer_timeout", 3600000);
    broker_env("channel_tick_interval", 60000);
    H_WAIT(h_duplicates(&r) >= 1, 60000, "the redelivered copy should end as a duplicate");
    ck_assert_int_eq(h_effects(&r, NULL), 1);
    h_run_stop(&r);
    h_expect_once(&r, 1, H_ANY_DUPS);
    h_run_close(&r);
}
END_TEST

/* RabbitMQ stopped: enqueued jobs wait in the outbox (the relay reports the
 * outage and retries), and once the broker is back every one is published
 * and runs once. */
START_TEST(test_outbox_rows_wait_for_rabbitmq_and_all_run_once)
{
    h_servers("start");
    struct h_run r;
    h_run_open(&r, "outbox-down");
    /* Ready by sekalid's own word: the test's broker connection goes before
     * the broker does, so it is closed as soon as the queue is declared. */
    r.config = h_write_config_top(r.dir, r.queue, H_EFFECT, 2, NULL, H_RELAY);
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    sk_broker_close(r.b);
    r.b = NULL;
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_count_events(r.log, "supervisor", SK_EVENT_READY, NULL) == 1, 20000,
           "sekalid should become ready");

    h_servers("stop-rabbitmq");
    char sql[512];
    snprintf(sql, sizeof(sql), "SELECT count(sekali.enqueue('%s', 'test', 'ok'::bytea, "
             "'k-' || i)) FROM generate_series(1, 100) AS i", r.queue);
    ck_assert_int_eq(h_pg_count(r.pg, "%s", sql), 100);
    H_WAIT(h_count_events(r.log, "relay", SK_EVENT_OUTAGE_BEGIN, SK_SERVER_RABBITMQ) >= 1, 30000,
           "the relay should notice that RabbitMQ is gone");
    /* The broker is provably down: nothing can have been published. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND published_at IS NOT NULL", r.queue), 0);

    h_servers("start-rabbitmq");
    H_WAIT(h_completed(&r) == 100, 90000,
           "every waiting job should run once RabbitMQ is back, %lld did", h_completed(&r));
    h_stop_sekalid(r.sekalid, r.dir);
    h_expect_once(&r, 100, H_ANY_DUPS);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND published_at IS NULL", r.queue), 0);
    h_run_close(&r);
}
END_TEST

/* Runs once after the test case, even when a test failed midway, so that
 * later suites meet the broker's normal consumer timeout. */
static void restore_broker_env(void)
{
    if (system("\"$SEKALI_RABBITMQCTL\" eval 'application:set_env(rabbit, consumer_timeout, "
               "3600000), application:set_env(rabbit, channel_tick_interval, 60000).' "
               ">/dev/null 2>&1") != 0)
        fprintf(stderr, "check_outages: could not restore the broker's consumer_timeout\n");
}

int main(void)
{
    const TTest *tests[] = {
        test_redis_stopped_mid_run_with_proceed_policy,
        test_redis_stopped_mid_run_with_wait_policy,
        test_postgres_restarted_mid_run,
        test_rabbitmq_connections_closed_mid_run,
        test_rabbitmq_restarted_mid_run,
        test_job_outliving_consumer_timeout_runs_once,
        test_outbox_rows_wait_for_rabbitmq_and_all_run_once,
        NULL,
    };
    Suite *s = suite_create("outages");
    TCase *tc = h_tcase(s, "outages", 600, tests);
    tcase_add_unchecked_fixture(tc, NULL, restore_broker_env);
    return h_run_suite(s);
}
