/* ctl_migrate_plan.c - the plan `sekalictl migrate` says before it applies
 * anything, and all that `migrate --plan` does.
 *
 * An operator upgrading a live store needs to know, before it starts, which
 * tables a migration holds and how, and for how long: a transactional file
 * keeps the locks of all its statements until its COMMIT, an online one
 * (ctl_migrate_online.c) only the ShareUpdateExclusive of each index build.
 * The statements are read from the files (ctl_migrate_scan.c); the sizes
 * from pg_class and the relation sizes, which cost nothing at any size,
 * never from counting rows. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_common.h"
#include "ctl_migrate_online.h"
#include "ctl_migrate_plan.h"
#include "ctl_migrate_scan.h"
#include "ctl_out.h"

#define MAX_STMTS 512
#define MAX_TABLES 32

/* What one file does to one table. */
struct table_plan {
    char name[128];         /* as the file writes it */
    enum sk_mig_lock lock;  /* the strongest of its statements' */
    int scans, writes;      /* statements that read the whole table, that write rows */
    int rewrites;           /* statements that write the whole table anew */
    int may_rewrites;       /* ...or may: a default whose volatility the text hides */
    bool exists;
    char index_of[128];     /* name is an index (DROP INDEX): its table; else "" */
    long long rows;         /* pg_class.reltuples: -1 until first analyzed */
    long long heap, total;  /* bytes: the table alone, with its indexes and TOAST */
    double seconds;
};

struct file_plan {
    bool online;
    struct table_plan tables[MAX_TABLES];
    size_t n_tables;
    int other, unknown;     /* statements on no table; statements that cannot be read */
    double seconds;
    struct sk_mig_stmt stmts[MAX_STMTS];
};

static bool plan_file(PGconn *pg, const char *dir, const char *name, struct file_plan *fp);
static void add_statement(struct file_plan *fp, const struct sk_mig_stmt *st);
static void add_work(struct file_plan *fp, const char *table, enum sk_mig_lock lock,
                     enum sk_mig_work work);
static void look_up(PGconn *pg, struct table_plan *t);
static void print_text(const char *name, const struct file_plan *fp);
static void print_table_text(const struct table_plan *t, bool online);
static void print_json(const char *name, const struct file_plan *fp);
static void put_size(long long bytes);
static void put_seconds(double s);

bool sk_ctl_migrate_plan(PGconn *pg, const char *dir, const char *const *names, size_t n,
                         bool json)
{
    struct file_plan *fp = malloc(sizeof(*fp));
    if (fp == NULL) {
        fprintf(stderr, "sekalictl: out of memory\n");
        return false;
    }
    if (json)
        printf("[");
    else if (n > 0)
        printf("plan: %zu migration%s to apply, in this order\n", n, n == 1 ? "" : "s");
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        ok = plan_file(pg, dir, names[i], fp);
        if (ok && json) {
            printf("%s", i > 0 ? "," : "");
            print_json(names[i], fp);
        } else if (ok) {
            print_text(names[i], fp);
        }
    }
    if (json)
        printf("]");
    free(fp);
    return ok;
}

char *sk_ctl_migration_text(const char *dir, const char *name)
{
    char file[4096];
    snprintf(file, sizeof(file), "%s/%s", dir, name);
    FILE *f = fopen(file, "r");
    if (f == NULL) {
        fprintf(stderr, "sekalictl: cannot open %s: %s\n", file, strerror(errno));
        return NULL;
    }
    size_t len;
    char *sql = sk_ctl_read_all(f, &len);
    fclose(f);
    if (sql == NULL)
        fprintf(stderr, "sekalictl: cannot read %s\n", file);
    return sql;
}

