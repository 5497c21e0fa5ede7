/* span_export.h - a worker's spans, one per job run, sent to an
 * OpenTelemetry collector over OTLP/HTTP (tracing.otlp_endpoint).
 *
 * Nothing here may slow or endanger a job: a job's end only copies a small
 * record into a bounded queue (a full queue drops the span and counts it);
 * a thread of the worker batches the records into JSON (otlp_json.c) and
 * POSTs them with libcurl, retrying a collector that is down with backoff
 * while the jobs go on. One exporter per worker process: the job's end
 * (job_state.c) reaches it without a pointer through the pipeline. */
#ifndef SK_SPAN_EXPORT_H
#define SK_SPAN_EXPORT_H

#include "common.h"
#include "config.h"

struct sk_job;

/* Worker main thread, once after fork: starts the export thread when
 * conf names an endpoint (else does nothing and returns SK_OK). queue is
 * borrowed for the process's life. SK_OK, or SK_ERR with err filled
 * (out of memory, no thread, libcurl refused): the worker then runs
 * without export. */
int sk_span_export_start(const struct sk_tracing_conf *conf, const char *queue,
                         struct sk_err *err);

/* Worker main thread, at a job's exit: queues the run's span. Never
 * blocks but on the queue's mutex, which the thread holds only to copy;
 * a full queue drops the span (sekali_spans_dropped_total). outcome is
 * the outcome event's name; error marks a failed run. */
void sk_span_export_job(const struct sk_job *j, const char *outcome, bool error);

/* Worker main thread, at its stop: what is queued is sent, waiting at most
 * otlp_timeout in all (the rest is dropped and counted), then the thread
 * is joined. Does nothing without a started exporter. */
void sk_span_export_stop(void);

#endif
