/* otlp_json.h - one span per job run, as OTLP/HTTP's JSON encoding: the
 * fixed-size record a job leaves for the exporter (span_export.c), and
 * the request body made of a batch of them. Pure: no I/O, no locks, so a
 * unit test reads it and the export thread calls it with no lock held.
 *
 * Everything a record carries from a message (keys, job type, reason) is
 * hostile: bounded when the record is made, valid UTF-8, and escaped here. */
#ifndef SK_OTLP_JSON_H
#define SK_OTLP_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trace_context.h"

#define SK_SPAN_TEXT_MAX 256  /* bytes kept of a key or job id (whole characters) */

struct sk_metrics_type;

/* One run of a job. Every string NUL-terminated, valid UTF-8. */
struct sk_span_rec {
    char     trace_id[SK_TRACE_ID_LEN + 1];
    char     span_id[SK_SPAN_ID_LEN + 1];
    char     parent_id[SK_SPAN_ID_LEN + 1];   /* "": a trace sekali began */
    char     tracestate[SK_TRACESTATE_MAX + 1];  /* the message's, checked; or "" */
    uint8_t  trace_flags;                     /* W3C's: SK_TRACE_SAMPLED or 0 */
    char     job_id[SK_SPAN_TEXT_MAX];
    char     idempotency_key[SK_SPAN_TEXT_MAX];
    char     job_type[64];
    char     outcome[16];                     /* the outcome event's `outcome` */
    char     reason[32];                      /* its `reason`, or "" */
    bool     error;                           /* the run failed: status ERROR */
    uint32_t attempt;
    uint64_t start_ns, end_ns;                /* Unix time */
    struct sk_metrics_type *metrics;          /* counts its export or its drop */
};

/* Writes to f the ExportTraceServiceRequest of n records (n >= 1) of queue
 * `queue`, from service `service`. Returns false if f failed. */
bool sk_otlp_encode(FILE *f, const char *service, const char *queue,
                    const struct sk_span_rec *recs, size_t n);

/* Writes s as a JSON string, quotes included: ", \ and every control
 * character escaped. Returns false if f failed. */
bool sk_otlp_string(FILE *f, const char *s);

#endif
