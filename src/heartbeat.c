/* heartbeat.c - renews the running job's lock from a second thread.
 *
 * The main thread only swaps the watched (key, token) under a mutex; it never
 * waits for Redis on the thread's behalf. The thread wakes on a fixed tick of
 * ttl/3 instead of being signalled per job: a lease taken just after a tick is
 * first renewed at most 2*ttl/3 later, still inside its ttl, and the hot path
 * pays for no wake-up. A generation number keeps a renewal that raced with
 * unwatch() from flagging the next job's lock as lost. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "envelope.h"
#include "failpoint.h"
#include "heartbeat.h"
#include "lock.h"
#include "log.h"

struct sk_heartbeat {
    const struct sk_redis_conf *conf;
    uint32_t                    ttl_ms;
    pthread_t                   thread;
    pthread_mutex_t             mutex;
    pthread_cond_t              cond;
    bool                        stopping;
    bool                        watching;
    uint64_t                    generation;
    char                        key[SK_KEY_MAX + 64];
    char                        token[SK_LOCK_TOKEN_LEN + 1];
    atomic_bool                 lost;
};

static void *run(void *arg);
static struct timespec deadline_after(uint32_t ms);

int sk_heartbeat_start(struct sk_heartbeat **out, const struct sk_redis_conf *conf,
                       uint32_t ttl_ms, struct sk_err *err)
{
    struct sk_heartbeat *hb = calloc(1, sizeof(*hb));
    if (hb == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(heartbeat)");
    hb->conf = conf;
    hb->ttl_ms = ttl_ms;
    atomic_init(&hb->lost, false);
    pthread_mutex_init(&hb->mutex, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&hb->cond, &attr);
    pthread_condattr_destroy(&attr);

    /* Signals belong to the main thread's loop; this thread must never run a
     * handler in the middle of a Redis call. */
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
    pthread_cond_destroy(&hb->cond);
    pthread_mutex_destroy(&hb->mutex);
    free(hb);
}

void sk_heartbeat_watch(struct sk_heartbeat *hb, const char *key, const char *token)
{
    pthread_mutex_lock(&hb->mutex);
    snprintf(hb->key, sizeof(hb->key), "%s", key);
    memcpy(hb->token, token, sizeof(hb->token));
    hb->watching = true;
    hb->generation++;
    atomic_store(&hb->lost, false);
    pthread_mutex_unlock(&hb->mutex);
}

void sk_heartbeat_unwatch(struct sk_heartbeat *hb)
{
    pthread_mutex_lock(&hb->mutex);
    hb->watching = false;
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
    struct sk_lock *lock = NULL;
    uint32_t tick_ms = hb->ttl_ms / 3 > 0 ? hb->ttl_ms / 3 : 1;
    bool redis_down = false;

    pthread_mutex_lock(&hb->mutex);
    for (;;) {
        struct timespec deadline = deadline_after(tick_ms);
        while (!hb->stopping &&
               pthread_cond_timedwait(&hb->cond, &hb->mutex, &deadline) == 0)
            ;
        if (hb->stopping)
            break;
        if (!hb->watching)
            continue;

        char key[sizeof(hb->key)], token[sizeof(hb->token)];
        memcpy(key, hb->key, sizeof(key));
        memcpy(token, hb->token, sizeof(token));
        uint64_t generation = hb->generation;
        pthread_mutex_unlock(&hb->mutex);

        struct sk_err err = { 0 };
        int rc = lock != NULL ? SK_OK : sk_lock_open(&lock, hb->conf, &err);
        if (sk_fault_active("no_renew")) {
            pthread_mutex_lock(&hb->mutex);
            continue;
        }
        if (rc == SK_OK)
            rc = sk_lock_renew(lock, key, token, hb->ttl_ms, &err);
        if (rc == SK_AGAIN && !redis_down)
            sk_log_warn("lock renewal failed, will retry each %u ms: %s", tick_ms, err.msg);
        redis_down = rc == SK_AGAIN;

        pthread_mutex_lock(&hb->mutex);
        if (rc == SK_BUSY && hb->generation == generation && hb->watching) {
            atomic_store(&hb->lost, true);
            sk_log_warn("lock %s lost while the job runs (expired or taken over)", key);
        }
    }
    pthread_mutex_unlock(&hb->mutex);
    sk_lock_close(lock);
    return NULL;
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
