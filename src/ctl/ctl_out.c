/* ctl_out.c - how sekalictl prints what it reads from the broker: JSON
 * strings that always parse, terminal text that a key cannot break, AMQP
 * header values of any type. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "broker.h"
#include "ctl_out.h"
#include "text.h"

const amqp_field_value_t *sk_ctl_header(const amqp_message_t *m, const char *name)
{
    const amqp_basic_properties_t *p = &m->properties;
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return NULL;
    size_t len = strlen(name);
    for (int i = 0; i < p->headers.num_entries; i++)
        if (p->headers.entries[i].key.len == len &&
            memcmp(p->headers.entries[i].key.bytes, name, len) == 0)
            return &p->headers.entries[i].value;
    return NULL;
}

bool sk_ctl_header_text(const amqp_message_t *m, const char *name, char *out, size_t size)
{
    const amqp_field_value_t *v = sk_ctl_header(m, name);
    out[0] = '\0';
    if (v == NULL || (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES))
        return false;
    size_t n = v->value.bytes.len < size - 1 ? v->value.bytes.len : size - 1;
    memcpy(out, v->value.bytes.bytes, n);
    out[n] = '\0';
    return true;
}

/* An integer field's value, or -1 when absent or not an integer. */
void sk_ctl_iso_time(uint64_t seconds, char *out, size_t size)
{
    time_t t = (time_t)seconds;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Length of the valid UTF-8 sequence at s (1 to 4), or 0 if there is none:
 * overlong forms, surrogates and code points past U+10FFFF are invalid. */
size_t sk_ctl_utf8_len(const unsigned char *s, size_t left)
{
    if (s[0] < 0x80)
        return 1;
    size_t n = (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4
                                                                                              : 0;
    if (n == 0 || n > left)
        return 0;
    uint32_t cp = s[0] & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* A JSON string; bytes that are not UTF-8 become U+FFFD, so the document
 * always parses; every control character, C0 or C1, and the characters that
 * reorder text are \u escapes, so the document is safe on a terminal too
 * (jq and less print strings decoded). */
void sk_ctl_put_json(FILE *f, const void *s, size_t len)
{
    const unsigned char *p = s;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        size_t n = sk_ctl_utf8_len(p + i, len - i);
        if (n == 0) {
            fputs("\\ufffd", f);
            i++;
            continue;
        }
        unsigned char c = p[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else if (sk_text_disguising(p + i, n) != 0)
            fprintf(f, "\\u%04x", (unsigned)sk_text_disguising(p + i, n));
        else
            fwrite(p + i, 1, n, f);
        i += n;
    }
    fputc('"', f);
}

void sk_ctl_put_jstr(FILE *f, const char *s)
{
    sk_ctl_put_json(f, s, strlen(s));
}

/* Text for a terminal: control characters (C0, DEL, C1), the characters
 * that reorder text, and bytes that are not UTF-8 as escapes, so that a
 * value cannot break a line, drive the terminal or disguise what follows
 * it; cut at max characters (0: no limit) with "...". Every value sekalictl
 * prints that came from a message goes through here or sk_ctl_put_json(). */
void sk_ctl_put_text(FILE *f, const void *s, size_t len, size_t max)
{
    const unsigned char *p = s;
    size_t shown = 0;
    for (size_t i = 0; i < len; shown++) {
        if (max > 0 && shown + 3 >= max && len - i > 3) {
            fputs("...", f);
            return;
        }
        size_t n = sk_ctl_utf8_len(p + i, len - i);
        if (n == 0 || p[i] < 0x20 || p[i] == 0x7f || p[i] == '\\') {
            if (p[i] == '\n')
                fputs("\\n", f);
            else if (p[i] == '\\')
                fputs("\\\\", f);
            else
                fprintf(f, "\\x%02x", p[i]);
            i++;
            continue;
        }
        uint32_t cp = sk_text_disguising(p + i, n);
        if (cp != 0)
            fprintf(f, "\\u%04x", (unsigned)cp);
        else
            fwrite(p + i, 1, n, f);
        i += n;
    }
}

void sk_ctl_put_tstr(FILE *f, const char *s)
{
    sk_ctl_put_text(f, s, strlen(s), 0);
}

/* Any header value: JSON, or compact text (x-death's tables and arrays). */
void sk_ctl_put_field(FILE *f, const amqp_field_value_t *v, bool json)
{
    char t[64];
    switch (v->kind) {
    case AMQP_FIELD_KIND_BOOLEAN:
        fputs(v->value.boolean ? "true" : "false", f);
        return;
    case AMQP_FIELD_KIND_F32:
        fprintf(f, "%g", (double)v->value.f32);
        return;
    case AMQP_FIELD_KIND_F64:
        fprintf(f, "%g", v->value.f64);
        return;
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
        if (json)
            sk_ctl_put_json(f, v->value.bytes.bytes, v->value.bytes.len);
        else
            sk_ctl_put_text(f, v->value.bytes.bytes, v->value.bytes.len, 0);
        return;
    case AMQP_FIELD_KIND_TIMESTAMP:
        sk_ctl_iso_time(v->value.u64, t, sizeof(t));
        fprintf(f, json ? "\"%s\"" : "%s", t);
        return;
    case AMQP_FIELD_KIND_ARRAY:
        fputc('[', f);
        for (int i = 0; i < v->value.array.num_entries; i++) {
            fputs(i > 0 ? (json ? "," : ", ") : "", f);
            sk_ctl_put_field(f, &v->value.array.entries[i], json);
        }
        fputc(']', f);
        return;
    case AMQP_FIELD_KIND_TABLE:
        fputc('{', f);
        for (int i = 0; i < v->value.table.num_entries; i++) {
            const amqp_table_entry_t *e = &v->value.table.entries[i];
            fputs(i > 0 ? (json ? "," : ", ") : "", f);
            if (json) {
                sk_ctl_put_json(f, e->key.bytes, e->key.len);
                fputc(':', f);
            } else {
                sk_ctl_put_text(f, e->key.bytes, e->key.len, 0);
                fputc('=', f);
            }
            sk_ctl_put_field(f, &e->value, json);
        }
        fputc('}', f);
        return;
    default:
        if (sk_broker_field_int(v) != -1 || v->kind == AMQP_FIELD_KIND_I64 ||
            v->kind == AMQP_FIELD_KIND_I32)
            fprintf(f, "%lld", (long long)sk_broker_field_int(v));
        else
            fputs(json ? "null" : "?", f);
    }
}
