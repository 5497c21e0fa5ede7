/* check_counts.c - status and dlq groups read counts kept as keys and
 * letters change (sql/029), not the keys and letters themselves: what they
 * read does not grow with the failed keys or the dead letters a queue
 * retains, and the counts stay exact through every change (fail, re-arm,
 * purge, a second failure of a key, letters replayed and purged), through
 * the janitor's folding of their shards, and through an upgrade of a
 * database that already holds failed keys and letters, with a writer
 * committing while the migration counts them. And the janitor's purges
 * read what has expired, not what is retained (sql/033-035). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define MANY 400

/* Rows of sekali.idempotency_keys (or dead_letters) this transaction has
 * read so far, by any scan: the table's and its indexes' statistics. */
static long long rows_read(PGconn *pg, const char *table)
{
    return h_pg_count(pg,
        "SELECT coalesce((SELECT seq_tup_read FROM pg_stat_xact_user_tables "
        "                  WHERE schemaname = 'sekali' AND relname = '%s'), 0) "
        "     + coalesce((SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid)) FROM pg_index "
        "                  WHERE indrelid = 'sekali.%s'::regclass), 0)", table, table);
}

static long long failed_status(PGconn *pg, const char *queue)
{
    return h_pg_count(pg, "SELECT failed FROM sekali.queue_status('%s')", queue);
}

static long long failed_keys(PGconn *pg, const char *queue)
{
    return h_pg_count(pg, "SELECT count(*) FROM sekali.idempotency_keys "
                          "WHERE queue = '%s' AND status = 'failed'", queue);
}

/* MANY failed keys, and completed ones beside them, for queue. */
static void fail_many(PGconn *pg, const char *queue)
{
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "SELECT sekali.fail('%s', 'f-' || i, 'test:1', 'job-' || i, 'test', 'boom ' || i) "
             "  FROM generate_series(1, %d) i;"
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, completed_at) "
             "SELECT '%s', 'c-' || i, 'completed', 1, now() FROM generate_series(1, %d) i;"
             "ANALYZE sekali.idempotency_keys", queue, MANY, queue, 4 * MANY);
    h_pg_exec(pg, sql);
}

START_TEST(test_status_counts_failed_keys_without_reading_them)
{
    struct h_run r;
    h_run_open(&r, "status");
    fail_many(r.pg, r.queue);

    h_pg_exec(r.pg, "BEGIN");
    long long before = rows_read(r.pg, "idempotency_keys");
    long long failed = failed_status(r.pg, r.queue);
    long long read = rows_read(r.pg, "idempotency_keys") - before;
    h_pg_exec(r.pg, "COMMIT");
    ck_assert_int_eq(failed, MANY);
    ck_assert_msg(read < MANY / 4, "status read %lld rows of idempotency_keys to count %d "
                  "failed keys: it should read their count", read, MANY);

    /* Exact through each change a key's state goes through. */
    char sql[512];
    snprintf(sql, sizeof(sql), "UPDATE sekali.idempotency_keys SET status = 'processing' "
                               "WHERE queue = '%s' AND key IN ('f-1', 'f-2', 'f-3')", r.queue);
    h_pg_exec(r.pg, sql);                              /* re-armed, as a replay does */
    ck_assert_int_eq(failed_status(r.pg, r.queue), MANY - 3);
    snprintf(sql, sizeof(sql), "SELECT sekali.fail('%s', 'f-1', 'test:1', 'j', 'test', 'again'), "
                               "sekali.fail('%s', 'f-4', 'test:1', 'j', 'test', 'twice')",
             r.queue, r.queue);
    h_pg_exec(r.pg, sql);                              /* failed again; a second failure */
    ck_assert_int_eq(failed_status(r.pg, r.queue), MANY - 2);
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.idempotency_keys WHERE queue = '%s' "
                               "AND key IN ('f-5', 'f-6', 'c-1')", r.queue);
    h_pg_exec(r.pg, sql);                              /* purged */
    ck_assert_int_eq(failed_status(r.pg, r.queue), MANY - 4);
    snprintf(sql, sizeof(sql), "BEGIN; SELECT sekali.fail('%s', 'f-gone', 't:1', 'j', 't', 'x'); "
                               "ROLLBACK", r.queue);
    h_pg_exec(r.pg, sql);                              /* rolled back: never counted */
    ck_assert_int_eq(failed_status(r.pg, r.queue), failed_keys(r.pg, r.queue));
    ck_assert_int_eq(failed_keys(r.pg, r.queue), MANY - 4);

    snprintf(sql, sizeof(sql), "DELETE FROM sekali.idempotency_keys WHERE queue = '%s'", r.queue);
    h_pg_exec(r.pg, sql);
    ck_assert_int_eq(failed_status(r.pg, r.queue), 0);
    h_run_close(&r);
}
END_TEST

