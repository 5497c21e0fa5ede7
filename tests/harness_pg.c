/* harness_pg.c - the test PostgreSQL: connections, statements and counts,
 * jobs enqueued through sekali.enqueue(), and what a run's jobs did as the
 * database records it (the test handler's effects, sekali's keys). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness_private.h"

PGconn *h_pg(void)
{
    PGconn *pg = PQconnectdb(h_pg_conninfo());
    ck_assert_msg(PQstatus(pg) == CONNECTION_OK, "PostgreSQL: %s", PQerrorMessage(pg));
    return pg;
}

void h_pg_exec(PGconn *pg, const char *sql)
{
    PGresult *res = PQexec(pg, sql);
    ExecStatusType status = PQresultStatus(res);
    ck_assert_msg(status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK, "%s: %s", sql,
                  PQresultErrorMessage(res));
    PQclear(res);
}

long long h_pg_count(PGconn *pg, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    PGresult *res = PQexec(pg, sql);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1, "%s: %s",
                  sql, PQresultErrorMessage(res));
    long long n = PQgetisnull(res, 0, 0) ? 0 : atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return n;
}

const char *h_enqueue(PGconn *pg, const char *queue, const char *key, const char *dedupe,
                      const char *run_at)
{
    return h_enqueue_body(pg, queue, "ok", key, dedupe, run_at);
}

const char *h_enqueue_body(PGconn *pg, const char *queue, const char *body, const char *key,
                           const char *dedupe, const char *run_at)
{
    static _Thread_local char id[128];  /* producers call it from several threads */
    const char *values[] = { queue, body, key, dedupe, run_at };
    PGresult *res = PQexecParams(pg, "SELECT sekali.enqueue($1, 'test', $2::bytea, $3, $4, "
                                     "NULL, coalesce($5::timestamptz, now()))",
                                 5, NULL, values, NULL, NULL, 0);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "sekali.enqueue: %s",
                  PQresultErrorMessage(res));
    snprintf(id, sizeof(id), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return id;
}

long long h_effects(const struct h_run *r, const char *key)
{
    if (key == NULL)
        return h_pg_count(r->pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                          r->queue);
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s' "
                             "AND idempotency_key = '%s'", r->queue, key);
}

long long h_effect_keys(const struct h_run *r)
{
    return h_pg_count(r->pg, "SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects "
                             "WHERE queue = '%s'", r->queue);
}

/* Keys of r's queue in that status. */
static long long keys_in(const struct h_run *r, const char *status)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                             "AND status = '%s'", r->queue, status);
}

/* Completed keys are in sekali.idempotency_keys, or archived in
 * sekali.finished_keys (sql/040): the counts read both. */
long long h_completed(const struct h_run *r)
{
    return keys_in(r, "completed") +
           h_pg_count(r->pg, "SELECT count(*) FROM sekali.finished_keys WHERE queue = '%s'",
                      r->queue);
}

long long h_duplicates(const struct h_run *r)
{
    return h_pg_count(r->pg, "SELECT (SELECT coalesce(sum(duplicates), 0) "
                             "FROM sekali.idempotency_keys WHERE queue = '%1$s') + "
                             "(SELECT coalesce(sum(duplicates), 0) FROM sekali.finished_keys "
                             "WHERE queue = '%1$s')", r->queue);
}

long long h_archived(const struct h_run *r)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali.finished_keys WHERE queue = '%s'",
                      r->queue);
}

long long h_unarchived(const struct h_run *r)
{
    return h_pg_count(r->pg, "SELECT coalesce(sum(n), 0) FROM sekali_test.finished_key_deletes "
                             "WHERE queue = '%s'", r->queue);
}

long long h_failed(const struct h_run *r)
{
    return keys_in(r, "failed");
}

const char *h_key_status(const struct h_run *r, const char *key, char *buf, size_t size)
{
    PGresult *res = PQexecParams(r->pg, "SELECT coalesce(sekali.key_status($1, $2), 'absent')",
                                 2, NULL, (const char *[]){ r->queue, key }, NULL, NULL, 0);
    snprintf(buf, size, "%s", PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "absent");
    PQclear(res);
    return buf;
}

void h_pg_expired_backlog(const struct h_run *r, int n, int slow_ms)
{
    char sql[2048];
    h_pg_exec(r->pg, "CREATE TABLE IF NOT EXISTS sekali_test.key_purges (queue text NOT NULL, "
                     "started timestamptz NOT NULL, ended timestamptz NOT NULL, n bigint NOT NULL)");
    /* statement_timestamp(): when the janitor's statement reached the
     * server, so a purge's own time is ended - started. */
    snprintf(sql, sizeof(sql),
             "CREATE OR REPLACE FUNCTION sekali_test.time_purge() RETURNS trigger "
             "LANGUAGE plpgsql AS $$ BEGIN "
             "IF EXISTS (SELECT 1 FROM gone WHERE queue = TG_ARGV[0]) THEN "
             "PERFORM pg_sleep(TG_ARGV[1]::float8 / 1000); "
             "INSERT INTO sekali_test.key_purges SELECT TG_ARGV[0], statement_timestamp(), "
             "clock_timestamp(), count(*) FROM gone WHERE queue = TG_ARGV[0]; "
             "END IF; RETURN NULL; END $$; "
             "CREATE TRIGGER \"time %1$s\" AFTER DELETE ON sekali.idempotency_keys "
             "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
             "EXECUTE FUNCTION sekali_test.time_purge('%1$s', '%2$d'); "
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) "
             "SELECT '%1$s', 'old-' || i, 'completed', 1, now() - interval '2 hours' "
             "FROM generate_series(1, %3$d) AS i",
             r->queue, slow_ms, n);
    h_pg_exec(r->pg, sql);
}

void h_pg_expired_backlog_end(const struct h_run *r)
{
    char sql[512];
    snprintf(sql, sizeof(sql), "DROP TRIGGER IF EXISTS \"time %s\" ON sekali.idempotency_keys",
             r->queue);
    h_pg_exec(r->pg, sql);
}
