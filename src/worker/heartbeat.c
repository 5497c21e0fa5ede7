/* heartbeat.c - renews the running span's locks and lease from a second thread.
 *
 * The main thread only swaps what is watched under a mutex; it never waits
 * for a server on the thread's behalf. The thread wakes on a fixed tick
 * (ttl/3) instead of being signalled per job: a lease taken just after a
 * tick is first renewed at most 2*ttl/3 later, still inside its ttl, and the
 * hot path pays for no wake-up. A generation number keeps a renewal that
 * raced with unwatch() from flagging the next job's ownership as lost.
 *
 * A renewal that Redis does not answer (a stall, a reset) is tried again
 * at once, not a tick later, as long as the lease it would extend has time
 * left, each try bounded by that time: a tick later can be past the lease
 * (a renewal sent into a stall gives up 1.5 ticks after it was sent, and
 * the lease it extends ends 2 ticks after that send at the earliest). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "clock.h"
#include "failpoint.h"
#include "heartbeat.h"
#include "lease.h"
#include "lock.h"
#include "log.h"
#include "outage.h"
#include "pg.h"

/* What the running span of jobs owns beyond its locks (which are in the
 * list below); copied out of the mutex for each renewal. */
struct watched {
    uint32_t ttl_ms;
    int64_t  since_ms;  /* monotonic: when the locks were given, just after taking them */
    bool     lease;
    char     queue[256];
    char     key[SK_KEY_MAX + 1];
    int64_t  fence;
    uint32_t lease_ms;
};

/* One watched lock: a span's jobs' locks, in the order they were given. */
struct watched_lock {
    char key[SK_LOCK_KEY_MAX];
    char token[SK_LOCK_TOKEN_LEN + 1];
};

struct sk_heartbeat {
    const struct sk_redis_conf    *redis_conf;
    const struct sk_postgres_conf *pg_conf;
    uint32_t              tick_ms;
    pthread_t             thread;
    pthread_mutex_t       mutex;
    pthread_cond_t        cond;
    bool                  stopping;
    uint64_t              generation;
    struct watched        watched;
    struct watched_lock  *locks;       /* n_locks of them; locks_cap allocated */
    bool                 *locks_lost;  /* which were found lost in this generation */
    size_t                n_locks, locks_cap;
    struct sk_broker     *lent[2];     /* a handler's connections, kept alive; NULL: none */
    atomic_bool           lost;
    /* Owned by the thread alone: the list copied out of the mutex for a
     * renewal, and the arrays of the one round trip. */
    struct sk_lock       *redis;
    PGconn               *pg;
    struct sk_outage      redis_outage, pg_outage;  /* retried each tick: no backoff */
    uint64_t              renewed_gen;  /* the generation renewed_ms is of */
    int64_t               renewed_ms;   /* monotonic: when its last answered renewal was sent */
    struct watched_lock  *copy;
    const char          **keys, **tokens;
    int                  *rcs;
    size_t                copy_cap;
};

static void *run(void *arg);
static bool grow_copy(struct sk_heartbeat *hb, size_t n);
static int renew_locks(struct sk_heartbeat *hb, size_t n, uint32_t ttl_ms, uint32_t bound_ms,
                       size_t *lost_at);
static int renew_lease(struct sk_heartbeat *hb, const struct watched *w);
static uint32_t renew_timeout_ms(const struct sk_heartbeat *hb, uint32_t ttl_ms);
static int64_t lease_left_ms(const struct sk_heartbeat *hb, const struct watched *w,
                             uint64_t generation, int64_t now);
static struct timespec deadline_after(uint32_t ms);

/* Between a renewal Redis did not answer and its retry: not a busy loop
 * against a Redis that refuses connections at once. */
#define RETRY_PAUSE_MS 50
/* Less of the lease left than this after the pause: no retry; the next
 * tick's renewal says whether the lease lived. */
#define RETRY_FLOOR_MS 20

uint32_t sk_heartbeat_tick(const struct sk_queue_conf *queue, const struct sk_amqp_conf *amqp)
{
    uint32_t tick = UINT32_MAX;
    if (queue->lock)
        tick = queue->lock_ttl_ms / 3;
    if (queue->mode == SK_MODE_EXTERNAL && queue->lease_ms / 3 < tick)
        tick = queue->lease_ms / 3;
    uint32_t keepalive = sk_broker_keepalive_period_ms(amqp);
    if (keepalive > 0 && keepalive < tick)
        tick = keepalive;
    return tick;
}

