/* ctl_pool.c - the PostgreSQL and AMQP connections that sekalictl's reports
 * take and give back (ctl_common.h). A command run once dials for each
 * report and closes after it, as it always did; `sekalictl serve` starts a
 * pool, so that its requests share a few connections instead of paying a
 * dial (TCP, TLS, authentication) each, and a busy console cannot take more
 * than a few of PostgreSQL's max_connections.
 *
 * One pool per process, behind a mutex: libmicrohttpd answers each console
 * connection on a thread of its own, and a connection is lent to one thread
 * at a time (libpq's and librabbitmq's rule). A PostgreSQL session comes
 * back reset (sk_pg_reset(): DISCARD ALL), so no request sees what another
 * left (a SET lock_timeout, an advisory lock); one that cannot be reset,
 * was lost or is inside a transaction is closed, never lent again; so is a
 * broker connection that failed. An idle connection is looked at before it
 * is lent: a server that restarted or ended it has closed its socket, which
 * then reads as ready, and a new one is dialled instead, so the request
 * after a restart does not fail. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "clock.h"
#include "ctl_common.h"

#define APPLICATION "sekalictl serve"  /* pg_stat_activity's application_name */
#define POOL_MAX    16

struct idle {
    void   *conn;
    int64_t since;                       /* given back at (sk_now_ms()) */
};

/* The connections of one kind: PostgreSQL sessions, or AMQP connections. */
struct shelf {
    const char *what;                    /* for the message of a wait that timed out */
    size_t      open;                    /* idle and lent */
    struct idle idle[POOL_MAX];
    size_t      n_idle;
    bool      (*fit)(void *conn, int64_t idle_ms);  /* may be lent again now */
    bool      (*ready)(void *conn);                 /* may go back on the shelf */
    void      (*close)(void *conn);
};

static bool pg_fit(void *conn, int64_t idle_ms);
static bool pg_ready(void *conn);
static void pg_close(void *conn);
static bool amqp_fit(void *conn, int64_t idle_ms);
static bool amqp_ready(void *conn);
static void amqp_close(void *conn);

static struct {
    pthread_mutex_t       lock;
    /* A connection of either kind came back, or an open one closed: a
     * broadcast, since the waiters of the other kind share it. */
    pthread_cond_t        given;
    const struct sk_conf *conf;       /* NULL: no pool, each take dials */
    size_t                size;       /* connections of each kind open at most */
    unsigned              idle_s, wait_s;
    struct shelf          pg, amqp;
} pool = {
    .lock = PTHREAD_MUTEX_INITIALIZER, .given = PTHREAD_COND_INITIALIZER,
    .pg = { .what = "PostgreSQL sessions", .fit = pg_fit, .ready = pg_ready, .close = pg_close },
    .amqp = { .what = "AMQP connections", .fit = amqp_fit, .ready = amqp_ready,
              .close = amqp_close },
};

/* What take() found. */
enum got {
    GOT,         /* an idle connection */
    DIAL,        /* room for one more: dial it, and drop() it if that fails */
    DIAL_ALONE,  /* no pool: dial, and close it after */
    BUSY,        /* all lent for the whole wait (said on stderr) */
};

static enum got take(struct shelf *s, void **conn);
static void give(struct shelf *s, void *conn);
static void drop(struct shelf *s);
static size_t sweep(struct shelf *s, int64_t now, void **old, size_t n_old);
static void sweep_all(int64_t now);
static void close_all(struct shelf *s, void **conns, size_t n);

void sk_ctl_pool_start(const struct sk_conf *conf, size_t size, unsigned idle_s,
                       unsigned wait_s)
{
    pthread_mutex_lock(&pool.lock);
    pool.conf = conf;
    pool.size = size < 1 ? 1 : size > POOL_MAX ? POOL_MAX : size;
    pool.idle_s = idle_s;
    pool.wait_s = wait_s;
    pool.pg.open = pool.pg.n_idle = pool.amqp.open = pool.amqp.n_idle = 0;
    pthread_mutex_unlock(&pool.lock);
}

