/* log.c - writes structured log lines.
 *
 * Under systemd (stderr is the journal stream named by JOURNAL_STREAM) each
 * line goes to journald with its fields as journal fields (JOB_ID=,
 * IDEMPOTENCY_KEY=, FENCE=, ...), so `journalctl IDEMPOTENCY_KEY=x` shows a
 * key's timeline. Otherwise each line is built in a stack buffer and written
 * to stderr with a single write(2), as JSON or text, so lines from concurrent
 * workers sharing one stderr never interleave mid-line. Keys come from
 * producers: in text format control characters are escaped, the message is
 * quoted, and a value that could pass for more than one field is quoted, so
 * that no key can forge a line or a field.
 *
 * A worker writes a line per job, so a line is built without printf where
 * it can be: the pid is kept from sk_log_init() (and a fork), the date part
 * of the time stamp is made once a second, and text is copied in runs. */
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-journal.h>

#include "common.h"
#include "log.h"

#define LINE_MAX_BYTES 4096

static enum sk_log_level  min_level = SK_LOG_INFO;
static enum sk_log_format format = SK_LOG_FORMAT_JSON;
static const char        *role = "sekali";
static bool               to_journal;
static char               pid_text[24];      /* getpid() is a system call: once per process */
static time_t             stamp_second = -1; /* the second stamp_prefix was made for */
static char               stamp_prefix[64];  /* "YYYY-MM-DDTHH:MM:SS." */

static const char *const level_names[] = { "debug", "info", "warn", "error" };

struct line {
    char   buf[LINE_MAX_BYTES];
    size_t len;
};

/* What a line says beyond its message: the event's name, server and own
 * fields (all may be absent) and the job's fields. */
struct about {
    const char                *event;
    const char                *server;
    const struct sk_log_job   *job;
    const struct sk_log_field *fields;
    size_t                     n_fields;
};

