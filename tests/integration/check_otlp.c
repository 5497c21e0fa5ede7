/* check_otlp.c - spans exported over OTLP/HTTP (tracing.otlp_endpoint), on
 * real servers with a collector in the test: one span per job run, in the
 * producer's trace (traceId, the producer's span as parentSpanId, the run's
 * span_id of the log), a retry a second span of the same trace, a hostile
 * key escaped and cut, the spans of the last jobs flushed at a stop, a
 * collector that is down neither holding a job nor losing count, the
 * configured headers on every request (an API key read from a file) with
 * the key in none of the daemon's output even when the collector refuses
 * it, and the message's tracestate and sampled flag on the span.
 *
 * The collector records each request's body, one per line; python3's json
 * module reads them (a real parser: a byte the exporter failed to escape
 * fails the test) and prints one tab-separated line per span. */
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define TRACE  "4bf92f3577b34da6a3ce929d0e0e4736"
#define PARENT "00f067aa0ba902b7"
#define TP     "00-" TRACE "-" PARENT "-01"
#define TRACE2 "0af7651916cd43dd8448eb211c80319c"
#define PARENT2 "b7ad6b7169203331"
#define TP2    "00-" TRACE2 "-" PARENT2 "-01"

/* The collector: every request's body appended to a file, one per line. */
struct collector {
    struct MHD_Daemon *d;
    pthread_mutex_t    lock;
    char               path[512];
    int                requests;
    int                port;
    /* Set: each request waits, unanswered, until collector_release(). */
    bool               hang;
    pthread_cond_t     released;
    unsigned           answer;       /* the status of every request; 0: 200 */
    const char        *header;       /* a request header to record, or NULL */
    char               got[256];     /* its value in the last request */
    int                with_header;  /* requests that had it */
};

struct upload {
    char  *body;
    size_t len;
};

static enum MHD_Result on_request(void *arg, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *data, size_t *data_size, void **cls)
{
    struct collector *col = arg;
    (void)version;
    struct upload *u = *cls;
    if (u == NULL) {
        *cls = u = calloc(1, sizeof(*u));
        return u != NULL ? MHD_YES : MHD_NO;
    }
    if (*data_size > 0) {
        char *more = realloc(u->body, u->len + *data_size + 1);
        if (more == NULL)
            return MHD_NO;
        u->body = more;
        memcpy(u->body + u->len, data, *data_size);
        u->len += *data_size;
        u->body[u->len] = '\0';
        *data_size = 0;
        return MHD_YES;
    }
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    pthread_mutex_lock(&col->lock);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    while (col->hang && pthread_cond_timedwait(&col->released, &col->lock, &until) == 0)
        ;
    pthread_mutex_unlock(&col->lock);
    unsigned status = col->answer != 0 ? col->answer : 200;
    if (strcmp(method, "POST") != 0 || strcmp(url, "/v1/traces") != 0 || type == NULL ||
        strcmp(type, "application/json") != 0 || u->body == NULL)
        status = 400;
    pthread_mutex_lock(&col->lock);
    FILE *f = fopen(col->path, "a");
    if (f != NULL) {
        /* A raw newline in a body would split it: the parser then fails. */
        fprintf(f, "%s\n", status == 200 ? u->body : "{\"bad request\"");
        fclose(f);
    }
    col->requests++;
    const char *h = col->header != NULL
        ? MHD_lookup_connection_value(c, MHD_HEADER_KIND, col->header) : NULL;
    if (h != NULL) {
        snprintf(col->got, sizeof(col->got), "%s", h);
        col->with_header++;
    }
    pthread_mutex_unlock(&col->lock);
    struct MHD_Response *r = MHD_create_response_from_buffer(2, (void *)"{}",
                                                             MHD_RESPMEM_PERSISTENT);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static void on_done(void *arg, struct MHD_Connection *c, void **cls,
                    enum MHD_RequestTerminationCode why)
{
    (void)arg, (void)c, (void)why;
    struct upload *u = *cls;
    if (u != NULL)
        free(u->body);
    free(u);
    *cls = NULL;
}

static void collector_start(struct collector *col, const char *dir)
{
    memset(col, 0, sizeof(*col));
    pthread_mutex_init(&col->lock, NULL);
    pthread_cond_init(&col->released, NULL);
    snprintf(col->path, sizeof(col->path), "%s/spans.jsonl", dir);
    col->port = h_free_port();
    col->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                              (uint16_t)col->port, NULL, NULL, on_request, col,
                              MHD_OPTION_NOTIFY_COMPLETED, on_done, col, MHD_OPTION_END);
    ck_assert_msg(col->d != NULL, "the collector cannot listen on port %d", col->port);
}