/* A database of this test's own, empty, named after its queue: its name
 * in db, its conninfo in url, a configuration naming it in config.
 * Returns a connection to it. */
static PGconn *own_database(struct h_run *r, char *db, size_t db_size, char *url,
                            size_t url_size, char **config)
{
    char sql[400], conninfo[1024];
    snprintf(db, db_size, "counts_%s", r->queue);
    for (char *c = db; *c != '\0'; c++)
        if (*c == '-')
            *c = '_';
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s", db);
    h_pg_exec(r->pg, sql);
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", db);
    h_pg_exec(r->pg, sql);
    /* The test database's name in the conninfo, and the new one's. */
    char from[160], to[200];
    snprintf(conninfo, sizeof(conninfo), "%s", h_pg_conninfo());
    char *at = strstr(conninfo, "dbname=");
    ck_assert_ptr_nonnull(at);
    size_t len = strcspn(at, " ");
    snprintf(from, sizeof(from), "%.*s", (int)len, at);
    snprintf(to, sizeof(to), "dbname=%s", db);
    *config = h_write_config(r->dir, r->queue, H_EFFECT, 1, NULL);
    h_config_replace(*config, from, to);
    snprintf(url, url_size, "%.*s%s%s", (int)(at - conninfo), conninfo, to, at + len);
    PGconn *pg = PQconnectdb(url);
    ck_assert_msg(PQstatus(pg) == CONNECTION_OK, "connecting to %s: %s", db,
                  PQerrorMessage(pg));
    return pg;
}

static void drop_own_database(struct h_run *r, PGconn *pg, const char *db, char *config)
{
    char sql[200];
    PQfinish(pg);
    snprintf(sql, sizeof(sql), "DROP DATABASE %s", db);
    h_pg_exec(r->pg, sql);
    free(config);
}

/* Links the migrations up to `last` (a file name prefix, e.g. "028") from
 * the source tree into dir, for sekalictl migrate --sql-dir dir. */
static void link_migrations(const char *dir, const char *last)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "for f in \"$PWD\"/sql/0*.sql; do n=$(basename \"$f\"); "
             "[ \"${n%%%%_*}\" \\> '%s' ] || ln -sf \"$f\" '%s/'; done", last, dir);
    ck_assert_int_eq(system(cmd), 0);
}

static int migrate(const char *config, const char *dir)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s/sekalictl' -c '%s' migrate --sql-dir '%s' >>'%s/migrate.log' 2>&1",
             h_build_dir(), config, dir, dir);
    return system(cmd);
}

/* What a purge (the janitor's round: sql/012, 023, 028, 034, 035) reads
 * of its table, at the janitor's default batch and at a batch larger than
 * the table: one that finds expired rows by a time index reads what it
 * deletes, one that scans reads every retained row. In a database of the
 * test's own: the shared one holds what earlier tests left expired, and
 * the index entries of rows a measuring transaction deletes are read
 * again by the next call, so that no count there could say "nothing". */
static long long purge_reads(PGconn *pg, const char *table, const char *call,
                             long long *deleted)
{
    h_pg_exec(pg, "BEGIN");
    long long before = rows_read(pg, table);
    *deleted = h_pg_count(pg, "SELECT %s", call);
    long long read = rows_read(pg, table) - before;
    h_pg_exec(pg, "ROLLBACK");
    return read;
}

