/* check_distance.c - a far PostgreSQL makes batches larger, not smaller.
 *
 * sekalid's PostgreSQL link goes through tests/bench/delay_proxy.c (built
 * as build/tests/delay_proxy), which holds every byte DELAY_MS in each
 * direction, so each of the handler's statements costs a round trip of
 * 2 x DELAY_MS, longer than the queue's batch_close_after. A batch must
 * still commit its jobs together: it closes on PostgreSQL's round trips as
 * the span measures them, not on milliseconds (span.c, time_to_close()).
 * Which transaction committed each key is told by its row's xmin; how many
 * round trips came between a job's BEGIN and its statement, by
 * PostgreSQL's own clock (clock_timestamp() - now()), which the proxy's
 * delay makes a multiple of 2 x DELAY_MS. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define DELAY_MS       40   /* each way: a statement's round trip is 80 ms */
#define TRACE_DELAY_MS 100  /* the SQL handler's test: its margin is one delay */
#define GROW_DELAY_MS  5    /* a round trip of 10 ms: past batch_size.c's 8 ms step */
#define GROW_JOBS      200
#define JOBS           8
#define H_QUEUED       "tests/plugins/queued.so"
/* One batch of the JOBS, the job charged for a failed COMMIT dead at once. */
#define BLAME_YAML     "    batch: 8\n    prefetch: 8\n    batch_wait: 500ms\n    lock: false\n" \
                       "    retry:\n      max_attempts: 1\n"

struct proxy {
    pid_t pid;
    int   port;
};

/* A delay_proxy in front of the server on port, delay_ms each way; its
 * listening port is read from its "ready PORT" line. */