static void collector_release(struct collector *col)
{
    pthread_mutex_lock(&col->lock);
    col->hang = false;
    pthread_cond_broadcast(&col->released);
    pthread_mutex_unlock(&col->lock);
}

static void collector_stop(struct collector *col)
{
    collector_release(col);
    MHD_stop_daemon(col->d);
    pthread_cond_destroy(&col->released);
    pthread_mutex_destroy(&col->lock);
}

/* One exported span, as the parser printed it. */
struct span {
    char trace_id[40], span_id[24], parent_id[24], name[300], outcome[32], service[64];
    char job_id[300], key_hex[1100], tracestate[600];
    int  kind, attempt, status, flags;
};

#define MAX_SPANS 64

static const char *const parser =
    "import json, sys\n"
    "for line in open(sys.argv[1]):\n"
    "    d = json.loads(line)\n"
    "    for rs in d['resourceSpans']:\n"
    "        svc = [a['value']['stringValue'] for a in rs['resource']['attributes']\n"
    "               if a['key'] == 'service.name'][0]\n"
    "        for ss in rs['scopeSpans']:\n"
    "            for s in ss['spans']:\n"
    "                a = {x['key']: list(x['value'].values())[0] for x in s['attributes']}\n"
    "                assert a['messaging.system'] == 'rabbitmq'\n"
    "                print('\\t'.join([s['traceId'], s['spanId'], s.get('parentSpanId', '-'),\n"
    "                      str(s['kind']), s['name'], a['sekali.outcome'],\n"
    "                      str(int(a['sekali.attempt'])),\n"
    "                      str(s.get('status', {}).get('code', 0)), svc,\n"
    "                      a['messaging.message.id'],\n"
    "                      a['sekali.idempotency_key'].encode().hex(),\n"
    "                      s.get('traceState', '-'), str(s.get('flags', -1))]))\n";

/* Parses every body the collector got; returns how many spans, in out. */
static size_t spans_read(struct collector *col, struct span *out, size_t max)
{
    char script[600], cmd[1400];
    snprintf(script, sizeof(script), "%s.py", col->path);
    FILE *f = fopen(script, "w");
    ck_assert(f != NULL);
    fputs(parser, f);
    fclose(f);
    pthread_mutex_lock(&col->lock);
    FILE *touch = fopen(col->path, "a");
    if (touch != NULL)
        fclose(touch);
    snprintf(cmd, sizeof(cmd), "python3 '%s' '%s'", script, col->path);
    FILE *p = popen(cmd, "r");
    ck_assert(p != NULL);
    size_t n = 0;
    char line[2048];
    while (fgets(line, sizeof(line), p) != NULL) {
        ck_assert_msg(n < max, "more than %zu spans", max);
        struct span *s = &out[n++];
        memset(s, 0, sizeof(*s));
        char *save = NULL, *fields[13];
        line[strcspn(line, "\n")] = '\0';
        for (int i = 0; i < 13; i++) {
            fields[i] = strtok_r(i == 0 ? line : NULL, "\t", &save);
            ck_assert_msg(fields[i] != NULL, "a span line with %d fields", i);
        }
        snprintf(s->trace_id, sizeof(s->trace_id), "%s", fields[0]);
        snprintf(s->span_id, sizeof(s->span_id), "%s", fields[1]);
        snprintf(s->parent_id, sizeof(s->parent_id), "%s", fields[2]);
        s->kind = atoi(fields[3]);
        snprintf(s->name, sizeof(s->name), "%s", fields[4]);
        snprintf(s->outcome, sizeof(s->outcome), "%s", fields[5]);
        s->attempt = atoi(fields[6]);
        s->status = atoi(fields[7]);
        snprintf(s->service, sizeof(s->service), "%s", fields[8]);
        snprintf(s->job_id, sizeof(s->job_id), "%s", fields[9]);
        snprintf(s->key_hex, sizeof(s->key_hex), "%s", fields[10]);
        snprintf(s->tracestate, sizeof(s->tracestate), "%s", fields[11]);
        s->flags = atoi(fields[12]);
    }
    int rc = pclose(p);
    pthread_mutex_unlock(&col->lock);
    ck_assert_msg(rc == 0, "python3 could not parse what the collector got (%s): exit %d",
                  col->path, rc);
    return n;
}

