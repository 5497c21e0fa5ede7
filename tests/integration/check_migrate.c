/* check_migrate.c - sekalictl migrate on a live table: an online migration
 * (a file marked "-- sekali: online", ctl_migrate_online.c) builds its index
 * with CREATE INDEX CONCURRENTLY while workers keep claiming and completing
 * keys in the same table, and a build cut short is built again, not taken
 * for done.
 *
 * Before it applies anything, migrate says its plan (ctl_migrate_plan.c),
 * and `migrate --plan` says only that: the pending files, how each runs,
 * the tables, their locks and sizes, and nothing changed.
 *
 * Each test migrates from a directory of its own holding its migrations, so
 * that only they are applied, and removes what they made after. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* Starts `sekalictl -c config migrate --sql-dir dir [extra...]` (extra
 * NULL-terminated, or NULL), its output in dir/migrate.out and
 * dir/migrate.err. */
static pid_t migrate_start_with(const char *config, const char *dir, const char *const *extra)
{
    char exe[1024], out[1024], err[1024];
    snprintf(exe, sizeof(exe), "%s/sekalictl", h_build_dir());
    snprintf(out, sizeof(out), "%s/migrate.out", dir);
    snprintf(err, sizeof(err), "%s/migrate.err", dir);
    const char *argv[16] = { exe, "-c", config, "migrate", "--sql-dir", dir };
    for (size_t i = 0; extra != NULL && extra[i] != NULL && i + 7 < 16; i++)
        argv[6 + i] = extra[i];
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd_out = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fd_err = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd_out < 0 || fd_err < 0 || dup2(fd_out, 1) < 0 || dup2(fd_err, 2) < 0)
            _exit(127);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static pid_t migrate_start(const char *config, const char *dir)
{
    return migrate_start_with(config, dir, NULL);
}

