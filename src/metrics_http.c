/* metrics_http.c - serves GET /metrics, /livez and /readyz with
 * libmicrohttpd (see metrics_http.h).
 *
 * Why not libmicrohttpd's own polling thread: the supervisor forks workers
 * while this server runs, and fork() copies only the forking thread, so any
 * lock another thread holds at that instant stays locked for ever in the
 * child. libmicrohttpd's thread could be anywhere: in malloc (ASan's
 * allocator is not fork-safe, and its workers were seen stuck on it), or in
 * gmtime_r() writing a Date header, holding glibc's time zone lock, which
 * the worker's first log line then waits on. So this file runs
 * libmicrohttpd's event loop in a thread of its own, and does every step of
 * it while holding `gate`, a mutex that fork() takes first (pthread_atfork):
 * a child is forked only while the thread waits in poll(), holding nothing.
 *
 * The listening socket is made here, not by libmicrohttpd: a port that
 * cannot be bound must stop sekalid with a message naming the configured
 * address, and the forked workers must close their copy of it, so its
 * descriptor has to be known. Nothing here logs: the supervisor's thread
 * logs what start returns, and the server thread stays silent.
 *
 * Health: the supervisor stamps each turn of its loop in an atomic, and
 * hands over its readiness verdict and text under `health_lock`, which the
 * server thread takes only while holding the gate, so it is never held
 * across fork() either. A supervisor stuck in its loop stops stamping while
 * this thread goes on answering: that is what /livez sees. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "backoff.h"
#include "metrics_http.h"

#define BACKLOG            64
#define MAX_CONNECTIONS    16  /* scrapers are few; anything more is a mistake or worse */
#define CONNECTION_TIMEOUT 10  /* seconds an idle connection is kept */
#define CONTENT_TYPE       "text/plain; version=0.0.4; charset=utf-8"
#define STATUS_MAX         512

struct sk_metrics_http {
    struct MHD_Daemon    *daemon;
    int                   listen_fd;
    int                   epoll_fd;    /* libmicrohttpd's, polled by the thread */
    int                   stop_fd;     /* eventfd: written to end the thread */
    int                   conns[MAX_CONNECTIONS];  /* open connections; -1: none */
    unsigned long         closed;      /* connections closed so far, for run() */
    pthread_t             thread;
    sem_t                 running;     /* posted once the thread holds the gate */
    const struct sk_conf *conf;
    struct sk_metrics    *metrics;
    _Atomic int64_t       loop_ms;     /* the supervisor's loop last turned */
    /* /readyz's verdict and text: written by the supervisor's thread only,
     * under health_lock; read by the server thread under it. */
    pthread_mutex_t       health_lock;
    bool                  ready;
    char                  status[STATUS_MAX];
};

/* Held by the server thread except while it waits in poll(). */
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t  gate_once = PTHREAD_ONCE_INIT;

static void gate_install(void);
static void gate_lock(void);
static void gate_unlock(void);
static int listen_on(const struct sk_metrics_conf *mc, int *fd, struct sk_err *err);
static void *serve(void *arg);
static void run(struct sk_metrics_http *h);
static void track(void *cls, struct MHD_Connection *conn, void **socket_context,
                  enum MHD_ConnectionNotificationCode code);
static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **request);
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int status,
                             const char *text);
static enum MHD_Result reply_copy(struct MHD_Connection *conn, unsigned int status,
                                  const char *text);
static enum MHD_Result livez(struct sk_metrics_http *h, struct MHD_Connection *conn);
static enum MHD_Result readyz(struct sk_metrics_http *h, struct MHD_Connection *conn);
static enum MHD_Result send_response(struct MHD_Connection *conn, unsigned int status,
                                     struct MHD_Response *resp);

