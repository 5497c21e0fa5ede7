/* ctl_migrate_online.c - sekalictl migrate: the migrations that must not
 * lock a live table.
 *
 * A migration file whose first line is "-- sekali: online" builds indexes
 * with CREATE INDEX CONCURRENTLY, which PostgreSQL refuses inside a
 * transaction block: its statements run one by one, each on its own, and
 * the version is recorded after the last. Every statement of such a file
 * must be idempotent (IF NOT EXISTS), since a run cut short is run again
 * from its first statement; and an index whose concurrent build was cut
 * short stays behind invalid, which IF NOT EXISTS would take for built, so
 * the invalid indexes of schema sekali are dropped (concurrently) first.
 * Statements end with ';' at the end of a line, and comment lines are
 * skipped: an online file holds plain DDL, never a function body. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "ctl_common.h"
#include "ctl_migrate_online.h"

static bool drop_invalid(PGconn *pg);
static bool run_statement(PGconn *pg, const char *name, const char *stmt, bool quiet);
static void say_table(PGconn *pg, const char *name, const char *stmt);
static double now_s(void);

bool sk_ctl_migration_is_online(const char *sql)
{
    return strncmp(sql, SK_ONLINE_MARK "\n", strlen(SK_ONLINE_MARK) + 1) == 0;
}

bool sk_ctl_migration_apply_online(PGconn *pg, const char *name, char *sql, bool quiet)
{
    if (strstr(sql, "$$") != NULL) {
        fprintf(stderr, "sekalictl: %s is marked online but holds a function body ($$): "
                "an online migration holds plain statements only\n", name);
        return false;
    }
    if (!drop_invalid(pg))
        return false;
    char stmt[8192];
    size_t len = 0;
    char *save = NULL;
    for (char *line = strtok_r(sql, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        const char *text = line + strspn(line, " \t");
        if (strncmp(text, "--", 2) == 0 || *text == '\0')
            continue;
        int n = snprintf(stmt + len, sizeof(stmt) - len, "%s\n", line);
        if (n < 0 || (size_t)n >= sizeof(stmt) - len) {
            fprintf(stderr, "sekalictl: %s: a statement longer than %zu bytes\n", name,
                    sizeof(stmt));
            return false;
        }
        len += (size_t)n;
        const char *end = line + strlen(line);
        while (end > line && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
            end--;
        if (end > line && end[-1] == ';') {
            if (!run_statement(pg, name, stmt, quiet))
                return false;
            len = 0;
        }
    }
    return len == 0 || run_statement(pg, name, stmt, quiet);
}

/* What an interrupted CREATE INDEX CONCURRENTLY leaves: an index that
 * writes maintain but no read uses. The advisory lock every migrate holds
 * means none is being built right now. */
static bool drop_invalid(PGconn *pg)
{
    const struct sk_pg_stmt st = {
        .sql = "SELECT format('DROP INDEX CONCURRENTLY IF EXISTS %I.%I', n.nspname, c.relname) "
               "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
               "JOIN pg_namespace n ON n.oid = c.relnamespace "
               "WHERE NOT i.indisvalid AND n.nspname = 'sekali'",
        .what = "looking for invalid indexes",
    };
    PGresult *res;
    if (!sk_ctl_pg_exec(pg, &st, &res))
        return false;
    bool ok = true;
    for (int r = 0; r < PQntuples(res) && ok; r++) {
        fprintf(stderr, "sekalictl: an interrupted build left an invalid index: %s\n",
                PQgetvalue(res, r, 0));
        ok = sk_ctl_pg_run(pg, PQgetvalue(res, r, 0), "dropping an invalid index");
    }
    PQclear(res);
    return ok;
}

static bool run_statement(PGconn *pg, const char *name, const char *stmt, bool quiet)
{
    if (!quiet)
        say_table(pg, name, stmt);
    double start = now_s();
    if (!sk_ctl_pg_run(pg, stmt, name))
        return false;
    if (!quiet)
        printf("  done in %.1f s\n", now_s() - start);
    return true;
}

/* Says what a statement will do before it runs: for an index, on which
 * table and how many rows (PostgreSQL's estimate), since its time grows
 * with them while the table stays writable. */
static void say_table(PGconn *pg, const char *name, const char *stmt)
{
    const char *on = strstr(stmt, " ON ");
    if (strstr(stmt, "CONCURRENTLY") == NULL || on == NULL) {
        printf("%s: running %.60s...\n", name, stmt);
        return;
    }
    char table[256], index[256] = "an index";
    if (sscanf(on + 4, " %255[A-Za-z0-9_.]", table) != 1)
        table[0] = '\0';
    const char *exists = strstr(stmt, " EXISTS ");
    if (exists != NULL && exists < on)
        sscanf(exists + 8, " %255[A-Za-z0-9_]", index);
    const char *params[] = { table };
    const struct sk_pg_stmt st = {
        .sql = "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass($1)",
        .n_params = 1, .values = params, .what = "estimating a table's rows",
    };
    PGresult *res;
    long long rows = -1;
    if (sk_ctl_pg_exec(pg, &st, &res)) {
        if (PQntuples(res) == 1)
            rows = atoll(PQgetvalue(res, 0, 0));
        PQclear(res);
    }
    printf("%s: building %s on %s (about %lld rows) concurrently, outside a "
           "transaction: writes go on meanwhile\n", name, index, table, rows);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
