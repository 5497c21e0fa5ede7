/* check_concurrency.c - queues[].concurrency on real servers: a resource
 * admits up to N jobs at once (a Redis semaphore in the lock's place), not
 * one and not more, and every effect happens once; workers SIGKILLed
 * while they hold permits run nothing twice. A fault suite: one test
 * kills workers (tests/README.md: never beside another suite on one
 * server set).
 *
 * How many jobs ran at once is read on PostgreSQL's clock: a trigger
 * stamps each effect of the test's queue with clock_timestamp() when the
 * handler inserts it, right after the handler slept SLEEP_MS; the span
 * [stamp - SLEEP_MS, stamp] lies inside the handler's run, which lies
 * inside the permit's holding, so the most spans over one instant can
 * only undercount the holders, never overcount them. Load makes the runs
 * longer, not the count higher. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

enum { LIMIT = 3, JOBS = 30, SLEEP_MS = 300, WORKERS = 6 };

/* Stamps the queue's effects with the time their INSERT ran (the table's
 * own created_at is the transaction's start). */
static void stamp_effects(struct h_run *r)
{
    h_pg_exec(r->pg, "CREATE TABLE IF NOT EXISTS sekali_test.concurrency_spans "
              "(queue text, idempotency_key text, ended timestamptz)");
    h_pg_exec(r->pg, "CREATE OR REPLACE FUNCTION sekali_test.stamp_span() RETURNS trigger "
              "LANGUAGE plpgsql AS $$ BEGIN INSERT INTO sekali_test.concurrency_spans "
              "VALUES (NEW.queue, NEW.idempotency_key, clock_timestamp()); RETURN NEW; END $$");
    h_pg_exec(r->pg, "DROP TRIGGER IF EXISTS stamp_span ON sekali_test.effects");
    h_pg_exec(r->pg, "CREATE TRIGGER stamp_span AFTER INSERT ON sekali_test.effects "
              "FOR EACH ROW EXECUTE FUNCTION sekali_test.stamp_span()");
}

static void unstamp_effects(struct h_run *r)
{
    h_pg_exec(r->pg, "DROP TRIGGER IF EXISTS stamp_span ON sekali_test.effects");
}

/* The most committed spans of r's queue that cover one instant (the start
 * of one of them, where the count can only rise). */
static long long most_at_once(struct h_run *r)
{
    return h_pg_count(r->pg, "WITH s AS (SELECT ended - interval '%d milliseconds' AS b, ended "
                      "FROM sekali_test.concurrency_spans WHERE queue = '%s') "
                      "SELECT coalesce(max((SELECT count(*) FROM s t WHERE t.b <= s.b "
                      "AND t.ended > s.b)), 0) FROM s", SLEEP_MS, r->queue);
}

static void publish(struct h_run *r, const char *prefix, int n)
{
    char body[32];
    snprintf(body, sizeof(body), "sleep:%d", SLEEP_MS);
    for (int i = 0; i < n; i++) {
        char id[64], key[64];
        snprintf(id, sizeof(id), "%s-id-%d", prefix, i);
        snprintf(key, sizeof(key), "%s-%d", prefix, i);
        h_publish(r->b, r->queue, "test", id, key, "one-resource", body);
    }
}

static const char queue_yaml[] = "    concurrency: 3\n    batch: 1\n    lock_ttl: 2s\n";

/* JOBS jobs of one resource, WORKERS workers, concurrency 3: at most 3
 * ran at once, and at least 2 did (a semaphore that admits one, as the
 * plain lock does, fails it), every effect once. sekali_locks_held shows
 * the 3 permits held while the other workers wait for one (a count of the
 * locks asked for would show up to 6), and none once the queue is idle. */
START_TEST(test_a_resource_admits_up_to_its_concurrency_at_once)
{
    struct h_run r;
    h_run_open(&r, "concurrency");
    stamp_effects(&r);
    char top[64], held[192];
    int port = h_metrics_top(top, sizeof(top));
    snprintf(held, sizeof(held), "sekali_locks_held{queue=\"%s\"}", r.queue);
    h_run_start(&r, &(struct h_run_opts){ .workers = WORKERS, .queue_yaml = queue_yaml,
                                          .top_yaml = top });
    publish(&r, "c", JOBS);
    H_WAIT(h_metric(port, "%s", held) == LIMIT, 60000, "%s should reach %d while jobs wait "
           "for a permit, last %g", held, LIMIT, h_metric(port, "%s", held));
    H_WAIT(h_completed(&r) == JOBS, 180000, "all %d jobs should complete, %lld did", JOBS,
           h_completed(&r));
    H_WAIT(h_metric(port, "%s", held) == 0, 20000, "%s should drop to 0 once the queue is "
           "idle, last %g", held, h_metric(port, "%s", held));
    long long most = most_at_once(&r);
    unstamp_effects(&r);
    ck_assert_msg(most <= LIMIT, "%lld jobs of one resource ran at once, concurrency %d", most,
                  LIMIT);
    ck_assert_msg(most >= 2, "at most %lld job of one resource ran at a time: concurrency %d "
                  "admitted no more than the plain lock", most, LIMIT);
    h_run_stop(&r);
    h_expect_once(&r, JOBS, H_ANY_DUPS);
    h_run_close(&r);
}
END_TEST

/* Workers SIGKILLed while they hold permits (each holds one for its
 * whole 300 ms job): the permits come free (released by the replacement
 * from the scoreboard, or at the latest at lock_ttl), the rest of the jobs
 * finish, still no more than 3 at once, and none ran twice. */
START_TEST(test_workers_killed_holding_permits_run_nothing_twice)
{
    struct h_run r;
    h_run_open(&r, "concurrencykill");
    stamp_effects(&r);
    h_run_start(&r, &(struct h_run_opts){ .workers = WORKERS, .queue_yaml = queue_yaml });
    publish(&r, "k", JOBS);
    char key[256];
    snprintf(key, sizeof(key), "sekali:lock:%s:one-resource", r.queue);
    int kills = 0;
    while (kills < 4 && h_completed(&r) < JOBS - 8) {
        pid_t pids[16];
        size_t n = h_children(r.sekalid, pids, 16);
        if (n > 0 && h_redis_exists(key)) {
            pid_t victim = pids[(size_t)rand() % n];
            if (kill(victim, SIGKILL) == 0) {
                H_WAIT(h_process_gone(victim), 10000, "child %ld should be dead", (long)victim);
                kills++;
            }
        }
        struct timespec t = { 0, 400 * 1000000L };
        nanosleep(&t, NULL);
    }
    ck_assert_int_ge(kills, 1);
    H_WAIT(h_completed(&r) == JOBS, 180000, "all %d jobs should complete after %d kills, "
           "%lld did", JOBS, kills, h_completed(&r));
    long long most = most_at_once(&r);
    unstamp_effects(&r);
    ck_assert_msg(most <= LIMIT, "%lld jobs of one resource ran at once after kills", most);
    h_run_stop(&r);
    /* Nothing holds a permit once the run is over: none outlived its lease. */
    H_WAIT(!h_redis_exists(key), 10000, "the semaphore %s should be gone", key);
    h_expect_once(&r, JOBS, H_ANY_DUPS);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_resource_admits_up_to_its_concurrency_at_once,
        test_workers_killed_holding_permits_run_nothing_twice,
        NULL,
    };
    return h_run_suite(h_suite("concurrency", 300, tests));
}