static bool plan_file(PGconn *pg, const char *dir, const char *name, struct file_plan *fp)
{
    char *sql = sk_ctl_migration_text(dir, name);
    if (sql == NULL)
        return false;
    memset(fp, 0, sizeof(*fp));
    size_t n = sk_ctl_migration_scan(sql, fp->stmts, MAX_STMTS);
    fp->online = sk_ctl_migration_is_online(sql);
    free(sql);
    fp->unknown = n > MAX_STMTS ? (int)(n - MAX_STMTS) : 0;
    for (size_t i = 0; i < n && i < MAX_STMTS; i++)
        add_statement(fp, &fp->stmts[i]);
    for (size_t t = 0; t < fp->n_tables; t++) {
        struct table_plan *tp = &fp->tables[t];
        look_up(pg, tp);
        /* A rewrite reads the heap, writes it anew and builds every index
         * again: about twice the table with its indexes. One that may
         * happen is estimated as if it does. */
        tp->seconds = ((tp->scans + tp->writes) * (double)tp->heap +
                       (tp->rewrites + tp->may_rewrites) * 2.0 * (double)tp->total) /
                      SK_MIG_SCAN_BYTES_PER_S;
        fp->seconds += tp->seconds;
    }
    return true;
}

static void add_statement(struct file_plan *fp, const struct sk_mig_stmt *st)
{
    if (st->work == SK_MIG_WORK_UNKNOWN) {
        fp->unknown++;
        return;
    }
    if (st->table[0] == '\0') {
        fp->other++;
        return;
    }
    add_work(fp, st->table, st->lock, st->work);
    if (st->other[0] != '\0')
        add_work(fp, st->other, st->other_lock, st->other_work);
}

/* The scanner's names fit the plan's as they are (gcc 14 cannot see that
 * through snprintf, and -Werror stops the Debian 13 build). */
_Static_assert(sizeof((struct table_plan *)0)->name == sizeof((struct sk_mig_stmt *)0)->table &&
               sizeof((struct sk_mig_stmt *)0)->other == sizeof((struct sk_mig_stmt *)0)->table,
               "table name sizes");

static void add_work(struct file_plan *fp, const char *table, enum sk_mig_lock lock,
                     enum sk_mig_work work)
{
    size_t t = 0;
    while (t < fp->n_tables && strcmp(fp->tables[t].name, table) != 0)
        t++;
    if (t == fp->n_tables) {
        if (t == MAX_TABLES) {
            fp->unknown++;
            return;
        }
        fp->n_tables++;
        memcpy(fp->tables[t].name, table, sizeof fp->tables[t].name);
    }
    struct table_plan *tp = &fp->tables[t];
    if (lock > tp->lock)
        tp->lock = lock;
    tp->scans += work == SK_MIG_WORK_SCAN;
    tp->writes += work == SK_MIG_WORK_ROWS;
    tp->rewrites += work == SK_MIG_WORK_REWRITE;
    tp->may_rewrites += work == SK_MIG_WORK_MAY_REWRITE;
}

/* The table's size, or for an index (DROP INDEX names one) its table's
 * size and name; t->exists false when neither is there (yet). A name
 * PostgreSQL cannot read is a table that is not there: the plan goes on
 * without its size. */
static void look_up(PGconn *pg, struct table_plan *t)
{
    const char *params[] = { t->name };
    PGresult *res = PQexecParams(
        pg, "SELECT c.reltuples::bigint, pg_relation_size(c.oid), pg_total_relation_size(c.oid), "
            "CASE WHEN c.oid <> to_regclass($1) THEN format('%I.%I', n.nspname, c.relname) "
            "ELSE '' END FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = coalesce((SELECT i.indrelid FROM pg_index i "
            "WHERE i.indexrelid = to_regclass($1)), to_regclass($1))",
        1, NULL, params, NULL, NULL, 0);
    t->exists = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1;
    if (t->exists) {
        t->rows = atoll(PQgetvalue(res, 0, 0));
        t->heap = atoll(PQgetvalue(res, 0, 1));
        t->total = atoll(PQgetvalue(res, 0, 2));
        snprintf(t->index_of, sizeof(t->index_of), "%s", PQgetvalue(res, 0, 3));
    }
    PQclear(res);
}

static void print_text(const char *name, const struct file_plan *fp)
{
    printf("  ");
    sk_ctl_put_tstr(stdout, name);
    printf(fp->online ? ": online, statement by statement outside a transaction\n"
                      : ": in one transaction, which holds its locks until COMMIT\n");
    for (size_t t = 0; t < fp->n_tables; t++)
        print_table_text(&fp->tables[t], fp->online);
    if (fp->other > 0)
        printf("    %d statement%s on no table (functions, settings): catalog only\n",
               fp->other, fp->other == 1 ? "" : "s");
    if (fp->unknown > 0)
        printf("    %d quer%s or call%s whose work cannot be read beforehand\n", fp->unknown,
               fp->unknown == 1 ? "y" : "ies", fp->unknown == 1 ? "" : "s");
    printf("    estimate: ");
    put_seconds(fp->seconds);
    printf("%s, not counting waits for other sessions' locks\n",
           fp->unknown > 0 ? " plus its queries and calls" : "");
}

