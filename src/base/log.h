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

#define sk_log_debug(...) sk_log(SK_LOG_DEBUG, __VA_ARGS__)
#define sk_log_info(...)  sk_log(SK_LOG_INFO, __VA_ARGS__)
#define sk_log_warn(...)  sk_log(SK_LOG_WARN, __VA_ARGS__)
#define sk_log_error(...) sk_log(SK_LOG_ERROR, __VA_ARGS__)

#endif