START_TEST(test_purges_read_what_expired_not_what_is_retained)
{
    struct h_run r;
    h_run_open(&r, "purges");
    char db[160], url[1024], *config;
    PGconn *pg = own_database(&r, db, sizeof(db), url, sizeof(url), &config);
    link_migrations(r.dir, "999");
    ck_assert_int_eq(migrate(config, r.dir), 0);

    /* RETAINED rows kept in each table (as many as make an index cheaper
     * than a scan to the planner), EXPIRED rows expired. */
    enum { RETAINED = 20000, EXPIRED = 50 };
    char sql[2400];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, completed_at, "
             "updated_at) SELECT '%s', 'k-' || i, 'completed', 1, t, t FROM generate_series(1, %d) "
             "i, LATERAL (SELECT CASE WHEN i <= %d THEN now() - interval '2 hours' ELSE now() "
             "END t) x;"
             "INSERT INTO sekali.outbox (job_id, queue, job_type, body, idempotency_key, "
             "published_at) SELECT '%s-o-' || i, '%s', 'test', '\\x00', 'k-' || i, "
             "CASE WHEN i <= %d THEN now() - interval '2 hours' ELSE now() END "
             "FROM generate_series(1, %d) i;"
             "INSERT INTO sekali.job_dedupe (dedupe_key, queue, job_id, expires_at, released_at) "
             "SELECT '%s-d-' || i, '%s', 'job-' || i, CASE WHEN i <= %d THEN now() - "
             "interval '2 hours' ELSE now() + interval '1 day' END, "
             "CASE WHEN i %% 2 = 0 THEN now() END FROM generate_series(1, %d) i;"
             "INSERT INTO sekali.job_crashes (queue, key, crashes, last_crash) "
             "SELECT '%s', 'c-' || i, 1, CASE WHEN i <= %d THEN now() - interval '2 days' "
             "ELSE now() END FROM generate_series(1, %d) i;"
             "ANALYZE sekali.idempotency_keys; ANALYZE sekali.outbox; "
             "ANALYZE sekali.job_dedupe; ANALYZE sekali.job_crashes",
             r.queue, RETAINED + EXPIRED, EXPIRED, r.queue, r.queue, EXPIRED,
             RETAINED + EXPIRED, r.queue, r.queue, EXPIRED, RETAINED + EXPIRED, r.queue,
             EXPIRED, RETAINED + EXPIRED);
    h_pg_exec(pg, sql);

    /* Each call rolls back, so each batch size finds the same rows. A
     * deleted row is read twice (its index entry, then its ctid). */
    const struct { const char *table, *call; } purges[] = {
        { "idempotency_keys", "sekali.purge_keys('%s', 3600000, %d)" },
        { "outbox", "sekali.purge_outbox(3600000, %d)" },
        { "job_dedupe", "sekali.purge_dedupe(%d)" },
        { "job_crashes", "sekali.purge_crashes(%d)" },
    };
    const int batches[] = { 1000, 1000000 };
    for (size_t i = 0; i < sizeof(purges) / sizeof(purges[0]); i++)
        for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++) {
            char call[200];
            if (strstr(purges[i].call, "%s") != NULL)
                snprintf(call, sizeof(call), purges[i].call, r.queue, batches[b]);
            else
                snprintf(call, sizeof(call), purges[i].call, batches[b]);
            long long deleted;
            long long read = purge_reads(pg, purges[i].table, call, &deleted);
            ck_assert_msg(deleted == EXPIRED, "%s deleted %lld rows of %s, not the %d expired",
                          call, deleted, purges[i].table, EXPIRED);
            ck_assert_msg(read <= 3 * EXPIRED, "%s read %lld rows of %s to delete %d "
                          "expired of %d: it should read only the expired ones", call, read,
                          purges[i].table, EXPIRED, RETAINED + EXPIRED);
        }
    drop_own_database(&r, pg, db, config);
    h_run_close(&r);
}
END_TEST

/* Calls fn (sql/041: queue, a time in ms, a batch, a mark; answers the
 * rows it took and a new mark) batch after batch from no mark, each from
 * the mark the last answered, as the janitor does, in one transaction it
 * rolls back; returns the rows it read of table, *taken the rows taken. */
static long long walk_reads(PGconn *pg, const char *table, const char *fn, const char *queue,
                            long long ms, int batch, long long *taken)
{
    char sql[512], mark[80] = "NULL";
    h_pg_exec(pg, "BEGIN");
    long long before = rows_read(pg, table), batches = 0;
    *taken = 0;
    for (;;) {
        snprintf(sql, sizeof(sql), "SELECT * FROM sekali.%s('%s', %lld, %d, %s)", fn, queue, ms,
                 batch, mark);
        PGresult *res = PQexec(pg, sql);
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s: %s", sql,
                      PQresultErrorMessage(res));
        long long n = atoll(PQgetvalue(res, 0, 0));
        snprintf(mark, sizeof(mark), "'%s'", PQgetvalue(res, 0, 1));
        PQclear(res);
        *taken += n;
        if (n < batch)
            break;
        ck_assert_msg(++batches < 1000, "%s: a full batch after a thousand", fn);
    }
    long long read = rows_read(pg, table) - before;
    h_pg_exec(pg, "ROLLBACK");
    return read;
}

/* The janitor's moves and the archive's purge go on from where their last
 * batch ended (sql/041). At the start of their time index lie the rows
 * earlier batches deleted, whose entries stay until a VACUUM (which a
 * table of 100 M keys waits long for), and, in the keys table's, the
 * failed keys, which never move; a batch that started from the oldest
 * row again walked all of them (at 100 M keys, 134 MB a purge batch). One
 * transaction holds the batches here: the rows it deleted stay in the
 * index for its later statements as they do for the janitor's later
 * batches until a VACUUM. */
