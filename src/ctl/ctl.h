/* ctl.h - what sekalictl's command files share (ctl.c runs main, help and
 * the schema and enqueue commands, ctl_dlq.c the dead-letter commands,
 * ctl_status.c and ctl_trace.c status and trace, ctl_http.c the scrape of
 * sekalid's /metrics).
 *
 * Exit codes of every command: 0 done, 1 runtime failure (a server
 * unreachable, an SQL error), 2 usage or configuration error, 3 some dead
 * letters were refused (the rest done), 4 nothing matched, 5 status found
 * sekalid not running or a queue without consumer. */
#ifndef SK_CTL_H
#define SK_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <amqp.h>
#include <libpq-fe.h>

#include "config.h"

#define SK_CTL_OK        0
#define SK_CTL_FAILED    1
#define SK_CTL_USAGE     2
#define SK_CTL_REFUSED   3
#define SK_CTL_NOT_FOUND 4
#define SK_CTL_UNHEALTHY 5  /* status: sekalid not running, or a queue without consumer */

/* A new connection to the configured PostgreSQL with sekalid's session
 * settings (sk_pg_dial()), or NULL after printing why on stderr. The caller
 * owns it. */
PGconn *sk_ctl_pg_connect(const struct sk_conf *conf);

/* sekalictl dlq SUBCOMMAND ...: argv[0] is "dlq". Returns an exit code. */
int sk_ctl_dlq(const struct sk_conf *conf, int argc, char **argv);

/* sekalictl status [--json]. */
int sk_ctl_status(const struct sk_conf *conf, int argc, char **argv);
/* sekalictl trace KEY [--queue Q] [--json]. */
int sk_ctl_trace(const struct sk_conf *conf, int argc, char **argv);

/* ctl_http.c: GET http://host:port/path within timeout_ms. The body of a
 * 200 answer (NUL-terminated; the caller frees it), or NULL with why. */
char *sk_ctl_http_get(const char *host, int port, const char *path, int timeout_ms,
                      char *why, size_t why_size);
/* The value of the first sample of metric `name` in Prometheus text (with
 * label queue="queue" when queue is not NULL); *found says whether there
 * was one. */
double sk_ctl_metric(const char *text, const char *name, const char *queue, bool *found);

/* ctl_out.c: reading headers and printing them. */

/* The header `name` of m, or NULL. Borrowed from m. */
const amqp_field_value_t *sk_ctl_header(const amqp_message_t *m, const char *name);
/* A string header copied into out (cut to size), or false and "". */
bool sk_ctl_header_text(const amqp_message_t *m, const char *name, char *out, size_t size);
/* seconds since the epoch as 2026-01-31T12:00:00Z. */
void sk_ctl_iso_time(uint64_t seconds, char *out, size_t size);
/* Length of the valid UTF-8 sequence at s (left > 0 bytes), or 0. */
size_t sk_ctl_utf8_len(const unsigned char *s, size_t left);
/* s (len bytes) as a quoted JSON string; bytes that are not UTF-8 become
 * U+FFFD, so the document always parses. */
void sk_ctl_put_json(FILE *f, const void *s, size_t len);
void sk_ctl_put_jstr(FILE *f, const char *s);
/* s for a terminal: control characters and bytes that are not UTF-8 as
 * escapes; cut at max characters with "..." (0: no limit). */
void sk_ctl_put_text(FILE *f, const void *s, size_t len, size_t max);
/* Any header value, as JSON or as compact text. */
void sk_ctl_put_field(FILE *f, const amqp_field_value_t *v, bool json);

#endif
