/* config_value.h - private to the config loader: config values that are parsed
 * without knowing where they sit in the schema.
 *
 * Messages carry no position: the walker knows the node and adds
 * "file:line:column: " in front. A message names its key through the label
 * argument ("<label>: <problem>"), except "out of memory", which reads the
 * same for every key. */
#ifndef SK_CONFIG_VALUE_H
#define SK_CONFIG_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "common.h"
#include "file.h"

/* Units for durations (milliseconds) and sizes (bytes): config_value.c's
 * parsers and the schema's bounds and defaults. Short, since the schema
 * tables read best that way; only src/config/config*.c include this header
 * (and the tests of them). */
#define SEC  UINT64_C(1000)
#define MIN  (60 * SEC)
#define HOUR (60 * MIN)
#define DAY  (24 * HOUR)
#define KIB  UINT64_C(1024)
#define MIB  (1024 * KIB)

/* "250ms", "30s", "5m", "1h" (a bare integer is not accepted: the unit is
 * part of the meaning). Returns SK_OK or SK_ERR with a message in err. */
int sk_conf_value_parse_duration(const char *text, uint64_t *ms, struct sk_err *err);

/* A rate limit: "<count>/<period>", the period a duration ("100/s",
 * "5/2m", "1/500ms"; a bare unit means one of it). count is 1 to
 * 1,000,000 and the period 1ms to 1d, and together at most 1,000,000 a
 * second (an interval of 1 microsecond, what the limiter counts in).
 * Returns SK_OK or SK_ERR with a message in err. */
int sk_conf_value_parse_rate(const char *text, uint32_t *count, uint32_t *period_ms,
                             struct sk_err *err);

/* "512", "64KiB", "1MiB", "1GiB" (also kB/MB/GB as powers of 1000). */
int sk_conf_value_parse_size(const char *text, uint64_t *bytes, struct sk_err *err);

/* Decimal only, with an optional '-'. Out-of-range values clamp, and the
 * caller's bounds catch them. Returns SK_OK, or SK_ERR (nothing written). */
int sk_conf_value_parse_int(const char *s, int64_t *v);

/* true/false, yes/no, on/off, in any case. Returns SK_OK, or SK_ERR
 * (nothing written). */
int sk_conf_value_parse_bool(const char *s, bool *v);

/* Writes ms (or bytes) into buf in the largest unit that divides it exactly
 * ("90s", not "90000ms"; "0" for zero), so that a bound quoted in a message
 * reads as the schema wrote it. Truncates to len. Returns buf. */
const char *sk_conf_value_fmt_duration(uint64_t ms, char *buf, size_t len);
const char *sk_conf_value_fmt_size(uint64_t bytes, char *buf, size_t len);

/* An address to listen on: "host:port" or "[IPv6 literal]:port". The host is
 * an IPv4 or IPv6 literal or a DNS name (letters, digits, '-' and '.'),
 * resolved only when it is used; the port is 1..65535. On success sets
 * *host to a new string (without the brackets), which the caller frees,
 * and *port. On failure returns SK_ERR with "<label>: ..." in err. */
int sk_conf_value_parse_listen(const char *label, const char *s, char **host, int *port,
                               struct sk_err *err);

/* password_env: the value of the environment variable `name`, which must be
 * set and non-empty.
 * password_file: the contents of the file at `path` (already resolved by the
 * caller), at most 64 KiB, with one trailing "\n" or "\r\n" dropped; it must
 * not be empty or contain a NUL byte.
 * On success wipes the old *dst and replaces it with a new string, which the
 * caller frees with sk_conf_value_wipe(). On failure returns SK_ERR, leaves
 * *dst untouched and fills err. Intermediate copies are wiped. */
int sk_conf_value_password_env(const char *label, const char *name, char **dst,
                               struct sk_err *err);

/* Wipes and unsets every variable sk_conf_value_password_env() has read in
 * this process: a child of the supervisor calls it after fork(), so that
 * neither a handler nor anything it starts (nor /proc/PID/environ) sees
 * the passwords. The supervisor keeps them for its reloads. */
void sk_conf_value_forget_password_envs(void);
int sk_conf_value_password_file(const char *label, const char *path, char **dst,
                                struct sk_err *err);

/* Re-emits node v of doc, with everything under it, as a YAML document of its
 * own: handlers parse their section themselves. Aliases stay shared (the
 * emitter re-anchors them), so neither a billion laughs nor a self-reference
 * expands; nesting deeper than 64 levels fails. doc is not changed.
 * On success sets *out to a new string, which the caller frees with
 * sk_conf_value_wipe() (handlers keep their secrets there). On failure
 * returns SK_ERR, leaves *out untouched, fills err and points *at to the node
 * to blame: v, or the node under it that could not be copied. */
int sk_conf_value_emit(yaml_document_t *doc, const yaml_node_t *v, const char *label,
                       char **out, const yaml_node_t **at, struct sk_err *err);

/* Returned by sk_conf_value_read_file() for a path that is not a regular
 * file or a directory; no errno value has this meaning. */
#define SK_NOT_REGULAR SK_FILE_NOT_REGULAR

/* Reads at most max bytes of the regular file path into a new NUL-terminated
 * buffer, which the caller frees; *len excludes the NUL. Never blocks on a
 * FIFO. Returns 0, or an errno value (EFBIG: longer than max; EISDIR) or
 * SK_NOT_REGULAR, with *op naming the step that failed, "open" or "read".
 * On failure *out and *len are untouched and what was read is wiped, since
 * the file may be a password. */
int sk_conf_value_read_file(const char *path, size_t max, char **out, size_t *len,
                            const char **op);

/* The text for a value returned by sk_conf_value_read_file(). */
const char *sk_conf_value_read_error(int e);

/* Wipes and frees a string that may hold a secret, so that it does not
 * linger in the heap. Accepts NULL. */
void sk_conf_value_wipe(char *s);

#endif
