/* span_export.c - a worker's spans to an OpenTelemetry collector: see
 * span_export.h.
 *
 * The job path and the export thread share only a ring of fixed-size
 * records under one mutex, held to copy a record in or a batch out, never
 * across a network call: a collector that is slow, down or refusing costs
 * a job a memcpy, and at worst its span (counted). The thread sends a
 * batch when BATCH_MAX spans wait or the oldest has waited FLUSH_MS, and
 * tries a batch TRIES times with backoff (the OTLP/HTTP specification's
 * retryable answers: no connection, 429, 502, 503, 504), meanwhile the
 * ring fills and drops; any other answer drops the batch at once. */
#include "span_export.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "backoff.h"
#include "job_steps.h"
#include "log.h"
#include "metrics.h"
#include "otlp_json.h"
#include "text.h"

#define QUEUE_CAP 2048   /* spans waiting; about 2.5 MiB */
#define BATCH_MAX 256    /* spans per request */
#define FLUSH_MS  500    /* longest the first span of a batch waits */
#define TRIES     5      /* a batch's attempts before it is dropped */

struct exporter {
    pthread_mutex_t mutex;
    pthread_cond_t  cond;          /* on CLOCK_MONOTONIC */
    struct sk_span_rec *ring;      /* QUEUE_CAP */
    size_t          head, n;
    bool            stopping;
    uint64_t        stop_by_ns;    /* with stopping: the flush's deadline */
    pthread_t       thread;
    /* The thread's own, untouched by the job path. */
    const struct sk_tracing_conf *conf;
    const char     *queue;
    struct sk_span_rec *batch;     /* BATCH_MAX */
    CURL           *curl;
    struct curl_slist *headers;
    bool            failing;       /* logged once, until a batch goes through */
};

/* One per worker process (span_export.h), so the job's end needs no
 * pointer handed down the pipeline. Set and cleared by the main thread. */
static struct exporter *ex;

static int headers(struct exporter *e, const struct sk_tracing_conf *conf);
static void *run(void *arg);
static size_t take(struct exporter *e);
static void deliver(struct exporter *e, size_t m);
static int post(struct exporter *e, const char *body, size_t len, uint64_t timeout_ms,
                char *why, size_t size);
static void count(struct sk_span_rec *recs, size_t m, enum sk_metric c);
static uint64_t unix_ns(void);
static void deadline_in(struct timespec *ts, uint64_t ms);
static void release(struct exporter *e);
static size_t discard(char *data, size_t size, size_t n, void *arg);

int sk_span_export_start(const struct sk_tracing_conf *conf, const char *queue,
                         struct sk_err *err)
{
    if (conf->otlp_endpoint == NULL || ex != NULL)
        return SK_OK;
    struct exporter *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(span exporter)");
    e->conf = conf;
    e->queue = queue;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&e->mutex, NULL);
    pthread_cond_init(&e->cond, &ca);
    pthread_condattr_destroy(&ca);
    e->ring = calloc(QUEUE_CAP, sizeof(*e->ring));
    e->batch = calloc(BATCH_MAX, sizeof(*e->batch));
    if (e->ring == NULL || e->batch == NULL) {
        sk_err_errno(err, SK_ERR, "calloc(span queue)");
        goto fail;
    }
    /* Thread-safe since libcurl 7.84; the HTTP handler may call it too. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || (e->curl = curl_easy_init()) == NULL) {
        sk_err_set(err, SK_ERR, "curl_easy_init(span exporter) failed");
        goto fail;
    }
    if (headers(e, conf) != SK_OK) {
        sk_err_set(err, SK_ERR, "curl_slist_append(span exporter) failed");
        goto fail;
    }
    CURL *c = e->curl;
    /* No signals in a worker's thread; https verifies the peer and host
     * (libcurl's defaults, left alone); no redirects to elsewhere. */
    if (curl_easy_setopt(c, CURLOPT_URL, conf->otlp_endpoint) != CURLE_OK ||
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK ||
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK ||
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, e->headers) != CURLE_OK ||
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard) != CURLE_OK ||
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)conf->otlp_timeout_ms) != CURLE_OK) {
        sk_err_set(err, SK_ERR, "curl_easy_setopt(span exporter) failed");
        goto fail;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&e->thread, NULL, run, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        sk_err_errno(err, SK_ERR, "pthread_create(span exporter)");
        goto fail;
    }
    ex = e;
    return SK_OK;