static void put_raw(struct line *l, const char *s, size_t n);
static void put_str(struct line *l, const char *s);
static void put_stamp(struct line *l);
static void remember_pid(void);
static void put_fmt(struct line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_json_string(struct line *l, const char *s);
static void put_text(struct line *l, const char *s, bool quoted);
static bool needs_quotes(const char *s);
static void put_field(struct line *l, const char *key, const char *value);
static void put_job(struct line *l, const struct sk_log_job *job);
static void put_about(struct line *l, const struct about *a);
static void put_json_line(struct line *l, enum sk_log_level level, const char *msg,
                          const struct about *a);
static void put_text_line(struct line *l, enum sk_log_level level, const char *msg,
                          const struct about *a);
static void put_number(struct line *l, const char *key, const char *num);
static void send_to_journal(enum sk_log_level level, const char *msg, const struct about *a);
static void vlog(enum sk_log_level level, const struct about *a, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

bool sk_log_stderr_is_journal(void)
{
    const char *stream = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    if (stream == NULL || sscanf(stream, "%llu:%llu", &dev, &ino) != 2 ||
        fstat(STDERR_FILENO, &st) != 0)
        return false;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void sk_log_init(enum sk_log_level level, enum sk_log_format fmt, const char *process_role)
{
    min_level = level;
    to_journal = fmt == SK_LOG_FORMAT_AUTO && sk_log_stderr_is_journal();
    if (fmt == SK_LOG_FORMAT_AUTO)
        fmt = isatty(STDERR_FILENO) ? SK_LOG_FORMAT_TEXT : SK_LOG_FORMAT_JSON;
    format = fmt;
    role = process_role;
    remember_pid();
    static bool fork_handler;
    if (!fork_handler)
        fork_handler = pthread_atfork(NULL, NULL, remember_pid) == 0;
}

/* Also the fork handler: a child that logs before its own sk_log_init()
 * still shows its own pid. */
static void remember_pid(void)
{
    pid_text[sk_format_u64(pid_text, (uint64_t)getpid())] = '\0';
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

void sk_log_event(enum sk_log_level level, const char *event, const char *server,
                  const struct sk_log_job *job, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, &(struct about){ .event = event, .server = server, .job = job }, fmt, ap);
    va_end(ap);
}

void sk_log_event_fields(enum sk_log_level level, const char *event, const char *server,
                         const struct sk_log_job *job, const struct sk_log_field *fields,
                         size_t n, const char *fmt, ...)
{
    sk_assert(n <= SK_LOG_MAX_FIELDS);
    va_list ap;
    va_start(ap, fmt);
    vlog(level, &(struct about){ .event = event, .server = server, .job = job,
                                 .fields = fields, .n_fields = n }, fmt, ap);
    va_end(ap);
}

void sk_vlog_job(enum sk_log_level level, const struct sk_log_job *job, const char *fmt,
                 va_list ap)
{
    vlog(level, &(struct about){ .job = job }, fmt, ap);
}

static void put_json_line(struct line *l, enum sk_log_level level, const char *msg,
                          const struct about *a)
{
    put_str(l, "{\"ts\":\"");
    put_stamp(l);
    put_str(l, "\",\"level\":\"");
    put_str(l, level_names[level]);
    put_str(l, "\",\"role\":");
    put_json_string(l, role);
    put_str(l, ",\"pid\":");
    put_str(l, pid_text);
    put_str(l, ",\"msg\":");
    put_json_string(l, msg);
    put_about(l, a);
    put_raw(l, "}", 1);
}

static void put_text_line(struct line *l, enum sk_log_level level, const char *msg,
                          const struct about *a)
{
    put_stamp(l);
    put_raw(l, " ", 1);
    put_fmt(l, "%-5s ", level_names[level]);
    put_str(l, role);
    put_raw(l, "[", 1);
    put_str(l, pid_text);
    put_raw(l, "] ", 2);
    /* Always quoted: a message echoes text (a key, a broker's or a
     * handler's error) that could otherwise pose as key=value fields. */
    put_text(l, msg, true);
    put_about(l, a);
}

/* The event's own fields come after the job's, so that every line's job
 * fields stand in one place whatever the event adds. */
static void put_about(struct line *l, const struct about *a)
{
    put_field(l, "event", a->event);
    put_field(l, "server", a->server);
    put_job(l, a->job);
    for (size_t i = 0; i < a->n_fields; i++)
        put_field(l, a->fields[i].key, a->fields[i].value);
}

static void vlog(enum sk_log_level level, const struct about *a, const char *fmt, va_list ap)
{
    if (level < min_level)
        return;

    /* Most lines are one string (job.c logs its outcomes as "%s"): that
     * string is the message, without a copy through vsnprintf. */
    char buf[2048];
    const char *msg = buf;
    if (fmt[0] == '%' && fmt[1] == 's' && fmt[2] == '\0') {
        msg = va_arg(ap, const char *);
        if (msg == NULL)
            msg = "(null)";
    } else {
        vsnprintf(buf, sizeof(buf), fmt, ap);
    }
    if (to_journal) {
        send_to_journal(level, msg, a);
        return;
    }
    if (pid_text[0] == '\0')
        remember_pid();

    struct line l = { .len = 0 };
    if (format == SK_LOG_FORMAT_JSON)
        put_json_line(&l, level, msg, a);
    else
        put_text_line(&l, level, msg, a);
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

static void put_str(struct line *l, const char *s)
{
    put_raw(l, s, strlen(s));
}

/* UTC, to the millisecond; gmtime_r and its formatting once a second. */
static void put_stamp(struct line *l)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec != stamp_second) {
        struct tm tm;
        gmtime_r(&now.tv_sec, &tm);
        snprintf(stamp_prefix, sizeof(stamp_prefix), "%04d-%02d-%02dT%02d:%02d:%02d.",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec);
        stamp_second = now.tv_sec;
    }
    long ms = now.tv_nsec / 1000000;
    char tail[4] = { (char)('0' + ms / 100), (char)('0' + ms / 10 % 10), (char)('0' + ms % 10),
                     'Z' };
    put_str(l, stamp_prefix);
    put_raw(l, tail, sizeof(tail));
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
    const unsigned char *run = (const unsigned char *)s, *p = run;
    for (; *p != '\0'; p++) {
        if (*p != '"' && *p != '\\' && *p >= 0x20)
            continue;
        put_raw(l, (const char *)run, (size_t)(p - run));
        run = p + 1;
        if (*p == '"' || *p == '\\')
            put_raw(l, (const char[]){ '\\', (char)*p }, 2);
        else
            put_fmt(l, "\\u%04x", *p);
    }
    put_raw(l, (const char *)run, (size_t)(p - run));
    put_raw(l, "\"", 1);
}

static void put_field(struct line *l, const char *key, const char *value)
{
    if (value == NULL || value[0] == '\0')
        return;
    if (format == SK_LOG_FORMAT_JSON) {
        put_raw(l, ",\"", 2);
        put_str(l, key);
        put_raw(l, "\":", 2);
        put_json_string(l, value);
    } else {
        put_raw(l, " ", 1);
        put_str(l, key);
        put_raw(l, "=", 1);
        put_text(l, value, needs_quotes(value));
    }
}

/* Control characters become C escapes (\n, \t, \xHH). Inside quotes '"' and
 * '\\' are escaped too, so that the closing quote is the value's end. */
static void put_text(struct line *l, const char *s, bool quoted)
{
    if (quoted)
        put_raw(l, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p == '\n')
            put_raw(l, "\\n", 2);
        else if (*p == '\r')
            put_raw(l, "\\r", 2);
        else if (*p == '\t')
            put_raw(l, "\\t", 2);
        else if (*p < 0x20 || *p == 0x7f)
            put_fmt(l, "\\x%02x", *p);
        else if (quoted && (*p == '"' || *p == '\\'))
            put_raw(l, (const char[]){ '\\', (char)*p }, 2);
        else
            put_raw(l, (const char *)p, 1);
    }
    if (quoted)
        put_raw(l, "\"", 1);
}

/* A value with a space or '=' could read as a second key=value pair. */
static bool needs_quotes(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++)
        if (*p <= ' ' || *p == '=' || *p == '"' || *p == '\\' || *p == 0x7f)
            return true;
    return false;
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
    char num[24];
    if (job->fence > 0) {
        num[sk_format_u64(num, (uint64_t)job->fence)] = '\0';
        put_number(l, "fence", num);
    }
    if (job->delivery_attempt > 0) {
        num[sk_format_u64(num, job->delivery_attempt)] = '\0';
        put_number(l, "delivery_attempt", num);
    }
    put_field(l, "trace_id", job->trace_id);
    put_field(l, "span_id", job->span_id);
}