START_TEST(test_the_janitors_walks_go_on_from_their_last_batch)
{
    struct h_run r;
    h_run_open(&r, "janitor-marks");
    char db[160], url[1024], *config;
    PGconn *pg = own_database(&r, db, sizeof(db), url, sizeof(url), &config);
    link_migrations(r.dir, "999");
    ck_assert_int_eq(migrate(config, r.dir), 0);

    enum { RETAINED = 20000, OLD = 2000, BATCH = 100 };
    char sql[2048];
    snprintf(sql, sizeof(sql),
             /* The archive: OLD expired, RETAINED not. */
             "INSERT INTO sekali.finished_keys (queue, key_id, duplicates, completed_at, "
             "updated_at) SELECT '%1$s', sekali.key_id('k-' || i), 0, t, t "
             "FROM generate_series(1, %2$d) i, LATERAL (SELECT CASE WHEN i <= %3$d "
             "THEN now() - interval '2 hours' - i * interval '1 ms' ELSE now() END t) x;"
             /* The keys: OLD failed two hours ago, OLD completed ten minutes
              * ago (to move), RETAINED completed now. */
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) "
             "SELECT '%1$s', 'f-' || i, 'failed', 1, now() - interval '2 hours' "
             "FROM generate_series(1, %3$d) i;"
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) "
             "SELECT '%1$s', 'c-' || i, 'completed', 1, CASE WHEN i <= %3$d "
             "THEN now() - interval '10 minutes' - i * interval '1 ms' ELSE now() END "
             "FROM generate_series(1, %2$d) i;"
             "ANALYZE sekali.finished_keys; ANALYZE sekali.idempotency_keys",
             r.queue, RETAINED + OLD, OLD);
    h_pg_exec(pg, sql);

    /* A row taken is read twice (its index entry, then its ctid), the rows
     * at each mark once more, and the first move walks the failed keys
     * once. From the oldest row each time it was about 11 times OLD for
     * the purge, 30 times for the moves. */
    long long taken, read = walk_reads(pg, "finished_keys", "purge_finished_keys_after",
                                       r.queue, 3600000, BATCH, &taken);
    ck_assert_int_eq(taken, OLD);
    ck_assert_msg(read <= 3 * OLD, "the purge read %lld rows of sekali.finished_keys to delete "
                  "%d: each batch should go on from the last", read, OLD);
    read = walk_reads(pg, "idempotency_keys", "archive_keys_after", r.queue, 60000, BATCH,
                      &taken);
    ck_assert_int_eq(taken, OLD);
    ck_assert_msg(read <= 5 * OLD, "the moves read %lld rows of sekali.idempotency_keys to move "
                  "%d past %d failed keys: each batch should go on from the last", read, OLD, OLD);
    drop_own_database(&r, pg, db, config);
    h_run_close(&r);
}
END_TEST

/* A job finds its key's row by index whatever the statistics said when
 * its session planned the statement (sql/042). Planned on a keys table
 * known to be empty (a new deployment, a VACUUM ANALYZE of an emptied
 * table), sekali.complete kept a sequential scan while the table grew,
 * and read every key at every call: 4,803 scans of 11.6 M rows for 4,800
 * jobs. The batches here: claim_many of 16 keys, then complete for each,
 * as the batch path calls them, in one session. */
START_TEST(test_a_job_finds_its_key_by_index_on_a_table_planned_empty)
{
    struct h_run r;
    h_run_open(&r, "planned-empty");
    char db[160], url[1024], *config;
    PGconn *pg = own_database(&r, db, sizeof(db), url, sizeof(url), &config);
    link_migrations(r.dir, "999");
    ck_assert_int_eq(migrate(config, r.dir), 0);
    h_pg_exec(pg, "VACUUM ANALYZE sekali.idempotency_keys");
    h_pg_exec(pg, "VACUUM ANALYZE sekali.finished_keys");

    enum { BATCHES = 100, KEYS = 16 };
    char sql[1024];
    h_pg_exec(pg, "BEGIN");
    long long before = rows_read(pg, "idempotency_keys");
    snprintf(sql, sizeof(sql),
             "DO $$ DECLARE ks text[]; k text; BEGIN FOR i IN 1 .. %d LOOP "
             "ks := ARRAY(SELECT '%s-' || i || '-' || j FROM generate_series(1, %d) j); "
             "PERFORM * FROM sekali.claim_many('%s', ks, 'test:1', ks, "
             "array_fill('t'::text, ARRAY[%d])); "
             "FOREACH k IN ARRAY ks LOOP PERFORM sekali.complete('%s', k, 1, NULL); END LOOP; "
             "END LOOP; END $$", BATCHES, r.queue, KEYS, r.queue, KEYS, r.queue);
    h_pg_exec(pg, sql);
    long long read = rows_read(pg, "idempotency_keys") - before;
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                    "status = 'completed'"), BATCHES * KEYS);
    h_pg_exec(pg, "ROLLBACK");
    /* One row a completion, by the primary key; reading the table at each
     * call was about 400 times more. */
    ck_assert_msg(read <= 2 * BATCHES * KEYS, "%d jobs read %lld rows of sekali.idempotency_keys "
                  "planned on an empty table: each should find its row by index",
                  BATCHES * KEYS, read);
    drop_own_database(&r, pg, db, config);
    h_run_close(&r);
}
END_TEST

