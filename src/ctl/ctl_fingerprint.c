/* ctl_fingerprint.c - the fingerprint of a dead letter's error text, by which
 * `sekalictl dlq groups` and the console group failures: forty letters that
 * failed with "payment gateway 503 for order 1234" and "... order 1250"
 * are one problem, not forty. */
#include <ctype.h>
#include <stdbool.h>
#include <string.h>

#include "ctl_out.h"
#include "ctl_reports.h"

#define ID_MIN 8  /* a hex word this long that holds a digit is taken for an id */

/* Appends len bytes of s to out[*n] (a mask or one whole character), or
 * nothing when they do not fit: the fingerprint ends short rather than
 * in the middle of either. Returns false when full. */
static bool put(char *out, size_t size, size_t *n, const char *s, size_t len)
{
    if (*n + len >= size)
        return false;
    memcpy(out + *n, s, len);
    *n += len;
    out[*n] = '\0';
    return true;
}

/* The length of the hex-and-dash word at s, and whether it holds a digit. */
static size_t hex_word(const char *s, bool *digit)
{
    size_t i = 0;
    *digit = false;
    while (isxdigit((unsigned char)s[i]) || s[i] == '-') {
        *digit |= isdigit((unsigned char)s[i]) != 0;
        i++;
    }
    return i;
}

void sk_ctl_fingerprint(const char *error, char *out, size_t size)
{
    size_t n = 0;
    if (size == 0)
        return;
    out[0] = '\0';
    const char *s = error;
    bool word_start = true;
    bool room = true;
    while (*s != '\0' && room) {
        unsigned char c = (unsigned char)*s;
        bool digit;
        size_t w = word_start ? hex_word(s, &digit) : 0;
        if (w >= ID_MIN && digit && !isalnum((unsigned char)s[w])) {
            room = put(out, size, &n, "{id}", 4);
            s += w;
        } else if (isdigit(c)) {
            room = put(out, size, &n, "{n}", 3);
            while (isdigit((unsigned char)*s))
                s++;
        } else if (isspace(c)) {
            room = put(out, size, &n, " ", 1);
            while (isspace((unsigned char)*s))
                s++;
        } else if (c < 0x80) {
            room = put(out, size, &n, s, 1);
            s++;
        } else {
            /* A byte that is not UTF-8 becomes U+FFFD, as in the JSON: the
             * fingerprint a page or script sends back must select again. */
            size_t len = sk_ctl_utf8_len((const unsigned char *)s, strlen(s));
            if (len == 0) {
                room = put(out, size, &n, "\xef\xbf\xbd", 3);
                s++;
            } else {
                room = put(out, size, &n, s, len);
                s += len;
            }
        }
        word_start = !isalnum((unsigned char)s[-1]);
    }
}
