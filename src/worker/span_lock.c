/* span_lock.c - a span's Redis locks: every lock of the span taken in one
 * round trip a try, jobs of one resource under the first one's lock, and
 * the settled jobs' locks released with the next acquire (or when the
 * worker would wait), so that a lock costs no round trip of its own while
 * jobs keep coming. What a refused lock means for a job is job.c's
 * (sk_job_later()); the heartbeat renews the locks while the span runs. */
#include <stdio.h>
#include <string.h>

#include "backoff.h"
#include "clock.h"
#include "failpoint.h"
#include "heartbeat.h"
#include "job.h"
#include "job_steps.h"
#include "limit.h"
#include "links.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "process.h"
#include "reschedule.h"
#include "scoreboard.h"

static size_t put_releases(struct sk_span *s);
static void released(struct sk_pipeline *p, struct sk_span *s, int rc, const struct sk_err *err);
static void lock_span(struct sk_pipeline *p, struct sk_span *s, struct sk_lock_ride *ride);
static size_t lock_round(struct sk_pipeline *p, struct sk_span *s, struct sk_lock *redis,
                         size_t r, struct sk_lock_ride *ride, size_t *asked, size_t *locked,
                         bool *dropped);
static void lock_refused(struct sk_pipeline *p, struct sk_job *j, int rc);
static bool asks_for_lock(const struct sk_job *j);
static size_t lock_leader(const struct sk_span *s, size_t i);
static void follow_leaders(struct sk_pipeline *p, struct sk_span *s);
static void waited_for_lock(struct sk_job *j);
static size_t refuse_or_defer(struct sk_pipeline *p, struct sk_span *s, size_t asked,
                              size_t locked);
static void watch_locks(struct sk_pipeline *p, struct sk_span *s);

/* Every received job's lock, in one round trip a try; the first carries
 * the releases of the jobs settled before (put_releases()). Jobs of one
 * resource share the first one's lock (lock_leader()). A span never waits
 * for a lock while it holds another (two spans each holding what the other
 * waits for would wait out busy_wait both), so a busy one is deferred while
 * others were taken: the span runs and commits the rest, releases their
 * locks and asks again (sk_span_deferred()). Holding none (a span of one
 * always), it asks again until lock.busy_wait, counted from the job's first
 * refusal, and only a lock still busy then is re-scheduled through a delay
 * queue. Each lock is recorded in the scoreboard before Redis is asked,
 * not after it said yes: a worker that dies between the SET and the record
 * would otherwise leave a lock its replacement knows nothing of, and the
 * redelivery would wait out the TTL; deleting by a token that never took
 * the lock deletes nothing. They stay recorded until they are released. */
void sk_span_lock(struct sk_pipeline *p, struct sk_span *s)
{
    lock_span(p, s, NULL);
}

/* The rate limit's question goes in the first round's write, ahead of the
 * locks, and is answered before any busy lock is waited for: a job over
 * the limit leaves at once, holding the lock it may have been given until
 * the span's releases go (sk_span_unlock()), as a settled job's does:
 * releasing it sooner would cost the round trip saved. Whether a start
 * was counted is the limit's alone: a job admitted whose lock is busy has
 * used its start, as one admitted and then lost has. */
void sk_span_admit_lock(struct sk_pipeline *p, struct sk_span *s)
{
    lock_span(p, s, sk_limit_ask(p, s));
}