/* MANY letters of queue in three groups: two with keys, one malformed. */
static void letters(PGconn *pg, const char *queue)
{
    char sql[1400];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.dead_letters (queue, key, job_id, job_type, reason, error, "
             "malformed, body, body_size, first_failure, failed_at) "
             "SELECT '%s', CASE WHEN i %% 4 = 0 THEN NULL ELSE 'k-' || i END, 'job-' || i, "
             "'test', CASE WHEN i %% 4 = 0 THEN 'malformed' ELSE 'failed' END, "
             "CASE WHEN i %% 2 = 0 THEN 'gateway ' || i ELSE 'timeout after ' || i || ' ms' END, "
             "CASE WHEN i %% 4 = 0 THEN 'no key' END, '\\x00', 1, "
             "timestamptz '2026-01-01' + i * interval '1 minute', "
             "timestamptz '2026-02-01' + i * interval '1 minute' "
             "FROM generate_series(1, %d) i; ANALYZE sekali.dead_letters", queue, MANY);
    h_pg_exec(pg, sql);
}

/* The backends sekalictl left behind: once gone, they have written their
 * statistics (a backend reports them before it leaves pg_stat_activity). */
static long long ctl_backends(PGconn *pg)
{
    return h_pg_count(pg, "SELECT count(*) FROM pg_stat_activity "
                          "WHERE application_name = 'sekalictl'");
}

static long long letters_read(PGconn *pg)
{
    h_pg_exec(pg, "SELECT pg_stat_clear_snapshot()");
    return h_pg_count(pg,
        "SELECT coalesce((SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) "
        "                  FROM pg_stat_user_tables "
        "                  WHERE schemaname = 'sekali' AND relname = 'dead_letters'), 0) "
        "     + coalesce((SELECT sum(idx_tup_read) FROM pg_stat_user_indexes "
        "                  WHERE schemaname = 'sekali' AND relname = 'dead_letters'), 0)");
}

/* What one sekalictl command (argv after the config) reads, by `count`:
 * the least of three tries, each with no other sekalictl connected. The
 * table's read counters are the whole server's: another session's
 * statistics arriving in the window (a test's sekalid just gone) add to
 * one try, never to every try, while a command that reads the letters
 * reads them each time. Stops early once a try reads at most `enough`.
 * *out: the last try's output (the caller frees it). */
static long long least_read(struct h_run *r, PGconn *pg, long long (*count)(PGconn *),
                            const char *const *argv, long long enough, char **out)
{
    long long read = -1;
    *out = NULL;
    for (int try = 0; try < 3 && (read < 0 || read > enough); try++) {
        free(*out);
        *out = NULL;
        H_WAIT(ctl_backends(pg) == 0, 10000, "no sekalictl should be connected");
        long long before = count(pg);
        int rc = h_sekalictl(r, out, argv);
        ck_assert_msg(rc == 0, "sekalictl %s should succeed: %s", argv[0], *out);
        H_WAIT(ctl_backends(pg) == 0, 10000, "sekalictl's session should end");
        long long this_try = count(pg) - before;
        read = read < 0 || this_try < read ? this_try : read;
    }
    return read;
}

