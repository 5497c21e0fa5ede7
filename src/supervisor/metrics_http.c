/* metrics_http.c - serves GET /metrics, /livez and /readyz with
 * libmicrohttpd (see metrics_http.h).
 *
 * libmicrohttpd runs without a thread of its own (MHD_USE_EPOLL alone): the
 * supervisor polls its epoll descriptor beside the signalfd and lets it take
 * a step when that is readable or its timeout comes. So the supervisor stays
 * one thread, and fork() never copies a lock some other thread held.
 *
 * The listening socket is made here, not by libmicrohttpd: a port that
 * cannot be bound must stop sekalid with a message naming the configured
 * address, and the forked workers must close their copy of it, so its
 * descriptor has to be known. Nothing here logs: the supervisor logs what
 * start returns.
 *
 * Slow clients: libmicrohttpd's timeout is an idle one, which a client
 * sending a byte a second never reaches, and its connection limit leaves
 * everyone else waiting in the backlog: sixteen such clients would keep
 * /livez, an orchestrator's liveness probe, unanswered for as long as they
 * like. So each request must have its headers in within HEADER_DEADLINE_MS
 * of the connection's start or of its previous answer; and while every
 * slot is taken and someone waits in the backlog, the connection that has
 * waited longest for its request is cut, so that a probe, which sends its
 * request at once, always gets in and is answered. A connection is cut
 * with shutdown(): libmicrohttpd reads the end of it and closes it as it
 * would any other, and keeps the descriptor its own. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "clock.h"
#include "metrics_http.h"
#include "metrics_text.h"

#define BACKLOG            64
#define MAX_CONNECTIONS    16  /* scrapers are few; anything more is a mistake or worse */
#define CONNECTION_TIMEOUT 10  /* seconds an idle connection is kept (but see below) */
#define HEADER_DEADLINE_MS 1000 /* from a connection's start or last answer to its request */
#define FULL_CHECK_MS      50   /* while every slot is taken: how often the backlog is looked at */
#define CONTENT_TYPE       "text/plain; version=0.0.4; charset=utf-8"
#define STATUS_MAX         1024

struct sk_metrics_http {
    struct MHD_Daemon    *daemon;
    int                   listen_fd;
    int                   epoll_fd;    /* libmicrohttpd's, polled by the supervisor */
    int                   conns[MAX_CONNECTIONS];  /* open connections; -1: none */
    int64_t               since[MAX_CONNECTIONS];  /* their start or last answer, sk_now_ms() */
    unsigned long         closed;      /* connections closed so far, for run() */
    const struct sk_conf *conf;
    struct sk_metrics    *metrics;
    sk_metrics_http_render_fn inflight;  /* /inflight's document, the supervisor's */
    void                 *inflight_arg;
    bool                  ready;       /* /readyz's verdict, */
    char                  status[STATUS_MAX];  /* and its text */
};

static int listen_on(const struct sk_metrics_conf *mc, int *fd, struct sk_err *err);
static int mhd_timeout(struct sk_metrics_http *h);
static int cut_slow(struct sk_metrics_http *h);
static size_t slot_of(struct sk_metrics_http *h, struct MHD_Connection *conn);
static bool backlog_waiting(const struct sk_metrics_http *h);
static void track(void *cls, struct MHD_Connection *conn, void **socket_context,
                  enum MHD_ConnectionNotificationCode code);
static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **request);
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int status,
                             const char *text);
static enum MHD_Result readyz(struct sk_metrics_http *h, struct MHD_Connection *conn);
static enum MHD_Result document(struct MHD_Connection *conn, char *text, size_t len,
                                const char *type);
static bool authorized(const struct sk_metrics_http *h, struct MHD_Connection *conn);
static enum MHD_Result send_response(struct MHD_Connection *conn, unsigned int status,
                                     struct MHD_Response *resp);

int sk_metrics_http_start(struct sk_metrics_http **out, const struct sk_conf *conf,
                          struct sk_metrics *m, struct sk_err *err)
{
    *out = NULL;
    if (conf->metrics.listen_host == NULL)
        return SK_OK;
    struct sk_metrics_http *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return sk_err_errno(err, SK_AGAIN, "calloc(metrics http)");
    h->conf = conf;
    h->metrics = m;
    for (size_t i = 0; i < MAX_CONNECTIONS; i++)
        h->conns[i] = -1;
    snprintf(h->status, sizeof(h->status), "starting: the workers are not consuming yet");
    int rc = listen_on(&conf->metrics, &h->listen_fd, err);
    if (rc != SK_OK) {
        free(h);
        return rc;
    }
    h->daemon = MHD_start_daemon(MHD_USE_EPOLL, 0, NULL, NULL, answer, h,
                                 MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->listen_fd,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned int)MAX_CONNECTIONS,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT,
                                 MHD_OPTION_NOTIFY_CONNECTION, track, h,
                                 MHD_OPTION_END);
    if (h->daemon == NULL) {
        close(h->listen_fd);  /* not yet libmicrohttpd's */
        free(h);
        return sk_err_set(err, SK_AGAIN, "MHD_start_daemon(metrics) failed");
    }
    h->epoll_fd = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_EPOLL_FD)->epoll_fd;
    *out = h;
    return SK_OK;
}

