/* metrics_http.c - serves GET /metrics with libmicrohttpd (see
 * metrics_http.h).
 *
 * The listening socket is made here, not by libmicrohttpd, for two reasons:
 * a port that cannot be bound must stop sekalid with a message that names
 * the configured address (it is a configuration problem), and the forked
 * workers must close their copy of the socket, so its descriptor has to be
 * known. Nothing here logs: the supervisor's thread logs what start returns,
 * and the server thread stays silent, so that it never holds a lock that a
 * fork() could copy in its locked state. */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "metrics_http.h"

#define BACKLOG            64
#define MAX_CONNECTIONS    16  /* scrapers are few; anything more is a mistake or worse */
#define CONNECTION_TIMEOUT 10  /* seconds an idle connection is kept */
#define CONTENT_TYPE       "text/plain; version=0.0.4; charset=utf-8"

struct sk_metrics_http {
    struct MHD_Daemon    *daemon;
    int                   fd;
    pthread_mutex_t       lock;     /* a reload swaps what is served under it */
    const struct sk_conf *conf;
    struct sk_metrics    *metrics;
};

static int listen_on(const struct sk_metrics_conf *mc, int *fd, struct sk_err *err);
static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **request);
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int status,
                             const char *text);
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
    pthread_mutex_init(&h->lock, NULL);
    int rc = listen_on(&conf->metrics, &h->fd, err);
    if (rc != SK_OK) {
        pthread_mutex_destroy(&h->lock);
        free(h);
        return rc;
    }

    /* The server's thread inherits this thread's signal mask: with every
     * signal blocked there, SIGTERM and SIGCHLD still reach only the
     * supervisor's signalfd, and a write to a closed connection cannot
     * raise SIGPIPE in it. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    h->daemon = MHD_start_daemon(MHD_USE_POLL_INTERNAL_THREAD, 0, NULL, NULL, answer, h,
                                 MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->fd,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned int)MAX_CONNECTIONS,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT,
                                 MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (h->daemon == NULL) {
        close(h->fd);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return sk_err_set(err, SK_AGAIN, "MHD_start_daemon(metrics) failed");
    }
    *out = h;
    return SK_OK;
}

void sk_metrics_http_stop(struct sk_metrics_http *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->daemon);  /* joins the thread, closes the listening socket too */
    pthread_mutex_destroy(&h->lock);
    free(h);
}

void sk_metrics_http_switch(struct sk_metrics_http *h, const struct sk_conf *conf,
                            struct sk_metrics *m)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->lock);
    h->conf = conf;
    h->metrics = m;
    pthread_mutex_unlock(&h->lock);
}

void sk_metrics_http_close_in_child(struct sk_metrics_http *h)
{
    if (h != NULL)
        close(h->fd);
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

/* Called by libmicrohttpd once a request's headers are in; a GET has no
 * body to wait for, so every request is answered on the first call. */
static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **request)
{
    struct sk_metrics_http *h = cls;
    (void)version, (void)upload, (void)upload_size, (void)request;

    if (strcmp(url, "/metrics") != 0)
        return reply(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    char *text;
    size_t len;
    pthread_mutex_lock(&h->lock);
    int rc = sk_metrics_render(h->metrics, h->conf, &text, &len);
    pthread_mutex_unlock(&h->lock);
    if (rc != SK_OK)
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

static enum MHD_Result send_response(struct MHD_Connection *conn, unsigned int status,
                                     struct MHD_Response *resp)
{
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);  /* the connection keeps its own reference */
    return rc;
}