START_TEST(test_dlq_groups_count_letters_without_reading_them)
{
    struct h_run r;
    h_run_open(&r, "groups");
    /* In a database of its own, vacuumed and analyzed as autovacuum leaves
     * a table at rest: in the shared one, the plan (a probe of a group's
     * index, or a scan of the whole group) followed the statistics of
     * every earlier suite's letters. */
    char db[160], url[1024];
    PGconn *pg = own_database(&r, db, sizeof(db), url, sizeof(url), &r.config);
    link_migrations(r.dir, "999");
    ck_assert_int_eq(migrate(r.config, r.dir), 0);
    letters(pg, r.queue);
    h_pg_exec(pg, "VACUUM ANALYZE sekali.dead_letters");

    char *out;
    long long read = least_read(&r, pg, letters_read, (const char *const[]){
        "dlq", "groups", r.queue, "--json", NULL }, MANY / 4 - 1, &out);
    ck_assert_msg(read < MANY / 4, "dlq groups read at least %lld dead letters' rows (the "
                  "least of 3 tries) for 3 groups of %d letters: it should read their counts",
                  read, MANY);

    /* The groups as the letters give them: counts, bounds, an example. */
    ck_assert_msg(strstr(out, "{\"reason\":\"failed\",\"fingerprint\":\"timeout after {n} ms\","
                              "\"count\":200,\"replayable\":200,"
                              "\"first_failure\":\"2026-01-01T00:01:00Z\","
                              "\"last_failure\":\"2026-02-01T06:39:00Z\","
                              "\"example_key\":\"k-399\"}") != NULL, "groups: %s", out);
    ck_assert_msg(strstr(out, "{\"reason\":\"failed\",\"fingerprint\":\"gateway {n}\","
                              "\"count\":100,\"replayable\":100,") != NULL, "groups: %s", out);
    ck_assert_msg(strstr(out, "{\"reason\":\"malformed\",\"fingerprint\":\"gateway {n}\","
                              "\"count\":100,\"replayable\":0,") != NULL &&
                  strstr(out, "\"example_key\":null") != NULL, "groups: %s", out);
    free(out);

    /* Replayed, purged and replaced letters change the counts, and the
     * janitor's folding of their shards does not. */
    char sql[600];
    snprintf(sql, sizeof(sql),
             "DELETE FROM sekali.dead_letters WHERE queue = '%s' AND key IN ('k-1', 'k-3', 'k-2');"
             "UPDATE sekali.dead_letters SET error = 'gateway 7', malformed = NULL "
             " WHERE queue = '%s' AND key = 'k-5'", r.queue, r.queue);
    h_pg_exec(pg, sql);
    ck_assert_int_eq(h_pg_count(pg, "SELECT sum(letters) FROM sekali.dlq_groups('%s', 10) "
                                      "WHERE fingerprint = 'timeout after {n} ms'", r.queue), 197);
    ck_assert_int_eq(h_pg_count(pg, "SELECT sum(letters) FROM sekali.dlq_groups('%s', 10) "
                                      "WHERE reason = 'failed' AND fingerprint = 'gateway {n}'",
                                r.queue), 100);
    ck_assert_int_ge(h_pg_count(pg, "SELECT sekali.fold_dead_letter_counts('%s', 1000)",
                                r.queue), 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.dead_letter_counts "
                                      "WHERE queue = '%s'", r.queue), 3);
    ck_assert_int_eq(h_pg_count(pg, "SELECT sekali.dead_letter_count('%s')", r.queue),
                     MANY - 3);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM (SELECT reason, fingerprint, "
                                      "count(*) n, count(*) FILTER (WHERE malformed IS NULL) m "
                                      "FROM sekali.dead_letters WHERE queue = '%s' GROUP BY 1, 2 "
                                      "EXCEPT SELECT reason, fingerprint, letters, replayable "
                                      "FROM sekali.dlq_groups('%s', 10)) x", r.queue, r.queue), 0);

    /* An emptied group leaves no row behind once folded. */
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.dead_letters WHERE queue = '%s'", r.queue);
    h_pg_exec(pg, sql);
    h_pg_count(pg, "SELECT sekali.fold_dead_letter_counts('%s', 1000)", r.queue);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.dead_letter_counts "
                                      "WHERE queue = '%s'", r.queue), 0);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.dlq_groups('%s', 10)",
                                r.queue), 0);
    drop_own_database(&r, pg, db, r.config);
    r.config = NULL;
    h_run_close(&r);
}
END_TEST