/* Runs migrate to its end; returns its exit code. */
static int migrate_with(const char *config, const char *dir, const char *const *extra)
{
    int status = h_wait_exit(migrate_start_with(config, dir, extra), 60000, "sekalictl migrate");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int migrate(const char *config, const char *dir)
{
    return migrate_with(config, dir, NULL);
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
    /* Its plan came first, and said the table stays writable. */
    const char *plan = strstr(out, "plan: 1 migration to apply");
    ck_assert_msg(plan != NULL && plan < strstr(out, "concurrently, outside") &&
                  strstr(out, ": online, statement by statement outside a transaction") != NULL &&
                  strstr(out, "    sekali.idempotency_keys: ") != NULL &&
                  strstr(out, "ShareUpdateExclusive while each statement runs: writes go on; "
                              "1 index build or scan") != NULL,
                  "migrate should say its plan first:\n%s", out);
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

/* A table of its own with n analysed rows, named after the run (sekali.plan_<queue>). */
static void plan_table(struct h_run *r, char *table, size_t size, int n)
{
    snprintf(table, size, "plan_%s", r->queue);
    for (char *c = table; *c != '\0'; c++)
        if (*c == '-')
            *c = '_';
    char sql[1024];
    snprintf(sql, sizeof(sql), "CREATE TABLE sekali.%s (v integer); "
                               "INSERT INTO sekali.%s SELECT generate_series(1, %d); "
                               "ANALYZE sekali.%s", table, table, n, table);
    h_pg_exec(r->pg, sql);
}

START_TEST(test_the_plan_lists_the_pending_files_and_plan_changes_nothing)
{
    struct h_run r;
    h_run_open(&r, "plan");
    char table[160], sql[1024], name[3][224];
    plan_table(&r, table, sizeof(table), 1000);
    for (int i = 0; i < 3; i++)
        snprintf(name[i], sizeof(name[i]), "90%d_%s.sql", i, table);
    /* Applied already: no plan lists it. */
    write_migration(r.dir, name[0], "CREATE TABLE sekali.never_applied (v integer);\n");
    snprintf(sql, sizeof(sql), "INSERT INTO sekali.schema_migrations (version) VALUES ('%s')",
             name[0]);
    h_pg_exec(r.pg, sql);
    snprintf(sql, sizeof(sql), "-- sekali: online\n"
                               "CREATE INDEX CONCURRENTLY IF NOT EXISTS %s_v ON sekali.%s (v);\n",
             table, table);
    write_migration(r.dir, name[1], sql);
    /* A function body's statements run when it is called: not in the plan. */
    snprintf(sql, sizeof(sql),
             "CREATE OR REPLACE FUNCTION sekali.%s_f() RETURNS void LANGUAGE sql AS $$\n"
             "    DELETE FROM sekali.idempotency_keys WHERE false $$;\n"
             "ALTER TABLE sekali.%s ADD COLUMN IF NOT EXISTS w integer;\n"
             "DROP INDEX IF EXISTS sekali.%s_old;\n", table, table, table);
    write_migration(r.dir, name[2], sql);
    snprintf(sql, sizeof(sql), "CREATE INDEX %s_old ON sekali.%s (v)", table, table);
    h_pg_exec(r.pg, sql);
    char *config = h_write_config(r.dir, r.queue, H_EFFECT, 1, NULL);
    long long versions = h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations");

    const char *plan_only[] = { "--plan", NULL };
    ck_assert_int_eq(migrate_with(config, r.dir, plan_only), 0);
    char *out = file_of(r.dir, "migrate.out");
    char want[3][512];
    snprintf(want[0], sizeof(want[0]), "  %s: online, statement by statement outside a "
             "transaction\n    sekali.%s: about 1000 rows, ", name[1], table);
    snprintf(want[1], sizeof(want[1]), "  %s: in one transaction, which holds its locks until "
             "COMMIT\n    sekali.%s: about 1000 rows, ", name[2], table);
    snprintf(want[2], sizeof(want[2]), "AccessExclusive until COMMIT: reads and writes wait; "
             "catalog only\n    sekali.%s_old (an index of sekali.%s): about 1000 rows, ", table,
             table);
    const char *online = strstr(out, want[0]), *tx = strstr(out, want[1]);
    ck_assert_msg(strncmp(out, "plan: 2 migrations to apply, in this order\n", 43) == 0 &&
                  online != NULL && tx != NULL && online < tx && strstr(out, want[2]) != NULL &&
                  strstr(out, "ShareUpdateExclusive while each statement runs: writes go on; "
                              "1 index build or scan, under 1 s") != NULL &&
                  strstr(out, "catalog only\n    1 statement on no table") != NULL,
                  "the plan should list %s online, then %s in a transaction:\n%s\n%s", name[1],
                  name[2], out, file_of(r.dir, "migrate.err"));
    ck_assert_msg(strstr(out, name[0]) == NULL && strstr(out, "idempotency_keys") == NULL,
                  "the plan lists an applied file, or a function body's table:\n%s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations"), versions);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_class WHERE relname = '%s_v'",
                                table), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_attribute WHERE attname = 'w' "
                                      "AND attrelid = 'sekali.%s'::regclass", table), 0);

    const char *plan_json[] = { "--plan", "--json", NULL };
    ck_assert_int_eq(migrate_with(config, r.dir, plan_json), 0);
    out = file_of(r.dir, "migrate.out");
    snprintf(want[0], sizeof(want[0]), "{\"plan\":[{\"name\":\"%s\",\"online\":true,"
             "\"tables\":[{\"table\":\"sekali.%s\",\"exists\":true,\"rows\":1000,", name[1], table);
    ck_assert_msg(strncmp(out, want[0], strlen(want[0])) == 0 &&
                  strstr(out, "\"lock\":\"AccessExclusive\",\"held\":\"transaction\"") != NULL &&
                  strstr(out, "],\"pending\":2,\"migrations\":3}\n") != NULL,
                  "--plan --json:\n%s", out);
    free(out);
    snprintf(sql, sizeof(sql),
             "python3 -c 'import json,sys; d = json.load(open(sys.argv[1])); p = d[\"plan\"]; "
             "sys.exit(0 if len(p) == 2 and p[0][\"online\"] and not p[1][\"online\"] and "
             "p[1][\"tables\"][0][\"writes\"] == 0 and p[1][\"other_statements\"] == 1 and "
             "p[1][\"tables\"][1][\"index_of\"] == \"sekali.%s\" and "
             "d[\"pending\"] == 2 else 1)' %s/migrate.out", table, r.dir);
    ck_assert_msg(system(sql) == 0, "--plan --json should parse and hold the two files");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations"), versions);

    /* Applying says the same plan first, then applies it. */
    ck_assert_int_eq(migrate(config, r.dir), 0);
    out = file_of(r.dir, "migrate.out");
    snprintf(want[0], sizeof(want[0]), "applied %s\napplied %s\n", name[1], name[2]);
    ck_assert_msg(strncmp(out, "plan: 2 migrations to apply", 27) == 0 &&
                  strstr(out, want[0]) != NULL, "migrate:\n%s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations"),
                     versions + 2);

    /* Nothing pending: both say so, and neither changes anything. */
    ck_assert_int_eq(migrate_with(config, r.dir, plan_only), 0);
    out = file_of(r.dir, "migrate.out");
    ck_assert_str_eq(out, "schema is up to date (3 migrations)\n");
    free(out);
    ck_assert_int_eq(migrate(config, r.dir), 0);
    out = file_of(r.dir, "migrate.out");
    ck_assert_str_eq(out, "schema is up to date (3 migrations)\n");
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations"),
                     versions + 2);

    snprintf(sql, sizeof(sql), "DROP TABLE sekali.%s; DROP FUNCTION sekali.%s_f(); "
                               "DELETE FROM sekali.schema_migrations WHERE version LIKE '90%%_%s.sql'",
             table, table, table);
    h_pg_exec(r.pg, sql);
    free(config);
    h_run_close(&r);
}
END_TEST