void sk_ctl_pool_stop(void)
{
    pthread_mutex_lock(&pool.lock);
    pool.conf = NULL;
    pthread_mutex_unlock(&pool.lock);
    sweep_all(INT64_MAX);
}

void sk_ctl_pool_sweep(void)
{
    sweep_all(sk_now_ms());
}

PGconn *sk_ctl_pg_take(const struct sk_conf *conf)
{
    void *conn;
    switch (take(&pool.pg, &conn)) {
    case GOT: return conn;
    case BUSY: return NULL;
    case DIAL_ALONE: return sk_ctl_pg_connect(conf);
    case DIAL: break;
    }
    struct sk_err err = { 0 };
    PGconn *pg = sk_pg_dial(&conf->postgres, APPLICATION, &err);
    if (pg == NULL) {
        fprintf(stderr, "sekalictl: %s\n", err.msg);
        drop(&pool.pg);
    }
    return pg;
}

void sk_ctl_pg_give(PGconn *pg)
{
    if (pg != NULL)
        give(&pool.pg, pg);
}

int sk_ctl_broker_take(const struct sk_conf *conf, struct sk_broker **b, struct sk_err *err)
{
    void *conn = NULL;
    *b = NULL;
    switch (take(&pool.amqp, &conn)) {
    case GOT:
        *b = conn;
        return SK_OK;
    case BUSY:
        return sk_err_set(err, SK_AGAIN, "all of the console's AMQP connections stayed busy");
    case DIAL_ALONE:
        return sk_broker_open(b, &conf->amqp, err);
    case DIAL:
        break;
    }
    int rc = sk_broker_open(b, &conf->amqp, err);
    if (rc != SK_OK)
        drop(&pool.amqp);
    return rc;
}

void sk_ctl_broker_give(struct sk_broker *b)
{
    if (b != NULL)
        give(&pool.amqp, b);
}

