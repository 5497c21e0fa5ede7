/* check_migrate_scan.c - reading what a migration's statements will do
 * (src/ctl/ctl_migrate_scan.c), which `sekalictl migrate` says in its plan:
 * the table and the lock of each kind of statement, a function body's
 * statements taken for what they are (run later, not now), and the files
 * of sql/ read without a statement the plan cannot place. */
/* links: ctl_migrate_scan */
#include <stdio.h>
#include <string.h>

#include "ctl_migrate_scan.h"
#include "suite.h"

static struct sk_mig_stmt st[64];

static size_t scan(const char *sql)
{
    memset(st, 0, sizeof(st));
    return sk_ctl_migration_scan(sql, st, 64);
}

START_TEST(test_each_kind_of_statement_has_its_table_and_lock)
{
    static const struct {
        const char *sql, *table;
        enum sk_mig_lock lock;
        enum sk_mig_work work;
    } cases[] = {
        { "CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON sekali.t (a) WHERE b", "sekali.t",
          SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE, SK_MIG_WORK_SCAN },
        { "create unique index i on only sekali.t (a)", "sekali.t", SK_MIG_LOCK_SHARE,
          SK_MIG_WORK_SCAN },
        { "ALTER TABLE sekali.t ADD COLUMN IF NOT EXISTS c int", "sekali.t",
          SK_MIG_LOCK_ACCESS_EXCLUSIVE, SK_MIG_WORK_CATALOG },
        { "ALTER TABLE sekali.t ADD CONSTRAINT c CHECK (a > 0) NOT VALID", "sekali.t",
          SK_MIG_LOCK_ACCESS_EXCLUSIVE, SK_MIG_WORK_CATALOG },
        { "ALTER TABLE sekali.t ADD CONSTRAINT c CHECK (a > 0)", "sekali.t",
          SK_MIG_LOCK_ACCESS_EXCLUSIVE, SK_MIG_WORK_SCAN },
        { "ALTER TABLE IF EXISTS sekali.t VALIDATE CONSTRAINT c", "sekali.t",
          SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE, SK_MIG_WORK_SCAN },
        { "CREATE TABLE IF NOT EXISTS sekali.n (a int)", "sekali.n", SK_MIG_LOCK_NONE,
          SK_MIG_WORK_CATALOG },
        { "CREATE TRIGGER x AFTER UPDATE OF status ON sekali.t FOR EACH ROW EXECUTE "
          "FUNCTION f()", "sekali.t", SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE, SK_MIG_WORK_CATALOG },
        { "DROP TRIGGER IF EXISTS x ON sekali.t", "sekali.t", SK_MIG_LOCK_ACCESS_EXCLUSIVE,
          SK_MIG_WORK_CATALOG },
        { "DROP INDEX CONCURRENTLY IF EXISTS sekali.i", "sekali.i",
          SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE, SK_MIG_WORK_CATALOG },
        { "LOCK TABLE sekali.t IN SHARE ROW EXCLUSIVE MODE", "sekali.t",
          SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE, SK_MIG_WORK_CATALOG },
        { "LOCK sekali.t", "sekali.t", SK_MIG_LOCK_ACCESS_EXCLUSIVE, SK_MIG_WORK_CATALOG },
        { "UPDATE ONLY sekali.t SET a = 1", "sekali.t", SK_MIG_LOCK_ROW_EXCLUSIVE,
          SK_MIG_WORK_ROWS },
        { "INSERT INTO \"Odd Name\".t VALUES (1)", "\"Odd Name\".t", SK_MIG_LOCK_ROW_EXCLUSIVE,
          SK_MIG_WORK_ROWS },
        { "SELECT sekali.recount()", "", SK_MIG_LOCK_NONE, SK_MIG_WORK_UNKNOWN },
        { "SET LOCAL lock_timeout = '5s'", "", SK_MIG_LOCK_NONE, SK_MIG_WORK_CATALOG },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ck_assert_uint_eq(scan(cases[i].sql), 1);
        ck_assert_msg(strcmp(st[0].table, cases[i].table) == 0 && st[0].lock == cases[i].lock &&
                      st[0].work == cases[i].work,
                      "%s: table '%s' lock %s work %d", cases[i].sql, st[0].table,
                      sk_ctl_mig_lock_name(st[0].lock), (int)st[0].work);
    }
}
END_TEST

