/* heartbeat.c - renews the running job's lock and lease from a second thread.
 *
 * The main thread only swaps what is watched under a mutex; it never waits
 * for a server on the thread's behalf. The thread wakes on a fixed tick
 * (ttl/3) instead of being signalled per job: a lease taken just after a
 * tick is first renewed at most 2*ttl/3 later, still inside its ttl, and the
 * hot path pays for no wake-up. A generation number keeps a renewal that
 * raced with unwatch() from flagging the next job's ownership as lost. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "failpoint.h"
#include "heartbeat.h"
#include "lease.h"
#include "lock.h"
#include "log.h"
#include "outage.h"
#include "pg.h"

/* What one job owns; copied out of the mutex for each renewal. */
struct watched {
    bool     lock;
    char     lock_key[SK_KEY_MAX + 300];
    char     token[SK_LOCK_TOKEN_LEN + 1];
    uint32_t ttl_ms;
    bool     lease;
    char     queue[256];
    char     key[SK_KEY_MAX + 1];
    int64_t  fence;
    uint32_t lease_ms;
};

/* A batch's further locks, past the first (which is in struct watched). */
struct more_lock {
    char key[SK_KEY_MAX + 300];
    char token[SK_LOCK_TOKEN_LEN + 1];
};

struct sk_heartbeat {
    const struct sk_conf *conf;
    uint32_t              tick_ms;
    pthread_t             thread;
    pthread_mutex_t       mutex;
    pthread_cond_t        cond;
    bool                  stopping;
    uint64_t              generation;
    struct watched        watched;
    struct more_lock     *more;        /* watched.lock's batch-mates: n_more of them */
    size_t                n_more, more_cap;
    struct sk_broker     *lent[2];     /* a handler's connections, kept alive; NULL: none */
    atomic_bool           lost;
    /* Owned by the thread alone. */
    struct sk_lock       *redis;
    PGconn               *pg;
    struct sk_outage      redis_outage, pg_outage;  /* retried each tick: no backoff */
    struct more_lock     *more_copy;   /* more, copied out of the mutex for a renewal */
    size_t                more_copy_cap;
};

static void *run(void *arg);
static int renew_lock(struct sk_heartbeat *hb, const struct watched *w);
static int renew_lease(struct sk_heartbeat *hb, const struct watched *w);
static struct timespec deadline_after(uint32_t ms);