START_TEST(test_an_upgrade_counts_what_the_database_held_while_writers_commit)
{
    struct h_run r;
    h_run_open(&r, "upgrade");
    char db[160], sql[1400], url[1024], *config;
    PGconn *pg = own_database(&r, db, sizeof(db), url, sizeof(url), &config);
    PGconn *writer = PQconnectdb(url);
    ck_assert_msg(PQstatus(writer) == CONNECTION_OK, "connecting to %s: %s", db,
                  PQerrorMessage(writer));

    /* A database of the release before, holding failed keys and letters. */
    link_migrations(r.dir, "028");
    ck_assert_int_eq(migrate(config, r.dir), 0);
    fail_many(pg, r.queue);
    letters(pg, r.queue);
    link_migrations(r.dir, "029");

    /* A transaction writing the keys and left open (a long job): adding
     * the triggers gives up after its lock_timeout instead of holding
     * every other writer behind it, and changes nothing. */
    h_pg_exec(writer, "BEGIN");
    snprintf(sql, sizeof(sql), "SELECT sekali.fail('%s', 'long', 'test:1', 'j', 'test', 'x')",
             r.queue);
    h_pg_exec(writer, sql);
    int64_t t0 = h_now_ms();
    ck_assert_int_ne(migrate(config, r.dir), 0);
    ck_assert_msg(h_now_ms() - t0 < h_ms(30000), "migrate should give up in seconds, took %lld ms",
                  (long long)(h_now_ms() - t0));
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM pg_class WHERE oid = "
                                    "to_regclass('sekali.key_counts')"), 0);
    h_pg_exec(writer, "ROLLBACK");
    ck_assert_int_eq(migrate(config, r.dir), 0);
    ck_assert_int_eq(failed_status(pg, r.queue), MANY);    /* not counted yet: read */

    /* A key fails in a transaction still open while the counts are taken:
     * it must count once, after its COMMIT, neither twice nor never. */
    h_pg_exec(writer, "BEGIN");
    snprintf(sql, sizeof(sql), "SELECT sekali.fail('%s', 'during', 'test:1', 'j', 'test', 'x'),"
                               " sekali.fail('%s', 'f-1', 'test:1', 'j', 'test', 'again')",
             r.queue, r.queue);
    h_pg_exec(writer, sql);
    link_migrations(r.dir, "030");
    ck_assert_int_eq(migrate(config, r.dir), 0);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.count_bases"), 2);
    ck_assert_int_eq(failed_status(pg, r.queue), MANY);
    h_pg_exec(writer, "COMMIT");
    ck_assert_int_eq(failed_status(pg, r.queue), MANY + 1);
    ck_assert_int_eq(failed_keys(pg, r.queue), MANY + 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT sekali.dead_letter_count('%s')", r.queue), MANY);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM (SELECT reason, fingerprint, "
                                    "count(*) n, count(*) FILTER (WHERE malformed IS NULL) m "
                                    "FROM sekali.dead_letters WHERE queue = '%s' GROUP BY 1, 2 "
                                    "EXCEPT SELECT reason, fingerprint, letters, replayable "
                                    "FROM sekali.dlq_groups('%s', 10)) x", r.queue, r.queue), 0);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.dlq_groups('%s', 10)", r.queue),
                     3);
    /* Run again, the counts come out the same. */
    h_pg_exec(pg, "SELECT sekali.recount_failed_keys(), sekali.recount_dead_letters()");
    ck_assert_int_eq(failed_status(pg, r.queue), MANY + 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT sekali.dead_letter_count('%s')", r.queue), MANY);

    PQfinish(writer);
    drop_own_database(&r, pg, db, config);
    h_run_close(&r);
}
END_TEST

/* own_database(), its config in r->config, with every migration of sql/. */
static PGconn *own_migrated_database(struct h_run *r, char *db, size_t db_size)
{
    char url[1024];
    PGconn *pg = own_database(r, db, db_size, url, sizeof(url), &r->config);
    link_migrations(r->dir, "999");
    ck_assert_int_eq(migrate(r->config, r->dir), 0);
    return pg;
}

/* The letters as autovacuum leaves a table at rest: analyzed, and every
 * page all-visible (one VACUUM right after a load may leave pages that a
 * second marks), so that an index-only scan reads no row. */
static void at_rest(PGconn *pg)
{
    H_WAIT((h_pg_exec(pg, "VACUUM ANALYZE sekali.dead_letters"),
            h_pg_count(pg, "SELECT relpages - relallvisible FROM pg_class "
                           "WHERE oid = 'sekali.dead_letters'::regclass") == 0),
           30000, "vacuum should leave every page of the letters all-visible");
}

/* Rows of sekali.dead_letters read whole (the heap's tuples, by a scan
 * or through an index), not index entries alone, by the sessions that
 * have left since the statistics' last snapshot. */
static long long letter_rows_read(PGconn *pg)
{
    h_pg_exec(pg, "SELECT pg_stat_clear_snapshot()");
    return h_pg_count(pg, "SELECT coalesce((SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) "
                          "FROM pg_stat_user_tables WHERE schemaname = 'sekali' "
                          "AND relname = 'dead_letters'), 0)");
}

/* A deep page of a reason's letters skips index entries, not the wide rows
 * of every letter before it (sql/036): the page reads its own rows. */
