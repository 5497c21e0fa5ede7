/* trace_context.h - W3C Trace Context (traceparent, tracestate) for jobs.
 *
 * A producer that traces its request puts `traceparent` (and perhaps
 * `tracestate`) in the message's headers; sekali reads them here, strictly,
 * gives each run of the job a span of its own, and hands that span on as
 * the parent of whatever the job calls. Pure parsing and formatting: no
 * I/O but the kernel's random numbers, so every process may use it.
 *
 * Producer input is hostile: a value that breaks the specification's
 * grammar is dropped with a reason (the caller counts it), never an error
 * of the job, and a trace is then started afresh, as the specification
 * asks of a receiver that cannot use what it got. */
#ifndef SK_TRACE_CONTEXT_H
#define SK_TRACE_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SK_TRACE_ID_LEN     32   /* hex digits of a trace id */
#define SK_SPAN_ID_LEN      16   /* hex digits of a span (parent) id */
#define SK_TRACEPARENT_LEN  55   /* "00-" trace "-" span "-" flags */
/* The most tracestate bytes kept. The specification asks a participant to
 * pass on at least 512; more is cut at whole members, the longest first. */
#define SK_TRACESTATE_MAX   512
#define SK_TRACESTATE_MEMBERS 32 /* the specification's limit */

/* The sampled flag, the one flag of version 00 sekali passes on. */
#define SK_TRACE_SAMPLED 0x01

/* One run of a job inside a trace. All strings NUL-terminated. */
struct sk_trace {
    char    trace_id[SK_TRACE_ID_LEN + 1];
    char    parent_id[SK_SPAN_ID_LEN + 1];  /* the producer's span; "" when sekali began it */
    char    span_id[SK_SPAN_ID_LEN + 1];    /* this run's own, new each run */
    uint8_t flags;
    /* This run as the parent of what it calls: "00-<trace>-<span>-<flags>". */
    char    traceparent[SK_TRACEPARENT_LEN + 1];
    char    tracestate[SK_TRACESTATE_MAX + 1];  /* as received (validated), or "" */
};

/* Parses a traceparent value of len bytes (not NUL-terminated). Returns
 * true with the trace id, parent id and flags filled; false with *why set
 * to a static reason. Any version but ff is read (a later version's value
 * may be longer, after a '-'); ids must be lowercase hex and not all zero. */
bool sk_trace_parse_parent(const char *s, size_t len, char trace_id[SK_TRACE_ID_LEN + 1],
                           char parent_id[SK_SPAN_ID_LEN + 1], uint8_t *flags,
                           const char **why);

/* Checks a tracestate value of len bytes against the specification's
 * grammar (members key=value, at most 32, no key twice) and copies it,
 * with the blanks around members and empty members left out, into out
 * (size bytes, at least 1). Past size - 1 bytes whole members are left
 * out, the ones over 128 bytes first, then from the end, and *cut is set.
 * Returns true, or false with *why set and out "". */
bool sk_trace_check_state(const char *s, size_t len, char *out, size_t size, bool *cut,
                          const char **why);

/* Begins this run's span in t from a message's headers: traceparent
 * (parent, parent_len) and tracestate (state, state_len), each NULL when
 * absent. A valid traceparent gives the trace; otherwise a new trace is
 * begun (sampled), and the tracestate, which belongs to the dropped one,
 * goes with it. Returns NULL, or a static reason why something the
 * message carried was dropped or cut, for the caller to count and log. */
const char *sk_trace_begin(struct sk_trace *t, const char *parent, size_t parent_len,
                           const char *state, size_t state_len);

/* Fills id with n random lowercase hex digits and a NUL (n even), never
 * all zero. From the kernel's random numbers. */
void sk_trace_random_id(char *id, size_t n);

/* Writes "00-<trace_id>-<span_id>-<flags>" into out. */
void sk_trace_format(char out[SK_TRACEPARENT_LEN + 1], const char *trace_id,
                     const char *span_id, uint8_t flags);

#endif