static void print_table_text(const struct table_plan *t, bool online)
{
    printf("    ");
    sk_ctl_put_tstr(stdout, t->name);
    if (t->index_of[0] != '\0') {
        printf(" (an index of ");
        sk_ctl_put_tstr(stdout, t->index_of);
        printf(")");
    }
    if (!t->exists)
        printf(": not there yet");
    else if (t->rows < 0)
        printf(": rows not yet estimated, ");
    else
        printf(": about %lld rows, ", t->rows);
    if (t->exists)
        put_size(t->total);
    printf("; %s", sk_ctl_mig_lock_name(t->lock));
    if (t->lock != SK_MIG_LOCK_NONE)
        printf(online ? " while each statement runs" : " until COMMIT");
    printf(": %s", sk_ctl_mig_lock_effect(t->lock));
    if (t->scans > 0)
        printf("; %d index build%s or scan%s", t->scans, t->scans == 1 ? "" : "s",
               t->scans == 1 ? "" : "s");
    if (t->writes > 0)
        printf("; %d statement%s writing rows", t->writes, t->writes == 1 ? "" : "s");
    if (t->rewrites > 0)
        printf("; %d rewrite%s of the whole table (a volatile default, a type change)",
               t->rewrites, t->rewrites == 1 ? "" : "s");
    if (t->may_rewrites > 0)
        printf("; %d statement%s that may rewrite the whole table (a default calling a "
               "function whose volatility is not known here)", t->may_rewrites,
               t->may_rewrites == 1 ? "" : "s");
    if (t->scans + t->writes + t->rewrites + t->may_rewrites > 0) {
        printf(", ");
        put_seconds(t->seconds);
    } else {
        printf("; catalog only");
    }
    printf("\n");
}

static void print_json(const char *name, const struct file_plan *fp)
{
    printf("{\"name\":");
    sk_ctl_put_jstr(stdout, name);
    printf(",\"online\":%s,\"tables\":[", fp->online ? "true" : "false");
    for (size_t i = 0; i < fp->n_tables; i++) {
        const struct table_plan *t = &fp->tables[i];
        printf("%s{\"table\":", i > 0 ? "," : "");
        sk_ctl_put_jstr(stdout, t->name);
        if (t->index_of[0] != '\0') {
            printf(",\"index_of\":");
            sk_ctl_put_jstr(stdout, t->index_of);
        }
        if (t->exists && t->rows >= 0)
            printf(",\"exists\":true,\"rows\":%lld", t->rows);
        else
            printf(",\"exists\":%s,\"rows\":null", t->exists ? "true" : "false");
        printf(",\"bytes\":%lld,\"lock\":\"%s\",\"held\":\"%s\",\"effect\":\"%s\","
               "\"scans\":%d,\"writes\":%d,\"rewrites\":%d,\"may_rewrites\":%d,"
               "\"estimate_s\":%.1f}",
               t->total, sk_ctl_mig_lock_name(t->lock), fp->online ? "statement" : "transaction",
               sk_ctl_mig_lock_effect(t->lock), t->scans, t->writes, t->rewrites,
               t->may_rewrites, t->seconds);
    }
    printf("],\"other_statements\":%d,\"unknown_statements\":%d,\"estimate_s\":%.1f}",
           fp->other, fp->unknown, fp->seconds);
}

static void put_size(long long bytes)
{
    if (bytes >= 1000LL * 1000 * 1000)
        printf("%.1f GB", (double)bytes / 1e9);
    else if (bytes >= 1000LL * 1000)
        printf("%.1f MB", (double)bytes / 1e6);
    else
        printf("%lld kB", bytes / 1000);
}

static void put_seconds(double s)
{
    if (s < 1)
        printf("under 1 s");
    else if (s < 120)
        printf("about %.0f s", s);
    else
        printf("about %.0f min", s / 60);
}