int sk_heartbeat_start(struct sk_heartbeat **out, const struct sk_redis_conf *redis,
                       const struct sk_postgres_conf *postgres, uint32_t tick_ms,
                       struct sk_err *err)
{
    struct sk_heartbeat *hb = calloc(1, sizeof(*hb));
    if (hb == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(heartbeat)");
    hb->redis_conf = redis;
    hb->pg_conf = postgres;
    hb->tick_ms = tick_ms > 0 ? tick_ms : 1;
    atomic_init(&hb->lost, false);
    pthread_mutex_init(&hb->mutex, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&hb->cond, &attr);
    pthread_condattr_destroy(&attr);

    /* Signals belong to the main thread's loop; this thread must never run a
     * handler in the middle of a server call. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&hb->thread, NULL, run, hb);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&hb->cond);
        pthread_mutex_destroy(&hb->mutex);
        free(hb);
        errno = rc;
        return sk_err_errno(err, SK_ERR, "pthread_create(heartbeat)");
    }
    *out = hb;
    return SK_OK;
}

void sk_heartbeat_stop(struct sk_heartbeat *hb)
{
    if (hb == NULL)
        return;
    pthread_mutex_lock(&hb->mutex);
    hb->stopping = true;
    pthread_cond_signal(&hb->cond);
    pthread_mutex_unlock(&hb->mutex);
    pthread_join(hb->thread, NULL);
    sk_lock_close(hb->redis);
    PQfinish(hb->pg);
    pthread_cond_destroy(&hb->cond);
    pthread_mutex_destroy(&hb->mutex);
    free(hb->locks);
    free(hb->locks_lost);
    free(hb->copy);
    free(hb->keys);
    free(hb->tokens);
    free(hb->rcs);
    free(hb);
}

void sk_heartbeat_watch_locks(struct sk_heartbeat *hb, size_t n, const char *const *keys,
                              const char *const *tokens, uint32_t ttl_ms)
{
    pthread_mutex_lock(&hb->mutex);
    if (n > hb->locks_cap) {
        struct watched_lock *grown = realloc(hb->locks, n * sizeof(*grown));
        if (grown != NULL)
            hb->locks = grown;
        bool *lost = grown != NULL ? realloc(hb->locks_lost, n * sizeof(*lost)) : NULL;
        if (lost != NULL) {
            hb->locks_lost = lost;
            hb->locks_cap = n;
        }
    }
    /* Out of memory: only the locks that fit are renewed; the others may
     * expire under a long span, which the lost flag does not see. */
    hb->n_locks = n < hb->locks_cap ? n : hb->locks_cap;
    for (size_t i = 0; i < hb->n_locks; i++) {
        snprintf(hb->locks[i].key, sizeof(hb->locks[i].key), "%s", keys[i]);
        snprintf(hb->locks[i].token, sizeof(hb->locks[i].token), "%s", tokens[i]);
        hb->locks_lost[i] = false;
    }
    hb->watched.ttl_ms = ttl_ms;
    hb->watched.since_ms = sk_now_ms();
    hb->generation++;
    atomic_store(&hb->lost, false);
    pthread_mutex_unlock(&hb->mutex);
}

void sk_heartbeat_watch_lease(struct sk_heartbeat *hb, const char *queue, const char *key,
                              int64_t fence, uint32_t lease_ms)
{
    pthread_mutex_lock(&hb->mutex);
    snprintf(hb->watched.queue, sizeof(hb->watched.queue), "%s", queue);
    snprintf(hb->watched.key, sizeof(hb->watched.key), "%s", key);
    hb->watched.fence = fence;
    hb->watched.lease_ms = lease_ms;
    hb->watched.lease = true;
    hb->generation++;
    if (hb->n_locks == 0)
        atomic_store(&hb->lost, false);
    pthread_mutex_unlock(&hb->mutex);
}

void sk_heartbeat_lend_brokers(struct sk_heartbeat *hb, struct sk_broker *consumer,
                               struct sk_broker *publisher)
{
    pthread_mutex_lock(&hb->mutex);
    hb->lent[0] = consumer;
    hb->lent[1] = publisher;
    pthread_mutex_unlock(&hb->mutex);
}

void sk_heartbeat_return_brokers(struct sk_heartbeat *hb)
{
    /* The thread sends only while holding the mutex: taking it waits out a
     * send in progress. */
    pthread_mutex_lock(&hb->mutex);
    hb->lent[0] = hb->lent[1] = NULL;
    pthread_mutex_unlock(&hb->mutex);
}

bool sk_heartbeat_unwatch(struct sk_heartbeat *hb, bool *lost, size_t n)
{
    pthread_mutex_lock(&hb->mutex);
    for (size_t i = 0; i < n; i++)
        lost[i] = i < hb->n_locks && hb->locks_lost[i];
    hb->n_locks = 0;
    hb->watched.lease = false;
    hb->generation++;
    /* After the generation moved on the thread can no longer raise the
     * flag for this span, and only a watch clears it: read now, it is this
     * span's. */
    bool any = atomic_load(&hb->lost);
    pthread_mutex_unlock(&hb->mutex);
    return any;
}

const atomic_bool *sk_heartbeat_lost(struct sk_heartbeat *hb)
{
    return &hb->lost;
}

static void *run(void *arg)
{
    struct sk_heartbeat *hb = arg;
    pthread_setname_np(pthread_self(), "sk-heartbeat");

    bool again = false;  /* the next wake-up retries the locks' renewal */
    pthread_mutex_lock(&hb->mutex);
    for (;;) {
        struct timespec deadline = deadline_after(again ? RETRY_PAUSE_MS : hb->tick_ms);
        while (!hb->stopping &&
               pthread_cond_timedwait(&hb->cond, &hb->mutex, &deadline) == 0)
            ;
        if (hb->stopping)
            break;
        /* Only a failed renewal of the same span asks for another retry:
         * every way out of this turn below leaves the tick's pace. */
        bool retry = again;
        again = false;
        /* A failed send is not ours to handle: the worker finds the
         * connection broken at its next use, and reconnects. */
        for (size_t i = 0; i < SK_ARRAY_LEN(hb->lent); i++)
            if (hb->lent[i] != NULL)
                sk_broker_keepalive(hb->lent[i], NULL);
        if (hb->n_locks == 0 && !hb->watched.lease)
            continue;
        if (sk_fault_active("no_renew"))
            continue;

        struct watched w = hb->watched;
        uint64_t generation = hb->generation;
        /* Out of memory for the copy: this tick renews nothing, the next
         * tries again. */
        size_t n = grow_copy(hb, hb->n_locks) ? hb->n_locks : 0;
        /* n 0 (no lock): copy may never have been allocated, and memcpy()
         * from or to NULL is undefined even for no bytes (UBSan aborted a
         * worker on it mid-job). */
        if (n > 0)
            memcpy(hb->copy, hb->locks, n * sizeof(*hb->locks));
        pthread_mutex_unlock(&hb->mutex);

        size_t lost_at = n;
        int64_t sent = sk_now_ms();
        int64_t left = lease_left_ms(hb, &w, generation, sent);
        /* Never waits past the lease it would extend, unless that is
         * already spent (then the answer says whether it lived). */
        uint32_t bound = renew_timeout_ms(hb, w.ttl_ms);
        if (left > RETRY_FLOOR_MS && left < bound)
            bound = (uint32_t)left;
        int lock_rc = n > 0 ? renew_locks(hb, n, w.ttl_ms, bound, &lost_at) : SK_OK;
        if (lock_rc == SK_OK && n > 0) {
            hb->renewed_gen = generation;
            hb->renewed_ms = sent;
        }
        bool lock_lost = lock_rc == SK_BUSY;
        /* A retry is the locks' alone: the lease was renewed at the tick. */
        bool lease_lost = w.lease && !retry && renew_lease(hb, &w) == SK_BUSY;
        bool time_left =
            lease_left_ms(hb, &w, generation, sk_now_ms()) > RETRY_PAUSE_MS + RETRY_FLOOR_MS;

        pthread_mutex_lock(&hb->mutex);
        if (hb->generation != generation)
            continue;  /* the span ended meanwhile: not its loss */
        again = lock_rc == SK_AGAIN && time_left;
        for (size_t i = 0; lock_lost && i < n; i++)
            hb->locks_lost[i] |= hb->rcs[i] == SK_BUSY;
        /* Logged once per span: the flag stays up until the next watch. */
        if ((lock_lost || lease_lost) && !atomic_load(&hb->lost)) {
            atomic_store(&hb->lost, true);
            sk_log_warn("%s of %s lost while the job runs (expired or taken over)",
                        w.lease ? "lease" : "lock", w.lease ? w.key : hb->copy[lost_at].key);
        }
    }
    pthread_mutex_unlock(&hb->mutex);
    return NULL;
}

static bool grow_copy(struct sk_heartbeat *hb, size_t n)
{
    if (n <= hb->copy_cap)
        return true;
    struct watched_lock *copy = realloc(hb->copy, n * sizeof(*copy));
    if (copy != NULL)
        hb->copy = copy;
    const char **keys = copy != NULL ? realloc(hb->keys, n * sizeof(*keys)) : NULL;
    if (keys != NULL)
        hb->keys = keys;
    const char **tokens = keys != NULL ? realloc(hb->tokens, n * sizeof(*tokens)) : NULL;
    if (tokens != NULL)
        hb->tokens = tokens;
    int *rcs = tokens != NULL ? realloc(hb->rcs, n * sizeof(*rcs)) : NULL;
    if (rcs == NULL)
        return false;
    hb->rcs = rcs;
    hb->copy_cap = n;
    return true;
}

/* Every watched lock in one round trip, each read and write bounded by
 * bound_ms. SK_BUSY when any was lost (hb->rcs says which; *lost_at is the
 * first), SK_OK, or SK_AGAIN. */
static int renew_locks(struct sk_heartbeat *hb, size_t n, uint32_t ttl_ms, uint32_t bound_ms,
                       size_t *lost_at)
{
    struct sk_err err = { 0 };
    if (hb->redis != NULL)
        sk_lock_set_timeout(hb->redis, bound_ms);
    int rc = hb->redis != NULL ? SK_OK
             : sk_lock_open_bounded(&hb->redis, hb->redis_conf, bound_ms, &err);
    for (size_t i = 0; i < n; i++) {
        hb->keys[i] = hb->copy[i].key;
        hb->tokens[i] = hb->copy[i].token;
    }
    if (rc == SK_OK)
        rc = sk_lock_renew_many(hb->redis, n, hb->keys, hb->tokens, ttl_ms, hb->rcs, &err);
    if (rc == SK_AGAIN && sk_outage_begin(&hb->redis_outage))
        sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_REDIS, NULL,
                     "lock renewal failed, will retry within the lease, then each %u ms: %s",
                     hb->tick_ms, err.msg);
    else if (rc != SK_AGAIN && sk_outage_ok(&hb->redis_outage))
        sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_REDIS, NULL,
                     "lock renewal reaches redis again");
    if (rc != SK_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (hb->rcs[i] == SK_BUSY) {
            *lost_at = i;
            return SK_BUSY;
        }
    }
    return SK_OK;
}

