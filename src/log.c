/* log.c - writes structured log lines to stderr.
 *
 * Each line is built in a stack buffer and written with a single write(2), so
 * lines from concurrent workers sharing one stderr (journald, a pipe) never
 * interleave mid-line. Under systemd stderr goes to the journal; journald
 * fields proper come with the service integration. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define LINE_MAX_BYTES 4096

static enum sk_log_level  min_level = SK_LOG_INFO;
static enum sk_log_format format = SK_LOG_FORMAT_JSON;
static const char        *role = "sekali";

static const char *const level_names[] = { "debug", "info", "warn", "error" };

struct line {
    char   buf[LINE_MAX_BYTES];
    size_t len;
};

static void put_raw(struct line *l, const char *s, size_t n);
static void put_fmt(struct line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_json_string(struct line *l, const char *s);
static void put_field(struct line *l, const char *key, const char *value);
static void put_job(struct line *l, const struct sk_log_job *job);

void sk_log_init(enum sk_log_level level, enum sk_log_format fmt, const char *process_role)
{
    min_level = level;
    if (fmt == SK_LOG_FORMAT_AUTO)
        fmt = isatty(STDERR_FILENO) ? SK_LOG_FORMAT_TEXT : SK_LOG_FORMAT_JSON;
    format = fmt;
    role = process_role;
}

void sk_log(enum sk_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sk_vlog_job(level, NULL, fmt, ap);
    va_end(ap);
}

void sk_log_job(enum sk_log_level level, const struct sk_log_job *job, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sk_vlog_job(level, job, fmt, ap);
    va_end(ap);
}

void sk_vlog_job(enum sk_log_level level, const struct sk_log_job *job, const char *fmt,
                 va_list ap)
{
    if (level < min_level)
        return;

    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);

    struct line l = { .len = 0 };
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    char ts[64];
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             now.tv_nsec / 1000000);

    if (format == SK_LOG_FORMAT_JSON) {
        put_fmt(&l, "{\"ts\":\"%s\",\"level\":\"%s\",\"role\":", ts, level_names[level]);
        put_json_string(&l, role);
        put_fmt(&l, ",\"pid\":%ld,\"msg\":", (long)getpid());
        put_json_string(&l, msg);
        put_job(&l, job);
        put_raw(&l, "}", 1);
    } else {
        put_fmt(&l, "%s %-5s %s[%ld] %s", ts, level_names[level], role, (long)getpid(), msg);
        put_job(&l, job);
    }
    /* Leave room for the newline even when the line was cut short. */
    if (l.len >= sizeof(l.buf))
        l.len = sizeof(l.buf) - 1;
    l.buf[l.len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, l.buf, l.len);
    (void)ignored;
}

static void put_raw(struct line *l, const char *s, size_t n)
{
    size_t room = sizeof(l->buf) - 1 - l->len;
    if (n > room)
        n = room;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void put_fmt(struct line *l, const char *fmt, ...)
{
    size_t room = sizeof(l->buf) - 1 - l->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->buf + l->len, room + 1, fmt, ap);
    va_end(ap);
    if (n > 0)
        l->len += (size_t)n < room ? (size_t)n : room;
}

static void put_json_string(struct line *l, const char *s)
{
    put_raw(l, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = { '\\', (char)*p };
            put_raw(l, esc, 2);
        } else if (*p < 0x20) {
            put_fmt(l, "\\u%04x", *p);
        } else {
            put_raw(l, (const char *)p, 1);
        }
    }
    put_raw(l, "\"", 1);
}

static void put_field(struct line *l, const char *key, const char *value)
{
    if (value == NULL || value[0] == '\0')
        return;
    if (format == SK_LOG_FORMAT_JSON) {
        put_fmt(l, ",\"%s\":", key);
        put_json_string(l, value);
    } else {
        put_fmt(l, " %s=%s", key, value);
    }
}

static void put_job(struct line *l, const struct sk_log_job *job)
{
    if (job == NULL)
        return;
    put_field(l, "queue", job->queue);
    put_field(l, "job_id", job->job_id);
    put_field(l, "idempotency_key", job->idempotency_key);
    put_field(l, "resource_key", job->resource_key);
    put_field(l, "lock_owner", job->lock_owner);
    char num[32];
    if (job->fence > 0) {
        snprintf(num, sizeof(num), "%lld", (long long)job->fence);
        if (format == SK_LOG_FORMAT_JSON)
            put_fmt(l, ",\"fence\":%s", num);
        else
            put_field(l, "fence", num);
    }
    if (job->delivery_attempt > 0) {
        snprintf(num, sizeof(num), "%u", job->delivery_attempt);
        if (format == SK_LOG_FORMAT_JSON)
            put_fmt(l, ",\"delivery_attempt\":%s", num);
        else
            put_field(l, "delivery_attempt", num);
    }
}