static void proxy_start_to(struct proxy *px, int port, int delay_ms)
{
    char path[1100], map[128];
    snprintf(path, sizeof(path), "%s/tests/delay_proxy", h_build_dir());
    snprintf(map, sizeof(map), "0:127.0.0.1:%d:%d", port, delay_ms);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    px->pid = fork();
    ck_assert_int_ge(px->pid, 0);
    if (px->pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl(path, path, map, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *out = fdopen(fds[0], "r");
    ck_assert_ptr_nonnull(out);
    char line[128] = "";
    bool ready = fgets(line, sizeof(line), out) != NULL &&
                 sscanf(line, "ready %d", &px->port) == 1;
    fclose(out);
    ck_assert_msg(ready, "%s did not start (is it built? make tests): \"%s\"", path, line);
}

/* ... in front of the test PostgreSQL. */
static void proxy_start(struct proxy *px, int delay_ms)
{
    proxy_start_to(px, atoi(getenv("SEKALI_PG_PORT")), delay_ms);
}

static void proxy_stop(struct proxy *px)
{
    kill(px->pid, SIGTERM);
    h_wait_exit(px->pid, 10000, "delay_proxy");
}

/* JOBS jobs, keys k-1.. k-JOBS, body "ok"; the bad-th's body "dup" (0: none). */
static void publish_jobs(struct h_run *r, int bad)
{
    for (int i = 1; i <= JOBS; i++) {
        char id[16], key[16];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r->b, r->queue, "test", id, key, NULL, i == bad ? "dup" : "ok");
    }
}

/* h_run_start(), with the configuration's PostgreSQL port the proxy's. */
static void start_far(struct h_run *r, const struct proxy *px, const char *handler,
                      const char *queue_yaml)
{
    r->config = h_write_config_top(r->dir, r->queue, handler, 1, queue_yaml, NULL);
    char from[64], to[64];
    snprintf(from, sizeof(from), "port=%s ", getenv("SEKALI_PG_PORT"));
    snprintf(to, sizeof(to), "port=%d ", px->port);
    h_config_replace(r->config, from, to);
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    char mark_env[1100];
    snprintf(mark_env, sizeof(mark_env), "SEKALI_FAILPOINT_MARK=%s", r->mark);
    const char *env[] = { mark_env, NULL };
    r->sekalid = h_start_sekalid("sekalid", r->config, r->dir, env);
    H_WAIT(h_consumers(r->b, r->queue) == 1, 30000, "the worker should consume %s", r->queue);
}

/* Eight jobs waiting before the worker starts, batch 8, batch_close_after
 * 50 ms against a statement's 80 ms round trip: before, every handler
 * outlasted batch_close_after and each transaction committed one job
 * (eight transactions); now the batch runs on, since its handlers have
 * run for far less than 16 round trips. Three transactions at most leave
 * room for a slow machine; the old code cannot commit fewer than eight. */
START_TEST(test_far_postgres_commits_a_batch_together)
{
    struct h_run r;
    h_run_open(&r, "farbatch");
    struct proxy px;
    proxy_start(&px, DELAY_MS);
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    publish_jobs(&r, 0);
    start_far(&r, &px, H_EFFECT, "    batch: 8\n    prefetch: 8\n    batch_wait: 500ms\n"
                       "    batch_close_after: 50ms\n    lock: false\n");
    H_WAIT(h_effect_keys(&r) == JOBS, 60000, "the %d jobs should commit, have %lld", JOBS,
           h_effect_keys(&r));
    h_run_stop(&r);
    proxy_stop(&px);
    h_expect_once(&r, JOBS, 0);
    long long transactions = h_pg_count(r.pg, "SELECT count(DISTINCT xmin::text) FROM "
                                              "sekali.idempotency_keys WHERE queue = '%s'",
                                        r.queue);
    printf("check_distance: %d jobs at %d ms each way committed in %lld transactions\n", JOBS,
           DELAY_MS, transactions);
    ck_assert_msg(transactions <= 3, "%d jobs of one batch at %d ms each way should commit in "
                  "at most 3 transactions, took %lld", JOBS, DELAY_MS, transactions);
    h_run_close(&r);
}
END_TEST

/* The stock SQL handler sets the job's trace context and runs its
 * statement in one round trip (pipeline mode), so the statement starts one
 * round trip after the claim's BEGIN (its answer, then the statement's
 * way there: 2 x TRACE_DELAY_MS), not two (the settings' round trip
 * between: 4 x TRACE_DELAY_MS, as before). Jobs one a transaction (batch:
 * 1); the first job also prepares the statement, so the least gap of the
 * four is compared, against 3 x TRACE_DELAY_MS: the old code cannot start
 * a statement sooner than 4 x TRACE_DELAY_MS. The statement also reads
 * the trace. */
START_TEST(test_sql_handler_sends_its_trace_with_its_statement)
{
    struct h_run r;
    h_run_open(&r, "fartrace");
    h_pg_exec(r.pg, "CREATE TABLE IF NOT EXISTS sekali_test.statement_gaps "
                    "(queue text, key text, gap_ms float8, traceparent text)");
    struct proxy px;
    proxy_start(&px, TRACE_DELAY_MS);
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    for (int i = 1; i <= 4; i++) {
        char id[16], key[16];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "{}");
    }
    start_far(&r, &px, "handlers/sql.so",
              "    batch: 1\n    lock: false\n    config:\n      statement: \"INSERT INTO "
              "sekali_test.statement_gaps VALUES (:queue, :idempotency_key, "
              "extract(epoch FROM clock_timestamp() - now()) * 1000, "
              "current_setting('sekali.traceparent', true))\"\n");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.statement_gaps WHERE queue = '%s'",
                      r.queue) == 4, 60000, "the 4 jobs should commit");
    h_run_stop(&r);
    proxy_stop(&px);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.statement_gaps WHERE "
                                      "queue = '%s' AND traceparent LIKE '00-%%'", r.queue), 4);
    long long gap = h_pg_count(r.pg, "SELECT min(gap_ms)::bigint FROM "
                                     "sekali_test.statement_gaps WHERE queue = '%s'", r.queue);
    printf("check_distance: at %d ms each way the SQL handler's statement started %lld ms "
           "after its BEGIN\n", TRACE_DELAY_MS, gap);
    ck_assert_msg(gap < 3 * TRACE_DELAY_MS, "the statement should start one round trip (%d ms) "
                  "after the claim's BEGIN, not two (%d ms): it started %lld ms after",
                  2 * TRACE_DELAY_MS, 4 * TRACE_DELAY_MS, gap);
    h_run_close(&r);
}
END_TEST

