/* pg_conninfo.h - reading postgres.conninfo: libpq's own parser says whether
 * it is valid, and a password in it moves out, so that the conninfo sekali
 * keeps can be logged and shown. No connection is made.
 *
 * In the pg adapter rather than the config loader because it is libpq's grammar:
 * config_servers.c only places the error at the key's line and column. */
#ifndef SK_PG_CONNINFO_H
#define SK_PG_CONNINFO_H

#include <stddef.h>

/* Parses s (keyword=value pairs or a postgres:// / postgresql:// URI).
 * On SK_OK: *conninfo is s without its password, rewritten as quoted
 * keyword='value' pairs when it had one (else s as it was), and *password
 * the password or NULL; both new strings, the caller frees them (and
 * should wipe *password). On SK_ERR: why (at least 200 bytes) says what is
 * wrong, never with the password or, when the string could hold one, any
 * text of it that libpq quoted; nothing is allocated. SK_AGAIN: out of
 * memory. Pure, callable from any thread. */
int sk_pg_conninfo_split(const char *s, char **conninfo, char **password, char *why,
                         size_t why_size);

#endif
