/* check_migrate.c - sekalictl migrate on a live table: an online migration
 * (a file marked "-- sekali: online", ctl_migrate_online.c) builds its index
 * with CREATE INDEX CONCURRENTLY while workers keep claiming and completing
 * keys in the same table, and a build cut short is built again, not taken
 * for done.
 *
 * Each test migrates from a directory of its own holding one migration, so
 * that only it is applied, and removes its index and its version after. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* Starts `sekalictl -c config migrate --sql-dir dir`, its output in
 * dir/migrate.out and dir/migrate.err. */
static pid_t migrate_start(const char *config, const char *dir)
{
    char exe[1024], out[1024], err[1024];
    snprintf(exe, sizeof(exe), "%s/sekalictl", h_build_dir());
    snprintf(out, sizeof(out), "%s/migrate.out", dir);
    snprintf(err, sizeof(err), "%s/migrate.err", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd_out = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fd_err = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd_out < 0 || fd_err < 0 || dup2(fd_out, 1) < 0 || dup2(fd_err, 2) < 0)
            _exit(127);
        execl(exe, exe, "-c", config, "migrate", "--sql-dir", dir, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Runs migrate to its end; returns its exit code. */
static int migrate(const char *config, const char *dir)
{
    int status = h_wait_exit(migrate_start(config, dir), 60000, "sekalictl migrate");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void write_migration(const char *dir, const char *name, const char *sql)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(sql, f);
    ck_assert_int_eq(fclose(f), 0);
}

static char *file_of(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return h_read_file(path);
}

START_TEST(test_an_online_migration_builds_its_index_while_jobs_complete)
{
    struct h_run r;
    h_run_open(&r, "online");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2 });
    char index[160], sql[1024], version[192];
    snprintf(index, sizeof(index), "online_%s", r.queue);
    for (char *c = index; *c != '\0'; c++)
        if (*c == '-')
            *c = '_';
    snprintf(version, sizeof(version), "900_%s.sql", index);
    snprintf(sql, sizeof(sql),
             "-- sekali: online\n-- a test's index; ends with a semicolon;\n"
             "CREATE INDEX CONCURRENTLY IF NOT EXISTS %s\n"
             "    ON sekali.idempotency_keys (job_type) WHERE queue = '%s';\n", index, r.queue);
    write_migration(r.dir, version, sql);

    /* A transaction that wrote the table and stays open: a concurrent build
     * waits for it, so the migration is certainly in progress while the
     * jobs below run. A plain CREATE INDEX would hold them all back. */
    PGconn *writer = h_pg();
    h_pg_exec(writer, "BEGIN");
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence) "
             "VALUES ('%s-other', 'held', 'completed', 1)", r.queue);
    h_pg_exec(writer, sql);
    pid_t mig = migrate_start(r.config, r.dir);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND query LIKE 'CREATE INDEX CONCURRENTLY IF NOT EXISTS %s%%'", index) == 1,
           20000, "the migration should be building %s, waiting for the open writer (stderr: %s)",
           index, file_of(r.dir, "migrate.err"));
    char id[32];
    for (int i = 0; i < 20; i++) {
        snprintf(id, sizeof(id), "during-%d", i);
        h_publish(r.b, r.queue, "test", id, id, NULL, "ok");
    }
    H_WAIT(h_effects(&r, NULL) == 20, 20000,
           "the 20 jobs should complete while the index is built, %lld did", h_effects(&r, NULL));
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                                      "'CREATE INDEX CONCURRENTLY IF NOT EXISTS %s%%'", index), 1);
    h_pg_exec(writer, "COMMIT");
    int status = h_wait_exit(mig, 60000, "sekalictl migrate");
    char *out = file_of(r.dir, "migrate.out");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "migrate should succeed, got %d:\n%s\n%s", status, out, file_of(r.dir, "migrate.err"));
    ck_assert_msg(strstr(out, "concurrently, outside a transaction: writes go on meanwhile") != NULL &&
                  strstr(out, "on sekali.idempotency_keys (about ") != NULL,
                  "migrate should say what it does:\n%s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_index WHERE indisvalid "
                                      "AND indexrelid = to_regclass('sekali.%s')", index), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations "
                                      "WHERE version = '%s'", version), 1);
    h_run_stop(&r);
    h_expect_once(&r, 20, 0);

    snprintf(sql, sizeof(sql),
             "DROP INDEX sekali.%s; DELETE FROM sekali.schema_migrations WHERE version = '%s';"
             "DELETE FROM sekali.idempotency_keys WHERE queue = '%s-other'", index, version, r.queue);
    h_pg_exec(r.pg, sql);
    PQfinish(writer);
    h_run_close(&r);
}
END_TEST

START_TEST(test_an_interrupted_online_build_is_built_again_not_taken_for_done)
{
    struct h_run r;
    h_run_open(&r, "rebuild");
    char table[160], sql[1024], version[192];
    snprintf(table, sizeof(table), "online_%s", r.queue);
    for (char *c = table; *c != '\0'; c++)
        if (*c == '-')
            *c = '_';
    snprintf(version, sizeof(version), "900_%s.sql", table);
    snprintf(sql, sizeof(sql), "CREATE TABLE sekali.%s (v integer); "
                               "INSERT INTO sekali.%s VALUES (1), (1)", table, table);
    h_pg_exec(r.pg, sql);
    snprintf(sql, sizeof(sql),
             "-- sekali: online\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS %s_v\n"
             "    ON sekali.%s (v);\n", table, table);
    write_migration(r.dir, version, sql);
    char *config = h_write_config(r.dir, r.queue, H_EFFECT, 1, NULL);

    /* The duplicate stops the build halfway, as a cancel or a lost
     * connection would: PostgreSQL leaves the index behind, invalid. */
    ck_assert_int_eq(migrate(config, r.dir), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_index WHERE NOT indisvalid "
                                      "AND indexrelid = to_regclass('sekali.%s_v')", table), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations "
                                      "WHERE version = '%s'", version), 0);
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.%s WHERE ctid = (SELECT min(ctid) FROM sekali.%s)",
             table, table);
    h_pg_exec(r.pg, sql);
    ck_assert_int_eq(migrate(config, r.dir), 0);
    char *err = file_of(r.dir, "migrate.err");
    ck_assert_msg(strstr(err, "an interrupted build left an invalid index") != NULL,
                  "migrate should say it dropped the invalid index:\n%s", err);
    free(err);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_index WHERE indisvalid "
                                      "AND indexrelid = to_regclass('sekali.%s_v')", table), 1);

    snprintf(sql, sizeof(sql), "DROP TABLE sekali.%s; "
                               "DELETE FROM sekali.schema_migrations WHERE version = '%s'",
             table, version);
    h_pg_exec(r.pg, sql);
    free(config);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_an_online_migration_builds_its_index_while_jobs_complete,
        test_an_interrupted_online_build_is_built_again_not_taken_for_done,
        NULL,
    };
    Suite *s = suite_create("migrate");
    h_tcase(s, "migrate", 120, tests);
    return h_run_suite(s);
}
