/* headers_json.c - AMQP field tables to JSON.
 *
 * Header values come from the producer, so every string is escaped here
 * and nothing is trusted to be UTF-8: what reaches a handler is always
 * valid JSON, which PostgreSQL's jsonb accepts. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "headers_json.h"

#define MAX_DEPTH 8

struct out {
    char  **buf;
    size_t *cap;
    size_t  len;
    bool    failed;
};

static void value(struct out *o, const amqp_field_value_t *v, int depth);

static void put(struct out *o, const char *s, size_t n)
{
    if (o->failed)
        return;
    if (o->len + n + 1 > *o->cap) {
        size_t cap = *o->cap > 0 ? *o->cap : 256;
        while (cap < o->len + n + 1)
            cap *= 2;
        char *grown = realloc(*o->buf, cap);
        if (grown == NULL) {
            o->failed = true;
            return;
        }
        *o->buf = grown;
        *o->cap = cap;
    }
    memcpy(*o->buf + o->len, s, n);
    o->len += n;
    (*o->buf)[o->len] = '\0';
}

static void puts_(struct out *o, const char *s)
{
    put(o, s, strlen(s));
}

/* The length of the valid UTF-8 sequence at s, or 0. */
static size_t utf8_len(const unsigned char *s, size_t left)
{
    size_t n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (n == 0 || n > left || s[0] > 0xf4)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    /* Overlong three- and four-byte forms, surrogates, past U+10FFFF. */
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return n;
}

static void string(struct out *o, const void *bytes, size_t len)
{
    const unsigned char *s = bytes;
    put(o, "\"", 1);
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(o, esc, 2);
            i++;
        } else if (c == 0) {
            /* jsonb refuses \u0000 (text cannot hold NUL): the whole
             * document would be refused for one byte. */
            puts_(o, "\\ufffd");
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(o, esc, 6);
            i++;
        } else if (c < 0x80) {
            put(o, (const char *)&s[i], 1);
            i++;
        } else {
            size_t n = utf8_len(&s[i], len - i);
            if (n == 0) {
                puts_(o, "\\ufffd");
                i++;
            } else {
                put(o, (const char *)&s[i], n);
                i += n;
            }
        }
    }
    put(o, "\"", 1);
}

static void table(struct out *o, const amqp_table_t *t, int depth)
{
    put(o, "{", 1);
    for (int i = 0; t != NULL && i < t->num_entries; i++) {
        if (i > 0)
            put(o, ",", 1);
        string(o, t->entries[i].key.bytes, t->entries[i].key.len);
        put(o, ":", 1);
        value(o, &t->entries[i].value, depth + 1);
    }
    put(o, "}", 1);
}

static void number(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void number(struct out *o, const char *fmt, ...)
{
    char text[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    put(o, text, n > 0 && (size_t)n < sizeof(text) ? (size_t)n : 0);
}

static void value(struct out *o, const amqp_field_value_t *v, int depth)
{
    if (depth > MAX_DEPTH) {
        puts_(o, "null");
        return;
    }
    switch (v->kind) {
    case AMQP_FIELD_KIND_BOOLEAN: puts_(o, v->value.boolean ? "true" : "false"); return;
    case AMQP_FIELD_KIND_I8:      number(o, "%d", v->value.i8); return;
    case AMQP_FIELD_KIND_U8:      number(o, "%u", v->value.u8); return;
    case AMQP_FIELD_KIND_I16:     number(o, "%d", v->value.i16); return;
    case AMQP_FIELD_KIND_U16:     number(o, "%u", v->value.u16); return;
    case AMQP_FIELD_KIND_I32:     number(o, "%" PRId32, v->value.i32); return;
    case AMQP_FIELD_KIND_U32:     number(o, "%" PRIu32, v->value.u32); return;
    case AMQP_FIELD_KIND_I64:     number(o, "%" PRId64, v->value.i64); return;
    case AMQP_FIELD_KIND_U64:
    case AMQP_FIELD_KIND_TIMESTAMP: number(o, "%" PRIu64, v->value.u64); return;
    case AMQP_FIELD_KIND_F32:
    case AMQP_FIELD_KIND_F64: {
        double d = v->kind == AMQP_FIELD_KIND_F32 ? v->value.f32 : v->value.f64;
        if (d != d || d > 1e308 || d < -1e308)  /* NaN and infinities have no JSON */
            puts_(o, "null");
        else
            number(o, "%.17g", d);
        return;
    }
    case AMQP_FIELD_KIND_DECIMAL: {
        uint32_t scale = 1;
        for (int i = 0; i < v->value.decimal.decimals && i < 9; i++)
            scale *= 10;
        number(o, "%.*f", v->value.decimal.decimals > 9 ? 9 : v->value.decimal.decimals,
               (double)(int32_t)v->value.decimal.value / scale);
        return;
    }
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
        string(o, v->value.bytes.bytes, v->value.bytes.len);
        return;
    case AMQP_FIELD_KIND_ARRAY:
        put(o, "[", 1);
        for (int i = 0; i < v->value.array.num_entries; i++) {
            if (i > 0)
                put(o, ",", 1);
            value(o, &v->value.array.entries[i], depth + 1);
        }
        put(o, "]", 1);
        return;
    case AMQP_FIELD_KIND_TABLE:
        table(o, &v->value.table, depth);
        return;
    case AMQP_FIELD_KIND_VOID:
    default:
        puts_(o, "null");
        return;
    }
}

long sk_headers_json(const amqp_table_t *headers, char **buf, size_t *cap)
{
    struct out o = { .buf = buf, .cap = cap };
    table(&o, headers, 0);
    return o.failed ? -1 : (long)o.len;
}