/* A volatile default rewrites the table under AccessExclusive, and a
 * foreign key holds the table it references too: the plan says both, and
 * estimates the rewrite, before anything runs. */
START_TEST(test_the_plan_says_a_rewrite_and_the_referenced_table)
{
    struct h_run r;
    h_run_open(&r, "rewrite");
    char table[160], sql[1024], name[224];
    plan_table(&r, table, sizeof(table), 1000);
    snprintf(sql, sizeof(sql), "CREATE TABLE sekali.%s_ref (id integer PRIMARY KEY); "
                               "INSERT INTO sekali.%s_ref SELECT generate_series(1, 500); "
                               "ANALYZE sekali.%s_ref", table, table, table);
    h_pg_exec(r.pg, sql);
    snprintf(name, sizeof(name), "907_%s.sql", table);
    snprintf(sql, sizeof(sql),
             "ALTER TABLE sekali.%s ADD COLUMN r double precision DEFAULT random();\n"
             "ALTER TABLE sekali.%s ADD CONSTRAINT %s_fk FOREIGN KEY (v) "
             "REFERENCES sekali.%s_ref (id) NOT VALID;\n", table, table, table, table);
    write_migration(r.dir, name, sql);
    char *config = h_write_config(r.dir, r.queue, H_EFFECT, 1, NULL);
    const char *plan_only[] = { "--plan", NULL };
    ck_assert_int_eq(migrate_with(config, r.dir, plan_only), 0);
    char *out = file_of(r.dir, "migrate.out");
    char want[2][512];
    snprintf(want[0], sizeof(want[0]), "    sekali.%s: about 1000 rows, ", table);
    snprintf(want[1], sizeof(want[1]), "    sekali.%s_ref: about 500 rows, ", table);
    /* Each table's line alone: the two must not borrow each other's words. */
    char line[2][1024] = { "", "" };
    for (int i = 0; i < 2; i++) {
        const char *at = strstr(out, want[i]);
        if (at != NULL)
            snprintf(line[i], sizeof(line[i]), "%.*s", (int)strcspn(at, "\n"), at);
    }
    ck_assert_msg(strstr(line[0], "AccessExclusive until COMMIT: reads and writes wait; 1 rewrite "
                                  "of the whole table") != NULL &&
                  strstr(line[1], "ShareRowExclusive until COMMIT: writes wait, reads go on; "
                                  "catalog only") != NULL,
                  "the plan should say the rewrite and the referenced table's lock:\n%s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_attribute WHERE attname = 'r' "
                                      "AND attrelid = 'sekali.%s'::regclass", table), 0);
    snprintf(sql, sizeof(sql), "DROP TABLE sekali.%s; DROP TABLE sekali.%s_ref", table, table);
    h_pg_exec(r.pg, sql);
    free(config);
    h_run_close(&r);
}
END_TEST

