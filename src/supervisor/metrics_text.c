/* metrics_text.c - renders the shared metrics (metrics.h) in Prometheus'
 * text exposition format 0.0.4, for GET /metrics.
 *
 * A scrape first reads the whole area (sk_metrics_read_*), then writes each
 * family from that copy, so every family shows the same moment. Metric
 * names and help texts live here; what is counted lives in metrics.c. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <sekali/handler.h>

#include "metrics.h"
#include "metrics_text.h"

#ifndef SK_VERSION
#define SK_VERSION "unknown"
#endif

#define NS_PER_S UINT64_C(1000000000)
#define NS_PER_MS UINT64_C(1000000)

struct family {
    const char *name;
    const char *help;
};

/* Indexed by enum sk_metric. */
static const struct family counters[SK_METRIC_COUNT] = {
    [SK_METRIC_DELIVERIES] = { "sekali_deliveries_total",
        "Deliveries received from the broker, malformed ones included." },
    [SK_METRIC_REDELIVERIES] = { "sekali_redeliveries_total",
        "Deliveries that the broker flagged as redelivered, or of an attempt after the first." },
    [SK_METRIC_EXECUTIONS] = { "sekali_executions_total",
        "Handler calls, including calls that never returned (the worker died)." },
    [SK_METRIC_COMPLETIONS] = { "sekali_completions_total",
        "Jobs whose effect and completion were committed." },
    [SK_METRIC_DUPLICATES] = { "sekali_duplicates_total",
        "Deliveries of a key already completed or failed, acked without running the handler." },
    [SK_METRIC_RETRIES] = { "sekali_retries_total",
        "Jobs re-scheduled for another attempt after a RETRY or a failed commit." },
    [SK_METRIC_LOCK_BUSY] = { "sekali_lock_busy_total",
        "Deliveries whose resource lock stayed held by another owner for lock.busy_wait." },
    [SK_METRIC_LOCKS_LOST] = { "sekali_locks_lost_total",
        "Jobs whose Redis lock or external-mode lease was found lost while they ran." },
    [SK_METRIC_FENCED_OUT] = { "sekali_fenced_out_total",
        "External mode: outcomes refused because another worker took the job over." },
    [SK_METRIC_OCC_CONFLICTS] = { "sekali_occ_conflicts_total",
        "Jobs whose handler found its row changed by another job (host->conflict())." },
    [SK_METRIC_CANCELLED] = { "sekali_cancelled_total",
        "Deliveries of a cancelled key: acked without running, or with their run's outcome "
        "refused." },
    [SK_METRIC_BATCH_RERUNS] = { "sekali_batch_reruns_total",
        "Handler calls rolled back with their batch because a batch-mate failed, their jobs run "
        "again (each is also in sekali_executions_total)." },
    [SK_METRIC_BATCH_DEFERRED] = { "sekali_batch_deferred_total",
        "Jobs whose batch closed early (batch_close_after) before their handler ran, left for "
        "the next transaction." },
    [SK_METRIC_TRACE_DROPPED] = { "sekali_trace_context_dropped_total",
        "Deliveries whose traceparent or tracestate broke the W3C grammar (dropped: the job ran "
        "in a new trace) or whose tracestate was cut to 512 bytes." },
    [SK_METRIC_RATE_LIMITED] = { "sekali_rate_limited_total",
        "Deliveries over their queue's rate_limit, re-scheduled through a delay queue to wait "
        "for a slot (not a failed attempt)." },
    [SK_METRIC_SPANS_EXPORTED] = { "sekali_spans_exported_total",
        "Spans of job runs sent to tracing.otlp_endpoint and accepted by the collector." },
    [SK_METRIC_SPANS_DROPPED] = { "sekali_spans_dropped_total",
        "Spans of job runs not exported: the worker's span queue was full, or the collector "
        "stayed unreachable or refused them." },
    [SK_METRIC_LANE_FORWARDS] = { "sekali_lane_forwards_total",
        "Deliveries of a queue with lanes taken from the queue itself and forwarded to their "
        "tenant's lane (job_type is empty: they are not read)." },
};

/* One scrape: the stream it writes, and the rows read for it. */
struct scrape {
    FILE                  *f;
    const struct sk_conf  *conf;
    struct sk_metrics     *m;
    struct sk_metrics_row *rows;    /* SK_METRICS_TYPES + 1 per queue */
    size_t                *n_rows;  /* per queue */
};

