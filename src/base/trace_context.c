/* trace_context.c - reading and writing W3C Trace Context values.
 *
 * The grammar is W3C Trace Context Level 1's: traceparent is
 * version-traceid-parentid-flags in lowercase hex, with ff an invalid
 * version and all-zero ids invalid; tracestate is a list of at most 32
 * key=value members. Everything here is checked byte by byte against that
 * grammar, because the value goes on into HTTP headers, PostgreSQL
 * settings and log lines: a value that passes holds only printable ASCII. */
#include <string.h>

#include "common.h"
#include "trace_context.h"

#define MEMBER_LONG 128  /* members cut first when tracestate is too long */

struct member {
    const char *at;
    size_t      len;
    bool        kept;
};

static bool lower_hex(const char *s, size_t n);
static bool all_zero(const char *s, size_t n);
static unsigned hex_value(char c);
static bool key_char(char c);
static bool valid_key(const char *k, size_t n);
static bool valid_value(const char *v, size_t n);
static const char *split_members(const char *s, size_t len, struct member *m, size_t *n);
static size_t joined_len(const struct member *m, size_t n);
static bool fit(struct member *m, size_t n, size_t room);

bool sk_trace_parse_parent(const char *s, size_t len, char trace_id[SK_TRACE_ID_LEN + 1],
                           char parent_id[SK_SPAN_ID_LEN + 1], uint8_t *flags,
                           const char **why)
{
    if (len < SK_TRACEPARENT_LEN) {
        *why = "traceparent is shorter than 55 characters";
        return false;
    }
    if (!lower_hex(s, 2) || memcmp(s, "ff", 2) == 0) {
        *why = "traceparent has an invalid version";
        return false;
    }
    /* Version 00 is exactly 55 characters; a later version may append
     * fields after a '-', which a version-00 reader skips. */
    bool v00 = memcmp(s, "00", 2) == 0;
    if ((v00 && len != SK_TRACEPARENT_LEN) || (!v00 && len > SK_TRACEPARENT_LEN &&
                                               s[SK_TRACEPARENT_LEN] != '-')) {
        *why = "traceparent has the wrong length for its version";
        return false;
    }
    if (s[2] != '-' || s[35] != '-' || s[52] != '-') {
        *why = "traceparent is not version-traceid-parentid-flags";
        return false;
    }
    if (!lower_hex(s + 3, SK_TRACE_ID_LEN) || !lower_hex(s + 36, SK_SPAN_ID_LEN) ||
        !lower_hex(s + 53, 2)) {
        *why = "traceparent is not lowercase hex";
        return false;
    }
    if (all_zero(s + 3, SK_TRACE_ID_LEN) || all_zero(s + 36, SK_SPAN_ID_LEN)) {
        *why = "traceparent has an all-zero trace or parent id";
        return false;
    }
    memcpy(trace_id, s + 3, SK_TRACE_ID_LEN);
    trace_id[SK_TRACE_ID_LEN] = '\0';
    memcpy(parent_id, s + 36, SK_SPAN_ID_LEN);
    parent_id[SK_SPAN_ID_LEN] = '\0';
    *flags = (uint8_t)(hex_value(s[53]) << 4 | hex_value(s[54]));
    return true;
}

bool sk_trace_check_state(const char *s, size_t len, char *out, size_t size, bool *cut,
                          const char **why)
{
    struct member m[SK_TRACESTATE_MEMBERS];
    size_t n = 0;
    out[0] = '\0';
    *cut = false;
    *why = split_members(s, len, m, &n);
    if (*why != NULL)
        return false;
    *cut = !fit(m, n, size - 1);
    char *o = out;
    for (size_t i = 0; i < n; i++) {
        if (!m[i].kept)
            continue;
        if (o != out)
            *o++ = ',';
        memcpy(o, m[i].at, m[i].len);
        o += m[i].len;
    }
    *o = '\0';
    return true;
}

const char *sk_trace_begin(struct sk_trace *t, const char *parent, size_t parent_len,
                           const char *state, size_t state_len)
{
    const char *why = NULL;
    t->tracestate[0] = '\0';
    if (parent != NULL &&
        sk_trace_parse_parent(parent, parent_len, t->trace_id, t->parent_id, &t->flags, &why)) {
        t->flags &= SK_TRACE_SAMPLED;
        bool cut = false;
        if (state != NULL && !sk_trace_check_state(state, state_len, t->tracestate,
                                                   sizeof(t->tracestate), &cut, &why))
            t->tracestate[0] = '\0';
        else if (cut)
            why = "tracestate over 512 bytes was cut";
    } else {
        /* Nothing usable came: this run begins the trace. A tracestate
         * without its traceparent describes no trace of ours. */
        if (parent == NULL && state != NULL)
            why = "tracestate without a traceparent";
        sk_trace_random_id(t->trace_id, SK_TRACE_ID_LEN);
        t->parent_id[0] = '\0';
        t->flags = SK_TRACE_SAMPLED;
    }
    sk_trace_random_id(t->span_id, SK_SPAN_ID_LEN);
    sk_trace_format(t->traceparent, t->trace_id, t->span_id, t->flags);
    return why;
}

