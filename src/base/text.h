/* text.h - the one gate for text sekali stores or sends: valid UTF-8,
 * bounded, before it reaches PostgreSQL or the broker.
 *
 * PostgreSQL refuses a text parameter that is not valid UTF-8 (SQLSTATE
 * 22021) and a NUL in it, so a handler's error cut in the middle of a
 * character made the failure impossible to record. Whatever made the text
 * (a handler, a server's message quoting a hostile body, a header value),
 * it goes through sk_text_bound() where it is stored or sent: a cut falls
 * on a character boundary, and every byte that is not part of a valid
 * character becomes U+FFFD, so the result is always accepted. */
#ifndef SK_TEXT_H
#define SK_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most bytes, NUL included, of an error or a reason sekali stores
 * (sekali.fail(), finish_lease()) or sends (x-sekali-* headers): about a
 * screenful, enough for a handler's error quoting a server's message. */
#define SK_TEXT_ERROR_MAX 1024

/* The replacement character U+FFFD, in UTF-8. */
#define SK_TEXT_REPLACEMENT "\xef\xbf\xbd"

/* Whether s[0..len) is valid UTF-8 as PostgreSQL reads it (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF) and holds no NUL.
 * Pure. */
bool sk_text_valid(const char *s, size_t len);

/* The code point of the valid n-byte UTF-8 sequence at s if it is one a
 * terminal or a text viewer would act on rather than show: C1 controls
 * (U+0080-U+009F; U+009B alone starts a CSI sequence), the bidi embeddings,
 * overrides and isolates (U+202A-U+202E, U+2066-U+2069) and marks (U+200E,
 * U+200F, U+061C), which reorder what follows them, and the line and
 * paragraph separators (U+2028, U+2029). Else 0. Every writer of text a
 * person may read (sekalictl, the console, /inflight) escapes these. */
uint32_t sk_text_disguising(const unsigned char *s, size_t n);

/* Copies in[0..len) (in may be NULL: the empty text) to out, a buffer of
 * size > 0 bytes, as valid UTF-8 ending in a NUL: each maximal invalid
 * sequence (and a NUL byte) becomes one U+FFFD, and the copy stops before
 * the first character that would not fit whole. in and out must not
 * overlap. Returns the bytes written, without the NUL. Pure. */
size_t sk_text_bound(char *out, size_t size, const char *in, size_t len);

/* sk_text_bound() of a NUL-terminated string (NULL: the empty text). */
size_t sk_text_copy(char *out, size_t size, const char *in);

#endif
