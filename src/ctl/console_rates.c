/* console_rates.c - the overview's charts: jobs completed and duplicates
 * absorbed per second, the duration p50/p99, and how many jobs completed
 * and failed (retried or dead-lettered), per queue over the last five
 * minutes. sekalid keeps only running totals (its /metrics), so a
 * thread of the console scrapes them every few seconds and keeps a ring of
 * samples; rates are differences of neighbours, quantiles come from the
 * difference of the histogram's buckets across the window. Nothing is
 * kept when metrics.listen is unset: the answer says so. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "console.h"
#include "ctl_http.h"
#include "ctl_out.h"

#define SAMPLES      60     /* five minutes of... */
#define INTERVAL_S   5      /* ...one scrape every five seconds */
#define BUCKETS      40
#define SCRAPE_MS    2000

struct sample {
    double t;                        /* 0: none yet */
    bool   ok;
    double completions, duplicates;
    double failures;                 /* retries and dead letters */
    int    n_le;
    double le[BUCKETS], cumulative[BUCKETS];
};

struct queue_ring {
    struct sample s[SAMPLES];
    double        lock_ttl, job_timeout;  /* seconds; NAN: unknown */
};

struct sk_console_rates {
    const struct sk_conf *conf;
    pthread_t             thread;
    bool                  running;
    pthread_mutex_t       lock;
    pthread_cond_t        wake;
    bool                  stop;
    size_t                next;         /* the slot the next sample goes into */
    char                  why[300];     /* why the last scrape has nothing; "" when ok */
    struct queue_ring    *q;
};

/* The label `name` of a sample line's {...} (escapes undone), or false. */
static bool label(const char *open, const char *close, const char *name, char *out,
                  size_t size)
{
    size_t n = strlen(name);
    for (const char *p = open + 1; p < close;) {
        if (strncmp(p, name, n) == 0 && p[n] == '=' && p[n + 1] == '"') {
            size_t w = 0;
            for (p += n + 2; p < close && *p != '"'; p++) {
                if (*p == '\\' && p + 1 < close)
                    p++;
                if (w + 1 < size)
                    out[w++] = *p == 'n' && p[-1] == '\\' ? '\n' : *p;
            }
            out[w] = '\0';
            return true;
        }
        /* Skip to the next label: past this one's quoted value. */
        const char *q = strchr(p, '"');
        if (q == NULL || q >= close)
            return false;
        for (q++; q < close && *q != '"'; q++)
            if (*q == '\\')
                q++;
        p = q + 2;  /* past '"' and ',' */
    }
    return false;
}

/* Adds one scrape's figures for queue `name` into *s. */
static void read_queue(const char *text, const char *name, struct sample *s, double *ttl,
                       double *timeout)
{
    static const char bucket[] = "sekali_job_duration_seconds_bucket{";
    char queue[1100], le[64];
    *ttl = *timeout = NAN;
    for (const char *line = text; line != NULL && *line != '\0';) {
        const char *next = strchr(line, '\n');
        const char *open = strchr(line, '{');
        const char *close = open != NULL ? strchr(open, '}') : NULL;
        if (line[0] == '#' || open == NULL || close == NULL || (next != NULL && close > next) ||
            !label(open, close, "queue", queue, sizeof(queue)) || strcmp(queue, name) != 0)
            goto skip;
        double v = strtod(close + 1, NULL);
        size_t len = (size_t)(open - line);
        if (len == 24 && strncmp(line, "sekali_completions_total", len) == 0)
            s->completions += v;
        else if (len == 23 && strncmp(line, "sekali_duplicates_total", len) == 0)
            s->duplicates += v;
        else if ((len == 20 && strncmp(line, "sekali_retries_total", len) == 0) ||
                 (len == 25 && strncmp(line, "sekali_dead_letters_total", len) == 0))
            s->failures += v;
        else if (len == 23 && strncmp(line, "sekali_lock_ttl_seconds", len) == 0)
            *ttl = v;
        else if (len == 26 && strncmp(line, "sekali_job_timeout_seconds", len) == 0)
            *timeout = v;
        else if (strncmp(line, bucket, sizeof(bucket) - 1) == 0 &&
                 label(open, close, "le", le, sizeof(le))) {
            double bound = strcmp(le, "+Inf") == 0 ? INFINITY : strtod(le, NULL);
            int i = 0;
            while (i < s->n_le && s->le[i] != bound)
                i++;
            if (i == s->n_le && s->n_le < BUCKETS)
                s->le[s->n_le++] = bound;
            if (i < s->n_le)
                s->cumulative[i] += v;  /* summed over the job types' rows */
        }
    skip:
        line = next != NULL ? next + 1 : NULL;
    }
    s->ok = true;
}

static void scrape(struct sk_console_rates *r)
{
    const struct sk_metrics_conf *m = &r->conf->metrics;
    char why[300] = "";
    char *text = NULL;
    if (m->listen_host == NULL)
        snprintf(why, sizeof(why), "metrics disabled (metrics.listen)");
    else
        text = sk_ctl_http_get(m->listen_host, m->listen_port, "/metrics", m->token,
                               SCRAPE_MS, why, sizeof(why));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&r->lock);
    snprintf(r->why, sizeof(r->why), "%s", text != NULL ? "" : why);
    for (size_t i = 0; i < r->conf->n_queues; i++) {
        struct sample *s = &r->q[i].s[r->next];
        *s = (struct sample){ .t = (double)ts.tv_sec + ts.tv_nsec / 1e9 };
        if (text != NULL)
            read_queue(text, r->conf->queues[i].name, s, &r->q[i].lock_ttl,
                       &r->q[i].job_timeout);
    }
    r->next = (r->next + 1) % SAMPLES;
    pthread_mutex_unlock(&r->lock);
    free(text);
}