static enum got take(struct shelf *s, void **conn)
{
    void *unfit[POOL_MAX];
    size_t n_unfit = 0;
    enum got got = DIAL;
    pthread_mutex_lock(&pool.lock);
    if (pool.conf == NULL) {
        pthread_mutex_unlock(&pool.lock);
        return DIAL_ALONE;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += pool.wait_s;
    for (;;) {
        /* The one given back last: the others age out when few are needed.
         * (Those found unfit while this waits can outnumber the shelf.) */
        while (s->n_idle > 0 && got != GOT && n_unfit < POOL_MAX) {
            struct idle *i = &s->idle[--s->n_idle];
            if (s->fit(i->conn, sk_now_ms() - i->since)) {
                *conn = i->conn;
                got = GOT;
            } else {
                unfit[n_unfit++] = i->conn;
                s->open--;
            }
        }
        if (got == GOT)
            break;
        if (s->open < pool.size) {
            s->open++;
            break;
        }
        if (pthread_cond_timedwait(&pool.given, &pool.lock, &until) == ETIMEDOUT) {
            fprintf(stderr, "sekalictl: all %zu of the console's %s stayed busy for %u s\n",
                    pool.size, s->what, pool.wait_s);
            got = BUSY;
            break;
        }
    }
    pthread_mutex_unlock(&pool.lock);
    /* Closed outside the lock: a broker connection says goodbye politely. */
    close_all(s, unfit, n_unfit);
    return got;
}

/* Back on the shelf when ready for the next taker, else closed (always
 * without a pool). */
static void give(struct shelf *s, void *conn)
{
    pthread_mutex_lock(&pool.lock);
    bool pooled = pool.conf != NULL;
    pthread_mutex_unlock(&pool.lock);
    /* Outside the lock: a reset is a round trip, and others may take
     * meanwhile. */
    bool keep = pooled && s->ready(conn);
    pthread_mutex_lock(&pool.lock);
    if (pool.conf == NULL)
        keep = false;
    else if (keep && s->n_idle < POOL_MAX)
        s->idle[s->n_idle++] = (struct idle){ .conn = conn, .since = sk_now_ms() };
    else {
        keep = false;
        if (s->open > 0)
            s->open--;
    }
    pthread_cond_broadcast(&pool.given);
    pthread_mutex_unlock(&pool.lock);
    if (!keep)
        s->close(conn);
}

/* A dial that take() made room for failed. */
static void drop(struct shelf *s)
{
    pthread_mutex_lock(&pool.lock);
    if (pool.conf != NULL && s->open > 0)
        s->open--;
    pthread_cond_broadcast(&pool.given);
    pthread_mutex_unlock(&pool.lock);
}

/* Takes the connections idle since before now - idle_s, and those no
 * longer fit to lend (ended by their server), off s into old; how many.
 * Called with pool.lock held. */
static size_t sweep(struct shelf *s, int64_t now, void **old, size_t n_old)
{
    size_t n = 0, kept = 0;
    for (size_t i = 0; i < s->n_idle; i++) {
        int64_t idle_ms = now - s->idle[i].since;
        if (n < n_old && (idle_ms >= (int64_t)pool.idle_s * 1000 ||
                          !s->fit(s->idle[i].conn, idle_ms)))
            old[n++] = s->idle[i].conn;
        else
            s->idle[kept++] = s->idle[i];
    }
    s->n_idle = kept;
    s->open = s->open >= n ? s->open - n : 0;
    return n;
}

/* Closes the connections idle since before now - idle_s or unfit (all,
 * at INT64_MAX). */
static void sweep_all(int64_t now)
{
    void *old_pg[POOL_MAX], *old_amqp[POOL_MAX];
    pthread_mutex_lock(&pool.lock);
    size_t n_pg = sweep(&pool.pg, now, old_pg, POOL_MAX);
    size_t n_amqp = sweep(&pool.amqp, now, old_amqp, POOL_MAX);
    if (n_pg + n_amqp > 0)
        pthread_cond_broadcast(&pool.given);
    pthread_mutex_unlock(&pool.lock);
    close_all(&pool.pg, old_pg, n_pg);
    close_all(&pool.amqp, old_amqp, n_amqp);
}

static void close_all(struct shelf *s, void **conns, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s->close(conns[i]);
}

/* An idle session has nothing to say: a socket ready to read holds the
 * server's goodbye (a restart, pg_terminate_backend) or its close. */
static bool pg_fit(void *conn, int64_t idle_ms)
{
    (void)idle_ms;
    PGconn *pg = conn;
    if (PQstatus(pg) != CONNECTION_OK || PQtransactionStatus(pg) != PQTRANS_IDLE)
        return false;
    struct pollfd p = { .fd = PQsocket(pg), .events = POLLIN };
    return p.fd >= 0 && poll(&p, 1, 0) == 0;
}

static bool pg_ready(void *conn)
{
    return sk_pg_reset(conn, NULL) == SK_OK;
}

static void pg_close(void *conn)
{
    PQfinish(conn);
}

/* librabbitmq reads nothing while the connection idles, and gives up on a
 * connection that heard nothing for two heartbeats (amqp.heartbeat): one
 * idle for half a heartbeat is closed rather than risked. */
static bool amqp_fit(void *conn, int64_t idle_ms)
{
    uint32_t heartbeat_ms = pool.conf != NULL ? pool.conf->amqp.heartbeat_ms : 0;
    return sk_broker_idle_ok(conn) && (heartbeat_ms == 0 || idle_ms < heartbeat_ms / 2);
}

static bool amqp_ready(void *conn)
{
    return sk_broker_idle_ok(conn);
}

static void amqp_close(void *conn)
{
    sk_broker_close(conn);
}
