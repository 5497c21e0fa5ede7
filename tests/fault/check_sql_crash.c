/* check_sql_crash.c - the stock SQL handler's worker SIGKILLed while its
 * statement runs: the statement's writes roll back with the job's open
 * transaction, and the job runs again and commits once. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

START_TEST(test_worker_killed_mid_statement_rolls_back_and_the_job_runs_once)
{
    struct h_run r;
    h_run_open(&r, "sqlkill");
    h_pg_exec(r.pg, "CREATE SCHEMA IF NOT EXISTS sekali_sqlh");
    h_pg_exec(r.pg, "CREATE TABLE IF NOT EXISTS sekali_sqlh.kill_rows (queue text NOT NULL, "
                    "key text NOT NULL, backend int NOT NULL)");
    /* Writes first, then sleeps on its first run only (a sequence is not
     * rolled back): the kill lands after the write, inside the statement. */
    h_pg_exec(r.pg,
        "CREATE OR REPLACE FUNCTION sekali_sqlh.slow_once(body jsonb, key text, q text) "
        "RETURNS text LANGUAGE plpgsql AS $fn$\n"
        "BEGIN\n"
        "  INSERT INTO sekali_sqlh.kill_rows VALUES (q, key, pg_backend_pid());\n"
        "  IF nextval(body->>'seq') = 1 THEN PERFORM pg_sleep(6); END IF;\n"
        "  RETURN 'done';\n"
        "END $fn$");
    char seq[256], sql[512], body[512];
    snprintf(seq, sizeof(seq), "sekali_sqlh.\"s_%s\"", r.queue);
    snprintf(sql, sizeof(sql), "CREATE SEQUENCE %s", seq);
    h_pg_exec(r.pg, sql);
    snprintf(body, sizeof(body), "{\"seq\": \"sekali_sqlh.\\\"s_%s\\\"\"}", r.queue);
    h_run_start(&r, &(struct h_run_opts){
        .handler = "handlers/sql.so", .workers = 1,
        .queue_yaml = "    lock_ttl: 2s\n    config:\n      statement: \"SELECT "
                      "sekali_sqlh.slow_once(:body::jsonb, :idempotency_key, :queue)\"\n" });
    pid_t victim = h_worker_pid(r.sekalid, 0);
    ck_assert_msg(victim > 0, "sekalid should have a worker");
    h_publish(r.b, r.queue, "slow", "kill-1", "order-kill", NULL, body);

    /* The fault: the statement is running (in pg_sleep, after its write). */
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                            "'sekali worker %s' AND state = 'active' AND wait_event = 'PgSleep'",
                      r.queue) == 1, 20000, "the statement never reached its sleep");
    long long backend = h_pg_count(r.pg, "SELECT pid FROM pg_stat_activity WHERE "
                                         "application_name = 'sekali worker %s' AND "
                                         "wait_event = 'PgSleep'", r.queue);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead after SIGKILL", (long)victim);

    H_WAIT(h_completed(&r) == 1, 60000, "the killed job should run again and complete");
    h_run_stop(&r);
    /* One row, written by another backend: the killed run's write was
     * rolled back with its transaction. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_sqlh.kill_rows WHERE "
                                      "queue = '%s'", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_sqlh.kill_rows WHERE "
                                      "queue = '%s' AND backend = %lld", r.queue, backend), 0);
    /* (attempts stays 1: in transactional mode the claim rolled back too.) */
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_worker_killed_mid_statement_rolls_back_and_the_job_runs_once,
        NULL,
    };
    return h_run_suite(h_suite("sql_crash", 120, tests));
}