/* How long a renewal may wait for Redis: half the lock's TTL (never less
 * than redis.timeout). redis.timeout is sized for the job's path, where
 * failing fast matters; a renewal that gives up on a Redis that is only
 * stalled or far away drops its connection, and the reconnect costs round
 * trips the lease no longer has. Half the TTL still gets the answer back
 * while the lease it extends is alive (it is renewed every third), and
 * holds this thread at most one and a half ticks, so the broker keepalives
 * it sends are late by no more than that. */
static uint32_t renew_timeout_ms(const struct sk_heartbeat *hb, uint32_t ttl_ms)
{
    uint32_t t = ttl_ms / 2;
    uint64_t ticks = (uint64_t)hb->tick_ms * 3 / 2;
    if (ticks < t)
        t = (uint32_t)ticks;
    return t > hb->redis_conf->timeout_ms ? t : hb->redis_conf->timeout_ms;
}

/* What is left of the watched locks' lease at now, as far as this thread
 * knows: from the send of their last answered renewal (Redis extended it
 * after that), or from their watch (just after they were taken: late by the
 * acquire's answer, so a retry may come too late, and then finds the lock
 * gone and says so). Less than 0: spent. */
static int64_t lease_left_ms(const struct sk_heartbeat *hb, const struct watched *w,
                             uint64_t generation, int64_t now)
{
    int64_t from = w->since_ms;
    if (hb->renewed_gen == generation && hb->renewed_ms > from)
        from = hb->renewed_ms;
    return from + (int64_t)w->ttl_ms - now;
}

static int renew_lease(struct sk_heartbeat *hb, const struct watched *w)
{
    struct sk_err err = { 0 };
    if (hb->pg != NULL && PQstatus(hb->pg) != CONNECTION_OK) {
        PQfinish(hb->pg);
        hb->pg = NULL;
    }
    if (hb->pg == NULL)
        hb->pg = sk_pg_dial(hb->pg_conf, "sekali heartbeat", &err);
    struct sk_keyref ref = { .queue = w->queue, .key = w->key };
    sk_keyref_set_fence(&ref, w->fence);
    int rc = hb->pg == NULL ? SK_AGAIN : sk_lease_renew(hb->pg, &ref, w->lease_ms, &err);
    bool down = rc != SK_OK && rc != SK_BUSY;
    if (down && sk_outage_begin(&hb->pg_outage))
        sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, NULL,
                     "lease renewal failed, will retry each %u ms: %s", hb->tick_ms, err.msg);
    else if (!down && sk_outage_ok(&hb->pg_outage))
        sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_POSTGRES, NULL,
                     "lease renewal reaches PostgreSQL again");
    return rc;
}

static struct timespec deadline_after(uint32_t ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}
