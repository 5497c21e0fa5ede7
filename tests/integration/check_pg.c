/* check_pg.c - the libpq seam (src/adapters/pg.c) against a real PostgreSQL: every
 * outcome of a statement reads as one SK_* code, the dial gives each
 * session sekali's settings without losing the user's, and a reset (for a
 * pool) returns a session to them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "pg.h"

/* A dial as sekalid's: the test server's conninfo, a short lock_timeout. */
static PGconn *dial(const char *extra_conninfo, struct sk_err *err)
{
    char conninfo[1024];
    snprintf(conninfo, sizeof(conninfo), "%s%s", h_pg_conninfo(),
             extra_conninfo != NULL ? extra_conninfo : "");
    struct sk_postgres_conf conf = { .conninfo = conninfo, .lock_timeout_ms = 300,
                                     .idle_in_transaction_timeout_ms = 60000 };
    return sk_pg_dial(&conf, "check_pg", err);
}

static char *show(PGconn *pg, const char *setting)
{
    static char value[256];
    char sql[128];
    snprintf(sql, sizeof(sql), "SHOW %s", setting);
    PGresult *res = PQexec(pg, sql);
    ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
    snprintf(value, sizeof(value), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return value;
}

START_TEST(test_dial_keeps_the_users_options_and_adds_sekalis)
{
    struct sk_err err = { 0 };
    PGconn *pg = dial(" options='-c statement_timeout=4321'", &err);
    ck_assert_msg(pg != NULL, "dial failed: %s", err.msg);
    ck_assert_str_eq(show(pg, "statement_timeout"), "4321ms");
    ck_assert_str_eq(show(pg, "lock_timeout"), "300ms");
    ck_assert_str_eq(show(pg, "idle_in_transaction_session_timeout"), "1min");
    ck_assert_str_eq(show(pg, "application_name"), "check_pg");
    PQfinish(pg);
}
END_TEST

START_TEST(test_unreachable_server_is_again)
{
    struct sk_postgres_conf conf = { .conninfo = "host=127.0.0.1 port=1 connect_timeout=2",
                                     .lock_timeout_ms = 300 };
    struct sk_err err = { 0 };
    ck_assert_ptr_null(sk_pg_dial(&conf, "check_pg", &err));
    ck_assert_int_eq(err.code, SK_AGAIN);
    ck_assert_msg(strstr(err.msg, "PostgreSQL connection failed") != NULL, "%s", err.msg);
}
END_TEST

START_TEST(test_missing_connection_is_again)
{
    struct sk_err err = { 0 };
    PGresult *res = (PGresult *)&err;  /* must be reset to NULL */
    const struct sk_pg_stmt st = { .sql = "SELECT 1" };
    ck_assert_int_eq(sk_pg_exec(NULL, &st, &res, &err), SK_AGAIN);
    ck_assert_ptr_null(res);
    ck_assert_msg(strstr(err.msg, "not connected") != NULL, "%s", err.msg);
}
END_TEST

START_TEST(test_server_error_is_err_with_the_servers_message)
{
    struct sk_err err = { 0 };
    PGconn *pg = dial(NULL, &err);
    ck_assert_msg(pg != NULL, "dial failed: %s", err.msg);
    const struct sk_pg_stmt st = { .sql = "SELECT 1 / $1::int", .n_params = 1,
                                   .values = (const char *const[]){ "0" }, .what = "divide" };
    PGresult *res;
    ck_assert_int_eq(sk_pg_exec(pg, &st, &res, &err), SK_ERR);
    ck_assert_ptr_null(res);
    ck_assert_msg(strstr(err.msg, "divide failed: ") == err.msg, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "division by zero") != NULL, "%s", err.msg);
    ck_assert_msg(err.msg[strlen(err.msg) - 1] != '\n', "the message keeps libpq's newline");
    /* The connection stays usable after an error of the statement. */
    ck_assert_int_eq(sk_pg_run(pg, "SELECT 1", &err), SK_OK);
    PQfinish(pg);
}
END_TEST

