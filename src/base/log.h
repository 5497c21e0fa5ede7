/* log.h - structured logging for every sekali process.
 *
 * One line per event: to journald with journal fields when stderr is the
 * journal stream, else on stderr as JSON objects (the default when stderr is
 * not a terminal) or "level message key=value" text. Job lines carry the job's
 * identifying fields so that one grep on an idempotency key shows its timeline. */
#ifndef SK_LOG_H
#define SK_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sk_log_level { SK_LOG_DEBUG = 0, SK_LOG_INFO, SK_LOG_WARN, SK_LOG_ERROR };
enum sk_log_format { SK_LOG_FORMAT_AUTO = 0, SK_LOG_FORMAT_JSON, SK_LOG_FORMAT_TEXT };

/* The fields every job line carries; NULL strings and zero numbers are omitted. */
struct sk_log_job {
    const char *queue;
    const char *job_id;
    const char *idempotency_key;
    const char *resource_key;
    const char *lock_owner;
    int64_t     fence;
    uint32_t    delivery_attempt;
    const char *trace_id;   /* W3C trace context (trace_context.h) */
    const char *span_id;    /* this run's span */
};

/* Sets the level, the format and the process's role ("supervisor",
 * "worker", "ctl") shown on each line. Call once per process, after fork. */
void sk_log_init(enum sk_log_level level, enum sk_log_format format, const char *role);

/* True when stderr is the journal stream systemd set up (JOURNAL_STREAM). */
bool sk_log_stderr_is_journal(void);

void sk_log(enum sk_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void sk_log_job(enum sk_log_level level, const struct sk_log_job *job, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void sk_vlog_job(enum sk_log_level level, const struct sk_log_job *job, const char *fmt,
                 va_list ap) __attribute__((format(printf, 3, 0)));

/* Stable names for the lines that tests, alerts and scripts look for: a
 * line logged with sk_log_event() carries its name as EVENT= in the journal,
 * "event" in JSON and event= in text, and the server it concerns (if any) as
 * SERVER=, "server", server=. The prose around them may change; these may
 * not, nor the keys of their fields (sk_log_event_fields()). Adding one, or
 * a field? Name it in sekalid(8) under LOGGING. */
#define SK_EVENT_OUTAGE_BEGIN   "outage_begin"    /* a server went away (once per outage) */
#define SK_EVENT_OUTAGE_END     "outage_end"      /* ... and came back (once) */
#define SK_EVENT_CRASH_RECORDED "crash_recorded"  /* a dead worker's job counted a crash */
#define SK_EVENT_CRASH_HANDED   "crash_handed"    /* a retired worker's crash handed down */
#define SK_EVENT_WORKER_DIED    "worker_died"     /* a child died unasked (and restarts) */
#define SK_EVENT_WORKER_CANNOT_RUN "worker_cannot_run"  /* exit 2 or 3: sekalid stops */
#define SK_EVENT_CRASH_LOOP     "crash_loop"      /* a slot keeps dying: restarts back off */
#define SK_EVENT_JOB_TIMEOUT    "job_timeout"     /* a worker killed for its job's time */
#define SK_EVENT_READY          "ready"           /* every worker consumes (READY=1) */
#define SK_EVENT_RELOADED       "reloaded"        /* a reload's new generation started */
#define SK_EVENT_RELOAD_FAILED  "reload_failed"   /* a reload refused; the old one runs */
#define SK_EVENT_LOCK_LOST      "lock_lost"       /* a job ran without its lock or lease */
#define SK_EVENT_FENCED_OUT     "fenced_out"      /* a job's outcome lost to a newer owner */
#define SK_EVENT_DOCTOR_FAILED  "doctor_failed"   /* a start check of doctor.h failed (once) */
#define SK_EVENT_MALFORMED      "malformed_message"  /* a delivery that can never run */
#define SK_EVENT_PUBLISH_FAILED "publish_failed"  /* a worker's publishing connection failed */
#define SK_EVENT_RELAY_REFUSED  "relay_refused"   /* the broker refused an outbox row */
#define SK_EVENT_HANDLER_REFUSED "handler_refused" /* a handler did not load at start: exit */
#define SK_EVENT_WORKER_CANNOT_START "worker_cannot_start" /* a worker's set-up failed */
#define SK_EVENT_PAUSED         "paused"          /* a worker cancelled its consumer: paused */
#define SK_EVENT_RESUMED        "resumed"         /* ... and consumes again */
#define SK_EVENT_JOB_CANCELLED  "job_cancelled"   /* a running job's outcome refused: cancelled */
#define SK_EVENT_LINK_REFUSED   "link_refused"    /* a login or TLS set-up refused: jobs held */
#define SK_EVENT_HANDLER_NOT_READY "handler_not_ready" /* a handler cannot run: no consumer */
#define SK_EVENT_HANDLER_READY  "handler_ready"   /* ... and can again: consuming */
#define SK_EVENT_TRACE_DROPPED  "trace_context_dropped" /* a bad traceparent/tracestate dropped */
#define SK_EVENT_STARTED        "started"         /* a child is set up and runs (its role) */
#define SK_EVENT_STOPPING       "stopping"        /* ... and, asked to, leaves its loop */
#define SK_EVENT_GENERATION_RETIRED "generation_retired" /* its workers finish and go */
#define SK_EVENT_LOCKS_FREED    "locks_freed"     /* a dead worker's locks deleted */
#define SK_EVENT_LOCKS_HANDED   "locks_handed"    /* a retired worker's locks handed on */
#define SK_EVENT_DOCTOR_PASSED  "doctor_passed"   /* every start check passed or warned */
#define SK_EVENT_OUTCOME        "outcome"         /* what became of a job: its exit */
#define SK_EVENT_RATE_LIMITED   "rate_limited"    /* a span's jobs over the rate limit delayed */
#define SK_EVENT_BATCH_RESIZED  "batch_resized"   /* a worker's batch grew or shrank (distance) */

/* The servers an event's SERVER= names. */
#define SK_SERVER_POSTGRES "postgres"
#define SK_SERVER_REDIS    "redis"
#define SK_SERVER_RABBITMQ "rabbitmq"

/* A line with a stable event name (SK_EVENT_*), the server it concerns or
 * NULL, and the job's fields or NULL. Any thread may call it. */
void sk_log_event(enum sk_log_level level, const char *event, const char *server,
                  const struct sk_log_job *job, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A field of an event's own beside the job's (a signal, a count): `key` in
 * lower case as JSON and text show it (the journal upper-cases it), `value`
 * as text; a NULL or empty value is left out. Its key is as stable as the
 * event's name: sekalid(8) lists both. */
struct sk_log_field {
    const char *key;
    const char *value;
};
#define SK_LOG_MAX_FIELDS 4

/* As sk_log_event(), with n (at most SK_LOG_MAX_FIELDS) fields of its own
 * after the job's; fields may be NULL when n is 0. Any thread may call it. */
void sk_log_event_fields(enum sk_log_level level, const char *event, const char *server,
                         const struct sk_log_job *job, const struct sk_log_field *fields,
                         size_t n, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

#define sk_log_debug(...) sk_log(SK_LOG_DEBUG, __VA_ARGS__)
#define sk_log_info(...)  sk_log(SK_LOG_INFO, __VA_ARGS__)
#define sk_log_warn(...)  sk_log(SK_LOG_WARN, __VA_ARGS__)
#define sk_log_error(...) sk_log(SK_LOG_ERROR, __VA_ARGS__)

#endif