static void lock_span(struct sk_pipeline *p, struct sk_span *s, struct sk_lock_ride *ride)
{
    size_t r = put_releases(s), m = r;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_RECEIVED)
            continue;
        if (j->lock.deferred)  /* dying while it waits, its batch-mates committed */
            sk_failpoint("lock_deferred", j->env.idempotency_key);
        j->lock.deferred = false;
        sk_lock_key(j->lock.key, sizeof(j->lock.key), p->queue->name, j->env.resource_key);
        j->lock.leader = lock_leader(s, i);
        if (j->lock.leader != 0)
            continue;
        sk_lock_new_token(j->lock.token);
        s->keys[m] = j->lock.key;
        s->tokens[m++] = j->lock.token;
    }
    sk_assert(m > r || ride == NULL);  /* the limit is asked for received jobs only */
    if (m == r)
        return;  /* the releases wait for the next acquire, or the worker's idling */
    struct sk_lock *redis;
    int rc = sk_links_lock(p->links, &redis);
    if (redis == NULL) {
        if (ride != NULL)  /* the limit fails closed, whatever on_redis_down says */
            sk_limit_answer(p, s, ride, true);
        /* Redis in its backoff: the queue proceeds without locks, or
         * re-schedules. */
        for (size_t i = 0; i < s->n; i++)
            if (s->jobs[i].state == SK_JOB_RECEIVED)
                lock_refused(p, &s->jobs[i], rc);
        return;
    }
    sk_slot_record_locks(p->slot, m, s->keys, s->tokens);

    size_t locked = 0, asked;
    for (;;) {
        bool dropped = false;
        size_t busy = lock_round(p, s, redis, r, ride, &asked, &locked, &dropped);
        if (ride != NULL)
            sk_limit_answer(p, s, ride, dropped);
        ride = NULL;
        r = 0;
        if (busy == 0 || refuse_or_defer(p, s, asked, locked) == 0)
            break;
        sk_sleep_ms(sk_jitter(5, 50));
    }
    if (locked == 0)
        sk_slot_forget_locks(p->slot);
    else
        sk_slot_set_held(p->slot, locked);  /* the round that took them carried the releases */
    follow_leaders(p, s);
    if (locked > 0 && p->heartbeat != NULL)
        watch_locks(p, s);
}

/* The busy ones of a round's asked: re-scheduled once busy for
 * lock.busy_wait (or the worker stops), deferred while the span holds
 * locks, else left to ask again. Returns how many are left to ask. */
static size_t refuse_or_defer(struct sk_pipeline *p, struct sk_span *s, size_t asked,
                              size_t locked)
{
    uint64_t now = sk_now_ns(), wait_ns = (uint64_t)p->conf->lock.busy_wait_ms * 1000000u;
    size_t again = 0;
    for (size_t k = 0; k < asked; k++) {
        if (s->rcs[k] != SK_BUSY)
            continue;
        struct sk_job *j = &s->jobs[s->index[k]];
        if (!sk_job_live(j)) {  /* over the rate limit: its followers wait too */
            waited_for_lock(j);
            j->lock.refusal = SK_BUSY;
        } else if (now - j->lock.busy_since >= wait_ns || sk_process_stopping()) {
            waited_for_lock(j);
            sk_metrics_inc(j->metrics, SK_METRIC_LOCK_BUSY);
            lock_refused(p, j, SK_BUSY);
        } else if (locked > 0) {
            j->lock.deferred = true;
        } else {
            again++;
        }
    }
    return again;
}

/* The heartbeat renews every lock the span took until it settles. */
static void watch_locks(struct sk_pipeline *p, struct sk_span *s)
{
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (!s->jobs[i].lock.held)
            continue;
        s->keys[m] = s->jobs[i].lock.key;
        s->tokens[m++] = s->jobs[i].lock.token;
    }
    sk_heartbeat_watch_locks(p->heartbeat, m, s->keys, s->tokens, p->queue->lock_ttl_ms);
}

/* A job still to ask Redis for its own lock in this pass. */
static bool asks_for_lock(const struct sk_job *j)
{
    return j->state == SK_JOB_RECEIVED && j->lock.leader == 0 && !j->lock.deferred;
}

/* 1 + the index of the first earlier job of the span asking for the same
 * lock as job i, or 0. The lock keeps two workers off one resource; jobs of
 * one worker run one after the other anyway, so the later job needs no lock
 * of its own, only to run after the first. Asking Redis would find the lock
 * taken by its batch-mate and re-schedule the job through a delay queue, so
 * that a burst on one resource would trickle through one job a batch. */
static size_t lock_leader(const struct sk_span *s, size_t i)
{
    const struct sk_job *j = &s->jobs[i];
    for (size_t k = 0; k < i; k++)
        if (asks_for_lock(&s->jobs[k]) && strcmp(s->jobs[k].lock.key, j->lock.key) == 0)
            return k + 1;
    return 0;
}

/* Each follower of a lock leader ends as its leader did: locked (under the
 * leader's lock), deferred, sent on unlocked, or re-scheduled for the same
 * reason. */
