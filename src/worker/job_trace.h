/* job_trace.h - a job's W3C trace context in the worker: its log fields,
 * the count of what a producer sent that could not be used, and what the
 * handler is given (the job's span as the parent of what it calls). The
 * parsing itself is trace_context.c's; the pipeline calls in here once
 * per delivery, so job.c and span.c carry no more of it than that call. */
#ifndef SK_JOB_TRACE_H
#define SK_JOB_TRACE_H

#include "envelope.h"
#include "log.h"

struct sk_metrics_type;

/* After sk_envelope_parse(), valid or not: points log's trace_id and
 * span_id at env's (so every later line of the job carries them), and,
 * when env's trace context was dropped or cut, counts it for m and logs
 * the trace_context_dropped event. Worker main thread. */
void sk_job_trace_admit(struct sk_log_job *log, const struct sk_envelope *env,
                        struct sk_metrics_type *m);

#endif