/* A handler that queues its INSERT (host->queue_sql(), ABI 1.8) has it
 * sent with the COMMIT: every job's statement of the batch runs one round
 * trip after the claim's BEGIN (the claim's answer back, the COMMIT's
 * pipeline out: 2 x DELAY_MS), on PostgreSQL's clock. The old way, each
 * statement its own round trip, runs the batch's last one JOBS round trips
 * after it. The bound is half of that: on a loaded machine the handlers,
 * the worker and the delaying proxy wait for a core (122 ms was seen with
 * a load of 10 on 2 cores), and the two ways stay far apart. */
START_TEST(test_far_postgres_queued_statements_ride_the_commit)
{
    struct h_run r;
    h_run_open(&r, "farqueued");
    struct proxy px;
    proxy_start(&px, DELAY_MS);
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    publish_jobs(&r, 0);
    start_far(&r, &px, H_QUEUED, "    batch: 8\n    prefetch: 8\n    batch_wait: 500ms\n"
                       "    batch_close_after: 50ms\n    lock: false\n");
    H_WAIT(h_completed(&r) == JOBS, 60000, "the %d jobs should complete, have %lld", JOBS,
           h_completed(&r));
    h_run_stop(&r);
    proxy_stop(&px);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.queued_effects WHERE "
                                      "queue = '%s'", r.queue), JOBS);
    long long gap = h_pg_count(r.pg, "SELECT max(gap_ms)::bigint FROM "
                                     "sekali_test.queued_effects WHERE queue = '%s'", r.queue);
    long long transactions = h_pg_count(r.pg, "SELECT count(DISTINCT xmin::text) FROM "
                                              "sekali_test.queued_effects WHERE queue = '%s'",
                                        r.queue);
    printf("check_distance: %d queued INSERTs at %d ms each way in %lld transactions, the "
           "last %lld ms after its BEGIN (%.1f round trips)\n", JOBS, DELAY_MS, transactions,
           gap, (double)gap / (2 * DELAY_MS));
    ck_assert_msg(gap < JOBS / 2 * 2 * DELAY_MS, "a batch's queued statements should run one "
                  "round trip (%d ms) after its BEGIN, not one a job (%d ms): the last ran %lld "
                  "ms after", 2 * DELAY_MS, JOBS * 2 * DELAY_MS, gap);
    h_run_close(&r);
}
END_TEST

/* GROW_JOBS jobs, keys k-1.., each with a resource of its own (r-1..)
 * when resources, so that every batch takes its locks. */
static void publish_grow_jobs(struct h_run *r, bool resources)
{
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    for (int i = 1; i <= GROW_JOBS; i++) {
        char id[16], key[16], resource[16];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        snprintf(resource, sizeof(resource), "r-%d", i);
        h_publish(r->b, r->queue, "test", id, key, resources ? resource : NULL, "ok");
    }
}

/* Every job done once, the consumer's prefetch grown from 8 to 64, then
 * sekalid and the proxy stopped; the batch_resized events to batch 32
 * that name server. */
