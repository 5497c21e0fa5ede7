/* check_history.c - the janitor's minute rows of sekali.history (history.c,
 * sql/037 and 038) against a real PostgreSQL: every count the workers make
 * lands in the rows once, through a failed write and a janitor that
 * replaces one that died; and hosts that send their queues in other orders
 * never deadlock on the minute they add to.
 *
 * The writer runs in the test's process, over a metrics area of its own
 * (the shared memory sekalid's workers count into), so that each count and
 * each failed write is the test's to place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "harness.h"
#include "history.h"
#include "metrics.h"

/* A name no earlier run used: the rows of every run stay in the database. */
static void unique_name(char *out, size_t size, const char *what)
{
    snprintf(out, size, "history-%s-%ld-%lld", what, (long)getpid(), (long long)h_now_ms());
}

static long long written(PGconn *pg, const char *queue, const char *column)
{
    return h_pg_count(pg, "SELECT coalesce(sum(%s), 0) FROM sekali.history WHERE queue = '%s'",
                      column, queue);
}

static void count(struct sk_metrics_type *t, enum sk_metric c, int n)
{
    for (int i = 0; i < n; i++)
        sk_metrics_inc(t, c);
}

static void expect_written(PGconn *pg, const char *queue, long long completed,
                           long long retried, long long dead, long long duplicates,
                           const char *after)
{
    ck_assert_msg(written(pg, queue, "completed") == completed &&
                  written(pg, queue, "retried") == retried &&
                  written(pg, queue, "dead_lettered") == dead &&
                  written(pg, queue, "duplicates") == duplicates,
                  "after %s, sekali.history should hold %lld completed, %lld retried, %lld "
                  "dead-lettered, %lld duplicates; holds %lld, %lld, %lld, %lld", after,
                  completed, retried, dead, duplicates, written(pg, queue, "completed"),
                  written(pg, queue, "retried"), written(pg, queue, "dead_lettered"),
                  written(pg, queue, "duplicates"));
}

START_TEST(test_each_count_is_written_once_through_a_failed_write_and_a_new_janitor)
{
    h_init();
    PGconn *pg = h_pg();
    char queue[96];
    unique_name(queue, sizeof(queue), "once");
    struct sk_queue_conf qc = { .name = queue };
    struct sk_conf conf = { .queues = &qc, .n_queues = 1 };
    struct sk_metrics *m = NULL;
    struct sk_err err = { 0 };
    ck_assert_int_eq(sk_metrics_create(&m, 1, 0, &err), SK_OK);
    struct sk_metrics_type *t = sk_metrics_lookup(sk_metrics_queue(m, 0), "test");

    struct sk_history *h = sk_history_new(&conf, m, true);
    ck_assert_ptr_nonnull(h);
    count(t, SK_METRIC_COMPLETIONS, 3);
    count(t, SK_METRIC_RETRIES, 1);
    count(t, SK_METRIC_DUPLICATES, 1);
    sk_metrics_dead_letter(t, SK_METRICS_FAILED);
    ck_assert_int_eq(sk_history_write(h, pg), SK_OK);
    expect_written(pg, queue, 3, 1, 1, 1, "the first round");
    ck_assert_int_eq(sk_history_write(h, pg), SK_OK);
    expect_written(pg, queue, 3, 1, 1, 1, "a round with nothing new");

    /* A round that fails (here: its session's transaction is aborted)
     * leaves its counts to a later round, neither lost nor doubled. */
    count(t, SK_METRIC_COMPLETIONS, 2);
    h_pg_exec(pg, "BEGIN");
    PQclear(PQexec(pg, "SELECT 1/0"));
    ck_assert_int_ne(sk_history_write(h, pg), SK_OK);
    h_pg_exec(pg, "ROLLBACK");
    expect_written(pg, queue, 3, 1, 1, 1, "a failed round");
    count(t, SK_METRIC_COMPLETIONS, 1);
    count(t, SK_METRIC_RETRIES, 1);
    ck_assert_int_eq(sk_history_write(h, pg), SK_OK);
    expect_written(pg, queue, 6, 2, 1, 1, "the round after a failed one");

    /* A janitor that replaces one that died finds the area as it was:
     * what is counted there was written, and is not written again. */
    count(t, SK_METRIC_DUPLICATES, 1);
    ck_assert_int_eq(sk_history_write(h, pg), SK_OK);
    sk_history_free(h);
    h = sk_history_new(&conf, m, false);
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(sk_history_write(h, pg), SK_OK);
    expect_written(pg, queue, 6, 2, 1, 2, "a new janitor's first round");
    count(t, SK_METRIC_COMPLETIONS, 1);
    ck_assert_int_eq(sk_history_write(h, pg), SK_OK);
    expect_written(pg, queue, 7, 2, 1, 2, "a new janitor's count");

    sk_history_free(h);
    sk_metrics_destroy(m);
    PQfinish(pg);
}
END_TEST

