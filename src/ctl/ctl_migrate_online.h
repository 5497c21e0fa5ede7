/* ctl_migrate_online.h - migrations run outside a transaction. */
#ifndef SK_CTL_MIGRATE_ONLINE_H
#define SK_CTL_MIGRATE_ONLINE_H

#include <stdbool.h>

#include <libpq-fe.h>

/* The first line of a migration file that runs statement by statement,
 * outside a transaction (ctl_migrate_online.c). */
#define SK_ONLINE_MARK "-- sekali: online"

/* Whether the text of a migration file begins with SK_ONLINE_MARK. */
bool sk_ctl_migration_is_online(const char *sql);

/* Runs an online migration's statements, each on its own, after dropping
 * the invalid indexes an interrupted run left; sql is cut up in place.
 * Says what each statement does on stdout unless quiet. Returns false
 * after printing why on stderr; the version is not recorded here. */
bool sk_ctl_migration_apply_online(PGconn *pg, const char *name, char *sql, bool quiet);

#endif
