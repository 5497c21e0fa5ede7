/* ctl_out.h - sekalictl's reading of AMQP headers and its printing of values
 * that came from messages (ctl_out.c): as JSON, or as text made safe for a
 * terminal. */
#ifndef SK_CTL_OUT_H
#define SK_CTL_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "amqp_lib.h"

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
/* s for a terminal: control characters (C0, DEL and C1), bidi controls
 * and bytes that are not UTF-8 as escapes; cut at max characters with
 * "..." (0: no limit). JSON escapes the same characters as \u. */
void sk_ctl_put_text(FILE *f, const void *s, size_t len, size_t max);
void sk_ctl_put_tstr(FILE *f, const char *s);  /* all of s, as sk_ctl_put_text() */
/* Any header value, as JSON or as compact text. */
void sk_ctl_put_field(FILE *f, const amqp_field_value_t *v, bool json);

#endif
