/* ctl_migrate.c - sekalictl migrate: the schema migrations.
 *
 * Migrations are the files DIR/NNN_name.sql, applied in name order, each in
 * its own transaction together with its row in sekali.schema_migrations, under
 * an advisory lock so that two hosts migrating at once do not race; except
 * the online ones (ctl_migrate_online.c), which build indexes on live tables
 * outside a transaction. What will run is said first (ctl_migrate_plan.c);
 * --plan says only that. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_migrate_online.h"
#include "ctl_migrate_plan.h"
#include "ctl_out.h"

#ifndef SK_SQL_DIR
#define SK_SQL_DIR "/usr/local/share/sekali/sql"
#endif

/* Any fixed number works; it only has to be the same for every sekalictl. */
#define MIGRATION_LOCK_ID 0x73656b616c69LL  /* "sekali" */

struct migrate_opts {
    const char *dir;
    bool json, plan_only;
};

static bool migrate_args(int argc, char **argv, struct migrate_opts *o);
static int migrate_run(PGconn *pg, struct dirent **files, int n, const struct migrate_opts *o);
static bool migrations_begin(PGconn *pg);
static bool pending_list(PGconn *pg, struct dirent **files, int n, bool plan_only,
                         const char **pending, size_t *n_pending);
static void print_applied(const char *name, bool json, int before);
static bool migration_apply(PGconn *pg, const char *dir, const char *name, bool quiet);
static bool migration_record(PGconn *pg, const char *name);
static int only_sql(const struct dirent *d);

int sk_ctl_migrate(const struct sk_conf *conf, int argc, char **argv)
{
    struct migrate_opts o = {
        .dir = getenv("SEKALI_SQL_DIR") != NULL ? getenv("SEKALI_SQL_DIR") : SK_SQL_DIR,
    };
    if (!migrate_args(argc, argv, &o))
        return SK_CTL_SHOW_USAGE;
    struct dirent **files = NULL;
    int n = scandir(o.dir, &files, only_sql, alphasort);
    if (n < 0) {
        fprintf(stderr, "sekalictl: cannot read %s: %s\n", o.dir, strerror(errno));
        return 1;
    }
    PGconn *pg = sk_ctl_pg_connect(conf);
    int code = pg != NULL ? migrate_run(pg, files, n, &o) : 1;
    PQfinish(pg);
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
    return code;
}

/* Says the plan, then (unless plan_only) applies it under the migration
 * lock, which is taken before the pending files are read, so that the plan
 * is what runs. */
static int migrate_run(PGconn *pg, struct dirent **files, int n, const struct migrate_opts *o)
{
    const char **pending = calloc((size_t)n + 1, sizeof(*pending));
    size_t n_pending = 0;
    const char *tail = NULL;  /* what closes the JSON document begun */
    int code = 1;
    if (pending == NULL || (!o->plan_only && !migrations_begin(pg)) ||
        !pending_list(pg, files, n, o->plan_only, pending, &n_pending))
        goto out;
    if (o->json)
        printf("{\"plan\":");
    bool planned = sk_ctl_migrate_plan(pg, o->dir, pending, n_pending, o->json);
    tail = o->json ? "," : NULL;  /* the plan's list is closed, whole or not */
    if (!planned)
        goto out;
    if (o->json) {
        printf(o->plan_only ? ",\"pending\":%zu" : ",\"applied\":[", n_pending);
        tail = o->plan_only ? "," : "],";
    }
    for (size_t i = 0; i < n_pending && !o->plan_only; i++) {
        if (!migration_apply(pg, o->dir, pending[i], o->json))
            goto out;
        print_applied(pending[i], o->json, (int)i);
    }
    if (o->json)
        printf("%s\"migrations\":%d}\n", tail, n);
    else if (n_pending == 0)
        printf("schema is up to date (%d migrations)\n", n);
    code = 0;

out:
    /* A failure halfway still closes the document, listing what was applied. */
    if (tail != NULL && code != 0)
        printf("%s\"migrations\":%d,\"failed\":true}\n", tail, n);
    free(pending);
    return code;
}

/* One line, or one element of the JSON document's list. */
static void print_applied(const char *name, bool json, int before)
{
    if (json) {
        printf("%s", before > 0 ? "," : "");
        sk_ctl_put_jstr(stdout, name);
    } else {
        printf("applied ");
        sk_ctl_put_tstr(stdout, name);
        printf("\n");
    }
}