fail:
    release(e);
    return SK_ERR;
}

void sk_span_export_job(const struct sk_job *j, const char *outcome, bool error)
{
    struct exporter *e = ex;
    if (e == NULL || j->env.trace.trace_id[0] == '\0')
        return;
    struct sk_span_rec r = { .error = error, .attempt = j->env.delivery_attempt,
                             .metrics = j->metrics };
    memcpy(r.trace_id, j->env.trace.trace_id, sizeof(r.trace_id));
    memcpy(r.span_id, j->env.trace.span_id, sizeof(r.span_id));
    memcpy(r.parent_id, j->env.trace.parent_id, sizeof(r.parent_id));
    memcpy(r.tracestate, j->env.trace.tracestate, sizeof(r.tracestate));
    r.trace_flags = j->env.trace.flags;
    /* Whole characters only, so that a cut key is still valid UTF-8. */
    sk_text_copy(r.job_id, sizeof(r.job_id), j->env.job_id);
    sk_text_copy(r.idempotency_key, sizeof(r.idempotency_key), j->env.idempotency_key);
    sk_text_copy(r.job_type, sizeof(r.job_type), j->env.job_type);
    sk_text_copy(r.outcome, sizeof(r.outcome), outcome);
    sk_text_copy(r.reason, sizeof(r.reason), j->exit.reason);
    /* The run's length by the monotonic clock, placed at the wall clock's now. */
    uint64_t took = sk_now_ns() - j->admitted_ns;
    r.end_ns = unix_ns();
    r.start_ns = took < r.end_ns ? r.end_ns - took : r.end_ns;

    pthread_mutex_lock(&e->mutex);
    bool full = e->n == QUEUE_CAP;
    if (!full) {
        e->ring[(e->head + e->n) % QUEUE_CAP] = r;
        e->n++;
        if (e->n == 1 || e->n == BATCH_MAX)
            pthread_cond_signal(&e->cond);
    }
    pthread_mutex_unlock(&e->mutex);
    if (full && j->metrics != NULL)
        sk_metrics_inc(j->metrics, SK_METRIC_SPANS_DROPPED);
}

void sk_span_export_stop(void)
{
    struct exporter *e = ex;
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->mutex);
    e->stopping = true;
    e->stop_by_ns = sk_now_ns() + (uint64_t)e->conf->otlp_timeout_ms * 1000000;
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->mutex);
    pthread_join(e->thread, NULL);
    ex = NULL;
    release(e);
}

/* The request's headers, built once: Content-Type and tracing.otlp_headers
 * (checked at load: token names, values without CR or LF). */
static int headers(struct exporter *e, const struct sk_tracing_conf *conf)
{
    if ((e->headers = curl_slist_append(NULL, "Content-Type: application/json")) == NULL)
        return SK_ERR;
    for (size_t i = 0; i < conf->n_otlp_headers; i++) {
        const struct sk_otlp_header *h = &conf->otlp_headers[i];
        char *line;
        int len = asprintf(&line, "%s: %s", h->name, h->value);
        if (len < 0)
            return SK_ERR;
        struct curl_slist *more = curl_slist_append(e->headers, line);
        explicit_bzero(line, (size_t)len);
        free(line);
        if (more == NULL)
            return SK_ERR;
        e->headers = more;
    }
    return SK_OK;
}

static void *run(void *arg)
{
    struct exporter *e = arg;
    size_t m;
    while ((m = take(e)) > 0)
        deliver(e, m);
    return NULL;
}

/* Waits for a batch (BATCH_MAX spans, or the first one FLUSH_MS old, or a
 * stop) and moves it out of the ring. 0: stopping, and nothing is left. */
static size_t take(struct exporter *e)
{
    pthread_mutex_lock(&e->mutex);
    while (e->n == 0 && !e->stopping)
        pthread_cond_wait(&e->cond, &e->mutex);
    struct timespec ts;
    deadline_in(&ts, FLUSH_MS);
    while (e->n < BATCH_MAX && !e->stopping &&
           pthread_cond_timedwait(&e->cond, &e->mutex, &ts) != ETIMEDOUT)
        ;
    size_t m = e->n < BATCH_MAX ? e->n : BATCH_MAX;
    for (size_t i = 0; i < m; i++)
        e->batch[i] = e->ring[(e->head + i) % QUEUE_CAP];
    e->head = (e->head + m) % QUEUE_CAP;
    e->n -= m;
    pthread_mutex_unlock(&e->mutex);
    return m;
}