void sk_metrics_http_stop(struct sk_metrics_http *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->daemon);  /* closes the connections and the listening socket */
    free(h);
}

/* Scrapes run in the supervisor's own loop, so none is in progress here. */
void sk_metrics_http_switch(struct sk_metrics_http *h, const struct sk_conf *conf,
                            struct sk_metrics *m)
{
    if (h == NULL)
        return;
    h->conf = conf;
    h->metrics = m;
    /* Like READY=1 to systemd: sent again only once the new generation
     * consumes. */
    h->ready = false;
    snprintf(h->status, sizeof(h->status), "reloading: the new workers are not consuming yet");
}

void sk_metrics_http_health(struct sk_metrics_http *h, bool ready, const char *status)
{
    if (h == NULL)
        return;
    h->ready = ready;
    snprintf(h->status, sizeof(h->status), "%s", status);
}

void sk_metrics_http_inflight(struct sk_metrics_http *h, sk_metrics_http_render_fn render,
                              void *arg)
{
    if (h == NULL)
        return;
    h->inflight = render;
    h->inflight_arg = arg;
}

void sk_metrics_http_poll(struct sk_metrics_http *h, struct pollfd *pfd, int *timeout)
{
    *pfd = (struct pollfd){ .fd = -1 };  /* poll() skips a negative fd */
    if (h == NULL)
        return;
    pfd->fd = h->epoll_fd;
    pfd->events = POLLIN;
    int due = mhd_timeout(h);
    int cut = cut_slow(h);
    if (due < 0 || (cut >= 0 && cut < due))
        due = cut;
    if (due >= 0 && (*timeout < 0 || due < *timeout))
        *timeout = due;
}

/* One step of libmicrohttpd's loop, taken again as long as a step closes
 * connections. At the connection limit libmicrohttpd takes the listening
 * socket out of its epoll set, and it puts it back only at the start of a
 * step, when it has room, while a step frees its closed connections at its
 * very end. A step that closes the connections of a full server therefore
 * ends with the socket still out; when no connection is left to time out,
 * the supervisor would then never see the descriptor readable again, and
 * the endpoint would never accept again. The step after a close puts it
 * back. */
void sk_metrics_http_serve(struct sk_metrics_http *h, const struct pollfd *pfd)
{
    if (h == NULL)
        return;
    bool cut = cut_slow(h) == 0;  /* cuts what is due: libmicrohttpd must see it */
    if (pfd->revents == 0 && mhd_timeout(h) != 0 && !cut)
        return;
    unsigned long closed;
    do {
        closed = h->closed;
        MHD_run(h->daemon);
    } while (h->closed != closed);
}

/* The fds are the parent's at fork(): its only thread was forking, not in
 * libmicrohttpd, so conns[] lists exactly the open connections. */
void sk_metrics_http_close_in_child(struct sk_metrics_http *h)
{
    if (h == NULL)
        return;
    close(h->listen_fd);
    close(h->epoll_fd);
    for (size_t i = 0; i < MAX_CONNECTIONS; i++)
        if (h->conns[i] >= 0)
            close(h->conns[i]);
}

/* Cuts (shutdown()) every connection past HEADER_DEADLINE_MS, and, while
 * every slot is taken and a client waits in the backlog, the one that has
 * waited longest. Returns 0 if it cut one (libmicrohttpd has work now), else
 * the milliseconds until it may have to, or -1 when no connection is open. */
static int cut_slow(struct sk_metrics_http *h)
{
    int64_t now = sk_now_ms(), next = -1;
    size_t open = 0, oldest = MAX_CONNECTIONS;
    bool cut = false;
    for (size_t i = 0; i < MAX_CONNECTIONS; i++) {
        if (h->conns[i] < 0)
            continue;
        open++;
        if (h->since[i] == INT64_MAX)
            continue;  /* cut already, not yet closed */
        int64_t left = h->since[i] + HEADER_DEADLINE_MS - now;
        if (left <= 0) {
            shutdown(h->conns[i], SHUT_RDWR);
            h->since[i] = INT64_MAX;
            cut = true;
            continue;
        }
        if (next < 0 || left < next)
            next = left;
        if (oldest == MAX_CONNECTIONS || h->since[i] < h->since[oldest])
            oldest = i;
    }
    if (open == MAX_CONNECTIONS && !cut) {
        if (oldest < MAX_CONNECTIONS && backlog_waiting(h)) {
            shutdown(h->conns[oldest], SHUT_RDWR);
            h->since[oldest] = INT64_MAX;
            cut = true;
        }
        /* Full, the backlog is not in libmicrohttpd's epoll set: look. */
        if (next < 0 || next > FULL_CHECK_MS)
            next = FULL_CHECK_MS;
    }
    return cut ? 0 : (int)next;
}