START_TEST(test_function_bodies_comments_and_strings_are_not_statements)
{
    const char *sql =
        "-- ALTER TABLE sekali.commented;\n"
        "/* DROP TABLE sekali.block; */\n"
        "CREATE OR REPLACE FUNCTION sekali.f(p int) RETURNS void LANGUAGE sql AS $body$\n"
        "    ALTER TABLE sekali.inside DROP COLUMN x; DELETE FROM sekali.inside;\n"
        "$body$;\n"
        "DO $$ BEGIN PERFORM 1; END $$;\n"
        "COMMENT ON FUNCTION sekali.f(int) IS 'it does; DROP TABLE sekali.quoted';\n"
        "UPDATE sekali.t SET a = $1;";
    ck_assert_uint_eq(scan(sql), 4);
    ck_assert_str_eq(st[0].table, "");
    ck_assert_int_eq(st[0].lock, SK_MIG_LOCK_NONE);
    ck_assert_int_eq(st[1].work, SK_MIG_WORK_UNKNOWN);
    ck_assert_str_eq(st[2].table, "");
    ck_assert_str_eq(st[3].table, "sekali.t");
    ck_assert_int_eq(st[3].lock, SK_MIG_LOCK_ROW_EXCLUSIVE);
    /* Unterminated quotes run to the end, and nothing reads past it. */
    ck_assert_uint_eq(scan("CREATE INDEX i ON sekali.t (a); SELECT 'open"), 2);
    ck_assert_uint_eq(scan("DO $x$ never closed"), 1);
    ck_assert_uint_eq(scan("ALTER TABLE \"never closed"), 1);
    ck_assert_uint_eq(scan(""), 0);
    ck_assert_uint_eq(scan(";;  ;"), 0);
}
END_TEST

/* A column whose default PostgreSQL must compute per row (a volatile
 * function, a sequence, a stored generated column, an identity) or a type
 * change rewrites the table under AccessExclusive; a default whose
 * function the text cannot judge may; a constant or now() is the catalog's.
 * Setting a default changes only later rows. */
START_TEST(test_a_volatile_default_or_a_new_type_is_a_rewrite)
{
    static const struct {
        const char *sql;
        enum sk_mig_work work;
    } cases[] = {
        { "ALTER TABLE sekali.t ADD COLUMN c timestamptz DEFAULT now()", SK_MIG_WORK_CATALOG },
        { "ALTER TABLE sekali.t ADD COLUMN c text NOT NULL DEFAULT 'x'::text", SK_MIG_WORK_CATALOG },
        { "ALTER TABLE sekali.t ADD c numeric DEFAULT 0::numeric(10, 2) NOT NULL",
          SK_MIG_WORK_CATALOG },
        { "ALTER TABLE sekali.t ADD COLUMN c jsonb DEFAULT '{}' CHECK (length(c::text) > 1)",
          SK_MIG_WORK_SCAN },
        { "ALTER TABLE sekali.t ADD COLUMN c double precision DEFAULT random()",
          SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ADD COLUMN IF NOT EXISTS c uuid DEFAULT gen_random_uuid()",
          SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ADD COLUMN a int, ADD COLUMN c timestamptz NOT NULL "
          "DEFAULT pg_catalog.clock_timestamp()", SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ADD COLUMN c bigint DEFAULT nextval('sekali.s')",
          SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ADD COLUMN c bigserial", SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ADD COLUMN c int GENERATED ALWAYS AS (a * 2) STORED",
          SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ADD COLUMN c int GENERATED BY DEFAULT AS IDENTITY",
          SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ALTER COLUMN a TYPE bigint", SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ALTER a SET DATA TYPE text USING a::text", SK_MIG_WORK_REWRITE },
        { "ALTER TABLE sekali.t ADD COLUMN c text DEFAULT sekali.pick()",
          SK_MIG_WORK_MAY_REWRITE },
        { "ALTER TABLE sekali.t ADD COLUMN c text DEFAULT upper(sekali.pick(1))",
          SK_MIG_WORK_MAY_REWRITE },
        { "ALTER TABLE sekali.t ALTER COLUMN c SET DEFAULT random()", SK_MIG_WORK_CATALOG },
        { "ALTER TABLE sekali.t ADD COLUMN type text", SK_MIG_WORK_CATALOG },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ck_assert_uint_eq(scan(cases[i].sql), 1);
        ck_assert_msg(strcmp(st[0].table, "sekali.t") == 0 &&
                      st[0].lock == SK_MIG_LOCK_ACCESS_EXCLUSIVE && st[0].work == cases[i].work,
                      "%s: table '%s' lock %s work %d, want %d", cases[i].sql, st[0].table,
                      sk_ctl_mig_lock_name(st[0].lock), (int)st[0].work, (int)cases[i].work);
    }
}
END_TEST