int sk_metrics_http_start(struct sk_metrics_http **out, const struct sk_conf *conf,
                          struct sk_metrics *m, struct sk_err *err)
{
    *out = NULL;
    if (conf->metrics.listen_host == NULL)
        return SK_OK;
    int rc = pthread_once(&gate_once, gate_install);
    if (rc != 0) {
        errno = rc;
        return sk_err_errno(err, SK_AGAIN, "pthread_atfork(metrics)");
    }
    struct sk_metrics_http *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return sk_err_errno(err, SK_AGAIN, "calloc(metrics http)");
    h->conf = conf;
    h->metrics = m;
    for (size_t i = 0; i < MAX_CONNECTIONS; i++)
        h->conns[i] = -1;
    h->stop_fd = -1;
    sem_init(&h->running, 0, 0);
    pthread_mutex_init(&h->health_lock, NULL);
    atomic_store(&h->loop_ms, sk_now_ms());
    snprintf(h->status, sizeof(h->status), "starting: the workers are not consuming yet");
    if ((rc = listen_on(&conf->metrics, &h->listen_fd, err)) != SK_OK)
        goto fail;

    rc = SK_AGAIN;
    h->daemon = MHD_start_daemon(MHD_USE_EPOLL, 0, NULL, NULL, answer, h,
                                 MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->listen_fd,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned int)MAX_CONNECTIONS,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT,
                                 MHD_OPTION_NOTIFY_CONNECTION, track, h,
                                 MHD_OPTION_END);
    if (h->daemon == NULL) {
        sk_err_set(err, SK_AGAIN, "MHD_start_daemon(metrics) failed");
        close(h->listen_fd);  /* not yet libmicrohttpd's */
        goto fail;
    }
    h->epoll_fd = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_EPOLL_FD)->epoll_fd;
    if ((h->stop_fd = eventfd(0, EFD_CLOEXEC)) < 0) {
        sk_err_errno(err, SK_AGAIN, "eventfd(metrics)");
        goto fail;
    }

    /* Signals stay the business of the supervisor's signalfd: the thread
     * starts with all of them blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int e = pthread_create(&h->thread, NULL, serve, h);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        errno = e;
        sk_err_errno(err, SK_AGAIN, "pthread_create(metrics)");
        goto fail;
    }
    /* Until the thread holds the gate, it is still being set up (by libc or
     * a sanitizer, which may allocate): no fork() before that. */
    while (sem_wait(&h->running) != 0 && errno == EINTR)
        ;
    *out = h;
    return SK_OK;

fail:
    if (h->stop_fd >= 0)
        close(h->stop_fd);
    if (h->daemon != NULL)
        MHD_stop_daemon(h->daemon);  /* closes the listening socket too */
    sem_destroy(&h->running);
    pthread_mutex_destroy(&h->health_lock);
    free(h);
    return rc;
}

