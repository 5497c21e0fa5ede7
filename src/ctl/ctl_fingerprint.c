/* ctl_fingerprint.c - the fingerprint of a dead letter's error text, by which
 * `sekalictl dlq groups` and the console group failures: forty letters that
 * failed with "payment gateway 503 for order 1234" and "... order 1250"
 * are one problem, not forty. */
#include <ctype.h>
#include <stdbool.h>
#include <string.h>

#include "ctl_reports.h"

#define ID_MIN 8  /* a hex word this long that holds a digit is taken for an id */

/* Appends s to out[*n], or nothing once it would not fit. */
static void put(char *out, size_t size, size_t *n, const char *s, size_t len)
{
    if (*n + len >= size)
        len = size - 1 - *n;
    /* Never end inside a UTF-8 sequence: drop its lead and continuations. */
    if (len < strlen(s) && len > 0) {
        size_t cut = len;
        while (cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80)
            cut--;
        len = cut;
    }
    memcpy(out + *n, s, len);
    *n += len;
    out[*n] = '\0';
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
    while (*s != '\0' && n + 1 < size) {
        unsigned char c = (unsigned char)*s;
        bool digit;
        size_t w = word_start ? hex_word(s, &digit) : 0;
        if (w >= ID_MIN && digit && !isalnum((unsigned char)s[w])) {
            put(out, size, &n, "{id}", 4);
            s += w;
        } else if (isdigit(c)) {
            put(out, size, &n, "{n}", 3);
            while (isdigit((unsigned char)*s))
                s++;
        } else if (isspace(c)) {
            put(out, size, &n, " ", 1);
            while (isspace((unsigned char)*s))
                s++;
        } else {
            put(out, size, &n, s, 1);
            s++;
        }
        word_start = !isalnum((unsigned char)s[-1]);
    }
    /* The byte loop may still have cut a sequence at the very end. */
    while (n > 0 && ((unsigned char)out[n - 1] & 0x80) != 0) {
        size_t lead = n - 1;
        while (lead > 0 && ((unsigned char)out[lead] & 0xC0) == 0x80)
            lead--;
        unsigned char b = (unsigned char)out[lead];
        size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
        if (n - lead >= need)
            break;
        n = lead;
        out[n] = '\0';
    }
}