/* A foreign key locks the table it references too (ShareRowExclusive:
 * its writers wait), and its validation reads both unless NOT VALID; a
 * column with REFERENCES is an ADD COLUMN, AccessExclusive on its own. */
START_TEST(test_a_foreign_key_locks_the_table_it_references)
{
    static const struct {
        const char *sql;
        enum sk_mig_lock lock;
        enum sk_mig_work work;
    } cases[] = {
        { "ALTER TABLE sekali.t ADD CONSTRAINT f FOREIGN KEY (a) REFERENCES sekali.o (id)",
          SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE, SK_MIG_WORK_SCAN },
        { "ALTER TABLE sekali.t ADD FOREIGN KEY (a) REFERENCES sekali.o(id) ON DELETE SET NULL "
          "NOT VALID", SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE, SK_MIG_WORK_CATALOG },
        { "ALTER TABLE sekali.t ADD COLUMN a bigint REFERENCES sekali.o",
          SK_MIG_LOCK_ACCESS_EXCLUSIVE, SK_MIG_WORK_SCAN },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ck_assert_uint_eq(scan(cases[i].sql), 1);
        ck_assert_msg(strcmp(st[0].table, "sekali.t") == 0 && st[0].lock == cases[i].lock &&
                      st[0].work == cases[i].work && strcmp(st[0].other, "sekali.o") == 0 &&
                      st[0].other_lock == SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE &&
                      st[0].other_work == cases[i].work,
                      "%s: %s %s %d, other '%s' %s %d", cases[i].sql, st[0].table,
                      sk_ctl_mig_lock_name(st[0].lock), (int)st[0].work, st[0].other,
                      sk_ctl_mig_lock_name(st[0].other_lock), (int)st[0].other_work);
    }
    ck_assert_uint_eq(scan("ALTER TABLE sekali.t ADD COLUMN c int DEFAULT 1"), 1);
    ck_assert_str_eq(st[0].other, "");
}
END_TEST

/* Every index of sql/ on a table is placed on its table, and the online
 * files take nothing stronger than ShareUpdateExclusive. */
START_TEST(test_the_migrations_of_sql_are_read_as_written)
{
    const char *online[] = { "027_history_indexes.sql", "033_purge_indexes.sql" };
    for (size_t f = 0; f < 2; f++) {
        char path[256];
        snprintf(path, sizeof(path), "sql/%s", online[f]);  /* run from the tree's root */
        FILE *in = fopen(path, "r");
        ck_assert_msg(in != NULL, "cannot open %s", path);
        static char text[65536];
        size_t len = fread(text, 1, sizeof(text) - 1, in);
        fclose(in);
        text[len] = '\0';
        size_t n = scan(text);
        ck_assert_uint_eq(n, 2);
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(strncmp(st[i].table, "sekali.", 7) == 0, "%s: '%s'", path, st[i].table);
            ck_assert_int_eq(st[i].lock, SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE);
            ck_assert_int_eq(st[i].work, SK_MIG_WORK_SCAN);
        }
    }
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_each_kind_of_statement_has_its_table_and_lock,
        test_function_bodies_comments_and_strings_are_not_statements,
        test_a_volatile_default_or_a_new_type_is_a_rewrite,
        test_a_foreign_key_locks_the_table_it_references,
        test_the_migrations_of_sql_are_read_as_written,
        NULL,
    };
    return h_run_suite(h_suite("migrate_scan", 0, tests));
}
