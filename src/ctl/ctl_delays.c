/* ctl_delays.c - the retries waiting in a queue's delay queues, bucket by
 * bucket (ctl_delays.h), for `sekalictl status` and the console's
 * /api/retries.
 *
 * The broker tells a queue's depth only to a declare: one passive
 * queue.declare per bucket of the ladder (about fifty up to five minutes),
 * and a bucket never used costs a 404 and a channel reopen on top. The
 * command line pays that once; the console, whose overview refreshes every
 * few seconds for every operator, keeps what it read for a few seconds
 * (sk_ctl_delays_cache()), so that its reads share one probe of the ladder
 * instead of each making its own. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_common.h"
#include "ctl_delays.h"
#include "ctl_out.h"
#include "ctl_reports.h"
#include "reschedule.h"

#define BUSY_DELAY_MAX_MS 5000  /* the longest busy-lock re-schedule (src/worker/job.c) */

/* What one queue's ladder held when last read; the console's alone. */
struct cached {
    char                 name[256];
    int64_t              at_ms;
    struct sk_ctl_delays d;
};

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned        cache_ms;      /* 0: every read probes */
static struct cached  *cache;
static size_t          n_cache;

static int64_t now_ms(void);
static int probe(struct sk_broker *b, const struct sk_queue_conf *q, struct sk_ctl_delays *out,
                 struct sk_err *err);
static bool cache_get(const char *queue, struct sk_ctl_delays *out);
static void cache_put(const char *queue, const struct sk_ctl_delays *d);

void sk_ctl_delays_cache(unsigned ms)
{
    pthread_mutex_lock(&cache_lock);
    cache_ms = ms;
    free(cache);
    cache = NULL;
    n_cache = 0;
    pthread_mutex_unlock(&cache_lock);
}

int sk_ctl_delays_read(struct sk_broker *b, const struct sk_queue_conf *q,
                       struct sk_ctl_delays *out, struct sk_err *err)
{
    if (cache_get(q->name, out))
        return SK_OK;
    int rc = probe(b, q, out, err);
    if (rc == SK_OK)
        cache_put(q->name, out);
    return rc;
}

int sk_ctl_delayed(struct sk_broker *b, const struct sk_queue_conf *q, uint32_t *messages,
                   uint32_t *queues, struct sk_err *err)
{
    struct sk_ctl_delays d;
    *messages = *queues = 0;
    if (sk_ctl_delays_read(b, q, &d, err) != SK_OK)
        return SK_ERR;
    *messages = d.messages;
    *queues = d.n;
    return SK_OK;
}

static int probe(struct sk_broker *b, const struct sk_queue_conf *q, struct sk_ctl_delays *out,
                 struct sk_err *err)
{
    memset(out, 0, sizeof(*out));
    out->read_ms = now_ms();
    uint32_t top = q->retry.max_ms;
    if (top < BUSY_DELAY_MAX_MS)
        top = BUSY_DELAY_MAX_MS;
    if (top < q->lease_ms)
        top = q->lease_ms;
    top = sk_reschedule_bucket(top);
    for (uint32_t step = sk_reschedule_bucket(0);; step = sk_reschedule_bucket(step + 1)) {
        char name[600];
        snprintf(name, sizeof(name), "%s.delay.%u", q->name, step);
        bool exists;
        uint32_t depth, consumers;
        if (sk_broker_queue_probe(b, name, &exists, &depth, &consumers, err) != SK_OK)
            return SK_ERR;
        /* The ladder is bounded by the config (a delay of 2^32 ms is
         * about 100 steps), and so is the array; a longer one is summed
         * but not listed. */
        if (exists && out->n < SK_CTL_DELAY_BUCKETS) {
            out->bucket[out->n].delay_ms = step;
            out->bucket[out->n].messages = depth;
            out->n++;
        }
        if (exists)
            out->messages += depth;
        if (step >= top)
            return SK_OK;
    }
}

static bool cache_get(const char *queue, struct sk_ctl_delays *out)
{
    bool hit = false;
    pthread_mutex_lock(&cache_lock);
    int64_t now = now_ms();
    for (size_t i = 0; cache_ms > 0 && i < n_cache; i++)
        if (strcmp(cache[i].name, queue) == 0 && now - cache[i].at_ms < (int64_t)cache_ms) {
            *out = cache[i].d;
            hit = true;
        }
    pthread_mutex_unlock(&cache_lock);
    return hit;
}

static void cache_put(const char *queue, const struct sk_ctl_delays *d)
{
    pthread_mutex_lock(&cache_lock);
    size_t i = 0;
    while (cache_ms > 0 && i < n_cache && strcmp(cache[i].name, queue) != 0)
        i++;
    if (cache_ms > 0 && i == n_cache) {
        struct cached *more = realloc(cache, (n_cache + 1) * sizeof(*cache));
        if (more != NULL) {
            cache = more;
            snprintf(cache[n_cache].name, sizeof(cache[n_cache].name), "%s", queue);
            n_cache++;
        }
    }
    if (cache_ms > 0 && i < n_cache) {
        cache[i].at_ms = now_ms();
        cache[i].d = *d;
    }
    pthread_mutex_unlock(&cache_lock);
}

void sk_ctl_delays_json(FILE *out, const struct sk_ctl_delays *d)
{
    fprintf(out, "[");
    for (uint32_t i = 0; i < d->n; i++)
        fprintf(out, "%s{\"delay_ms\":%u,\"messages\":%u}", i > 0 ? "," : "",
                d->bucket[i].delay_ms, d->bucket[i].messages);
    fprintf(out, "]");
}

/* A queue the broker could not be asked about is null, never 0 waiting. */
int sk_ctl_retries_report(const struct sk_conf *conf, FILE *out)
{
    struct sk_broker *b = NULL;
    struct sk_err err = { 0 };
    bool ok = sk_ctl_broker_take(conf, &b, &err) == SK_OK;
    pthread_mutex_lock(&cache_lock);
    unsigned kept = cache_ms;
    pthread_mutex_unlock(&cache_lock);
    fprintf(out, "{\"cached_ms\":%u,\"queues\":[", kept);
    for (size_t i = 0; i < conf->n_queues; i++) {
        const struct sk_queue_conf *q = &conf->queues[i];
        struct sk_ctl_delays d;
        fprintf(out, "%s{\"name\":", i > 0 ? "," : "");
        sk_ctl_put_jstr(out, q->name);
        if (ok && sk_ctl_delays_read(b, q, &d, &err) != SK_OK)
            ok = false;
        if (!ok) {
            fprintf(out, ",\"delayed\":null,\"delay_queues\":null,\"age_ms\":null,"
                    "\"buckets\":null}");
            continue;
        }
        fprintf(out, ",\"delayed\":%u,\"delay_queues\":%u,\"age_ms\":%lld,\"buckets\":",
                d.messages, d.n, (long long)(now_ms() - d.read_ms));
        sk_ctl_delays_json(out, &d);
        fprintf(out, "}");
    }
    fprintf(out, "],\"broker_error\":");
    if (ok)
        fprintf(out, "null");
    else
        sk_ctl_put_jstr(out, err.msg);
    fprintf(out, "}\n");
    sk_ctl_broker_give(b);
    return ok ? SK_CTL_OK : SK_CTL_FAILED;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
