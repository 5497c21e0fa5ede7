/* ctl_pool.c - the PostgreSQL connections that sekalictl's reports take and
 * give back (ctl_common.h). A command run once dials for each report and
 * closes after it, as it always did; `sekalictl serve` installs a pool, so
 * that its requests share a few sessions instead of paying a dial (TCP, TLS,
 * authentication) each, and a busy console cannot take more than a few of
 * PostgreSQL's max_connections.
 *
 * One pool per process, behind a mutex: libmicrohttpd answers each console
 * connection on a thread of its own, and a connection is lent to one thread
 * at a time (libpq's rule). A session comes back reset (sk_pg_reset():
 * DISCARD ALL), so no request sees what another left (a SET lock_timeout, an
 * advisory lock); one that cannot be reset, was lost or is inside a
 * transaction is closed, never lent again. An idle one is looked at before
 * it is lent: a server that restarted or terminated it has closed its
 * socket, which then reads as ready, and a new session is dialled instead,
 * so the request after a restart does not fail. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "ctl_common.h"

#define APPLICATION "sekalictl serve"  /* pg_stat_activity's application_name */
#define POOL_MAX    16

struct idle {
    PGconn *pg;
    time_t  since;   /* CLOCK_MONOTONIC seconds */
};

static struct {
    pthread_mutex_t       lock;
    pthread_cond_t        given;      /* a session came back, or an open one closed */
    const struct sk_conf *conf;       /* NULL: no pool, each take dials */
    size_t                size;       /* sessions open at most, idle and lent */
    size_t                open;
    unsigned              idle_s, wait_s;
    struct idle           idle[POOL_MAX];
    size_t                n_idle;
} pool = { .lock = PTHREAD_MUTEX_INITIALIZER, .given = PTHREAD_COND_INITIALIZER };

static time_t now_s(void);
static bool quiet(PGconn *pg);
static PGconn *dial(const struct sk_conf *conf);

void sk_ctl_pool_start(const struct sk_conf *conf, size_t size, unsigned idle_s,
                       unsigned wait_s)
{
    pthread_mutex_lock(&pool.lock);
    pool.conf = conf;
    pool.size = size < 1 ? 1 : size > POOL_MAX ? POOL_MAX : size;
    pool.idle_s = idle_s;
    pool.wait_s = wait_s;
    pool.open = pool.n_idle = 0;
    pthread_mutex_unlock(&pool.lock);
}

void sk_ctl_pool_stop(void)
{
    pthread_mutex_lock(&pool.lock);
    for (size_t i = 0; i < pool.n_idle; i++)
        PQfinish(pool.idle[i].pg);
    pool.conf = NULL;
    pool.open = pool.n_idle = 0;
    pthread_mutex_unlock(&pool.lock);
}

void sk_ctl_pool_sweep(void)
{
    PGconn *old[POOL_MAX];
    size_t n_old = 0, kept = 0;
    time_t now = now_s();
    pthread_mutex_lock(&pool.lock);
    for (size_t i = 0; i < pool.n_idle; i++) {
        if (now - pool.idle[i].since >= (time_t)pool.idle_s)
            old[n_old++] = pool.idle[i].pg;
        else
            pool.idle[kept++] = pool.idle[i];
    }
    pool.n_idle = kept;
    pool.open -= n_old;
    if (n_old > 0)
        pthread_cond_broadcast(&pool.given);
    pthread_mutex_unlock(&pool.lock);
    for (size_t i = 0; i < n_old; i++)
        PQfinish(old[i]);
}

PGconn *sk_ctl_pg_take(const struct sk_conf *conf)
{
    pthread_mutex_lock(&pool.lock);
    if (pool.conf == NULL) {
        pthread_mutex_unlock(&pool.lock);
        return sk_ctl_pg_connect(conf);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += pool.wait_s;
    for (;;) {
        /* The session given back last: the others age out when few are needed. */
        while (pool.n_idle > 0) {
            PGconn *pg = pool.idle[--pool.n_idle].pg;
            if (quiet(pg)) {
                pthread_mutex_unlock(&pool.lock);
                return pg;
            }
            PQfinish(pg);
            pool.open--;
        }
        if (pool.open < pool.size) {
            pool.open++;
            pthread_mutex_unlock(&pool.lock);
            PGconn *pg = dial(pool.conf);
            if (pg == NULL) {
                pthread_mutex_lock(&pool.lock);
                pool.open--;
                pthread_cond_signal(&pool.given);
                pthread_mutex_unlock(&pool.lock);
            }
            return pg;
        }
        if (pthread_cond_timedwait(&pool.given, &pool.lock, &until) == ETIMEDOUT) {
            size_t size = pool.size;
            pthread_mutex_unlock(&pool.lock);
            fprintf(stderr, "sekalictl: all %zu of the console's PostgreSQL sessions stayed "
                    "busy for %u s\n", size, pool.wait_s);
            return NULL;
        }
    }
}

void sk_ctl_pg_give(PGconn *pg)
{
    if (pg == NULL)
        return;
    pthread_mutex_lock(&pool.lock);
    bool pooled = pool.conf != NULL;
    pthread_mutex_unlock(&pool.lock);
    /* Reset outside the lock: it is a round trip, and others may take
     * meanwhile. */
    bool keep = pooled && sk_pg_reset(pg, NULL) == SK_OK;
    if (pooled) {
        pthread_mutex_lock(&pool.lock);
        if (keep && pool.conf != NULL && pool.n_idle < POOL_MAX)
            pool.idle[pool.n_idle++] = (struct idle){ .pg = pg, .since = now_s() };
        else {
            keep = false;
            if (pool.open > 0)
                pool.open--;
        }
        pthread_cond_signal(&pool.given);
        pthread_mutex_unlock(&pool.lock);
    }
    if (!keep)
        PQfinish(pg);
}

static time_t now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec;
}

/* An idle session has nothing to say: a socket ready to read holds the
 * server's goodbye (a restart, pg_terminate_backend) or its close. */
static bool quiet(PGconn *pg)
{
    if (PQstatus(pg) != CONNECTION_OK || PQtransactionStatus(pg) != PQTRANS_IDLE)
        return false;
    struct pollfd p = { .fd = PQsocket(pg), .events = POLLIN };
    return p.fd >= 0 && poll(&p, 1, 0) == 0;
}

static PGconn *dial(const struct sk_conf *conf)
{
    struct sk_err err = { 0 };
    PGconn *pg = sk_pg_dial(&conf->postgres, APPLICATION, &err);
    if (pg == NULL)
        fprintf(stderr, "sekalictl: %s\n", err.msg);
    return pg;
}