void sk_metrics_http_stop(struct sk_metrics_http *h)
{
    if (h == NULL)
        return;
    uint64_t one = 1;
    while (write(h->stop_fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
    pthread_join(h->thread, NULL);
    MHD_stop_daemon(h->daemon);  /* closes the connections and the listening socket */
    close(h->stop_fd);
    sem_destroy(&h->running);
    pthread_mutex_destroy(&h->health_lock);
    free(h);
}

/* The server thread renders only while it holds the gate, so taking the gate
 * here waits for a scrape in progress, and the next one reads the new
 * generation. */
void sk_metrics_http_switch(struct sk_metrics_http *h, const struct sk_conf *conf,
                            struct sk_metrics *m)
{
    if (h == NULL)
        return;
    gate_lock();
    h->conf = conf;
    h->metrics = m;
    /* Like READY=1 to systemd: sent again only once the new generation
     * consumes. */
    pthread_mutex_lock(&h->health_lock);
    h->ready = false;
    snprintf(h->status, sizeof(h->status), "reloading: the new workers are not consuming yet");
    pthread_mutex_unlock(&h->health_lock);
    gate_unlock();
}

/* Only the supervisor's thread writes ready and status, so it may compare
 * them without the lock; it takes it to change them. */
void sk_metrics_http_health(struct sk_metrics_http *h, bool ready, const char *status)
{
    if (h == NULL)
        return;
    atomic_store(&h->loop_ms, sk_now_ms());
    if (ready == h->ready && strncmp(status, h->status, sizeof(h->status) - 1) == 0)
        return;
    pthread_mutex_lock(&h->health_lock);
    h->ready = ready;
    snprintf(h->status, sizeof(h->status), "%s", status);
    pthread_mutex_unlock(&h->health_lock);
}

/* The gate is held across fork(), so the connections listed are exactly
 * those open in the parent at that instant. */
void sk_metrics_http_close_in_child(struct sk_metrics_http *h)
{
    if (h == NULL)
        return;
    close(h->listen_fd);
    close(h->epoll_fd);
    close(h->stop_fd);
    for (size_t i = 0; i < MAX_CONNECTIONS; i++)
        if (h->conns[i] >= 0)
            close(h->conns[i]);
}

/* Both sides unlock after fork(): the child's only thread is the copy of
 * the one that locked it (the usual pthread_atfork pairing). */
static void gate_install(void)
{
    if (pthread_atfork(gate_lock, gate_unlock, gate_unlock) != 0)
        abort();  /* ENOMEM at start; pthread_once cannot report it */
}

static void gate_lock(void)
{
    pthread_mutex_lock(&gate);
}

static void gate_unlock(void)
{
    pthread_mutex_unlock(&gate);
}

/* Binds the first address the configured host resolves to. SO_REUSEADDR
 * lets a restarted sekalid listen while the old one's connections are in
 * TIME_WAIT; it does not let two live sockets listen on one port. */
static int listen_on(const struct sk_metrics_conf *mc, int *fd, struct sk_err *err)
{
    const char *host = mc->listen_host;
    const char *lb = strchr(host, ':') != NULL ? "[" : "", *rb = *lb ? "]" : "";
    char port[8];
    snprintf(port, sizeof(port), "%d", mc->listen_port);

    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0)
        return sk_err_set(err, SK_ERR, "metrics.listen %s%s%s:%s: cannot resolve the host: %s",
                          lb, host, rb, port, gai_strerror(gai));
    *fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                 ai->ai_protocol);
    if (*fd < 0) {
        freeaddrinfo(ai);
        return sk_err_errno(err, SK_AGAIN, "socket(metrics)");
    }
    int on = 1;
    setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    int rc = SK_OK;
    if (bind(*fd, ai->ai_addr, ai->ai_addrlen) != 0)
        rc = sk_err_errno(err, SK_ERR, "metrics.listen %s%s%s:%s: cannot listen there: bind",
                          lb, host, rb, port);
    else if (listen(*fd, BACKLOG) != 0)
        rc = sk_err_errno(err, SK_ERR, "metrics.listen %s%s%s:%s: cannot listen there: listen",
                          lb, host, rb, port);
    freeaddrinfo(ai);
    if (rc != SK_OK)
        close(*fd);
    return rc;
}

/* The server thread: libmicrohttpd's event loop, run under the gate. */
static void *serve(void *arg)
{
    struct sk_metrics_http *h = arg;
    pthread_setname_np(pthread_self(), "sk-metrics");

    pthread_mutex_lock(&gate);
    sem_post(&h->running);
    for (;;) {
        MHD_UNSIGNED_LONG_LONG next;
        int timeout = -1;  /* nothing timed: only sockets or a stop wake us */
        if (MHD_get_timeout(h->daemon, &next) == MHD_YES)
            timeout = next > INT32_MAX ? INT32_MAX : (int)next;
        pthread_mutex_unlock(&gate);
        struct pollfd fds[2] = {
            { .fd = h->epoll_fd, .events = POLLIN },
            { .fd = h->stop_fd, .events = POLLIN },
        };
        int n = poll(fds, 2, timeout);
        pthread_mutex_lock(&gate);
        if (n > 0 && fds[1].revents != 0)
            break;
        run(h);
    }
    pthread_mutex_unlock(&gate);
    return NULL;
}

/* One step of libmicrohttpd's loop, taken again as long as a step closes
 * connections. At the connection limit libmicrohttpd takes the listening
 * socket out of its epoll set, and it puts it back only at the start of a
 * step, when it has room, while a step frees its closed connections at its
 * very end. A step that closes the connections of a full server therefore
 * ends with the socket still out; when no connection is left to time out,
 * serve() would then wait with no timeout on an empty set, and the endpoint
 * would never accept again. The step after a close puts it back. */