/* A file name is an operator's input too: a terminal's control sequences
 * in one reach the screen escaped. */
START_TEST(test_the_plan_escapes_a_hostile_file_name)
{
    struct h_run r;
    h_run_open(&r, "hostile");
    char name[256];
    snprintf(name, sizeof(name), "905_\x1b]0;owned\x07_%s.sql", r.queue);
    write_migration(r.dir, name, "SELECT 1;\n");
    char *config = h_write_config(r.dir, r.queue, H_EFFECT, 1, NULL);
    const char *plan_only[] = { "--plan", NULL };
    ck_assert_int_eq(migrate_with(config, r.dir, plan_only), 0);
    char *out = file_of(r.dir, "migrate.out");
    ck_assert_msg(strchr(out, '\x1b') == NULL && strchr(out, '\x07') == NULL &&
                  strstr(out, "  905_\\x1b]0;owned\\x07_") != NULL &&
                  strstr(out, "1 query or call whose work cannot be read beforehand") != NULL,
                  "the plan should escape the name:\n%s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations "
                                      "WHERE version LIKE '905_%%'"), 0);
    free(config);
    h_run_close(&r);
}
END_TEST

/* A migration that fails rolls back, and the JSON document still parses:
 * the plan, nothing applied, and the failure. */
START_TEST(test_a_failed_migration_still_closes_its_json_document)
{
    struct h_run r;
    h_run_open(&r, "failed");
    char name[256], cmd[1024];
    snprintf(name, sizeof(name), "906_%s.sql", r.queue);
    write_migration(r.dir, name, "SELECT sekali.no_such_function();\n");
    char *config = h_write_config(r.dir, r.queue, H_EFFECT, 1, NULL);
    const char *json[] = { "--json", NULL };
    ck_assert_int_eq(migrate_with(config, r.dir, json), 1);
    snprintf(cmd, sizeof(cmd),
             "python3 -c 'import json,sys; d = json.load(open(sys.argv[1])); "
             "sys.exit(0 if d[\"failed\"] and d[\"applied\"] == [] and len(d[\"plan\"]) == 1 and "
             "d[\"plan\"][0][\"unknown_statements\"] == 1 else 1)' %s/migrate.out", r.dir);
    ck_assert_msg(system(cmd) == 0, "the document should parse:\n%s", file_of(r.dir, "migrate.out"));
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.schema_migrations "
                                      "WHERE version = '%s'", name), 0);
    free(config);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_an_online_migration_builds_its_index_while_jobs_complete,
        test_an_interrupted_online_build_is_built_again_not_taken_for_done,
        test_the_plan_lists_the_pending_files_and_plan_changes_nothing,
        test_the_plan_says_a_rewrite_and_the_referenced_table,
        test_the_plan_escapes_a_hostile_file_name,
        test_a_failed_migration_still_closes_its_json_document,
        NULL,
    };
    Suite *s = suite_create("migrate");
    h_tcase(s, "migrate", 120, tests);
    return h_run_suite(s);
}