/* Every (queue q, job type row r) of a scrape s. */
#define EACH_ROW(s, q, r)                                                         \
    for (size_t q = 0; q < (s)->conf->n_queues; q++)                              \
        for (const struct sk_metrics_row *r = &(s)->rows[q * (SK_METRICS_TYPES + 1)], \
                                         *r##_end = r + (s)->n_rows[q];           \
             r < r##_end; r++)

static void job_counters(struct scrape *s);
static void dead_letters(struct scrape *s);
static void lock_wait(struct scrape *s);
static void rate_delay(struct scrape *s);
static void durations(struct scrape *s);
static void processes(struct scrape *s);
static void limits(struct scrape *s);
static void outbox(struct scrape *s);
static void rounds(struct scrape *s);
static void schedules(struct scrape *s);
static void build(struct scrape *s);
static void header(FILE *f, const char *name, const char *type, const char *help);
static void labels(FILE *f, const char *queue, const char *job_type);
static void label_value(FILE *f, const char *text);
static void seconds(FILE *f, uint64_t ns);
static void le(FILE *f, uint64_t ns);

int sk_metrics_render(struct sk_metrics *m, const struct sk_conf *conf, char **out,
                      size_t *len)
{
    sk_assert(conf->n_queues == sk_metrics_queues(m));
    sk_assert(conf->n_schedules == sk_metrics_schedules(m));
    struct scrape s = { .conf = conf, .m = m };
    s.rows = calloc(conf->n_queues * (SK_METRICS_TYPES + 1), sizeof(*s.rows));
    s.n_rows = calloc(conf->n_queues, sizeof(*s.n_rows));
    char *buf = NULL;
    size_t size = 0;
    if (s.rows != NULL && s.n_rows != NULL)
        s.f = open_memstream(&buf, &size);
    if (s.f != NULL) {
        for (size_t q = 0; q < conf->n_queues; q++)
            s.n_rows[q] = sk_metrics_read_types(m, q, &s.rows[q * (SK_METRICS_TYPES + 1)]);
        job_counters(&s);
        dead_letters(&s);
        lock_wait(&s);
        rate_delay(&s);
        durations(&s);
        processes(&s);
        limits(&s);
        outbox(&s);
        rounds(&s);
        schedules(&s);
        build(&s);
        int failed = ferror(s.f);
        if (fclose(s.f) != 0 || failed) {
            free(buf);
            buf = NULL;
        }
    }
    free(s.rows);
    free(s.n_rows);
    if (buf == NULL)
        return SK_ERR;
    *out = buf;
    *len = size;
    return SK_OK;
}

static void job_counters(struct scrape *s)
{
    for (int c = 0; c < SK_METRIC_COUNT; c++) {
        header(s->f, counters[c].name, "counter", counters[c].help);
        EACH_ROW(s, q, r) {
            fputs(counters[c].name, s->f);
            labels(s->f, s->conf->queues[q].name, r->name);
            fprintf(s->f, "} %" PRIu64 "\n", r->counter[c]);
        }
    }
}

/* The help names every reason, from the same table as the labels. */
static void dead_letters(struct scrape *s)
{
    const char *name = "sekali_dead_letters_total";
    fprintf(s->f, "# HELP %s Jobs sekali dead-lettered to <queue>.dead, by reason:", name);
    for (int why = 0; why < SK_METRICS_REASONS; why++)
        fprintf(s->f, "%s %s", why > 0 ? "," : "", sk_metrics_reason_name(why));
    fprintf(s->f, ".\n# TYPE %s counter\n", name);
    EACH_ROW(s, q, r) {
        for (int why = 0; why < SK_METRICS_REASONS; why++) {
            fputs(name, s->f);
            labels(s->f, s->conf->queues[q].name, r->name);
            fprintf(s->f, ",reason=\"%s\"} %" PRIu64 "\n", sk_metrics_reason_name(why),
                    r->dead[why]);
        }
    }
}

static void lock_wait(struct scrape *s)
{
    header(s->f, "sekali_lock_wait_seconds_total", "counter",
           "Time spent waiting for resource locks held by another owner.");
    EACH_ROW(s, q, r) {
        fputs("sekali_lock_wait_seconds_total", s->f);
        labels(s->f, s->conf->queues[q].name, r->name);
        fputs("} ", s->f);
        seconds(s->f, r->lock_wait_ns);
        fputc('\n', s->f);
    }
}

static void rate_delay(struct scrape *s)
{
    header(s->f, "sekali_rate_limit_delay_seconds_total", "counter",
           "Delay given to deliveries over their queue's rate_limit, summed.");
    EACH_ROW(s, q, r) {
        fputs("sekali_rate_limit_delay_seconds_total", s->f);
        labels(s->f, s->conf->queues[q].name, r->name);
        fputs("} ", s->f);
        seconds(s->f, r->rate_delay_ns);
        fputc('\n', s->f);
    }
}

/* The finite buckets a queue's histogram shows: up to the first bound at
 * or over its longest limit (lock_ttl, job_timeout), so that the "jobs near
 * their lock TTL" alert sees such jobs, but never fewer than up to 60 s.
 * Buckets are cumulative: the ones left out are in +Inf, still correct. */
static int shown_buckets(const struct sk_queue_conf *queue)
{
    uint64_t longest = (uint64_t)(queue->lock_ttl_ms > queue->job_timeout_ms
                                      ? queue->lock_ttl_ms : queue->job_timeout_ms) * NS_PER_MS;
    int b = SK_METRICS_BUCKET_60S;
    while (b < SK_METRICS_BUCKETS - 2 && sk_metrics_bucket_ns[b] < longest)
        b++;
    return b + 1;
}

static void durations(struct scrape *s)
{
    FILE *f = s->f;
    header(f, "sekali_job_duration_seconds", "histogram",
           "Completed jobs' time from claim to commit.");
    EACH_ROW(s, q, r) {
        const char *queue = s->conf->queues[q].name;
        int shown = shown_buckets(&s->conf->queues[q]);
        uint64_t cumulative = 0;
        for (int b = 0; b < SK_METRICS_BUCKETS; b++) {
            cumulative += r->duration[b];
            if (b >= shown && b < SK_METRICS_BUCKETS - 1)
                continue;
            fputs("sekali_job_duration_seconds_bucket", f);
            labels(f, queue, r->name);
            fputs(",le=\"", f);
            le(f, b < SK_METRICS_BUCKETS - 1 ? sk_metrics_bucket_ns[b] : 0);
            fprintf(f, "\"} %" PRIu64 "\n", cumulative);
        }
        fputs("sekali_job_duration_seconds_sum", f);
        labels(f, queue, r->name);
        fputs("} ", f);
        seconds(f, r->duration_ns);
        /* The +Inf bucket's count, so that the two always agree. */
        fputs("\nsekali_job_duration_seconds_count", f);
        labels(f, queue, r->name);
        fprintf(f, "} %" PRIu64 "\n", cumulative);
    }
}

/* A family of one uint64_t field of a struct the scrape reads: its offset. */
struct field_family {
    const char *name, *type, *help;
    size_t      field;
};

static uint64_t field(const void *figures, size_t offset)
{
    return *(const uint64_t *)((const char *)figures + offset);
}

/* The per-queue figures of the supervisor and the workers' processes. */
static void processes(struct scrape *s)
{
    static const struct field_family families[] = {
        { "sekali_worker_restarts_total", "counter",
          "Workers the supervisor started again after one died.",
          offsetof(struct sk_metrics_procs, restarts) },
        { "sekali_locks_released_for_dead_total", "counter",
          "Redis locks of dead workers deleted by their replacements, before lock_ttl.",
          offsetof(struct sk_metrics_procs, locks_released_for_dead) },
        { "sekali_workers_up", "gauge", "Worker processes running now.",
          offsetof(struct sk_metrics_procs, workers_up) },
        { "sekali_workers_paused", "gauge",
          "Workers that found their queue paused and cancelled their consumer.",
          offsetof(struct sk_metrics_procs, workers_paused) },
        { "sekali_workers_blocked", "gauge",
          "Workers whose handler cannot run (its ready() refused), holding no job.",
          offsetof(struct sk_metrics_procs, workers_blocked) },
        { "sekali_locks_held", "gauge",
          "Resource locks or concurrency permits this host's workers hold in Redis now.",
          offsetof(struct sk_metrics_procs, locks_held) },
    };
    for (size_t k = 0; k < SK_ARRAY_LEN(families); k++) {
        header(s->f, families[k].name, families[k].type, families[k].help);
        for (size_t q = 0; q < s->conf->n_queues; q++) {
            struct sk_metrics_procs p = sk_metrics_read_procs(s->m, q);
            fputs(families[k].name, s->f);
            labels(s->f, s->conf->queues[q].name, NULL);
            fprintf(s->f, "} %" PRIu64 "\n", field(&p, families[k].field));
        }
    }
}

/* The configured limits, as gauges, so that alerts can compare with them. */
static void limits(struct scrape *s)
{
    FILE *f = s->f;
    header(f, "sekali_lock_ttl_seconds", "gauge",
           "The queue's Redis lock lease (lock_ttl), for queues that take the lock.");
    for (size_t q = 0; q < s->conf->n_queues; q++) {
        if (!s->conf->queues[q].lock)
            continue;
        fputs("sekali_lock_ttl_seconds", f);
        labels(f, s->conf->queues[q].name, NULL);
        fputs("} ", f);
        seconds(f, (uint64_t)s->conf->queues[q].lock_ttl_ms * NS_PER_MS);
        fputc('\n', f);
    }
    header(f, "sekali_job_timeout_seconds", "gauge",
           "The queue's job_timeout, past which a job's worker is killed; 0 means none.");
    for (size_t q = 0; q < s->conf->n_queues; q++) {
        fputs("sekali_job_timeout_seconds", f);
        labels(f, s->conf->queues[q].name, NULL);
        fputs("} ", f);
        seconds(f, (uint64_t)s->conf->queues[q].job_timeout_ms * NS_PER_MS);
        fputc('\n', f);
    }
}

/* The relays' figures, one series per target queue seen. */
static void outbox(struct scrape *s)
{
    static const struct field_family families[] = {
        { "sekali_outbox_published_total", "counter",
          "Outbox rows the relays published and the broker confirmed, by target queue.",
          offsetof(struct sk_metrics_outrow, published) },
        { "sekali_outbox_unroutable_total", "counter",
          "Outbox rows the broker refused (no such queue, or nacked), marked with publish_error.",
          offsetof(struct sk_metrics_outrow, unroutable) },
        { "sekali_outbox_pending", "gauge", "Due outbox rows waiting to be published.",
          offsetof(struct sk_metrics_outrow, pending) },
        { "sekali_outbox_failed_rows", "gauge",
          "Unpublished outbox rows holding a publish_error, waiting for an operator.",
          offsetof(struct sk_metrics_outrow, failed_rows) },
    };
    if (s->conf->outbox.relays == 0)
        return;
    struct sk_metrics_outrow rows[SK_METRICS_OUTBOX_QUEUES + 1];
    size_t n = sk_metrics_read_outbox(s->m, rows);
    for (size_t k = 0; k < SK_ARRAY_LEN(families); k++) {
        header(s->f, families[k].name, families[k].type, families[k].help);
        for (size_t i = 0; i < n; i++) {
            fputs(families[k].name, s->f);
            labels(s->f, rows[i].queue, NULL);
            fprintf(s->f, "} %" PRIu64 "\n", field(&rows[i], families[k].field));
        }
    }
    header(s->f, "sekali_outbox_lag_seconds", "gauge",
           "How long the oldest due outbox row has been waiting to be published.");
    for (size_t i = 0; i < n; i++) {
        fputs("sekali_outbox_lag_seconds", s->f);
        labels(s->f, rows[i].queue, NULL);
        fputs("} ", s->f);
        seconds(s->f, rows[i].lag_ms * NS_PER_MS);
        fputc('\n', s->f);
    }
}

/* When the relays and the janitor last finished a round, for the processes
 * the configuration runs. */
static void rounds(struct scrape *s)
{
    if (s->conf->outbox.relays > 0) {
        header(s->f, "sekali_relay_last_round_timestamp_seconds", "gauge",
               "When an outbox relay last finished a batch (Unix time); 0 before the first.");
        fputs("sekali_relay_last_round_timestamp_seconds ", s->f);
        seconds(s->f, sk_metrics_read_relay_round(s->m) * NS_PER_MS);
        fputc('\n', s->f);
    }
    if (s->conf->janitor.interval_ms > 0) {
        header(s->f, "sekali_janitor_last_round_timestamp_seconds", "gauge",
               "When the janitor last finished a round (Unix time); 0 before the first.");
        fputs("sekali_janitor_last_round_timestamp_seconds ", s->f);
        seconds(s->f, sk_metrics_read_janitor_round(s->m) * NS_PER_MS);
        fputc('\n', s->f);
    }
    if (s->conf->n_schedules > 0) {
        header(s->f, "sekali_scheduler_last_round_timestamp_seconds", "gauge",
               "When the scheduler last looked at every schedule (Unix time); 0 before the "
               "first.");
        fputs("sekali_scheduler_last_round_timestamp_seconds ", s->f);
        seconds(s->f, sk_metrics_read_scheduler_round(s->m) * NS_PER_MS);
        fputc('\n', s->f);
    }
}

/* Per configured schedule: what this sekalid's scheduler enqueued, and the
 * last tick in the schedule's row, whichever host enqueued it (so a
 * schedule that stopped ticking shows everywhere). */
static void schedules(struct scrape *s)
{
    static const struct field_family families[] = {
        { "sekali_schedule_ticks_total", "counter",
          "Ticks this sekalid's scheduler enqueued (another host may enqueue the rest).",
          offsetof(struct sk_metrics_schedrow, enqueued) },
        { "sekali_schedule_missed_total", "counter",
          "Due ticks the schedule's missed policy dropped instead of enqueueing.",
          offsetof(struct sk_metrics_schedrow, missed) },
        { "sekali_schedule_failures_total", "counter",
          "Statements of the schedule that failed; it waits 5 s and tries again.",
          offsetof(struct sk_metrics_schedrow, failures) },
        { "sekali_schedule_last_tick_timestamp_seconds", "gauge",
          "The schedule's last enqueued tick (Unix time), by any host; 0 before its row "
          "was read.",
          offsetof(struct sk_metrics_schedrow, last_tick_s) },
    };
    if (s->conf->n_schedules == 0)
        return;
    for (size_t k = 0; k < SK_ARRAY_LEN(families); k++) {
        header(s->f, families[k].name, families[k].type, families[k].help);
        for (size_t i = 0; i < s->conf->n_schedules; i++) {
            struct sk_metrics_schedrow row = sk_metrics_read_schedule(s->m, i);
            fputs(families[k].name, s->f);
            fputs("{schedule=\"", s->f);
            label_value(s->f, s->conf->schedules[i].name);
            fprintf(s->f, "\"} %" PRIu64 "\n", field(&row, families[k].field));
        }
    }
}

static void header(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Opens the label set: {queue="...",job_type="..." (job_type only when
 * given); the caller adds more labels and the closing brace. */
static void labels(FILE *f, const char *queue, const char *job_type)
{
    fputs("{queue=\"", f);
    label_value(f, queue);
    fputc('"', f);
    if (job_type != NULL) {
        fputs(",job_type=\"", f);
        label_value(f, job_type);
        fputc('"', f);
    }
}

/* The format's three escapes. Job types come from producers; the envelope
 * already made sure they are UTF-8 without NUL. */
static void label_value(FILE *f, const char *text)
{
    for (; *text != '\0'; text++) {
        if (*text == '\\')
            fputs("\\\\", f);
        else if (*text == '"')
            fputs("\\\"", f);
        else if (*text == '\n')
            fputs("\\n", f);
        else
            fputc(*text, f);
    }
}

/* Exact decimal seconds: no float rounding in a counter that only grows. */
static void seconds(FILE *f, uint64_t ns)
{
    fprintf(f, "%" PRIu64 ".%09" PRIu64, ns / NS_PER_S, ns % NS_PER_S);
}

/* A bucket bound as Prometheus' clients write it: the shortest exact
 * decimal ("0.005", "2.5", "60"); 0 stands for the last bucket, "+Inf". */
static void le(FILE *f, uint64_t ns)
{
    if (ns == 0) {
        fputs("+Inf", f);
        return;
    }
    fprintf(f, "%" PRIu64, ns / NS_PER_S);
    uint64_t frac = ns % NS_PER_S;
    if (frac == 0)
        return;
    char digits[10];
    snprintf(digits, sizeof(digits), "%09" PRIu64, frac);
    for (int i = 8; i > 0 && digits[i] == '0'; i--)
        digits[i] = '\0';
    fprintf(f, ".%s", digits);
}

/* The wall-clock second this process began: the supervisor renders, and it
 * starts once per sekalid (a reload keeps it), so a dashboard can mark
 * restarts next to crash loops. Taken before main(), not at the first
 * scrape. */
static time_t started;
__attribute__((constructor)) static void note_start(void)
{
    started = time(NULL);
}

/* What runs: the version and the handler ABI it loads (MAJOR.MINOR), as
 * labels of a constant 1, and when it started. */
static void build(struct scrape *s)
{
    header(s->f, "sekali_build_info", "gauge",
           "The version of sekalid and the handler ABI it loads; always 1.");
    fputs("sekali_build_info{version=\"", s->f);
    label_value(s->f, SK_VERSION);
    fprintf(s->f, "\",abi=\"%d.%d\"} 1\n", SEKALI_HANDLER_ABI_MAJOR, SEKALI_HANDLER_ABI_MINOR);
    header(s->f, "process_start_time_seconds", "gauge",
           "When sekalid's supervisor started (Unix time).");
    fprintf(s->f, "process_start_time_seconds %lld\n", (long long)started);
}