static void follow_leaders(struct sk_pipeline *p, struct sk_span *s)
{
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (j->state != SK_JOB_RECEIVED || j->lock.leader == 0)
            continue;
        const struct sk_job *leader = &s->jobs[j->lock.leader - 1];
        if (leader->lock.held) {
            j->lock.shared = true;
            j->log.lock_owner = leader->lock.token;
            sk_job_transition(j, SK_JOB_LOCKED);
        } else if (leader->lock.deferred) {
            j->lock.deferred = true;
        } else if (!sk_job_live(leader)) {
            lock_refused(p, j, leader->lock.refusal);
        }
    }
}

/* The releases waiting, as the first r of s->keys and s->tokens. */
static size_t put_releases(struct sk_span *s)
{
    for (size_t i = 0; i < s->n_releases; i++) {
        s->keys[i] = s->releases[i].key;
        s->tokens[i] = s->releases[i].token;
    }
    return s->n_releases;
}

/* The answers to the releases waiting (the first of s->rcs), when the
 * round trip carrying them returned rc; they are done with either way. */
static void released(struct sk_pipeline *p, struct sk_span *s, int rc, const struct sk_err *err)
{
    for (size_t i = 0; i < s->n_releases; i++) {
        const struct sk_release *x = &s->releases[i];
        if (rc == SK_OK && s->rcs[i] == SK_OK)
            continue;
        const struct sk_log_job job = {
            .queue = p->queue->name, .job_id = x->job_id, .idempotency_key = x->idempotency_key,
            .resource_key = x->resource_key, .lock_owner = x->token, .fence = x->fence,
            .delivery_attempt = x->delivery_attempt,
        };
        if (rc != SK_OK && s->n_releases > 1 && i == 0)
            sk_log_warn("queue %s: releasing %zu locks failed (they will expire): %s",
                        p->queue->name, s->n_releases, err->msg);
        if (rc != SK_OK && s->n_releases == 1)
            sk_log_job(SK_LOG_WARN, &job, "lock release failed (it will expire): %s", err->msg);
        else if (rc == SK_OK)
            sk_log_job(SK_LOG_WARN, &job, "lock had expired before release");
    }
    s->n_releases = 0;
}

/* One script for each job still without its lock (SET NX PX), after the r
 * releases that s->keys starts with, and ride (if any) in the same write:
 * those granted are locked (*locked counts them all so far). Returns how
 * many were busy, which s->index and s->rcs name among the *asked; 0 also
 * when Redis failed (*dropped), its jobs then sent on (unlocked, or
 * re-scheduled). */
static size_t lock_round(struct sk_pipeline *p, struct sk_span *s, struct sk_lock *redis,
                         size_t r, struct sk_lock_ride *ride, size_t *asked, size_t *locked,
                         bool *dropped)
{
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        if (!asks_for_lock(j))
            continue;
        s->keys[r + m] = j->lock.key;
        s->tokens[r + m] = j->lock.token;
        s->index[m++] = i;
    }
    *asked = m;
    if (m == 0 && ride == NULL)
        return 0;
    struct sk_err err = { 0 };
    int rc = sk_lock_swap_riding(redis, ride, r, r + m, s->keys, s->tokens,
                                 p->queue->lock_ttl_ms, p->queue->concurrency, s->rcs, &err);
    if (r > 0)
        released(p, s, rc, &err);
    if (rc != SK_OK) {
        /* No lock of this round was taken, and none of an earlier one
         * (only a span holding none asks again). */
        sk_slot_forget_locks(p->slot);
        *dropped = true;
        rc = sk_links_drop(p->links, SK_LINK_LOCK, m > 0 ? &s->jobs[s->index[0]].log : NULL,
                           &err);
        for (size_t k = 0; k < m; k++) {
            struct sk_job *j = &s->jobs[s->index[k]];
            waited_for_lock(j);
            lock_refused(p, j, rc);
        }
        return 0;
    }
    /* The jobs' answers first in s->rcs, where the caller reads them. */
    if (r > 0)
        memmove(s->rcs, s->rcs + r, m * sizeof(*s->rcs));
    sk_links_up(p->links, SK_LINK_LOCK);
    size_t busy = 0;
    for (size_t k = 0; k < m; k++) {
        struct sk_job *j = &s->jobs[s->index[k]];
        if (s->rcs[k] == SK_BUSY) {
            busy++;
            if (j->lock.busy_since == 0)
                j->lock.busy_since = sk_now_ns();
            sk_failpoint("lock_busy", j->env.idempotency_key);  /* dying while waiting */
            continue;
        }
        waited_for_lock(j);
        j->lock.held = true;
        j->log.lock_owner = j->lock.token;
        sk_job_transition(j, SK_JOB_LOCKED);
        (*locked)++;
    }
    return busy;
}