/* The spans of job_id, in attempt order (at most 4). */
static size_t spans_of(const struct span *all, size_t n, const char *job_id,
                       const struct span **out)
{
    size_t m = 0;
    for (int attempt = 1; attempt <= 4; attempt++)
        for (size_t i = 0; i < n; i++)
            if (strcmp(all[i].job_id, job_id) == 0 && all[i].attempt == attempt && m < 4)
                out[m++] = &all[i];
    return m;
}

static void publish_state(struct h_run *r, const char *id, const char *key,
                          const char *traceparent, const char *tracestate, const char *body)
{
    struct sk_header h[3];
    size_t n = 0;
    h[n++] = (struct sk_header){ .key = "x-idempotency-key", .text = key };
    if (traceparent != NULL)
        h[n++] = (struct sk_header){ .key = "traceparent", .text = traceparent };
    if (tracestate != NULL)
        h[n++] = (struct sk_header){ .key = "tracestate", .text = tracestate };
    h_publish_raw(r->b, r->queue, id, "charge", h, n, body, strlen(body));
}

static void publish(struct h_run *r, const char *id, const char *key, const char *traceparent,
                    const char *body)
{
    publish_state(r, id, key, traceparent, NULL, body);
}

static void hex(const char *s, size_t len, char *out)
{
    for (size_t i = 0; i < len; i++)
        sprintf(out + 2 * i, "%02x", (unsigned char)s[i]);
    out[2 * len] = '\0';
}

/* The run's span_id in the exported span is the one of the job's
 * outcome line in the log. */
static void span_is_logged(const struct h_run *r, const struct span *s)
{
    ck_assert_msg(h_count_event_where(r->log, "outcome", "job_id", s->job_id, "span_id",
                                      s->span_id, "trace_id", s->trace_id, NULL) == 1,
                  "no outcome line of job %s with span %s in trace %s", s->job_id, s->span_id,
                  s->trace_id);
}

START_TEST(test_each_run_is_one_span_in_the_producers_trace)
{
    struct h_run r;
    struct collector col;
    h_run_open(&r, "otlp");
    collector_start(&col, r.dir);
    char top[512];
    snprintf(top, sizeof(top),
             "tracing:\n  otlp_endpoint: http://127.0.0.1:%d/v1/traces\n"
             "  service_name: billing\n  otlp_timeout: 3s\n", col.port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top,
        .queue_yaml = "    retry:\n      max_attempts: 3\n      initial: 10ms\n      max: 100ms\n" });

    /* A key with quotes, a backslash, control characters and 200 two-byte
     * characters (406 bytes): escaped, and cut at a whole character. */
    char key[512] = "k\"\\\t\x01\n";
    for (int i = 0; i < 200; i++)
        strcat(key, "\xc3\xa9");
    publish(&r, "job-otlp-retry", "otlp-retry", TP, "retry");
    publish(&r, "job-otlp-ok", "otlp-ok", TP2, "ok");
    publish(&r, "job-otlp-fresh", "otlp-fresh", NULL, "ok");
    publish(&r, "job-otlp-hostile", key, TP2, "ok");
    H_WAIT(h_completed(&r) == 4, 30000, "the four jobs should complete");
    /* At once: the last spans leave with the worker's stop, not later. */
    h_run_stop(&r);

    struct span all[MAX_SPANS];
    size_t n = spans_read(&col, all, MAX_SPANS);
    ck_assert_msg(n == 5, "5 spans expected (the retried job's two runs), got %zu", n);
    const struct span *s[4];
    char name[300];
    snprintf(name, sizeof(name), "%s process", r.queue);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(all[i].kind, 5);  /* CONSUMER */
        ck_assert_str_eq(all[i].name, name);
        ck_assert_str_eq(all[i].service, "billing");
        span_is_logged(&r, &all[i]);
    }
    /* The retried job: two runs of the producer's trace, both children of
     * the producer's span, each with a span of its own; the failed run an
     * error. */
    ck_assert_uint_eq(spans_of(all, n, "job-otlp-retry", s), 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_str_eq(s[i]->trace_id, TRACE);
        ck_assert_str_eq(s[i]->parent_id, PARENT);
    }
    ck_assert_str_ne(s[0]->span_id, s[1]->span_id);
    ck_assert_str_eq(s[0]->outcome, "retry");
    ck_assert_int_eq(s[0]->status, 2);  /* ERROR */
    ck_assert_str_eq(s[1]->outcome, "completed");
    ck_assert_int_eq(s[1]->status, 0);
    ck_assert_uint_eq(spans_of(all, n, "job-otlp-ok", s), 1);
    ck_assert_str_eq(s[0]->trace_id, TRACE2);
    ck_assert_str_eq(s[0]->parent_id, PARENT2);
    ck_assert_str_eq(s[0]->outcome, "completed");
    /* Without a traceparent: a trace sekali began, no parent. */
    ck_assert_uint_eq(spans_of(all, n, "job-otlp-fresh", s), 1);
    ck_assert_str_ne(s[0]->trace_id, TRACE);
    ck_assert_str_ne(s[0]->trace_id, TRACE2);
    ck_assert_str_eq(s[0]->parent_id, "-");
    char want[1100];
    ck_assert_uint_eq(spans_of(all, n, "job-otlp-hostile", s), 1);
    hex(key, 6 + 124 * 2, want);
    ck_assert_str_eq(s[0]->key_hex, want);

    collector_stop(&col);
    h_run_close(&r);
}
END_TEST