/* One host's round: one completion for each of its queues, in its order. */
static void add_sql(char *sql, size_t size, const char *first, const char *second)
{
    if (second == NULL)
        snprintf(sql, size, "SELECT sekali.add_history(ARRAY['%s'], '{1}', '{0}', '{0}', "
                 "'{0}')", first);
    else
        snprintf(sql, size, "SELECT sekali.add_history(ARRAY['%s', '%s'], '{1,1}', '{0,0}', "
                 "'{0,0}', '{0,0}')", first, second);
}

static long long lock_waits(PGconn *watch, int pid)
{
    return h_pg_count(watch, "SELECT count(*) FROM pg_locks WHERE pid = %d AND NOT granted", pid);
}

/* Host A lists queue "a" before "b", host B the other way round. A's round
 * is held after its first row (two statements of one transaction place
 * the moment: one statement would take both rows at once); B's round runs
 * meanwhile. On sql/037 B took b's row and waited for a's, A's second row
 * then waited for B: one of them failed with "deadlock detected". */
START_TEST(test_hosts_adding_a_minute_in_opposite_orders_both_finish)
{
    h_init();
    PGconn *a = h_pg(), *b = h_pg(), *watch = h_pg();
    char base[80], qa[96], qb[96], sql[512];
    unique_name(base, sizeof(base), "order");
    snprintf(qa, sizeof(qa), "%s-a", base);
    snprintf(qb, sizeof(qb), "%s-b", base);
    /* A bound on each, should both wait for ever (they cannot: PostgreSQL
     * breaks a deadlock after deadlock_timeout). */
    h_pg_exec(a, "SET statement_timeout = '60s'");
    h_pg_exec(b, "SET statement_timeout = '60s'");

    /* Both rounds must add to one minute (PostgreSQL's, at each
     * transaction's start): not begun in its last seconds. */
    H_WAIT(h_pg_count(watch, "SELECT (extract(second FROM clock_timestamp()) < 50)::int") == 1,
           15000, "PostgreSQL's minute should be young");
    h_pg_exec(a, "BEGIN");
    add_sql(sql, sizeof(sql), qa, NULL);
    h_pg_exec(a, sql);
    add_sql(sql, sizeof(sql), qb, qa);
    ck_assert_msg(PQsendQuery(b, sql) == 1, "PQsendQuery: %s", PQerrorMessage(b));
    H_WAIT(lock_waits(watch, PQbackendPID(b)) > 0, 20000,
           "host B's round should wait for host A's row of %s", qa);
    add_sql(sql, sizeof(sql), qb, NULL);
    PGresult *res = PQexec(a, sql);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK,
                  "host A's second row failed: %s", PQresultErrorMessage(res));
    PQclear(res);
    h_pg_exec(a, "COMMIT");
    res = PQgetResult(b);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "host B's round failed: %s",
                  PQresultErrorMessage(res));
    PQclear(res);
    ck_assert_ptr_null(PQgetResult(b));

    ck_assert_int_eq(written(watch, qa, "completed"), 2);
    ck_assert_int_eq(written(watch, qb, "completed"), 2);
    PQfinish(a);
    PQfinish(b);
    PQfinish(watch);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_each_count_is_written_once_through_a_failed_write_and_a_new_janitor,
        test_hosts_adding_a_minute_in_opposite_orders_both_finish,
        NULL,
    };
    return h_run_suite(h_suite("history", 60, tests));
}
