/* otlp_json.c - a batch of job runs as one OTLP/HTTP JSON request: see
 * otlp_json.h. The shape is the OTLP specification's JSON mapping of
 * ExportTraceServiceRequest: ids in lowercase hex, enums as numbers, times
 * as decimal strings of nanoseconds. Attributes follow OpenTelemetry's
 * messaging conventions where one fits, sekali.* otherwise. */
#include "otlp_json.h"

#include <inttypes.h>

#define KIND_CONSUMER 5   /* SpanKind SPAN_KIND_CONSUMER */
#define STATUS_ERROR  2   /* StatusCode STATUS_CODE_ERROR */
/* SpanFlags: the parent's remoteness is known, and it is remote. */
#define FLAGS_HAS_IS_REMOTE 0x100
#define FLAGS_IS_REMOTE     0x200

static bool attr_str(FILE *f, bool first, const char *key, const char *value);
static bool span(FILE *f, const char *queue, const struct sk_span_rec *r);

bool sk_otlp_encode(FILE *f, const char *service, const char *queue,
                    const struct sk_span_rec *recs, size_t n)
{
    fputs("{\"resourceSpans\":[{\"resource\":{\"attributes\":[", f);
    attr_str(f, true, "service.name", service);
    fputs("]},\"scopeSpans\":[{\"scope\":{\"name\":\"sekali\",\"version\":", f);
    sk_otlp_string(f, SK_VERSION);
    fputs("},\"spans\":[", f);
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            fputc(',', f);
        span(f, queue, &recs[i]);
    }
    fputs("]}]}]}", f);
    return !ferror(f);
}

/* "<queue> process", as the messaging conventions name a consumer's span. */
static bool span(FILE *f, const char *queue, const struct sk_span_rec *r)
{
    fprintf(f, "{\"traceId\":\"%s\",\"spanId\":\"%s\",", r->trace_id, r->span_id);
    /* The message's parent is the producer's span, in another process. */
    unsigned flags = r->trace_flags;
    if (r->parent_id[0] != '\0') {
        fprintf(f, "\"parentSpanId\":\"%s\",", r->parent_id);
        flags |= FLAGS_HAS_IS_REMOTE | FLAGS_IS_REMOTE;
    }
    if (r->tracestate[0] != '\0') {
        fputs("\"traceState\":", f);
        sk_otlp_string(f, r->tracestate);
        fputc(',', f);
    }
    fprintf(f, "\"flags\":%u,", flags);
    fputs("\"name\":", f);
    fputc('"', f);
    /* The queue is a configured name (NAME_CHARS): nothing to escape. */
    fprintf(f, "%s process\",\"kind\":%d,", queue, KIND_CONSUMER);
    fprintf(f, "\"startTimeUnixNano\":\"%" PRIu64 "\",\"endTimeUnixNano\":\"%" PRIu64 "\",",
            r->start_ns, r->end_ns);
    fputs("\"attributes\":[", f);
    attr_str(f, true, "messaging.system", "rabbitmq");
    attr_str(f, false, "messaging.operation.type", "process");
    attr_str(f, false, "messaging.destination.name", queue);
    attr_str(f, false, "messaging.message.id", r->job_id);
    attr_str(f, false, "sekali.job_type", r->job_type);
    attr_str(f, false, "sekali.idempotency_key", r->idempotency_key);
    attr_str(f, false, "sekali.outcome", r->outcome);
    if (r->reason[0] != '\0')
        attr_str(f, false, "sekali.reason", r->reason);
    fprintf(f, ",{\"key\":\"sekali.attempt\",\"value\":{\"intValue\":\"%" PRIu32 "\"}}]",
            r->attempt);
    if (r->error) {
        fprintf(f, ",\"status\":{\"code\":%d,\"message\":", STATUS_ERROR);
        sk_otlp_string(f, r->reason[0] != '\0' ? r->reason : r->outcome);
        fputc('}', f);
    }
    fputc('}', f);
    return !ferror(f);
}

static bool attr_str(FILE *f, bool first, const char *key, const char *value)
{
    fprintf(f, "%s{\"key\":\"%s\",\"value\":{\"stringValue\":", first ? "" : ",", key);
    sk_otlp_string(f, value);
    fputs("}}", f);
    return !ferror(f);
}

bool sk_otlp_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
    return !ferror(f);
}
