/* ctl_migrate_scan.h - what the statements of a migration file will do,
 * read from its text before it runs (ctl_migrate_scan.c). */
#ifndef SK_CTL_MIGRATE_SCAN_H
#define SK_CTL_MIGRATE_SCAN_H

#include <stddef.h>

/* PostgreSQL's table lock modes that a migration's statements take, weakest
 * first (the order of its conflict table), so that a larger value is a
 * stronger lock. */
enum sk_mig_lock {
    SK_MIG_LOCK_NONE,                    /* no lock on an existing table */
    SK_MIG_LOCK_ROW_EXCLUSIVE,           /* INSERT, UPDATE, DELETE */
    SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE,  /* CREATE INDEX CONCURRENTLY, VALIDATE */
    SK_MIG_LOCK_SHARE,                   /* CREATE INDEX */
    SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE,     /* CREATE TRIGGER, a foreign key */
    SK_MIG_LOCK_EXCLUSIVE,
    SK_MIG_LOCK_ACCESS_EXCLUSIVE,        /* most ALTER TABLE, DROP, TRUNCATE */
};

/* How a statement's time grows. */
enum sk_mig_work {
    SK_MIG_WORK_CATALOG,  /* catalog only: instant once its locks are granted */
    SK_MIG_WORK_SCAN,     /* reads the whole table: an index build, a validation */
    SK_MIG_WORK_ROWS,     /* writes rows of the table: at most about a scan */
    SK_MIG_WORK_UNKNOWN,  /* a query, a call or a DO block: cannot be read beforehand */
    SK_MIG_WORK_MAY_REWRITE,  /* a default whose volatility the text does not tell */
    SK_MIG_WORK_REWRITE,  /* writes the whole table anew, locked: a volatile default, a type */
};

/* One top-level statement of a migration file. */
struct sk_mig_stmt {
    char table[128];        /* the table as written (for DROP INDEX, the index); "" if none */
    enum sk_mig_lock lock;  /* the strongest lock it takes on table */
    enum sk_mig_work work;
    /* A foreign key's referenced table ("" if none): it is locked too, and
     * read by the validation unless the key is NOT VALID. */
    char other[128];
    enum sk_mig_lock other_lock;
    enum sk_mig_work other_work;
};

/* Reads the top-level statements of sql (a migration file's text): comments,
 * string literals and dollar-quoted bodies (a function's statements run when
 * it is called, not when it is created) are skipped. Fills up to max of out
 * and returns how many statements there are (which may exceed max). Pure:
 * no database, any thread. */
size_t sk_ctl_migration_scan(const char *sql, struct sk_mig_stmt *out, size_t max);

/* The lock's PostgreSQL name ("AccessExclusive"), and what others may do
 * while it is held ("reads and writes wait"). Static strings. */
const char *sk_ctl_mig_lock_name(enum sk_mig_lock lock);
const char *sk_ctl_mig_lock_effect(enum sk_mig_lock lock);

#endif
