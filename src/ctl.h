/* ctl.h - what sekalictl's command files share (ctl.c runs main and the
 * schema and enqueue commands, ctl_dlq.c the dead-letter commands).
 *
 * Exit codes of every command: 0 done, 1 runtime failure (a server
 * unreachable, an SQL error), 2 usage or configuration error, 3 some dead
 * letters were refused (the rest done), 4 nothing matched. */
#ifndef SK_CTL_H
#define SK_CTL_H

#include <libpq-fe.h>

#include "config.h"

#define SK_CTL_OK        0
#define SK_CTL_FAILED    1
#define SK_CTL_USAGE     2
#define SK_CTL_REFUSED   3
#define SK_CTL_NOT_FOUND 4

/* A new connection to the configured PostgreSQL, or NULL after printing
 * why on stderr. The caller owns it. */
PGconn *sk_ctl_pg_connect(const struct sk_conf *conf);

/* sekalictl dlq SUBCOMMAND ...: argv[0] is "dlq". Returns an exit code. */
int sk_ctl_dlq(const struct sk_conf *conf, int argc, char **argv);

#endif
