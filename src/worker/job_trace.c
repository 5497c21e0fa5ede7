/* job_trace.c - the worker's side of a job's trace context: see
 * job_trace.h. A dropped value is a warning, not an error, because the
 * job runs all the same; the counter is what an alert watches. */
#include "job_trace.h"
#include "metrics.h"

void sk_job_trace_admit(struct sk_log_job *log, const struct sk_envelope *env,
                        struct sk_metrics_type *m)
{
    log->trace_id = env->trace.trace_id;
    log->span_id = env->trace.span_id;
    if (env->trace_dropped == NULL)
        return;
    sk_metrics_inc(m, SK_METRIC_TRACE_DROPPED);
    sk_log_event(SK_LOG_WARN, SK_EVENT_TRACE_DROPPED, NULL, log,
                 "trace context dropped: %s; the job runs in trace %s", env->trace_dropped,
                 env->trace.trace_id);
}