/* No collector listens: every job completes as fast as ever, the export
 * thread tries each batch with backoff (logged once), then drops it and
 * counts it; a stop does not wait for the collector. */
START_TEST(test_with_the_collector_down_jobs_run_and_the_spans_are_counted_dropped)
{
    struct h_run r;
    h_run_open(&r, "otlpdown");
    char top[512];
    int mport = h_metrics_top(top, sizeof(top));
    size_t used = strlen(top);
    snprintf(top + used, sizeof(top) - used,
             "tracing:\n  otlp_endpoint: http://127.0.0.1:%d/v1/traces\n", h_free_port());
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top });
    enum { JOBS = 40 };
    int64_t t0 = h_now_ms();
    for (int i = 0; i < JOBS; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "job-down-%d", i);
        snprintf(key, sizeof(key), "down-%d", i);
        publish(&r, id, key, TP, "ok");
    }
    H_WAIT(h_completed(&r) == JOBS, 30000, "every job should complete with the collector down");
    int64_t took = h_now_ms() - t0;
    /* Less than one export attempt's backoff: no job waited for one. */
    ck_assert_msg(took < h_ms(5000), "%d jobs took %lld ms", JOBS, (long long)took);
    H_WAIT(h_metric(mport, "sekali_spans_dropped_total{queue=\"%s\",job_type=\"charge\"}",
                    r.queue) == JOBS, 60000, "the %d spans should be counted dropped", JOBS);
    ck_assert_double_eq(h_metric(mport, "sekali_spans_exported_total{queue=\"%s\","
                                        "job_type=\"charge\"}", r.queue), 0);
    ck_assert_int_ge(h_count_lines(r.log, "spans not exported"), 2);
    ck_assert_int_ge(h_count_lines(r.log, "trying again"), 1);
    /* One more span, stuck at the stop: the flush gives up within
     * otlp_timeout (2s), well inside the stop's own limit. */
    publish(&r, "job-down-last", "down-last", TP, "ok");
    H_WAIT(h_completed(&r) == JOBS + 1, 30000, "the last job should complete");
    int64_t t1 = h_now_ms();
    h_run_stop(&r);
    ck_assert_msg(h_now_ms() - t1 < h_ms(10000), "the stop took %lld ms",
                  (long long)(h_now_ms() - t1));
    h_run_close(&r);
}
END_TEST

static int by_span_id(const void *a, const void *b)
{
    return strcmp(((const struct span *)a)->span_id, ((const struct span *)b)->span_id);
}