void sk_trace_random_id(char *id, size_t n)
{
    /* All zero means "no id" to every reader: one in 2^64 at worst. */
    do
        sk_random_hex(id, n);
    while (all_zero(id, n));
}

void sk_trace_format(char out[SK_TRACEPARENT_LEN + 1], const char *trace_id,
                     const char *span_id, uint8_t flags)
{
    static const char digits[] = "0123456789abcdef";
    memcpy(out, "00-", 3);
    memcpy(out + 3, trace_id, SK_TRACE_ID_LEN);
    out[35] = '-';
    memcpy(out + 36, span_id, SK_SPAN_ID_LEN);
    out[52] = '-';
    out[53] = digits[flags >> 4];
    out[54] = digits[flags & 15];
    out[55] = '\0';
}

/* The members of s, blanks around them and empty ones left out, or why
 * s is not a tracestate. */
static const char *split_members(const char *s, size_t len, struct member *m, size_t *n)
{
    size_t i = 0;
    *n = 0;
    while (i <= len) {
        size_t end = i;
        while (end < len && s[end] != ',')
            end++;
        size_t a = i, b = end;
        while (a < b && (s[a] == ' ' || s[a] == '\t'))
            a++;
        while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
            b--;
        if (a < b) {
            const char *eq = memchr(s + a, '=', b - a);
            if (eq == NULL)
                return "tracestate has a member without '='";
            size_t klen = (size_t)(eq - (s + a));
            if (!valid_key(s + a, klen) || !valid_value(eq + 1, b - a - klen - 1))
                return "tracestate has an invalid key or value";
            if (*n == SK_TRACESTATE_MEMBERS)
                return "tracestate has more than 32 members";
            for (size_t j = 0; j < *n; j++) {
                const char *other = m[j].at;
                size_t olen = (size_t)((const char *)memchr(other, '=', m[j].len) - other);
                if (olen == klen && memcmp(other, s + a, klen) == 0)
                    return "tracestate has a key twice";
            }
            m[(*n)++] = (struct member){ .at = s + a, .len = b - a, .kept = true };
        }
        i = end + 1;
    }
    return NULL;
}

/* Leaves members out until the rest joined fit in room bytes: the long
 * ones first, then from the end. False when any was left out. */
static bool fit(struct member *m, size_t n, size_t room)
{
    bool whole = true;
    for (size_t i = n; i-- > 0 && joined_len(m, n) > room;)
        if (m[i].len > MEMBER_LONG) {
            m[i].kept = false;
            whole = false;
        }
    for (size_t i = n; i-- > 0 && joined_len(m, n) > room;) {
        if (m[i].kept)
            whole = false;
        m[i].kept = false;
    }
    return whole;
}

static size_t joined_len(const struct member *m, size_t n)
{
    size_t total = 0, kept = 0;
    for (size_t i = 0; i < n; i++)
        if (m[i].kept) {
            total += m[i].len;
            kept++;
        }
    return kept > 0 ? total + kept - 1 : 0;
}

/* simple-key, or tenant@system (tenant may begin with a digit; system at
 * most 14 characters, beginning with a letter). */
static bool valid_key(const char *k, size_t n)
{
    const char *at = memchr(k, '@', n);
    if (at == NULL) {
        if (n < 1 || n > 256 || !(k[0] >= 'a' && k[0] <= 'z'))
            return false;
        for (size_t i = 1; i < n; i++)
            if (!key_char(k[i]))
                return false;
        return true;
    }
    size_t tenant = (size_t)(at - k), system = n - tenant - 1;
    if (tenant < 1 || tenant > 241 || system < 1 || system > 14)
        return false;
    if (!((k[0] >= 'a' && k[0] <= 'z') || (k[0] >= '0' && k[0] <= '9')) ||
        !(at[1] >= 'a' && at[1] <= 'z'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (i != tenant && i != tenant + 1 && !key_char(k[i]))
            return false;
    return true;
}

static bool key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '*' || c == '/';
}

/* 1 to 256 printable ASCII characters but ',' and '=', not ending in a
 * space (the member's trailing blanks are already gone). */
static bool valid_value(const char *v, size_t n)
{
    if (n < 1 || n > 256 || v[n - 1] == ' ')
        return false;
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0x20 || v[i] > 0x7e || v[i] == ',' || v[i] == '=')
            return false;
    return true;
}

static bool lower_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static bool all_zero(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != '0')
            return false;
    return true;
}

static unsigned hex_value(char c)
{
    return c <= '9' ? (unsigned)(c - '0') : (unsigned)(c - 'a' + 10);
}