static int expect_grown(struct h_run *r, struct proxy *px, const char *server)
{
    H_WAIT(h_completed(r) == GROW_JOBS, 90000, "the %d jobs should complete, have %lld",
           GROW_JOBS, h_completed(r));
    H_WAIT(h_consumer_prefetch(r->queue) == 64, 10000, "the consumer's prefetch should grow to "
           "64, is %d", h_consumer_prefetch(r->queue));
    h_run_stop(r);
    proxy_stop(px);
    /* Once each: the effects' primary key is (queue, key). */
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT count(*) FROM sekali_test.queued_effects WHERE "
                                       "queue = '%s'", r->queue), GROW_JOBS);
    ck_assert_int_eq(h_completed(r), GROW_JOBS);
    return h_count_event_where(r->log, SK_EVENT_BATCH_RESIZED, "queue", r->queue, "server",
                               server, "batch", "32", "prefetch", "64", NULL);
}

/* A far PostgreSQL (GROW_DELAY_MS each way: a round trip past 8 ms) grows
 * a worker's batch from 4 to its batch_max of 32, and its unset prefetch
 * from 8 to 64, a new consumer the broker counts (batch_size.c). With a
 * handler that queues its statement no transaction closes early, so
 * transactions commit more jobs than the first window held: the old code
 * could not commit more than 4 together. Every job once. */
START_TEST(test_far_postgres_grows_the_batch_and_the_prefetch)
{
    struct h_run r;
    h_run_open(&r, "fargrow");
    struct proxy px;
    proxy_start(&px, GROW_DELAY_MS);
    publish_grow_jobs(&r, false);
    start_far(&r, &px, H_QUEUED, "    batch: 4\n    batch_max: 32\n    lock: false\n");
    int resized = expect_grown(&r, &px, SK_SERVER_POSTGRES);
    long long largest = h_pg_count(r.pg, "SELECT max(n) FROM (SELECT count(*) AS n FROM "
                                         "sekali_test.queued_effects WHERE queue = '%s' "
                                         "GROUP BY xmin::text) t", r.queue);
    printf("check_distance: %d jobs at %d ms each way, batch 4 grown to 32 (%d events), at "
           "most %lld jobs a transaction\n", GROW_JOBS, GROW_DELAY_MS, resized, largest);
    ck_assert_msg(resized >= 1, "the worker should log its batch grown to 32");
    ck_assert_msg(largest > 8, "a grown batch should commit more than the first window's 8 "
                  "jobs together, at most %lld did", largest);
    h_run_close(&r);
}
END_TEST

/* The same with Redis far and PostgreSQL near: a batch's lock is one of
 * its round trips, so the farther server decides, and the event names it. */
START_TEST(test_far_redis_grows_the_batch_too)
{
    struct h_run r;
    h_run_open(&r, "farredis");
    int redis_port = h_test_tls() ? atoi(getenv("SEKALI_REDIS_TLS_PORT")) : h_redis_port();
    struct proxy px;
    proxy_start_to(&px, redis_port, GROW_DELAY_MS);
    publish_grow_jobs(&r, true);
    r.config = h_write_config_top(r.dir, r.queue, H_QUEUED, 1,
                                  "    batch: 4\n    batch_max: 32\n", NULL);
    char from[64], to[64];
    snprintf(from, sizeof(from), "  port: %d\n", redis_port);
    snprintf(to, sizeof(to), "  port: %d\n", px.port);
    h_config_replace(r.config, from, to);
    char mark_env[1100];
    snprintf(mark_env, sizeof(mark_env), "SEKALI_FAILPOINT_MARK=%s", r.mark);
    const char *env[] = { mark_env, NULL };
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, env);
    int resized = expect_grown(&r, &px, SK_SERVER_REDIS);
    printf("check_distance: Redis at %d ms each way grew batch 4 to 32 (%d events)\n",
           GROW_DELAY_MS, resized);
    ck_assert_msg(resized >= 1, "the worker should log its batch grown to 32 for Redis");
    h_run_close(&r);
}
END_TEST

/* The row "taken" (tests/data/effects.sql), which a job whose body is
 * "dup" breaks the unique key on; and r's queue declared. */
static void taken_row(struct h_run *r)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali_test.queued_effects VALUES ('%s', 'taken', 0)",
             r->queue);
    h_pg_exec(r->pg, sql);
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
}

