/* pg.h - the one place sekali drives libpq: connecting with sekali's session
 * settings, running a statement, and reading its outcome as an SK_* code.
 *
 * Every module that talks to PostgreSQL (the store, leases, the relay, the
 * janitor, the handler host, sekalictl) goes through here, so a lost
 * connection, a lock timeout and a server error mean the same thing
 * everywhere: SK_AGAIN, SK_BUSY and SK_ERR with the server's message. */
#ifndef SK_PG_H
#define SK_PG_H

#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "common.h"

struct sk_postgres_conf {
    char    *conninfo;             /* libpq connection string, without the password: one
                                    * written inside it moves to `password`, and the rest
                                    * is rewritten as key='value' pairs */
    char    *password;             /* NULL: libpq's own defaults (.pgpass, PGPASSWORD) */
    uint32_t lock_timeout_ms;      /* longest a claim waits for another worker's row */
    uint32_t idle_in_transaction_timeout_ms;  /* 0: off */
};

/* One statement: a prepared statement's name, or SQL text, with its
 * parameters (lengths and formats as PQexecParams takes them; NULL: text).
 * Text without parameters or binary results goes by the simple protocol,
 * so it may hold several statements (a migration file); the outcome is the
 * last one's. */
struct sk_pg_stmt {
    const char        *prepared;    /* name of a prepared statement, or NULL */
    const char        *sql;         /* the text, when prepared is NULL */
    int                n_params;
    const char *const *values;
    const int         *lengths;
    const int         *formats;
    int                binary;      /* 1: results in binary, as PQexecParams' resultFormat */
    bool               one_row;     /* any other number of rows is an error */
    const char        *what;        /* for messages; NULL: the name or the SQL */
};

/* A new connection with sekali's session settings: application_name,
 * lock_timeout and idle_in_transaction_session_timeout from conf, added
 * after the user's own options (from the conninfo, else PGOPTIONS) so that
 * those are kept and sekali's win; and synchronous_commit raised to on if
 * the server's default is off and the user chose nothing. NULL with
 * SK_AGAIN in err (marked SK_AUTH when the server refused the login). The
 * caller owns the connection. */
/* Whether pg, connected, reached a server on another machine without TLS:
 * neither a Unix socket nor a loopback address, and no SSL in use. The
 * first such connection of each process is also logged as a warning by
 * sk_pg_dial(). */
bool sk_pg_clear_text_remote(PGconn *pg);

/* The rule behind it: a Unix socket directory (host starts with '/' or
 * '@'), "localhost", or a loopback address (127.0.0.0/8, ::1, or 127.x
 * mapped into IPv6) in hostaddr, the address libpq connected to. */
bool sk_pg_is_local(const char *host, const char *hostaddr);

PGconn *sk_pg_dial(const struct sk_postgres_conf *conf, const char *application_name,
                   struct sk_err *err);

/* Returns a session sk_pg_dial() made to the state it was dialled in, for
 * a pool to lend it again: DISCARD ALL (settings, prepared statements,
 * temporary tables, advisory locks, LISTENs) and sk_pg_dial()'s own SETs
 * again. SK_OK, or a code of sk_pg_exec(), and SK_AGAIN for a connection
 * lost or left inside a transaction: then it must not be lent again.
 * Blocks for a round trip or two. */
int sk_pg_reset(PGconn *pg, struct sk_err *err);

/* Runs one statement. SK_OK when it succeeded (and, with one_row, returned
 * exactly one row); then *out, if out is not NULL, holds the result, which
 * the caller PQclear()s. Otherwise *out is NULL and the code says what to
 * do: SK_AGAIN when the connection is missing or was lost, or the server is
 * read-only (SQLSTATE 25006: a standby; the caller must dial again), SK_BUSY
 * when the statement waited past lock_timeout (SQLSTATE 55P03), SK_ERR with
 * the server's message for anything else. */
int sk_pg_exec(PGconn *pg, const struct sk_pg_stmt *st, PGresult **out, struct sk_err *err);

/* Whether err is an SK_ERR for which PostgreSQL refused the statement
 * itself, so that sending it again as it is would be refused again: any
 * SQLSTATE but those of a condition that passes (class 08 connection, 40
 * rollback: deadlock or serialization, 53 resources, 55 lock not
 * available, 57 cancel or shutdown, 58 system error, XX internal error).
 * E.g. 22021, text that is not UTF-8; 23514, a trigger's or a table's
 * check. False for SK_AGAIN and SK_BUSY, and when no SQLSTATE came. Pure. */
bool sk_pg_refused_for_good(const struct sk_err *err);

/* sk_pg_exec() of SQL text without parameters. */
int sk_pg_run(PGconn *pg, const char *sql, struct sk_err *err);

/* A text[] literal of n strings, each quoted and escaped ({"a","b\\"c"}),
 * to bind as one parameter: at(items, i) gives string i (NULL is written
 * as ""). NULL when out of memory; the caller frees it. */
char *sk_pg_text_array(size_t n, const char *(*at)(const void *items, size_t i),
                       const void *items);

/* Sends n statements in one round trip (libpq's pipeline mode) and reads
 * every result up to the sync, so the connection is left idle and out of
 * pipeline mode. The codes are sk_pg_exec()'s, for the first statement that
 * failed (the later ones are skipped by the server and the transaction, if
 * any, is aborted). On SK_OK, *last (if not NULL) holds the last
 * statement's result when it returned rows, else NULL. */
int sk_pg_pipeline(PGconn *pg, const struct sk_pg_stmt *st, int n, PGresult **last,
                   struct sk_err *err);

#endif