START_TEST(test_one_row_refuses_any_other_count)
{
    struct sk_err err = { 0 };
    PGconn *pg = dial(NULL, &err);
    ck_assert_msg(pg != NULL, "dial failed: %s", err.msg);
    const struct sk_pg_stmt two = { .sql = "SELECT generate_series(1, 2)", .one_row = true };
    PGresult *res;
    ck_assert_int_eq(sk_pg_exec(pg, &two, &res, &err), SK_ERR);
    ck_assert_ptr_null(res);
    ck_assert_msg(strstr(err.msg, "returned 2 rows") != NULL, "%s", err.msg);
    const struct sk_pg_stmt one = { .sql = "SELECT 42", .one_row = true };
    ck_assert_int_eq(sk_pg_exec(pg, &one, &res, &err), SK_OK);
    ck_assert_str_eq(PQgetvalue(res, 0, 0), "42");
    PQclear(res);
    PQfinish(pg);
}
END_TEST

START_TEST(test_lock_timeout_is_busy)
{
    PGconn *holder = h_pg();
    char table[80], sql[256];
    h_unique_name(table, sizeof(table), "check_pg_lock");
    for (char *c = table; *c != '\0'; c++)
        if (*c == '-')
            *c = '_';
    snprintf(sql, sizeof(sql), "CREATE TABLE %s (id int PRIMARY KEY); INSERT INTO %s VALUES (1)",
             table, table);
    h_pg_exec(holder, sql);
    h_pg_exec(holder, "BEGIN");
    snprintf(sql, sizeof(sql), "SELECT id FROM %s FOR UPDATE", table);
    h_pg_exec(holder, sql);

    struct sk_err err = { 0 };
    PGconn *pg = dial(NULL, &err);
    ck_assert_msg(pg != NULL, "dial failed: %s", err.msg);
    snprintf(sql, sizeof(sql), "UPDATE %s SET id = 2", table);
    ck_assert_int_eq(sk_pg_run(pg, sql, &err), SK_BUSY);
    ck_assert_msg(strstr(err.msg, "lock timeout") != NULL, "%s", err.msg);
    /* In a pipeline too, as the claim runs. */
    const struct sk_pg_stmt steps[] = { { .sql = "BEGIN" }, { .sql = sql }, { .sql = "COMMIT" } };
    ck_assert_int_eq(sk_pg_pipeline(pg, steps, 3, NULL, &err), SK_BUSY);
    ck_assert_int_eq(sk_pg_run(pg, "ROLLBACK", &err), SK_OK);

    h_pg_exec(holder, "ROLLBACK");
    snprintf(sql, sizeof(sql), "DROP TABLE %s", table);
    h_pg_exec(holder, sql);
    PQfinish(pg);
    PQfinish(holder);
}
END_TEST

/* A session on a standby (here: a server that refuses writes) reads as a
 * lost connection: only a new dial, with target_session_attrs=read-write,
 * finds the primary after a failover. Before, it was the statement's error
 * and a worker retried on the same standby session until it was promoted. */
START_TEST(test_read_only_server_is_again)
{
    struct sk_err err = { 0 };
    PGconn *pg = dial(" options='-c default_transaction_read_only=on'", &err);
    ck_assert_msg(pg != NULL, "dial failed: %s", err.msg);
    ck_assert_str_eq(show(pg, "default_transaction_read_only"), "on");
    ck_assert_int_eq(sk_pg_run(pg, "CREATE TABLE check_pg_ro_table (id int)", &err), SK_AGAIN);
    ck_assert_msg(strstr(err.msg, "read-only") != NULL, "%s", err.msg);
    const struct sk_pg_stmt steps[] = {
        { .sql = "BEGIN" }, { .sql = "CREATE TABLE check_pg_ro_table (id int)" },
    };
    ck_assert_int_eq(sk_pg_pipeline(pg, steps, 2, NULL, &err), SK_AGAIN);
    PQfinish(pg);
}
END_TEST

START_TEST(test_lost_connection_is_again)
{
    struct sk_err err = { 0 };
    PGconn *pg = dial(NULL, &err);
    ck_assert_msg(pg != NULL, "dial failed: %s", err.msg);
    PGconn *admin = h_pg();
    ck_assert_int_eq(h_pg_count(admin, "SELECT count(*) FROM (SELECT pg_terminate_backend(%d)) "
                                       "AS t WHERE pg_terminate_backend", PQbackendPID(pg)), 1);
    /* The fault happened: the backend is gone. */
    H_WAIT(h_pg_count(admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %d",
                      PQbackendPID(pg)) == 0, 10000, "the backend should have exited");
    ck_assert_int_eq(sk_pg_run(pg, "SELECT 1", &err), SK_AGAIN);
    ck_assert_int_eq(PQstatus(pg), CONNECTION_BAD);
    ck_assert_int_eq(sk_pg_run(pg, "SELECT 1", &err), SK_AGAIN);
    ck_assert_msg(strstr(err.msg, "not connected") != NULL, "%s", err.msg);
    PQfinish(admin);
    PQfinish(pg);
}
END_TEST