/* Sends the batch, trying again with backoff while the collector is
 * unreachable; at a stop, once, within what is left of the flush's time. */
static void deliver(struct exporter *e, size_t m)
{
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    bool ok = f != NULL && sk_otlp_encode(f, e->conf->service_name, e->queue, e->batch, m);
    if (f != NULL && fclose(f) != 0)
        ok = false;
    if (!ok) {
        sk_log_warn("queue %s: %zu spans dropped: no memory to encode them", e->queue, m);
        count(e->batch, m, SK_METRIC_SPANS_DROPPED);
        free(body);
        return;
    }
    struct sk_backoff b = { .base_ms = 500, .cap_ms = 30000 };
    for (int try = 1;; try++) {
        pthread_mutex_lock(&e->mutex);
        bool stopping = e->stopping;
        uint64_t now = sk_now_ns(), by = e->stop_by_ns;
        pthread_mutex_unlock(&e->mutex);
        uint64_t timeout_ms = e->conf->otlp_timeout_ms;
        if (stopping)
            timeout_ms = by > now ? (by - now) / 1000000 : 0;
        char why[160] = "no time left to send them at the worker's stop";
        int rc = timeout_ms == 0 ? SK_ERR : post(e, body, len, timeout_ms, why, sizeof(why));
        if (rc == SK_OK) {
            count(e->batch, m, SK_METRIC_SPANS_EXPORTED);
            if (e->failing)
                sk_log_info("queue %s: the collector takes spans again", e->queue);
            e->failing = false;
            break;
        }
        bool last = rc != SK_AGAIN || try == TRIES || stopping;
        /* Once per outage: a collector that is down is no one's emergency. */
        if (!e->failing || last)
            sk_log_warn("queue %s: spans not exported: %s%s", e->queue, why,
                        last ? "; the batch is dropped" : "; trying again");
        e->failing = true;
        if (last) {
            count(e->batch, m, SK_METRIC_SPANS_DROPPED);
            break;
        }
        struct timespec ts;
        deadline_in(&ts, sk_backoff_next(&b));
        pthread_mutex_lock(&e->mutex);
        while (!e->stopping && pthread_cond_timedwait(&e->cond, &e->mutex, &ts) != ETIMEDOUT)
            ;
        pthread_mutex_unlock(&e->mutex);
    }
    free(body);
}

/* SK_OK (2xx), SK_AGAIN (worth another try) or SK_ERR, with why filled.
 * why never holds the URL: its query may carry a collector's key. */
static int post(struct exporter *e, const char *body, size_t len, uint64_t timeout_ms,
                char *why, size_t size)
{
    CURL *c = e->curl;
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 1));
    CURLcode cc = curl_easy_perform(c);
    if (cc != CURLE_OK) {
        snprintf(why, size, "%s", curl_easy_strerror(cc));
        return SK_AGAIN;
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300)
        return SK_OK;
    snprintf(why, size, "the collector answered HTTP %ld%s", status,
             status == 401 || status == 403 ? " (is tracing.otlp_headers' key right?)" : "");
    return status == 429 || status == 502 || status == 503 || status == 504 ? SK_AGAIN : SK_ERR;
}

static void count(struct sk_span_rec *recs, size_t m, enum sk_metric c)
{
    for (size_t i = 0; i < m; i++)
        if (recs[i].metrics != NULL)
            sk_metrics_inc(recs[i].metrics, c);
}

static uint64_t unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void deadline_in(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }
}

/* Accepts a half-made exporter (no thread running). */
static void release(struct exporter *e)
{
    /* The list's copies of the headers hold the API key. */
    for (struct curl_slist *l = e->headers; l != NULL; l = l->next)
        explicit_bzero(l->data, strlen(l->data));
    curl_slist_free_all(e->headers);
    if (e->curl != NULL)
        curl_easy_cleanup(e->curl);
    pthread_cond_destroy(&e->cond);
    pthread_mutex_destroy(&e->mutex);
    free(e->ring);
    free(e->batch);
    free(e);
}

/* The collector's answer is not read: its status says enough. */
static size_t discard(char *data, size_t size, size_t n, void *arg)
{
    (void)data;
    (void)arg;
    return size * n;
}
