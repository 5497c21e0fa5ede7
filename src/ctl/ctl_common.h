/* ctl_common.h - what every sekalictl command shares: the exit codes, the
 * PostgreSQL connection made as sekalid makes it, and running one statement
 * with the error on stderr.
 *
 * Exit codes of every command: 0 done, 1 runtime failure (a server
 * unreachable, an SQL error), 2 usage or configuration error, 3 some dead
 * letters were refused (the rest done), 4 nothing matched, 5 status found
 * sekalid not running or a queue without consumer, 6 doctor: some check
 * warned (none failed), 7 doctor: some check failed; verify: 8 jobs lost or
 * stuck; pause: 9 paused, but consumers still subscribed after --wait. */
#ifndef SK_CTL_COMMON_H
#define SK_CTL_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <libpq-fe.h>

#include "broker.h"
#include "config.h"
#include "pg.h"

#define SK_CTL_OK        0
#define SK_CTL_FAILED    1
#define SK_CTL_USAGE     2
#define SK_CTL_REFUSED   3
#define SK_CTL_NOT_FOUND 4
#define SK_CTL_UNHEALTHY 5  /* status: sekalid not running, or a queue without consumer */
#define SK_CTL_WARNINGS  6  /* doctor: a check warned, none failed */
#define SK_CTL_FAILURES  7  /* doctor: a check failed */
#define SK_CTL_LOST      8  /* verify: jobs lost or stuck */
#define SK_CTL_WAITING   9  /* pause: paused, but consumers were left after --wait */
#define SK_CTL_ALREADY_RAN 10  /* cancel: the job completed (or failed) before */

/* A new connection to the configured PostgreSQL with sekalid's session
 * settings (sk_pg_dial()), or NULL after printing why on stderr. The caller
 * owns it. */
PGconn *sk_ctl_pg_connect(const struct sk_conf *conf);

/* The connection a report uses (ctl_pool.c): with no pool started, a new
 * one (sk_ctl_pg_connect()) that sk_ctl_pg_give() closes; with a pool, a
 * session of it, dialled with application_name "sekalictl serve", waiting
 * up to the pool's wait_s while all of them are lent (then NULL, why on
 * stderr). Each take is paired with one give, from the same thread, before
 * that thread takes again. Any thread may call them. */
PGconn *sk_ctl_pg_take(const struct sk_conf *conf);
/* Gives pg back (NULL: nothing): reset for the next taker (sk_pg_reset()),
 * or closed when it cannot be, or when no pool runs. */
void sk_ctl_pg_give(PGconn *pg);
/* The same for an AMQP connection (sk_broker_open()): SK_OK with *b set,
 * or sk_broker_open()'s code; with a pool, SK_AGAIN also when all were lent
 * for the whole wait. Only for connections that neither consume nor scan:
 * give back one that was left so and it is closed. */
int sk_ctl_broker_take(const struct sk_conf *conf, struct sk_broker **b, struct sk_err *err);
void sk_ctl_broker_give(struct sk_broker *b);
/* Starts the process's pool (sekalictl serve): of each kind, at most size
 * connections open (1 to 16), an idle one closed by sk_ctl_pool_sweep()
 * after idle_s (an AMQP one sooner: after half amqp.heartbeat). conf is
 * borrowed until sk_ctl_pool_stop(), which closes the idle ones; those
 * lent then are closed when given back. */
void sk_ctl_pool_start(const struct sk_conf *conf, size_t size, unsigned idle_s,
                       unsigned wait_s);
void sk_ctl_pool_sweep(void);
void sk_ctl_pool_stop(void);

/* Runs st (sk_pg_exec()); false after printing why on stderr. *out, when out
 * is not NULL, is the caller's to PQclear(). */
bool sk_ctl_pg_exec(PGconn *pg, const struct sk_pg_stmt *st, PGresult **out);
/* SQL text without parameters (a migration file may hold many statements). */
bool sk_ctl_pg_run(PGconn *pg, const char *sql, const char *what);

/* The messages waiting in q's delay queues, and how many of those queues
 * exist (sk_ctl_delays_read(), summed). */
int sk_ctl_delayed(struct sk_broker *b, const struct sk_queue_conf *q, uint32_t *messages,
                   uint32_t *queues, struct sk_err *err);

/* The rest of f, NUL-terminated (the caller frees it), or NULL. */
char *sk_ctl_read_all(FILE *f, size_t *len);

/* A command whose only option is --json: sets *json from it; false on any
 * other option (getopt has said which). Its operands then start at optind. */
bool sk_ctl_json_option(int argc, char **argv, bool *json);

/* An option's whole decimal number up to max (no sign, nothing after it)
 * into *out; false otherwise. */
bool sk_ctl_whole_number(const char *s, uint64_t max, uint64_t *out);

#endif