static void *sampler(void *arg)
{
    struct sk_console_rates *r = arg;
    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        pthread_mutex_unlock(&r->lock);
        scrape(r);
        pthread_mutex_lock(&r->lock);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += INTERVAL_S;
        while (!r->stop && pthread_cond_timedwait(&r->wake, &r->lock, &until) == 0)
            ;
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

struct sk_console_rates *sk_console_rates_start(const struct sk_conf *conf)
{
    struct sk_console_rates *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->conf = conf;
    r->q = calloc(conf->n_queues > 0 ? conf->n_queues : 1, sizeof(*r->q));
    if (r->q == NULL) {
        free(r);
        return NULL;
    }
    for (size_t i = 0; i < conf->n_queues; i++)
        r->q[i].lock_ttl = r->q[i].job_timeout = NAN;
    snprintf(r->why, sizeof(r->why), "no scrape yet");
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->wake, NULL);
    r->running = pthread_create(&r->thread, NULL, sampler, r) == 0;
    return r;
}

void sk_console_rates_stop(struct sk_console_rates *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->lock);
    r->stop = true;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->lock);
    if (r->running)
        pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->lock);
    free(r->q);
    free(r);
}

static void put_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* The bound of the bucket holding quantile q of the window's jobs. */
static double quantile(const struct sample *old, const struct sample *new, double q)
{
    if (old->n_le != new->n_le || new->n_le == 0)
        return NAN;
    double total = new->cumulative[new->n_le - 1] - old->cumulative[old->n_le - 1];
    if (total <= 0)
        return NAN;
    for (int i = 0; i < new->n_le; i++)
        if (new->cumulative[i] - old->cumulative[i] >= q * total)
            return new->le[i];
    return NAN;
}

static void queue_json(FILE *f, struct sk_console_rates *r, size_t qi)
{
    const struct queue_ring *ring = &r->q[qi];
    fputs("{\"name\":", f);
    sk_ctl_put_jstr(f, r->conf->queues[qi].name);
    fputs(",\"points\":[", f);
    const struct sample *first = NULL, *last = NULL, *prev = NULL;
    bool comma = false;
    for (size_t k = 0; k < SAMPLES; k++) {
        const struct sample *s = &ring->s[(r->next + k) % SAMPLES];
        if (s->t == 0 || !s->ok) {
            prev = NULL;
            continue;
        }
        if (first == NULL)
            first = s;
        last = s;
        /* A drop is a restart of sekalid (its totals start again): no rate. */
        if (prev != NULL && s->t > prev->t && s->completions >= prev->completions &&
            s->duplicates >= prev->duplicates) {
            double dt = s->t - prev->t;
            fprintf(f, "%s{\"t\":%.3f,\"jobs_per_second\":", comma ? "," : "", s->t);
            put_num(f, (s->completions - prev->completions) / dt);
            fputs(",\"duplicates_per_second\":", f);
            put_num(f, (s->duplicates - prev->duplicates) / dt);
            fputc('}', f);
            comma = true;
        }
        prev = s;
    }
    fputs("],\"p50_seconds\":", f);
    put_num(f, first != NULL && last != first ? quantile(first, last, 0.5) : NAN);
    fputs(",\"p99_seconds\":", f);
    put_num(f, first != NULL && last != first ? quantile(first, last, 0.99) : NAN);
    fputs(",\"lock_ttl_seconds\":", f);
    put_num(f, ring->lock_ttl);
    fputs(",\"job_timeout_seconds\":", f);
    put_num(f, ring->job_timeout);
    /* The window's totals, so that a queue where every job fails is not
     * called healthy because its consumers are up. */
    bool whole = first != NULL && last != first && last->completions >= first->completions &&
                 last->failures >= first->failures;
    fputs(",\"completed_in_window\":", f);
    put_num(f, whole ? last->completions - first->completions : NAN);
    fputs(",\"failed_in_window\":", f);
    put_num(f, whole ? last->failures - first->failures : NAN);
    fputc('}', f);
}

void sk_console_rates_json(struct sk_console_rates *r, struct sk_console_call *c)
{
    if (r == NULL)
        return sk_console_fail(c, 503, "no sampler (out of memory at start)");
    char *doc = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&doc, &len);
    if (f == NULL)
        return sk_console_fail(c, 500, "out of memory");
    pthread_mutex_lock(&r->lock);
    fprintf(f, "{\"interval_seconds\":%d,\"window_seconds\":%d,\"metrics\":", INTERVAL_S,
            INTERVAL_S * SAMPLES);
    if (r->why[0] == '\0')
        fputs("\"answered\"", f);
    else
        sk_ctl_put_jstr(f, r->why);
    fputs(",\"queues\":[", f);
    for (size_t i = 0; i < r->conf->n_queues; i++) {
        if (i > 0)
            fputc(',', f);
        queue_json(f, r, i);
    }
    fputs("]}\n", f);
    pthread_mutex_unlock(&r->lock);
    fclose(f);
    sk_console_json(c, 200, doc, len);
}
