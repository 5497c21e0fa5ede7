/* limit.c - a span's jobs through the queue's rate limit (see limit.h).
 *
 * Per queue, the span asks one key for as many starts as it has jobs; per
 * resource, each distinct resource key for its jobs' count. Either way it
 * is one script (rate.c), sent in the round trip that takes the span's
 * locks (span_lock.c), or alone in a queue without locks. What is asked of the limiter
 * is only a start: a job admitted and then lost (its worker killed, its
 * claim a duplicate) has used its slot, so the limit errs towards fewer
 * starts, never more. */
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "limit.h"
#include "links.h"
#include "log.h"
#include "metrics.h"
#include "rate.h"
#include "reschedule.h"

#define RATE_KEY_MAX (SK_KEY_MAX + 300)  /* "sekali:rate:<queue>:<resource>" and NUL */

/* The round trip's arrays, kept between spans: a span never allocates. */
struct scratch {
    size_t        cap;
    char        (*text)[RATE_KEY_MAX];  /* the distinct keys */
    const char  **keys;
    uint32_t     *counts;               /* starts asked of each key */
    uint32_t     *first;                /* where each key's answers begin */
    uint32_t     *seen;                 /* answers of each key given out so far */
    uint32_t     *waits;                /* one answer a start */
    size_t       *key_of;               /* each job's key */
};

static struct scratch scratch;

static struct sk_rate_call call;

#define NOT_ASKED SIZE_MAX  /* key_of[] of a job the limit was not asked for */

static bool grow(size_t n);
static size_t gather(struct sk_pipeline *p, struct sk_span *s);
static void refuse(struct sk_pipeline *p, struct sk_span *s, bool gathered, uint32_t delay_ms,
                   const char *why);
static void delay(struct sk_pipeline *p, struct sk_job *j, uint32_t wait_ms, const char *why);
static void report(struct sk_pipeline *p, struct sk_span *s, size_t limited, uint32_t shortest);

void sk_limit_admit(struct sk_pipeline *p, struct sk_span *s)
{
    struct sk_lock_ride *ride = sk_limit_ask(p, s);
    if (ride == NULL)
        return;
    /* Redis's outage is logged once, by the links; each job's exit line
     * says why it waits. */
    struct sk_lock *redis;
    sk_links_lock(p->links, &redis);
    if (redis != NULL)
        sk_lock_swap_riding(redis, ride, 0, 0, NULL, NULL, 0, 1, NULL, &ride->err);
    sk_limit_answer(p, s, ride, redis == NULL);
}

struct sk_lock_ride *sk_limit_ask(struct sk_pipeline *p, struct sk_span *s)
{
    const struct sk_rate_conf *c = &p->queue->rate;
    if (c->count == 0)
        return NULL;
    if (!grow(s->n)) {
        sk_log_warn("queue %s: out of memory for the rate limit's round trip", p->queue->name);
        refuse(p, s, false, sk_jitter(100, 1000), "rate limit unknown (out of memory)");
        return NULL;
    }
    size_t m = gather(p, s);
    if (m == 0)
        return NULL;
    const struct sk_rate rate = sk_rate_of(c->count, c->period_ms, c->burst);
    struct sk_err err = { 0 };
    if (sk_rate_ask(&call, &rate, m, scratch.keys, scratch.counts, &err) != SK_OK) {
        sk_log_warn("queue %s: %s", p->queue->name, err.msg);
        refuse(p, s, true, sk_jitter(100, 1000), "rate limit unknown (out of memory)");
        return NULL;
    }
    return &call.ride;
}

void sk_limit_answer(struct sk_pipeline *p, struct sk_span *s, struct sk_lock_ride *ride,
                     bool dropped)
{
    sk_assert(ride == &call.ride);
    if (ride->rc != SK_OK) {
        if (!dropped)
            sk_links_drop(p->links, SK_LINK_LOCK, NULL, &ride->err);
        refuse(p, s, true, sk_jitter(1000, 5000), "rate limit unknown (redis down)");
        sk_rate_call_free(&call);
        return;
    }
    sk_links_up(p->links, SK_LINK_LOCK);
    sk_rate_answers(&call, scratch.waits);
    sk_rate_call_free(&call);
    size_t limited = 0;
    uint32_t shortest = UINT32_MAX;
    memset(scratch.seen, 0, scratch.cap * sizeof(*scratch.seen));
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        size_t k = scratch.key_of[i];
        if (k == NOT_ASKED)
            continue;
        /* Every answer of a key is taken in turn, a job's that has gone
         * (its lock busy past busy_wait) too: it used its start. */
        uint32_t wait = scratch.waits[scratch.first[k] + scratch.seen[k]++];
        if (wait == 0 || !sk_job_live(j))
            continue;
        limited++;
        shortest = wait < shortest ? wait : shortest;
        delay(p, j, wait, "rate limited");
    }
    if (limited > 0)
        report(p, s, limited, shortest);
}