static void run(struct sk_metrics_http *h)
{
    unsigned long closed;
    do {
        closed = h->closed;
        MHD_run(h->daemon);
    } while (h->closed != closed);
}

/* Keeps conns[] in step with libmicrohttpd's open connections, for
 * sk_metrics_http_close_in_child(), and counts the closed ones for run().
 * Runs in MHD_run(), under the gate. */
static void track(void *cls, struct MHD_Connection *conn, void **socket_context,
                  enum MHD_ConnectionNotificationCode code)
{
    struct sk_metrics_http *h = cls;
    (void)socket_context;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED)
        h->closed++;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info == NULL)
        return;
    int fd = info->connect_fd;
    for (size_t i = 0; i < MAX_CONNECTIONS; i++) {
        if (code == MHD_CONNECTION_NOTIFY_STARTED && h->conns[i] < 0) {
            h->conns[i] = fd;
            return;
        }
        if (code == MHD_CONNECTION_NOTIFY_CLOSED && h->conns[i] == fd) {
            h->conns[i] = -1;
            return;
        }
    }
}

/* Called by libmicrohttpd once a request's headers are in; a GET has no
 * body to wait for, so every request is answered on the first call. */
static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **request)
{
    struct sk_metrics_http *h = cls;
    (void)version, (void)upload, (void)upload_size, (void)request;

    bool health = strcmp(url, "/livez") == 0 || strcmp(url, "/readyz") == 0;
    if (strcmp(url, "/metrics") != 0 && !health)
        return reply(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /livez or /readyz\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    if (health)
        return url[1] == 'l' ? livez(h, conn) : readyz(h, conn);
    char *text;
    size_t len;
    if (sk_metrics_render(h->metrics, h->conf, &text, &len) != SK_OK)
        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text,
                                                                MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
    return send_response(conn, MHD_HTTP_OK, resp);
}

/* A short constant text, for everything but the metrics. */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int status,
                             const char *text)
{
    /* PERSISTENT: libmicrohttpd neither copies, frees nor writes it. */
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                                MHD_RESPMEM_PERSISTENT);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    return send_response(conn, status, resp);
}

/* How long the supervisor's loop has been stuck, or 0 if it turns. */
static int64_t stalled_ms(struct sk_metrics_http *h)
{
    int64_t age = sk_now_ms() - atomic_load(&h->loop_ms);
    return age > SK_LIVEZ_STALL_MS ? age : 0;
}

static enum MHD_Result livez(struct sk_metrics_http *h, struct MHD_Connection *conn)
{
    int64_t stalled = stalled_ms(h);
    if (stalled == 0)
        return reply(conn, MHD_HTTP_OK, "live\n");
    char text[128];
    snprintf(text, sizeof(text), "not live: the supervisor's loop has not turned for %lld ms\n",
             (long long)stalled);
    return reply_copy(conn, MHD_HTTP_SERVICE_UNAVAILABLE, text);
}

/* A stuck supervisor's last verdict is stale: it cannot see workers die. */
static enum MHD_Result readyz(struct sk_metrics_http *h, struct MHD_Connection *conn)
{
    char text[STATUS_MAX + 64];
    int64_t stalled = stalled_ms(h);
    if (stalled != 0) {
        snprintf(text, sizeof(text), "not ready: the supervisor's loop has not turned for "
                 "%lld ms\n", (long long)stalled);
        return reply_copy(conn, MHD_HTTP_SERVICE_UNAVAILABLE, text);
    }
    pthread_mutex_lock(&h->health_lock);
    bool ready = h->ready;
    snprintf(text, sizeof(text), "%s: %s\n", ready ? "ready" : "not ready", h->status);
    pthread_mutex_unlock(&h->health_lock);
    return reply_copy(conn, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text);
}

/* A text made for this request; libmicrohttpd keeps its own copy. */
static enum MHD_Result reply_copy(struct MHD_Connection *conn, unsigned int status,
                                  const char *text)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                                MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    return send_response(conn, status, resp);
}

static enum MHD_Result send_response(struct MHD_Connection *conn, unsigned int status,
                                     struct MHD_Response *resp)
{
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);  /* the connection keeps its own reference */
    return rc;
}