static double spans_metric(int port, const char *name, const struct h_run *r)
{
    return h_metric(port, "%s{queue=\"%s\",job_type=\"charge\"}", name, r->queue);
}

/* A collector that takes requests and does not answer: the export thread
 * waits in its POST, the worker's queue of 2048 spans fills, and the spans
 * past it are dropped and counted while every job completes; once the
 * collector answers, the queued spans go out. */
START_TEST(test_a_full_span_queue_drops_and_counts_and_never_holds_a_job)
{
    struct h_run r;
    struct collector col;
    h_run_open(&r, "otlpfull");
    collector_start(&col, r.dir);
    col.hang = true;
    char top[512];
    int mport = h_metrics_top(top, sizeof(top));
    size_t used = strlen(top);
    snprintf(top + used, sizeof(top) - used,
             "tracing:\n  otlp_endpoint: http://127.0.0.1:%d/v1/traces\n  otlp_timeout: 10s\n",
             col.port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top });
    enum { JOBS = 2400, QUEUE = 2048, BATCH = 256 };
    for (int i = 0; i < JOBS; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "job-full-%d", i);
        snprintf(key, sizeof(key), "full-%d", i);
        publish(&r, id, key, NULL, "ok");
    }
    H_WAIT(h_completed(&r) == JOBS, 60000, "every job should complete while the collector hangs");
    /* The first batch hangs in its POST, the queue is full, the rest dropped. */
    H_WAIT(spans_metric(mport, "sekali_spans_dropped_total", &r) >= JOBS - QUEUE - BATCH, 10000,
           "at least %d spans should be counted dropped", JOBS - QUEUE - BATCH);
    ck_assert_double_eq(spans_metric(mport, "sekali_spans_exported_total", &r), 0);
    double dropped = spans_metric(mport, "sekali_spans_dropped_total", &r);
    ck_assert_double_le(dropped, JOBS - QUEUE);
    collector_release(&col);
    H_WAIT(spans_metric(mport, "sekali_spans_exported_total", &r) == JOBS - dropped, 30000,
           "the %.0f queued spans should be exported once the collector answers",
           JOBS - dropped);
    ck_assert_double_eq(spans_metric(mport, "sekali_spans_dropped_total", &r), dropped);
    h_run_stop(&r);
    /* A POST that outlived otlp_timeout while the collector hung was sent
     * again, and the collector kept both copies: spans counted once each. */
    struct span *all = calloc(2 * JOBS, sizeof(*all));
    ck_assert_ptr_nonnull(all);
    size_t n = spans_read(&col, all, 2 * JOBS);
    qsort(all, n, sizeof(*all), by_span_id);
    size_t unique = 0;
    for (size_t i = 0; i < n; i++)
        unique += i == 0 || strcmp(all[i].span_id, all[i - 1].span_id) != 0;
    ck_assert_uint_eq(unique, (size_t)(JOBS - dropped));
    free(all);
    collector_stop(&col);
    h_run_close(&r);
}
END_TEST

#define API_KEY "hcaik_S3cretApiKey0123456789"
#define ENV_KEY "S3cretFromTheEnvironment42"
#define STATE   "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"

/* Writes the API key to dir/otlp.key (with the newline an editor adds)
 * and into top the tracing: section sending it, and a plain header. */
static void headers_top(char *top, size_t size, const char *dir, int port)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/otlp.key", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(API_KEY "\n", f);
    fclose(f);
    size_t used = strlen(top);
    snprintf(top + used, size - used,
             "tracing:\n  otlp_endpoint: http://127.0.0.1:%d/v1/traces\n"
             "  otlp_headers:\n    x-honeycomb-team: {value_file: %s}\n"
             "    x-honeycomb-dataset: sekali-tests\n"
             "    x-env-key: {value_env: SK_TEST_OTLP_ENV_KEY}\n", port, path);
}

/* The key, read from its file, on every request; a message's tracestate
 * and flags on its span (sampled or not). */