/* false: a usage error. */
static bool migrate_args(int argc, char **argv, struct migrate_opts *o)
{
    static const struct option options[] = { { "sql-dir", required_argument, NULL, 'd' },
                                             { "json", no_argument, NULL, 'j' },
                                             { "plan", no_argument, NULL, 'p' },
                                             { NULL, 0, NULL, 0 } };
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (opt == 'j')
            o->json = true;
        else if (opt == 'p')
            o->plan_only = true;
        else if (opt == 'd')
            o->dir = optarg;
        else
            return false;
    }
    return optind == argc;
}

/* Takes the migration lock and makes sure the table of applied versions
 * exists. The session is sekalid's (the same dial), but a migration waits
 * for its locks as long as it takes (behind another migrate, or a table a
 * long transaction holds) instead of failing after a claim's timeout. */
static bool migrations_begin(PGconn *pg)
{
    char lock_sql[96];
    snprintf(lock_sql, sizeof(lock_sql), "SELECT pg_advisory_lock(%lld)", MIGRATION_LOCK_ID);
    return sk_ctl_pg_run(pg, "SET lock_timeout = 0", "SET lock_timeout") &&
           sk_ctl_pg_run(pg, lock_sql, "pg_advisory_lock") &&
           sk_ctl_pg_run(pg, "CREATE SCHEMA IF NOT EXISTS sekali;"
                       "CREATE TABLE IF NOT EXISTS sekali.schema_migrations ("
                       "  version text PRIMARY KEY,"
                       "  applied_at timestamptz NOT NULL DEFAULT now())",
                   "create sekali.schema_migrations");
}

/* The files not recorded in sekali.schema_migrations, in order (borrowed
 * from files). With plan_only nothing is created: a database without the
 * table has every file pending. */
static bool pending_list(PGconn *pg, struct dirent **files, int n, bool plan_only,
                         const char **pending, size_t *n_pending)
{
    const struct sk_pg_stmt st = {
        .sql = "SELECT version FROM sekali.schema_migrations",
        .what = "reading sekali.schema_migrations",
    };
    PGresult *res = NULL;
    if (plan_only) {
        const struct sk_pg_stmt exists = {
            .sql = "SELECT 1 WHERE to_regclass('sekali.schema_migrations') IS NOT NULL",
            .what = "looking for sekali.schema_migrations",
        };
        if (!sk_ctl_pg_exec(pg, &exists, &res))
            return false;
        bool table = PQntuples(res) == 1;
        PQclear(res);
        res = NULL;
        if (!table) {
            for (int i = 0; i < n; i++)
                pending[(*n_pending)++] = files[i]->d_name;
            return true;
        }
    }
    if (!sk_ctl_pg_exec(pg, &st, &res))
        return false;
    for (int i = 0; i < n; i++) {
        bool done = false;
        for (int r = 0; r < PQntuples(res) && !done; r++)
            done = strcmp(PQgetvalue(res, r, 0), files[i]->d_name) == 0;
        if (!done)
            pending[(*n_pending)++] = files[i]->d_name;
    }
    PQclear(res);
    return true;
}

/* Runs one file and records its version in the same transaction, so a
 * migration is applied and recorded, or neither. An online file cannot be
 * one transaction: its version is recorded once all of it ran, and a run
 * cut short runs it again (its statements are idempotent). */
static bool migration_apply(PGconn *pg, const char *dir, const char *name, bool quiet)
{
    char *sql = sk_ctl_migration_text(dir, name);
    if (sql == NULL)
        return false;
    if (sk_ctl_migration_is_online(sql)) {
        bool ok = sk_ctl_migration_apply_online(pg, name, sql, quiet) && migration_record(pg, name);
        free(sql);
        if (!ok)
            fprintf(stderr, "sekalictl: online migration %s stopped; run migrate again "
                    "(it starts the file over)\n", name);
        return ok;
    }
    bool ok = sk_ctl_pg_run(pg, "BEGIN", "BEGIN") && sk_ctl_pg_run(pg, sql, name);
    free(sql);
    ok = ok && migration_record(pg, name);
    if (!ok || !sk_ctl_pg_run(pg, "COMMIT", "COMMIT")) {
        sk_ctl_pg_run(pg, "ROLLBACK", "ROLLBACK");
        fprintf(stderr, "sekalictl: migration %s failed and was rolled back\n", name);
        return false;
    }
    return true;
}

static bool migration_record(PGconn *pg, const char *name)
{
    const char *params[] = { name };
    const struct sk_pg_stmt record = {
        .sql = "INSERT INTO sekali.schema_migrations (version) VALUES ($1)",
        .n_params = 1, .values = params, .what = "recording the migration",
    };
    return sk_ctl_pg_exec(pg, &record, NULL);
}

static int only_sql(const struct dirent *d)
{
    size_t len = strlen(d->d_name);
    return len > 4 && strcmp(d->d_name + len - 4, ".sql") == 0 && d->d_name[0] != '.';
}