int sk_heartbeat_start(struct sk_heartbeat **out, const struct sk_conf *conf,
                       uint32_t tick_ms, struct sk_err *err)
{
    struct sk_heartbeat *hb = calloc(1, sizeof(*hb));
    if (hb == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(heartbeat)");
    hb->conf = conf;
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
    free(hb->more);
    free(hb->more_copy);
    free(hb);
}

void sk_heartbeat_watch_lock(struct sk_heartbeat *hb, const char *key, const char *token,
                             uint32_t ttl_ms)
{
    pthread_mutex_lock(&hb->mutex);
    snprintf(hb->watched.lock_key, sizeof(hb->watched.lock_key), "%s", key);
    memcpy(hb->watched.token, token, sizeof(hb->watched.token));
    hb->watched.ttl_ms = ttl_ms;
    hb->watched.lock = true;
    hb->n_more = 0;
    hb->generation++;
    atomic_store(&hb->lost, false);
    pthread_mutex_unlock(&hb->mutex);
}

void sk_heartbeat_watch_locks(struct sk_heartbeat *hb, size_t n, const char *const *keys,
                              const char *const *tokens, uint32_t ttl_ms)
{
    sk_heartbeat_watch_lock(hb, keys[0], tokens[0], ttl_ms);
    pthread_mutex_lock(&hb->mutex);
    if (n - 1 > hb->more_cap) {
        struct more_lock *grown = realloc(hb->more, (n - 1) * sizeof(*grown));
        if (grown != NULL) {
            hb->more = grown;
            hb->more_cap = n - 1;
        }
    }
    /* Out of memory: only the locks that fit are renewed; the others may
     * expire under a long batch, which the lost flag does not see. */
    hb->n_more = n - 1 < hb->more_cap ? n - 1 : hb->more_cap;
    for (size_t i = 0; i < hb->n_more; i++) {
        snprintf(hb->more[i].key, sizeof(hb->more[i].key), "%s", keys[i + 1]);
        snprintf(hb->more[i].token, sizeof(hb->more[i].token), "%s", tokens[i + 1]);
    }
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
    if (!hb->watched.lock)
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

void sk_heartbeat_unwatch(struct sk_heartbeat *hb)
{
    pthread_mutex_lock(&hb->mutex);
    hb->watched.lock = false;
    hb->watched.lease = false;
    hb->n_more = 0;
    hb->generation++;
    pthread_mutex_unlock(&hb->mutex);
}

const atomic_bool *sk_heartbeat_lost(struct sk_heartbeat *hb)
{
    return &hb->lost;
}

static void *run(void *arg)
{
    struct sk_heartbeat *hb = arg;
    pthread_setname_np(pthread_self(), "sk-heartbeat");

    pthread_mutex_lock(&hb->mutex);
    for (;;) {
        struct timespec deadline = deadline_after(hb->tick_ms);
        while (!hb->stopping &&
               pthread_cond_timedwait(&hb->cond, &hb->mutex, &deadline) == 0)
            ;
        if (hb->stopping)
            break;
        /* A failed send is not ours to handle: the worker finds the
         * connection broken at its next use, and reconnects. */
        for (size_t i = 0; i < SK_ARRAY_LEN(hb->lent); i++)
            if (hb->lent[i] != NULL)
                sk_broker_keepalive(hb->lent[i], NULL);
        if (!hb->watched.lock && !hb->watched.lease)
            continue;
        if (sk_fault_active("no_renew"))
            continue;

        struct watched w = hb->watched;
        uint64_t generation = hb->generation;
        size_t n_more = 0;
        if (hb->n_more > hb->more_copy_cap) {
            struct more_lock *grown = realloc(hb->more_copy, hb->n_more * sizeof(*grown));
            if (grown != NULL) {
                hb->more_copy = grown;
                hb->more_copy_cap = hb->n_more;
            }
        }
        /* n_more 0 (one job's lock): more_copy may never have been
         * allocated, and memcpy() from or to NULL is undefined even for
         * no bytes (UBSan aborted a worker on it mid-job). */
        if (hb->n_more > 0 && hb->n_more <= hb->more_copy_cap) {
            n_more = hb->n_more;
            memcpy(hb->more_copy, hb->more, n_more * sizeof(*hb->more));
        }
        pthread_mutex_unlock(&hb->mutex);

        bool lost = (w.lock && renew_lock(hb, &w) == SK_BUSY) |
                    (w.lease && renew_lease(hb, &w) == SK_BUSY);
        for (size_t i = 0; i < n_more; i++) {
            snprintf(w.lock_key, sizeof(w.lock_key), "%s", hb->more_copy[i].key);
            memcpy(w.token, hb->more_copy[i].token, sizeof(w.token));
            lost |= renew_lock(hb, &w) == SK_BUSY;
        }

        pthread_mutex_lock(&hb->mutex);
        /* Logged once per job: the flag stays up until the next watch. */
        if (lost && hb->generation == generation && !atomic_load(&hb->lost)) {
            atomic_store(&hb->lost, true);
            sk_log_warn("%s of %s lost while the job runs (expired or taken over)",
                        w.lease ? "lease" : "lock", w.lease ? w.key : w.lock_key);
        }
    }
    pthread_mutex_unlock(&hb->mutex);
    return NULL;
}

static int renew_lock(struct sk_heartbeat *hb, const struct watched *w)
{
    struct sk_err err = { 0 };
    int rc = hb->redis != NULL ? SK_OK : sk_lock_open(&hb->redis, &hb->conf->redis, &err);
    if (rc == SK_OK)
        rc = sk_lock_renew(hb->redis, w->lock_key, w->token, w->ttl_ms, &err);
    if (rc == SK_AGAIN && sk_outage_begin(&hb->redis_outage))
        sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_REDIS, NULL,
                     "lock renewal failed, will retry each %u ms: %s", hb->tick_ms, err.msg);
    else if (rc != SK_AGAIN && sk_outage_ok(&hb->redis_outage))
        sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_REDIS, NULL,
                     "lock renewal reaches redis again");
    return rc;
}

static int renew_lease(struct sk_heartbeat *hb, const struct watched *w)
{
    struct sk_err err = { 0 };
    if (hb->pg != NULL && PQstatus(hb->pg) != CONNECTION_OK) {
        PQfinish(hb->pg);
        hb->pg = NULL;
    }
    if (hb->pg == NULL)
        hb->pg = sk_pg_dial(&hb->conf->postgres, "sekali heartbeat", &err);
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