START_TEST(test_a_deep_dlq_page_reads_its_own_letters_only)
{
    struct h_run r;
    h_run_open(&r, "deep");
    char db[160], sql[800];
    PGconn *pg = own_migrated_database(&r, db, sizeof(db));
    /* As many letters as make an index cheaper than a scan to the planner,
     * as wide as letters are (a body of 1 kB) and beside another queue's,
     * at rest as autovacuum leaves them (every page all-visible). */
    enum { LETTERS = 20000, PAGE = 5 };
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.dead_letters (queue, key, reason, error, body, body_size) "
             "SELECT CASE WHEN i %% 2 = 0 THEN '%s' ELSE 'other' END, 'k-' || i, "
             "CASE WHEN i %% 4 = 0 THEN 'failed' ELSE 'timeout' END, 'gateway ' || i, "
             "convert_to(repeat('x', 1000), 'UTF8'), 1000 FROM generate_series(1, %d) i",
             r.queue, 2 * LETTERS);
    h_pg_exec(pg, sql);
    at_rest(pg);

    char offset[16], limit[16];
    snprintf(offset, sizeof(offset), "%d", LETTERS / 4);
    snprintf(limit, sizeof(limit), "%d", PAGE);
    const char *const selectors[][2] = { { "--reason", "failed" },
                                         { "--fingerprint", "gateway {n}" } };
    for (size_t s = 0; s < 2; s++) {
        char *out;
        long long read = least_read(&r, pg, letter_rows_read, (const char *const[]){
            "dlq", "list", r.queue, selectors[s][0], selectors[s][1], "--offset", offset,
            "--limit", limit, "--json", NULL }, 4 * PAGE, &out);
        ck_assert_msg(read <= 4 * PAGE, "dlq list %s '%s' --offset %s --limit %d read %lld "
                      "dead letters' rows (the least of 3 tries): it should read the page's "
                      "%d, skipping index entries", selectors[s][0], selectors[s][1], offset,
                      PAGE, read, PAGE);
        /* The page is the right one: the 5,001st matching letter onwards. */
        char first[40];
        snprintf(first, sizeof(first), "\"key\":\"k-%d\"", s == 0 ? 4 * (LETTERS / 4 + 1)
                                                                  : 2 * (LETTERS / 4 + 1));
        ck_assert_msg(strstr(out, first) != NULL && strstr(out, "\"more\":true") != NULL,
                      "the page should start at %s: %s", first, out);
        free(out);
    }
    drop_own_database(&r, pg, db, r.config);
    r.config = NULL;
    h_run_close(&r);
}
END_TEST

/* verify counts a queue's dead letters as they are kept (sql/029), and
 * checks the keys of a bounded number of them, saying so: what it reads
 * does not grow with the letters a queue retains. --letters asks for a
 * larger sample, and gets exactly that. */
static void verify_reads_its_sample(struct h_run *r, PGconn *pg, const char *letters,
                                    int checked, int held)
{
    char *out;
    long long read = least_read(r, pg, letters_read,
                                (const char *const[]){ "verify", "--letters", letters, NULL },
                                5 * checked / 2, &out);
    /* The sample: its index entries and its rows. */
    ck_assert_msg(read <= 5 * checked / 2, "verify --letters %s read %lld dead letters' rows "
                  "and index entries (the least of 3 tries) of %d: it should read its sample "
                  "of %d", letters, read, held, checked);
    char dead[64], inconsistent[64], said[200];
    snprintf(dead, sizeof(dead), "dead %d\n", held);
    snprintf(inconsistent, sizeof(inconsistent), "inconsistent %d:", checked);
    snprintf(said, sizeof(said), "inconsistent: the oldest %d keyed dead letters checked, of "
             "%d (--letters checks more)\n", checked, held);
    ck_assert_msg(strstr(out, dead) != NULL && strstr(out, inconsistent) != NULL &&
                  strstr(out, said) != NULL, "verify should say its sample: %s", out);
    free(out);
}

START_TEST(test_verify_reads_a_bounded_sample_of_dead_letters)
{
    struct h_run r;
    h_run_open(&r, "verify");
    char db[160], sql[800];
    PGconn *pg = own_migrated_database(&r, db, sizeof(db));
    enum { LETTERS = 40000 };
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.dead_letters (queue, key, reason, error, body, body_size) "
             "SELECT '%s', 'k-' || i, 'failed', 'gateway ' || i, '\\x00', 1 "
             "FROM generate_series(1, %d) i", r.queue, LETTERS);
    h_pg_exec(pg, sql);
    at_rest(pg);
    verify_reads_its_sample(&r, pg, "1000", 1000, LETTERS);  /* ctl_verify.c's default */
    verify_reads_its_sample(&r, pg, "5000", 5000, LETTERS);
    drop_own_database(&r, pg, db, r.config);
    r.config = NULL;
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_status_counts_failed_keys_without_reading_them,
        test_dlq_groups_count_letters_without_reading_them,
        test_an_upgrade_counts_what_the_database_held_while_writers_commit,
        test_purges_read_what_expired_not_what_is_retained,
        test_the_janitors_walks_go_on_from_their_last_batch,
        test_a_job_finds_its_key_by_index_on_a_table_planned_empty,
        test_a_deep_dlq_page_reads_its_own_letters_only,
        test_verify_reads_a_bounded_sample_of_dead_letters,
        NULL,
    };
    Suite *s = suite_create("counts");
    h_tcase(s, "counts", 120, tests);
    return h_run_suite(s);
}
