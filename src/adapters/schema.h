/* schema.h - the schema migrations this build needs (schema.c) and how far
 * a database has come: the one list that sekalid (which refuses to run on
 * an older schema: its workers check each new connection) and sekalictl
 * (migrate, doctor) share.
 *
 * A migration is a file sql/NNN_name.sql; `sekalictl migrate` records the
 * file name in sekali.schema_migrations when it applies it. */
#ifndef SK_SCHEMA_H
#define SK_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "common.h"
#include "pg.h"

/* The file names of sql/, in order. Adding a migration? Add its file name
 * here too (tests/unit/check_schema.c compares this list with sql/). */
extern const char *const sk_schema_migrations[];
extern const size_t sk_schema_n_migrations;

/* A database's migrations against this build's. */
struct sk_schema_state {
    bool   table;               /* sekali.schema_migrations exists */
    size_t n_missing, n_unknown;
    char   missing[512];        /* "003_replies.sql, 016_..." (cut with "...") */
    char   unknown[512];        /* applied, but not of this build (a newer one's) */
};

/* Reads the applied migrations over pg into *st. SK_OK, or sk_pg_exec()'s
 * code with err filled. Blocks for one query. */
int sk_schema_read(PGconn *pg, struct sk_schema_state *st, struct sk_err *err);


#endif