START_TEST(test_the_api_key_from_a_file_is_sent_and_the_tracestate_exported)
{
    struct h_run r;
    struct collector col;
    h_run_open(&r, "otlphdr");
    collector_start(&col, r.dir);
    col.header = "x-honeycomb-team";
    char top[1536] = "";
    headers_top(top, sizeof(top), r.dir, col.port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top,
        .env = (const char *const[]){ "SK_TEST_OTLP_ENV_KEY=" ENV_KEY, NULL } });
    publish_state(&r, "job-state", "otlp-state", TP, STATE, "ok");
    publish_state(&r, "job-unsampled", "otlp-unsampled", "00-" TRACE2 "-" PARENT2 "-00", NULL,
                  "ok");
    H_WAIT(h_completed(&r) == 2, 30000, "the two jobs should complete");
    h_run_stop(&r);

    struct span all[MAX_SPANS];
    size_t n = spans_read(&col, all, MAX_SPANS);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_ge(col.requests, 1);
    ck_assert_int_eq(col.with_header, col.requests);
    ck_assert_str_eq(col.got, API_KEY);
    const struct span *s[4];
    ck_assert_uint_eq(spans_of(all, n, "job-state", s), 1);
    ck_assert_str_eq(s[0]->trace_id, TRACE);
    ck_assert_str_eq(s[0]->tracestate, STATE);
    ck_assert_int_eq(s[0]->flags, 0x301);  /* sampled; the parent is remote */
    ck_assert_uint_eq(spans_of(all, n, "job-unsampled", s), 1);
    ck_assert_str_eq(s[0]->tracestate, "-");
    ck_assert_int_eq(s[0]->flags, 0x300);
    collector_stop(&col);
    h_run_close(&r);
}
END_TEST

/* Nothing of the daemon's shows a key: its log while the collector
 * answers 401 (logged), /metrics, and `sekalid -t`. */
START_TEST(test_a_refused_api_key_shows_in_none_of_the_daemons_output)
{
    struct h_run r;
    struct collector col;
    h_run_open(&r, "otlp401");
    collector_start(&col, r.dir);
    col.answer = 401;
    col.header = "x-honeycomb-team";
    char top[1536];
    int mport = h_metrics_top(top, sizeof(top));
    headers_top(top, sizeof(top), r.dir, col.port);
    const char *const env[] = { "SK_TEST_OTLP_ENV_KEY=" ENV_KEY, NULL };
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top, .env = env });
    for (int i = 0; i < 3; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "job-401-%d", i);
        snprintf(key, sizeof(key), "otlp-401-%d", i);
        publish(&r, id, key, TP, "ok");
    }
    H_WAIT(h_completed(&r) == 3, 30000, "the jobs should complete with the key refused");
    H_WAIT(h_metric(mport, "sekali_spans_dropped_total{queue=\"%s\",job_type=\"charge\"}",
                    r.queue) == 3, 30000, "the refused spans should be counted dropped");
    ck_assert_int_ge(h_count_lines(r.log, "the collector answered HTTP 401"), 1);
    char *scrape = h_scrape(mport);
    ck_assert_ptr_null(strstr(scrape, "S3cret"));
    free(scrape);
    h_run_stop(&r);

    char out[600];
    snprintf(out, sizeof(out), "%s/sekalid-t.out", r.dir);
    char *text = NULL;
    int rc = h_spawn(&(struct h_spawn){ .binary = "sekalid",
                                        .args = (const char *const[]){ "-t", "-c", r.config,
                                                                       NULL },
                                        .env = env, .out = out, .err = out },
                     30000, &text, NULL);
    ck_assert_msg(rc == 0, "sekalid -t: exit %d: %s", rc, text);
    ck_assert_ptr_null(strstr(text, "S3cret"));
    free(text);
    char *log = h_read_file(r.log);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "S3cret") == NULL, "the key is in %s", r.log);
    free(log);
    ck_assert_int_ge(col.with_header, 1);
    ck_assert_str_eq(col.got, API_KEY);
    collector_stop(&col);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_each_run_is_one_span_in_the_producers_trace,
        test_with_the_collector_down_jobs_run_and_the_spans_are_counted_dropped,
        test_a_full_span_queue_drops_and_counts_and_never_holds_a_job,
        test_the_api_key_from_a_file_is_sent_and_the_tracestate_exported,
        test_a_refused_api_key_shows_in_none_of_the_daemons_output,
        NULL,
    };
    return h_run_suite(h_suite("otlp", 120, tests));
}