/* The event of a span that had jobs over the limit. */
static void report(struct sk_pipeline *p, struct sk_span *s, size_t limited, uint32_t shortest)
{
    char jobs[24], wait[24];
    snprintf(jobs, sizeof(jobs), "%zu", limited);
    snprintf(wait, sizeof(wait), "%u", shortest);
    const struct sk_log_field fields[] = { { "jobs", jobs }, { "delay_ms", wait } };
    sk_log_event_fields(SK_LOG_INFO, SK_EVENT_RATE_LIMITED, NULL, NULL, fields, 2,
                        "queue %s: %zu of %zu jobs over the rate limit, re-scheduled "
                        "(the first in %u ms)", p->queue->name, limited, s->n, shortest);
}

/* The distinct keys of the span's received jobs, with their counts and
 * where their answers begin; each job's key in key_of. Returns how many. */
static size_t gather(struct sk_pipeline *p, struct sk_span *s)
{
    bool per_resource = p->queue->rate.per == SK_RATE_PER_RESOURCE;
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct sk_job *j = &s->jobs[i];
        scratch.key_of[i] = NOT_ASKED;
        if (j->state != SK_JOB_RECEIVED)
            continue;
        char key[RATE_KEY_MAX];
        sk_rate_key(key, sizeof(key), p->queue->name, per_resource ? j->env.resource_key : NULL);
        size_t k = 0;
        while (k < m && strcmp(scratch.text[k], key) != 0)
            k++;
        if (k == m) {
            memcpy(scratch.text[m], key, sizeof(key));
            scratch.keys[m] = scratch.text[m];
            scratch.counts[m++] = 0;
        }
        scratch.counts[k]++;
        scratch.key_of[i] = k;
    }
    for (size_t k = 0, at = 0; k < m; at += scratch.counts[k++])
        scratch.first[k] = (uint32_t)at;
    return m;
}

/* Every job that asked and is still live waits, or every received one
 * before they were gathered: the limit could not be asked, and fails
 * closed. */
static void refuse(struct sk_pipeline *p, struct sk_span *s, bool gathered, uint32_t delay_ms,
                   const char *why)
{
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        bool asked = gathered ? scratch.key_of[i] != NOT_ASKED : j->state == SK_JOB_RECEIVED;
        if (asked && sk_job_live(j))
            delay(p, j, delay_ms, why);
    }
}

/* A copy comes back after the wait, at the same attempt: waiting for a slot
 * is no failure. A little jitter keeps the workers' copies from all coming
 * back in the same millisecond. */
static void delay(struct sk_pipeline *p, struct sk_job *j, uint32_t wait_ms, const char *why)
{
    uint32_t ms = sk_reschedule_bucket(sk_jitter(wait_ms, wait_ms + wait_ms / 10 + 1));
    if (sk_job_later(p, j, ms, j->env.delivery_attempt, NULL, why)) {
        sk_metrics_inc(j->metrics, SK_METRIC_RATE_LIMITED);
        sk_metrics_rate_delay(j->metrics, (uint64_t)ms * 1000000);
    }
}

static bool grow(size_t n)
{
    if (n <= scratch.cap)
        return true;
    struct scratch g = { .cap = n };
    g.text = calloc(n, sizeof(*g.text));
    g.keys = calloc(n, sizeof(*g.keys));
    g.counts = calloc(n, sizeof(*g.counts));
    g.first = calloc(n, sizeof(*g.first));
    g.seen = calloc(n, sizeof(*g.seen));
    g.waits = calloc(n, sizeof(*g.waits));
    g.key_of = calloc(n, sizeof(*g.key_of));
    bool ok = g.text && g.keys && g.counts && g.first && g.seen && g.waits && g.key_of;
    struct scratch *drop = ok ? &scratch : &g;
    free(drop->text);
    free(drop->keys);
    free(drop->counts);
    free(drop->first);
    free(drop->seen);
    free(drop->waits);
    free(drop->key_of);
    if (ok)
        scratch = g;
    return ok;
}
