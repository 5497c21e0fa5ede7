/* fuzz_trace_context.c - libFuzzer harness for W3C Trace Context reading
 * (src/base/trace_context.c). The input is split at its first NUL into a
 * traceparent and a tracestate. Whatever they are, the run's traceparent
 * must parse again, the kept tracestate must hold only printable ASCII
 * within its bound, and a tracestate that passes must pass again unchanged. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace_context.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define EXPECT(cond, ...)                                                \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "fuzz_trace_context: " __VA_ARGS__);         \
            fputc('\n', stderr);                                         \
            abort();                                                     \
        }                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    size_t parent_len = nul != NULL ? (size_t)(nul - data) : size;
    size_t state_len = nul != NULL ? size - parent_len - 1 : 0;
    /* Copies of exactly their length, so ASan sees a read past them. */
    char *parent = malloc(parent_len + 1), *state = malloc(state_len + 1);
    if (parent == NULL || state == NULL) {
        free(parent);
        free(state);
        return 0;
    }
    memcpy(parent, data, parent_len);
    if (nul != NULL)
        memcpy(state, nul + 1, state_len);
    struct sk_trace t;
    sk_trace_begin(&t, parent, parent_len, nul != NULL ? state : NULL, state_len);
    char trace[SK_TRACE_ID_LEN + 1], span[SK_SPAN_ID_LEN + 1];
    uint8_t flags;
    const char *why;
    EXPECT(sk_trace_parse_parent(t.traceparent, strlen(t.traceparent), trace, span, &flags, &why),
           "the run's traceparent does not parse: %s", why);
    EXPECT(strlen(t.tracestate) <= SK_TRACESTATE_MAX, "tracestate over its bound");
    for (const char *p = t.tracestate; *p != '\0'; p++)
        EXPECT(*p >= 0x20 && *p <= 0x7e, "a byte outside printable ASCII kept");
    char out[SK_TRACESTATE_MAX + 1], again[SK_TRACESTATE_MAX + 1];
    bool cut;
    if (sk_trace_check_state(state, state_len, out, sizeof(out), &cut, &why)) {
        EXPECT(sk_trace_check_state(out, strlen(out), again, sizeof(again), &cut, &why),
               "a kept tracestate fails again: %s", why);
        EXPECT(strcmp(out, again) == 0 && !cut, "a kept tracestate changed");
    }
    free(parent);
    free(state);
    return 0;
}
