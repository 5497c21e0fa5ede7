/* fuzz_ctl_out.c - libFuzzer harness for sekalictl's writers of values
 * that came from messages (src/ctl/ctl_out.c).
 *
 * Every input goes through the terminal text writer (whole, and cut at a
 * length the first byte picks), the JSON string writer, and the header
 * writer in both modes, inside an array and a table as x-death is. The
 * output must never hold what a terminal acts on: a C0 control or DEL, a
 * C1 control (U+0080-U+009F, in UTF-8 0xC2 0x80-0x9F), a bidi embedding,
 * override, isolate or mark, or a line separator. It must also be valid
 * UTF-8 (the writers escape the rest), and the JSON must be one string. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#include "ctl_out.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const char *what, const char *out, size_t len);

/* abort() is what libFuzzer reports as a finding, with the input saved. */
#define EXPECT(cond, ...)                                                \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "fuzz_ctl_out: " __VA_ARGS__);               \
            fputc('\n', stderr);                                         \
            abort();                                                     \
        }                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (f == NULL)
        return 0;

    sk_ctl_put_text(f, data, size, 0);
    fflush(f);
    check("text", out, len);

    rewind(f);
    sk_ctl_put_text(f, data, size, size > 0 ? data[0] % 64 : 0);
    fflush(f);
    check("cut text", out, ftell(f) >= 0 ? (size_t)ftell(f) : 0);

    rewind(f);
    sk_ctl_put_json(f, data, size);
    fflush(f);
    size_t json_len = (size_t)ftell(f);
    check("json", out, json_len);
    EXPECT(json_len >= 2 && out[0] == '"' && out[json_len - 1] == '"', "json not one string");
    for (size_t i = 1; i + 1 < json_len; i++) {
        if (out[i] == '\\') {
            i++;
            continue;
        }
        EXPECT(out[i] != '"', "unescaped quote inside the json string at %zu", i);
    }

    /* As a header: the bytes as a text value, keyed by themselves too, in
     * an array of one table (the shape of x-death). */
    amqp_bytes_t bytes = { .len = size, .bytes = (void *)data };
    amqp_table_entry_t entry = { .key = bytes,
                                 .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = bytes } };
    amqp_field_value_t table = { .kind = AMQP_FIELD_KIND_TABLE,
                                 .value.table = { .num_entries = 1, .entries = &entry } };
    amqp_field_value_t array = { .kind = AMQP_FIELD_KIND_ARRAY,
                                 .value.array = { .num_entries = 1, .entries = &table } };
    for (int json = 0; json < 2; json++) {
        rewind(f);
        sk_ctl_put_field(f, &array, json);
        fflush(f);
        check(json ? "json field" : "text field", out, (size_t)ftell(f));
    }
    fclose(f);
    free(out);
    return 0;
}

/* Fails on any byte or character in out[0..len) that a terminal would
 * act on, and on UTF-8 that is not valid. */
static void check(const char *what, const char *out, size_t len)
{
    const unsigned char *s = (const unsigned char *)out;
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        EXPECT(c >= 0x20 && c != 0x7f, "%s: raw control byte 0x%02x at %zu", what, c, i);
        size_t n = sk_ctl_utf8_len(s + i, len - i);
        EXPECT(n > 0, "%s: invalid UTF-8 at %zu", what, i);
        uint32_t cp = c;
        if (n == 2)
            cp = ((uint32_t)(c & 0x1f) << 6) | (s[i + 1] & 0x3f);
        else if (n == 3)
            cp = ((uint32_t)(c & 0x0f) << 12) | ((uint32_t)(s[i + 1] & 0x3f) << 6) |
                 (s[i + 2] & 0x3f);
        EXPECT(!(cp >= 0x80 && cp <= 0x9f), "%s: raw C1 control U+%04X at %zu", what, cp, i);
        EXPECT(!((cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069) ||
                 cp == 0x200e || cp == 0x200f || cp == 0x061c),
               "%s: raw bidi control U+%04X at %zu", what, cp, i);
        EXPECT(cp != 0x2028 && cp != 0x2029, "%s: raw line separator U+%04X at %zu", what, cp, i);
        i += n;
    }
}
