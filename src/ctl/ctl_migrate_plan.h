/* ctl_migrate_plan.h - what `sekalictl migrate` will do, said before it
 * does it (ctl_migrate_plan.c). */
#ifndef SK_CTL_MIGRATE_PLAN_H
#define SK_CTL_MIGRATE_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

/* The rate of an index build or a table scan that the plan's estimates
 * assume: bytes of the table's heap a second. Measured on the live 10 M keys
 * of docs/benchmark.md (a 2 GB heap indexed concurrently in 47.6 s on two
 * loaded cores); a rough guide, documented in sekalictl(8). */
#define SK_MIG_SCAN_BYTES_PER_S 40e6

/* The text of DIR/name, NUL-terminated (the caller frees it), or NULL after
 * printing why on stderr. */
char *sk_ctl_migration_text(const char *dir, const char *name);

/* Prints the plan of the pending migrations names[0..n) of dir, in order:
 * how each runs, the tables it touches with their size (pg_class, never a
 * count), the strongest lock it takes on each and an estimate of its time.
 * As text, or with json as the value of a "plan" member ([...]). Reads the
 * catalog only and takes no lock. Returns false after printing why on
 * stderr (a file unreadable). */
bool sk_ctl_migrate_plan(PGconn *pg, const char *dir, const char *const *names, size_t n,
                         bool json);

#endif
