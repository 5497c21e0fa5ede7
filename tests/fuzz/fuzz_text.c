/* fuzz_text.c - libFuzzer harness for the text gate (src/base/text.c).
 *
 * The input's first byte chooses the output buffer's size (1 to 256), the
 * rest is the text. Whatever it is, the bounded copy must be valid UTF-8
 * (so PostgreSQL and the broker take it), fit the buffer with its NUL, keep
 * a valid input that fits unchanged, keep a valid prefix of any input, and
 * come out unchanged when bounded again. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* abort() is what libFuzzer reports as a finding, with the input saved. */
#define EXPECT(cond, ...)                                                \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "fuzz_text: " __VA_ARGS__);                  \
            fputc('\n', stderr);                                         \
            abort();                                                     \
        }                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t cap = (size_t)data[0] + 1;
    const char *in = (const char *)data + 1;
    size_t len = size - 1;
    /* Exactly cap bytes on the heap, so ASan sees a write past them. */
    char *out = malloc(cap);
    char *again = malloc(cap);
    if (out == NULL || again == NULL) {
        free(out);
        free(again);
        return 0;
    }
    size_t n = sk_text_bound(out, cap, in, len);
    EXPECT(n < cap && out[n] == '\0', "%zu bytes written into %zu", n, cap);
    EXPECT(strlen(out) == n, "a NUL inside the output");
    EXPECT(sk_text_valid(out, n), "the output is not valid UTF-8");
    if (sk_text_valid(in, len) && len < cap)
        EXPECT(n == len && memcmp(out, in, len) == 0, "a valid input that fits was changed");
    /* The longest valid prefix of the input that fits is kept as it was. */
    size_t ok = 0;
    while (ok < len && ok < n && out[ok] == in[ok])
        ok++;
    size_t prefix = len < cap - 1 ? len : cap - 1;
    while (prefix > ok && !sk_text_valid(in, prefix))
        prefix--;
    EXPECT(prefix <= ok, "a valid prefix of %zu bytes was changed", prefix);
    size_t m = sk_text_bound(again, cap, out, n);
    EXPECT(m == n && memcmp(again, out, n) == 0, "bounding twice changed the text");
    free(out);
    free(again);
    return 0;
}