START_TEST(test_pipeline_returns_the_last_rows_and_leaves_the_connection_idle)
{
    struct sk_err err = { 0 };
    PGconn *pg = dial(NULL, &err);
    ck_assert_msg(pg != NULL, "dial failed: %s", err.msg);
    const struct sk_pg_stmt ok[] = {
        { .sql = "BEGIN" },
        { .sql = "SELECT $1::int + 1", .n_params = 1, .values = (const char *const[]){ "41" } },
    };
    PGresult *last;
    ck_assert_int_eq(sk_pg_pipeline(pg, ok, 2, &last, &err), SK_OK);
    ck_assert_ptr_nonnull(last);
    ck_assert_str_eq(PQgetvalue(last, 0, 0), "42");
    PQclear(last);
    ck_assert_int_eq(PQpipelineStatus(pg), PQ_PIPELINE_OFF);
    ck_assert_int_eq(PQtransactionStatus(pg), PQTRANS_INTRANS);

    /* The first failure is reported; what followed it did not run. */
    const struct sk_pg_stmt bad[] = {
        { .sql = "SELECT 1 / 0", .what = "first" }, { .sql = "SELECT 2", .what = "second" },
    };
    ck_assert_int_eq(sk_pg_pipeline(pg, bad, 2, &last, &err), SK_ERR);
    ck_assert_ptr_null(last);
    ck_assert_msg(strstr(err.msg, "first failed: ") == err.msg, "%s", err.msg);
    ck_assert_int_eq(PQpipelineStatus(pg), PQ_PIPELINE_OFF);
    ck_assert_int_eq(PQtransactionStatus(pg), PQTRANS_INERROR);
    ck_assert_int_eq(sk_pg_run(pg, "ROLLBACK", &err), SK_OK);
    ck_assert_int_eq(PQtransactionStatus(pg), PQTRANS_IDLE);
    PQfinish(pg);
}
END_TEST

/* What a pool relies on before it lends a session again (src/ctl/ctl_pool.c):
 * what one request set is gone, what the dial set is back. */
START_TEST(test_reset_returns_a_session_to_what_the_dial_made)
{
    struct sk_err err = { 0 };
    PGconn *pg = dial(" options='-c statement_timeout=4321'", &err);
    ck_assert_msg(pg != NULL, "dial failed: %s", err.msg);
    h_pg_exec(pg, "SET lock_timeout = '10s'");
    h_pg_exec(pg, "SET statement_timeout = '1s'");
    h_pg_exec(pg, "SELECT pg_advisory_lock(4242)");
    h_pg_exec(pg, "PREPARE left_behind AS SELECT 1");
    h_pg_exec(pg, "CREATE TEMP TABLE left_behind (x int)");
    ck_assert_int_eq(sk_pg_reset(pg, &err), SK_OK);
    ck_assert_str_eq(show(pg, "lock_timeout"), "300ms");
    ck_assert_str_eq(show(pg, "statement_timeout"), "4321ms");
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                    "AND pid = pg_backend_pid()"), 0);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM pg_prepared_statements"), 0);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM pg_class WHERE relname = "
                                    "'left_behind' AND relpersistence = 't'"), 0);

    /* A session inside a transaction is not reset (its work is not the
     * pool's to end): SK_AGAIN, and it is closed instead. */
    h_pg_exec(pg, "BEGIN");
    ck_assert_int_eq(sk_pg_reset(pg, &err), SK_AGAIN);
    ck_assert_int_eq(PQtransactionStatus(pg), PQTRANS_INTRANS);
    PQfinish(pg);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_dial_keeps_the_users_options_and_adds_sekalis,
        test_unreachable_server_is_again,
        test_missing_connection_is_again,
        test_server_error_is_err_with_the_servers_message,
        test_one_row_refuses_any_other_count,
        test_lock_timeout_is_busy,
        test_read_only_server_is_again,
        test_lost_connection_is_again,
        test_pipeline_returns_the_last_rows_and_leaves_the_connection_idle,
        test_reset_returns_a_session_to_what_the_dial_made,
        NULL,
    };
    Suite *s = suite_create("pg");
    tcase_add_checked_fixture(h_tcase(s, "pg", 60, tests), h_init, NULL);
    return h_run_suite(s);
}
