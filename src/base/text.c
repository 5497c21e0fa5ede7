/* text.c - valid, bounded UTF-8 for everything sekali stores or sends (see
 * text.h). Decoding follows the table of well-formed byte sequences in the
 * Unicode standard (chapter 3, "UTF-8"), which is also what PostgreSQL
 * accepts; an ill-formed sequence is replaced by one U+FFFD per maximal
 * subpart, as the standard recommends, so a character cut at its end
 * becomes one replacement, not one per byte. */
#include <string.h>

#include "text.h"

static size_t next_char(const unsigned char *s, size_t len, size_t *bad);

/* The length of the valid character at s (1 to 4), or 0 with *bad set to
 * the length of the maximal ill-formed subpart there (at least 1). A NUL
 * is ill-formed here: PostgreSQL's text cannot hold it. */
static size_t next_char(const unsigned char *s, size_t len, size_t *bad)
{
    unsigned char c = s[0];
    *bad = 1;
    if (c != 0 && c < 0x80)
        return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;  /* the second byte's range */
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0;  /* overlong below U+0800 */
        else if (c == 0xed)
            hi = 0x9f;  /* surrogates U+D800..U+DFFF */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90;  /* overlong below U+10000 */
        else if (c == 0xf4)
            hi = 0x8f;  /* past U+10FFFF */
    } else {
        return 0;  /* NUL, a continuation byte, C0, C1, F5..FF */
    }
    for (size_t k = 1; k < n; k++) {
        if (k >= len || s[k] < (k == 1 ? lo : 0x80) || s[k] > (k == 1 ? hi : 0xbf)) {
            *bad = k;
            return 0;
        }
    }
    return n;
}

bool sk_text_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t bad;
        size_t n = next_char(u + i, len - i, &bad);
        if (n == 0)
            return false;
        i += n;
    }
    return true;
}

size_t sk_text_bound(char *out, size_t size, const char *in, size_t len)
{
    if (size == 0)
        return 0;
    const unsigned char *u = (const unsigned char *)in;
    size_t o = 0;
    for (size_t i = 0; in != NULL && i < len;) {
        size_t bad;
        size_t n = next_char(u + i, len - i, &bad);
        const char *put = n > 0 ? in + i : SK_TEXT_REPLACEMENT;
        size_t put_len = n > 0 ? n : sizeof(SK_TEXT_REPLACEMENT) - 1;
        if (o + put_len + 1 > size)
            break;
        memcpy(out + o, put, put_len);
        o += put_len;
        i += n > 0 ? n : bad;
    }
    out[o] = '\0';
    return o;
}

size_t sk_text_copy(char *out, size_t size, const char *in)
{
    return sk_text_bound(out, size, in, in != NULL ? strlen(in) : 0);
}

uint32_t sk_text_disguising(const unsigned char *s, size_t n)
{
    uint32_t cp;
    if (n == 2)
        cp = ((uint32_t)(s[0] & 0x1f) << 6) | (s[1] & 0x3f);
    else if (n == 3)
        cp = ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    else
        return 0;
    if ((cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
        (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200e || cp == 0x200f || cp == 0x061c ||
        cp == 0x2028 || cp == 0x2029)
        return cp;
    return 0;
}