/* The blame rule: one job's queued INSERT breaks a unique key at the
 * COMMIT of a batch of JOBS. With retry.max_attempts 1, a job charged for
 * it is dead-lettered at once: so only that job may end failed, and every
 * other job's row is there exactly once (they ran again, each alone,
 * spending no attempt). */
START_TEST(test_queued_statement_failing_charges_its_job_alone)
{
    struct h_run r;
    h_run_open(&r, "queuedblame");
    taken_row(&r);
    publish_jobs(&r, 4);
    h_run_start(&r, &(struct h_run_opts){ .handler = H_QUEUED, .workers = 1,
                                          .queue_yaml = BLAME_YAML });
    H_WAIT(h_completed(&r) + h_failed(&r) == JOBS, 60000, "the %d jobs should settle, have "
           "%lld completed, %lld failed", JOBS, h_completed(&r), h_failed(&r));
    long long completed = h_completed(&r), failed = h_failed(&r);
    h_stop_sekalid(r.sekalid, r.dir);
    char status[32];
    printf("check_distance: a queued statement failing in a batch of %d: %lld completed, %lld "
           "failed (k-4: %s)\n", JOBS, completed, failed,
           h_key_status(&r, "k-4", status, sizeof(status)));
    ck_assert_int_eq(completed, JOBS - 1);
    ck_assert_str_eq(h_key_status(&r, "k-4", status, sizeof(status)), "failed");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.queued_effects WHERE "
                                      "queue = '%s' AND key LIKE 'k-%%'", r.queue), JOBS - 1);
    h_run_close(&r);
}
END_TEST

/* A batch's claim counts its duplicates, and only its COMMIT makes that
 * count true. When a queued statement fails that COMMIT, the batch-mates
 * run again alone, but a duplicate was settled at its claim and is not
 * claimed again: its count must be written anyway. k-2 completes first;
 * then JOBS jobs wait, k-2 among them again and k-4's INSERT failing, and
 * run as one batch: k-2's key counts one duplicate delivery. Before, the
 * count went with the rolled-back batch (found by check_queued_crash). */
START_TEST(test_queued_statement_failing_keeps_the_batch_duplicates_count)
{
    struct h_run r;
    h_run_open(&r, "queueddups");
    taken_row(&r);
    h_publish(r.b, r.queue, "test", "m-2", "k-2", NULL, "ok");
    h_run_start(&r, &(struct h_run_opts){ .handler = H_QUEUED, .workers = 1,
                                          .queue_yaml = BLAME_YAML });
    H_WAIT(h_completed(&r) == 1, 30000, "k-2 should complete first");
    h_stop_sekalid(r.sekalid, r.dir);
    publish_jobs(&r, 4);
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_completed(&r) + h_failed(&r) == JOBS && h_queue_depth(r.b, r.queue) == 0, 60000,
           "the %d jobs should settle, have %lld completed, %lld failed", JOBS, h_completed(&r),
           h_failed(&r));
    h_run_stop(&r);
    long long dups = h_duplicates(&r);
    printf("check_distance: a duplicate in a batch whose queued statement failed: %lld "
           "duplicates counted, %lld completed\n", dups, h_completed(&r));
    ck_assert_int_eq(dups, 1);
    ck_assert_int_eq(h_completed(&r), JOBS - 1);
    h_run_close(&r);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("distance");
    TCase *tc = tcase_create("far");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_far_postgres_commits_a_batch_together);
    tcase_add_test(tc, test_sql_handler_sends_its_trace_with_its_statement);
    tcase_add_test(tc, test_far_postgres_queued_statements_ride_the_commit);
    tcase_add_test(tc, test_far_postgres_grows_the_batch_and_the_prefetch);
    tcase_add_test(tc, test_far_redis_grows_the_batch_too);
    tcase_add_test(tc, test_queued_statement_failing_charges_its_job_alone);
    tcase_add_test(tc, test_queued_statement_failing_keeps_the_batch_duplicates_count);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