/* Whether a client waits to be accepted. */
static bool backlog_waiting(const struct sk_metrics_http *h)
{
    struct pollfd pfd = { .fd = h->listen_fd, .events = POLLIN };
    return poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLIN);
}

/* conn's index in conns[], or MAX_CONNECTIONS. */
static size_t slot_of(struct sk_metrics_http *h, struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    for (size_t i = 0; info != NULL && i < MAX_CONNECTIONS; i++)
        if (h->conns[i] == info->connect_fd)
            return i;
    return MAX_CONNECTIONS;
}

/* Milliseconds until libmicrohttpd has timed work (an idle connection to
 * close), 0 if it has work now, -1 if none. */
static int mhd_timeout(struct sk_metrics_http *h)
{
    MHD_UNSIGNED_LONG_LONG next;
    if (MHD_get_timeout(h->daemon, &next) != MHD_YES)
        return -1;
    return next > INT32_MAX ? INT32_MAX : (int)next;
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

/* Keeps conns[] in step with libmicrohttpd's open connections, for
 * sk_metrics_http_close_in_child(), and counts the closed ones for
 * sk_metrics_http_serve(). */
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
            h->since[i] = sk_now_ms();
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
    /* The deadline for the connection's next request starts now. */
    size_t slot = slot_of(h, conn);
    if (slot < MAX_CONNECTIONS)
        h->since[slot] = sk_now_ms();

    bool health = strcmp(url, "/livez") == 0 || strcmp(url, "/readyz") == 0;
    bool inflight = strcmp(url, "/inflight") == 0;
    if (strcmp(url, "/metrics") != 0 && !health && !inflight)
        return reply(conn, MHD_HTTP_NOT_FOUND,
                     "not found: try /metrics, /inflight, /livez or /readyz\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    if (!authorized(h, conn))
        return reply(conn, MHD_HTTP_UNAUTHORIZED, "a bearer token is required "
                     "(metrics.token_file)\n");
    if (health)
        return url[1] == 'l' ? reply(conn, MHD_HTTP_OK, "live\n") : readyz(h, conn);
    char *text = NULL;
    size_t len = 0;
    if (inflight) {
        text = h->inflight != NULL ? h->inflight(h->inflight_arg, &len) : NULL;
        return document(conn, text, len, "application/json");
    }
    if (sk_metrics_render(h->metrics, h->conf, &text, &len) != SK_OK)
        text = NULL;
    return document(conn, text, len, CONTENT_TYPE);
}

/* A rendered document, taken over (NULL: rendering ran out of memory). */
static enum MHD_Result document(struct MHD_Connection *conn, char *text, size_t len,
                                const char *type)
{
    if (text == NULL)
        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text,
                                                                MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
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
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    return send_response(conn, status, resp);
}

static enum MHD_Result readyz(struct sk_metrics_http *h, struct MHD_Connection *conn)
{
    char text[STATUS_MAX + 64];
    snprintf(text, sizeof(text), "%s: %s\n", h->ready ? "ready" : "not ready", h->status);
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text,
                                                                MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    return send_response(conn, h->ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, resp);
}

static enum MHD_Result send_response(struct MHD_Connection *conn, unsigned int status,
                                     struct MHD_Response *resp)
{
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);  /* the connection keeps its own reference */
    return rc;
}

/* With metrics.token_file, every path wants "Authorization: Bearer <token>".
 * Compared in time independent of where the first difference is, so that
 * the answer's timing does not spell the token out. */
static bool authorized(const struct sk_metrics_http *h, struct MHD_Connection *conn)
{
    const char *token = h->conf->metrics.token;
    if (token == NULL)
        return true;
    const char *got = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                  MHD_HTTP_HEADER_AUTHORIZATION);
    if (got == NULL || strncasecmp(got, "Bearer ", 7) != 0)
        return false;
    got += 7;
    size_t want = strlen(token), len = strlen(got);
    unsigned char diff = len != want;
    for (size_t i = 0; i < want; i++)
        diff |= (unsigned char)token[i] ^ (unsigned char)(i < len ? got[i] : 0);
    return diff == 0;
}