/* JSON numbers go unquoted; in text a number is a field like any other. */
static void put_number(struct line *l, const char *key, const char *num)
{
    if (format != SK_LOG_FORMAT_JSON) {
        put_field(l, key, num);
        return;
    }
    put_raw(l, ",\"", 2);
    put_str(l, key);
    put_raw(l, "\":", 2);
    put_str(l, num);
}

/* journald's own fields: PRIORITY is syslog's (error 3 .. debug 7). */
static void send_to_journal(enum sk_log_level level, const char *msg, const struct about *a)
{
    static const int priorities[] = { 7, 6, 4, 3 };
    const char *event = a->event, *server = a->server;
    const struct sk_log_job *job = a->job;
    char fields[14 + SK_LOG_MAX_FIELDS][640];  /* a key is at most 512 bytes */
    struct iovec iov[14 + SK_LOG_MAX_FIELDS];
    int n = 0;
#define FIELD(...)                                                               \
    do {                                                                         \
        int len_ = snprintf(fields[n], sizeof(fields[n]), __VA_ARGS__);          \
        iov[n].iov_base = fields[n];                                             \
        iov[n].iov_len = len_ < 0 ? 0 : (size_t)len_ < sizeof(fields[n])         \
                                            ? (size_t)len_ : sizeof(fields[n]) - 1; \
        n++;                                                                     \
    } while (0)
    FIELD("MESSAGE=%s", msg);
    FIELD("PRIORITY=%d", priorities[level]);
    FIELD("SEKALI_ROLE=%s", role);
    if (event != NULL)
        FIELD("EVENT=%s", event);
    if (server != NULL)
        FIELD("SERVER=%s", server);
    if (job != NULL) {
        if (job->queue != NULL)
            FIELD("QUEUE=%s", job->queue);
        if (job->job_id != NULL)
            FIELD("JOB_ID=%s", job->job_id);
        if (job->idempotency_key != NULL)
            FIELD("IDEMPOTENCY_KEY=%s", job->idempotency_key);
        if (job->resource_key != NULL)
            FIELD("RESOURCE_KEY=%s", job->resource_key);
        if (job->lock_owner != NULL)
            FIELD("LOCK_OWNER=%s", job->lock_owner);
        if (job->fence > 0)
            FIELD("FENCE=%lld", (long long)job->fence);
        if (job->delivery_attempt > 0)
            FIELD("DELIVERY_ATTEMPT=%u", job->delivery_attempt);
        if (job->trace_id != NULL)
            FIELD("TRACE_ID=%s", job->trace_id);
        if (job->span_id != NULL)
            FIELD("SPAN_ID=%s", job->span_id);
    }
    for (size_t i = 0; i < a->n_fields; i++) {
        if (a->fields[i].value == NULL || a->fields[i].value[0] == '\0')
            continue;
        char key[32];
        size_t k = 0;
        for (; a->fields[i].key[k] != '\0' && k < sizeof(key) - 1; k++)
            key[k] = (char)toupper((unsigned char)a->fields[i].key[k]);
        key[k] = '\0';
        FIELD("%s=%s", key, a->fields[i].value);
    }
#undef FIELD
    sd_journal_sendv(iov, n);
}