/* What a refused lock means: SK_BUSY or SK_AGAIN re-schedule the job; SK_OK
 * (Redis down, the queue proceeds without it) sends it on unlocked. */
static void lock_refused(struct sk_pipeline *p, struct sk_job *j, int rc)
{
    j->lock.refusal = rc;
    if (rc == SK_BUSY)
        sk_job_later(p, j, sk_reschedule_bucket(sk_jitter(100, 1000)),
                     j->env.delivery_attempt, NULL, "lock busy");
    else if (rc == SK_AGAIN)
        sk_job_later(p, j, sk_reschedule_bucket(sk_jitter(1000, 5000)),
                     j->env.delivery_attempt, NULL, "redis down");
}

/* Adds the time since the job's lock was first refused (none: it never
 * was), once. */
static void waited_for_lock(struct sk_job *j)
{
    if (j->lock.busy_since != 0)
        sk_metrics_lock_wait(j->metrics, sk_now_ns() - j->lock.busy_since);
    j->lock.busy_since = 0;
}

/* The span's locks join the releases waiting, for the next acquire or the
 * worker's idling to carry (sk_span_release_locks()): a lock release costs
 * no round trip of its own while jobs keep coming. The scoreboard keeps
 * exactly those until then. */
void sk_span_unlock(struct sk_pipeline *p, struct sk_span *s)
{
    for (size_t i = 0; i < s->n; i++) {
        struct sk_job *j = &s->jobs[i];
        j->lock.shared = false;
        if (!j->lock.held)
            continue;
        j->lock.held = false;
        /* Only a span that asked Redis nothing keeps older releases, and it
         * locked none of its own: they never exceed the span's size. */
        sk_assert(s->n_releases < s->cap);
        struct sk_release *x = &s->releases[s->n_releases++];
        snprintf(x->key, sizeof(x->key), "%s", j->lock.key);
        snprintf(x->token, sizeof(x->token), "%s", j->lock.token);
        snprintf(x->job_id, sizeof(x->job_id), "%s", j->env.job_id);
        snprintf(x->idempotency_key, sizeof(x->idempotency_key), "%s", j->env.idempotency_key);
        snprintf(x->resource_key, sizeof(x->resource_key), "%s", j->env.resource_key);
        x->fence = j->log.fence;
        x->delivery_attempt = j->log.delivery_attempt;
    }
    size_t r = put_releases(s);
    if (r > 0) {
        sk_slot_record_locks(p->slot, r, s->keys, s->tokens);
        sk_slot_set_held(p->slot, r);  /* still held in Redis until the release goes */
    } else {
        sk_slot_forget_locks(p->slot);
    }
}

bool sk_span_releases_waiting(const struct sk_pipeline *p)
{
    return p->span != NULL && p->span->n_releases > 0;
}

void sk_span_release_locks(struct sk_pipeline *p)
{
    struct sk_span *s = p->span;
    if (s == NULL || s->n_releases == 0)
        return;
    size_t r = put_releases(s);
    struct sk_lock *redis;
    struct sk_err err = { 0 };
    sk_links_lock(p->links, &redis);
    int rc = SK_AGAIN;
    if (redis == NULL)
        sk_err_set(&err, SK_AGAIN, "redis unavailable");
    else
        rc = sk_lock_swap_many(redis, r, r, s->keys, s->tokens, p->queue->lock_ttl_ms,
                               p->queue->concurrency, s->rcs, &err);
    released(p, s, rc, &err);
    sk_slot_forget_locks(p->slot);
    if (redis != NULL && rc != SK_OK)
        sk_links_drop(p->links, SK_LINK_LOCK, NULL, &err);
    else if (redis != NULL)
        sk_links_up(p->links, SK_LINK_LOCK);
}
