/* redis_link.c - a Redis connection's stream, clear or TLS, under
 * hiredis's reply reader (see redis_link.h).
 *
 * Why not hiredis's own redisContext: in 0.14 its I/O is read()/write() on
 * the socket, with no hook for TLS. Why not a RESP parser of our own:
 * hiredis's reader is what every earlier sekali talked to Redis through,
 * and parsing replies well (nesting, sizes, errors) is its job. So one
 * path for both: commands are formatted (by hiredis, or by lock.c's own
 * formatter for the per-job ones), queued here, sent in one write, and
 * the bytes read are fed to a redisReader until it has a reply.
 *
 * Timeouts: the connect polls with the timeout; after it, SO_RCVTIMEO and
 * SO_SNDTIMEO bound every read and write, OpenSSL's included. Writes use
 * send(MSG_NOSIGNAL), through a BIO of ours under TLS, so that a server
 * gone away is an error, never a SIGPIPE that kills the worker. */
#include "redis_link.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "clock.h"

#define READ_CHUNK 16384

struct sk_redis_link {
    int                 fd;
    SSL_CTX            *ctx;
    SSL                *ssl;
    redisReader        *reader;
    char               *out;       /* queued commands, not yet sent */
    size_t              out_len, out_size;
    char                host[256];
    int                 port;
    char                errstr[256];
    bool                setting;   /* the last failure was a setting's (SK_SETTING) */
    bool                heard;     /* the server has sent us a byte */
    bool                closed;    /* ... and the last failure was its close */
    struct sk_tls_state tls;
    struct sk_rtt       rtt;       /* a pipeline sent and its first reply */
};

static int dial(struct sk_redis_link *l, uint32_t timeout_ms, struct sk_err *err);
static int handshake(struct sk_redis_link *l, const struct sk_tls_conf *tls, struct sk_err *err);
static int probe_clear(struct sk_redis_link *l, struct sk_err *err);
static int fail(struct sk_redis_link *l, const char *what);
static BIO_METHOD *nosignal_method(void);

int sk_redis_link_open(struct sk_redis_link **out, const char *host, int port,
                       const struct sk_tls_conf *tls, uint32_t timeout_ms, struct sk_err *err)
{
    struct sk_redis_link *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return sk_err_errno(err, SK_AGAIN, "calloc(redis link)");
    l->fd = -1;
    snprintf(l->host, sizeof(l->host), "%s", host);
    l->port = port;
    if ((l->reader = redisReaderCreate()) == NULL) {
        free(l);
        return sk_err_set(err, SK_AGAIN, "redisReaderCreate: out of memory");
    }
    int rc = dial(l, timeout_ms, err);
    if (rc == SK_OK && tls != NULL && tls->enabled)
        rc = handshake(l, tls, err);
    else if (rc == SK_OK)
        rc = probe_clear(l, err);
    if (rc != SK_OK) {
        sk_redis_link_close(l);
        return rc;
    }
    *out = l;
    return SK_OK;
}

void sk_redis_link_close(struct sk_redis_link *l)
{
    if (l == NULL)
        return;
    if (l->ssl != NULL) {
        SSL_shutdown(l->ssl);  /* one close_notify, not waiting for the answer */
        SSL_free(l->ssl);
    }
    SSL_CTX_free(l->ctx);
    if (l->fd >= 0)
        close(l->fd);
    if (l->reader != NULL)
        redisReaderFree(l->reader);
    free(l->out);
    free(l);
}

/* Non-blocking connect bounded by poll(); then blocking with timeouts. */
static int dial(struct sk_redis_link *l, uint32_t timeout_ms, struct sk_err *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res, *ai;
    char service[16];
    snprintf(service, sizeof(service), "%d", l->port);
    int gai = getaddrinfo(l->host, service, &hints, &res);
    if (gai != 0)
        return sk_err_set(err, SK_AGAIN, "redis connect to %s:%d failed: %s", l->host, l->port,
                          gai_strerror(gai));
    int e = ECONNREFUSED;
    for (ai = res; ai != NULL && l->fd < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno == EINPROGRESS) {
            struct pollfd p = { .fd = fd, .events = POLLOUT };
            socklen_t len = sizeof(e);
            int n = poll(&p, 1, (int)timeout_ms);
            e = n == 0 ? ETIMEDOUT : n < 0 ? errno : 0;
            if (n > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
                e = errno;
        } else {
            e = errno == EINPROGRESS ? 0 : errno;
            if (e == EISCONN)
                e = 0;
        }
        if (e == 0)
            l->fd = fd;
        else
            close(fd);
    }
    freeaddrinfo(res);
    if (l->fd < 0)
        return sk_err_set(err, SK_AGAIN, "redis connect to %s:%d failed: %s", l->host, l->port,
                          strerror(e));
    int one = 1;
    if (fcntl(l->fd, F_SETFL, fcntl(l->fd, F_GETFL) & ~O_NONBLOCK) != 0 ||
        sk_redis_link_set_timeout(l, timeout_ms) != SK_OK ||
        setsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        return sk_err_errno(err, SK_AGAIN, "redis connect to %s:%d: setting up the socket",
                            l->host, l->port);
    return SK_OK;
}

int sk_redis_link_set_timeout(struct sk_redis_link *l, uint32_t timeout_ms)
{
    struct timeval tv = { .tv_sec = timeout_ms / 1000,
                          .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000 };
    if (setsockopt(l->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
        setsockopt(l->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)
        return SK_AGAIN;
    return SK_OK;
}

static int handshake(struct sk_redis_link *l, const struct sk_tls_conf *tls, struct sk_err *err)
{
    struct sk_err e = { 0 };
    char why[200];

    if ((l->ctx = SSL_CTX_new(TLS_client_method())) == NULL)
        return sk_err_set(err, SK_AGAIN, "redis TLS to %s:%d: SSL_CTX_new failed", l->host,
                          l->port);
    if (sk_tls_prepare(l->ctx, tls, l->host, &l->tls, &e) != SK_OK)
        return sk_err_set(err, SK_AGAIN, "redis TLS to %s:%d: %s", l->host, l->port, e.msg);
    BIO *bio = nosignal_method() != NULL ? BIO_new(nosignal_method()) : NULL;
    if (bio == NULL || (l->ssl = SSL_new(l->ctx)) == NULL) {
        BIO_free(bio);
        return sk_err_set(err, SK_AGAIN, "redis TLS to %s:%d: out of memory", l->host, l->port);
    }
    BIO_set_fd(bio, l->fd, BIO_NOCLOSE);
    SSL_set_bio(l->ssl, bio, bio);
    SSL_set_mode(l->ssl, SSL_MODE_AUTO_RETRY);
    if (SSL_connect(l->ssl) == 1)
        return SK_OK;
    enum sk_tls_cause cause = sk_tls_explain(&l->tls, why, sizeof(why));
    if (cause == SK_TLS_UNEXPLAINED)
        snprintf(why, sizeof(why), "TLS: the handshake failed (%s)",
                 errno == EAGAIN ? "timed out" : errno != 0 ? strerror(errno) : "closed");
    sk_err_set(err, SK_AGAIN, "redis connect to %s:%d failed: %s", l->host, l->port, why);
    if (cause == SK_TLS_SETTING && err != NULL)
        err->code = SK_SETTING;
    return SK_AGAIN;
}

/* In clear text, a harmless PING before anything else is sent: a port that
 * speaks TLS (redis.tls left out by mistake) answers it with a TLS alert or
 * by dropping the connection unheard, and is named so before AUTH could
 * give it the password in clear. Any answer at all, an error (NOAUTH)
 * included, is a Redis speaking RESP. */
static int probe_clear(struct sk_redis_link *l, struct sk_err *err)
{
    redisReply *reply = sk_redis_link_command(l, "PING");
    if (reply != NULL) {
        freeReplyObject(reply);
        return SK_OK;
    }
    /* A timeout, or a close after Redis spoke, is an outage like any. */
    if (!l->setting && (l->heard || !l->closed))
        return sk_err_set(err, SK_AGAIN, "redis PING at %s:%d failed: %s", l->host, l->port,
                          l->errstr);
    sk_err_set(err, SK_AGAIN, "redis at %s:%d %s: this port seems to speak TLS, which "
               "redis.tls turns on (nothing secret was sent)", l->host, l->port,
               l->setting ? "answered a clear-text PING in TLS"
                          : "closed the connection at a clear-text PING, unanswered");
    if (err != NULL)
        err->code = SK_SETTING;
    return SK_AGAIN;
}

int sk_redis_link_append(struct sk_redis_link *l, const char *cmd, size_t len)
{
    if (l->out_len + len > l->out_size) {
        size_t size = l->out_size > 0 ? l->out_size : 1024;
        while (size < l->out_len + len)
            size *= 2;
        char *grown = realloc(l->out, size);
        if (grown == NULL)
            return REDIS_ERR;
        l->out = grown;
        l->out_size = size;
    }
    memcpy(l->out + l->out_len, cmd, len);
    l->out_len += len;
    return REDIS_OK;
}

int sk_redis_link_reply(struct sk_redis_link *l, redisReply **reply)
{
    *reply = NULL;
    l->setting = false;
    /* A reply that comes after what we sent, not one already read with
     * an earlier pipeline's, is a sample of the round trip. */
    uint64_t sent_ns = l->out_len > 0 ? sk_now_ns() : 0;
    for (size_t sent = 0; sent < l->out_len;) {
        ssize_t n = l->ssl != NULL ? SSL_write(l->ssl, l->out + sent, (int)(l->out_len - sent))
                                   : send(l->fd, l->out + sent, l->out_len - sent, MSG_NOSIGNAL);
        if (n <= 0 && l->ssl == NULL && errno == EINTR)
            continue;
        if (n <= 0)
            return fail(l, "write");
        sent += (size_t)n;
    }
    l->out_len = 0;
    for (;;) {
        void *r = NULL;
        if (redisReaderGetReply(l->reader, &r) != REDIS_OK) {
            snprintf(l->errstr, sizeof(l->errstr), "protocol error: %s", l->reader->errstr);
            return REDIS_ERR;
        }
        if (r != NULL) {
            *reply = r;
            if (sent_ns != 0)
                sk_rtt_add(&l->rtt, sent_ns);
            return REDIS_OK;
        }
        char buf[READ_CHUNK];
        ssize_t n = l->ssl != NULL ? SSL_read(l->ssl, buf, sizeof(buf))
                                   : recv(l->fd, buf, sizeof(buf), 0);
        if (n <= 0 && l->ssl == NULL && n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return fail(l, "read");
        /* A TLS record (an alert, a handshake) where RESP was expected:
         * 0x15 or 0x16, then the version's major 3. */
        if (!l->heard && l->ssl == NULL && n >= 2 && (buf[0] == 0x15 || buf[0] == 0x16) &&
            buf[1] == 0x03) {
            l->heard = l->setting = true;
            snprintf(l->errstr, sizeof(l->errstr), "the server answered in TLS");
            return REDIS_ERR;
        }
        l->heard = true;
        if (redisReaderFeed(l->reader, buf, (size_t)n) != REDIS_OK) {
            snprintf(l->errstr, sizeof(l->errstr), "protocol error: %s", l->reader->errstr);
            return REDIS_ERR;
        }
    }
}

/* Says why a read or write failed: TLS's words first (a certificate the
 * server refused shows at the first read in TLS 1.3), then errno's. Once
 * the server has answered, the handshake's findings explain nothing: a
 * connection killed later is not a certificate problem. */
static int fail(struct sk_redis_link *l, const char *what)
{
    int e = errno;
    char why[200];
    l->closed = false;
    enum sk_tls_cause cause = l->ssl != NULL ? sk_tls_explain(&l->tls, why, sizeof(why))
                                             : SK_TLS_UNEXPLAINED;
    if (l->heard)
        cause = SK_TLS_UNEXPLAINED;
    l->setting = cause == SK_TLS_SETTING;
    if (cause != SK_TLS_UNEXPLAINED)
        snprintf(l->errstr, sizeof(l->errstr), "%s", why);
    else if (e == EAGAIN || e == EWOULDBLOCK)
        snprintf(l->errstr, sizeof(l->errstr), "%s timed out", what);
    else if ((l->closed = e == 0 || e == EPIPE || e == ECONNRESET || !strcmp(what, "read")))
        snprintf(l->errstr, sizeof(l->errstr), "the server closed the connection");
    else
        snprintf(l->errstr, sizeof(l->errstr), "%s: %s", what, strerror(e));
    return REDIS_ERR;
}

redisReply *sk_redis_link_command(struct sk_redis_link *l, const char *fmt, ...)
{
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    redisReply *reply = NULL;
    if (len < 0) {
        snprintf(l->errstr, sizeof(l->errstr), "out of memory for the command");
        return NULL;
    }
    int rc = sk_redis_link_append(l, cmd, (size_t)len);
    explicit_bzero(cmd, (size_t)len);  /* AUTH's password */
    redisFreeCommand(cmd);
    if (rc != REDIS_OK) {
        snprintf(l->errstr, sizeof(l->errstr), "out of memory for the command");
        return NULL;
    }
    return sk_redis_link_reply(l, &reply) == REDIS_OK ? reply : NULL;
}

uint64_t sk_redis_link_rtt_ns(const struct sk_redis_link *l)
{
    return sk_rtt_least(&l->rtt);
}

const char *sk_redis_link_errstr(const struct sk_redis_link *l)
{
    return l->errstr;
}

const char *sk_redis_link_host(const struct sk_redis_link *l)
{
    return l->host;
}

int sk_redis_link_port(const struct sk_redis_link *l)
{
    return l->port;
}

bool sk_redis_link_setting(const struct sk_redis_link *l)
{
    return l->setting;
}

bool sk_redis_link_tls(const struct sk_redis_link *l)
{
    return l->ssl != NULL;
}

/* OpenSSL's socket BIO writes with write(): ours is a socket BIO of its
 * own that sends with send(MSG_NOSIGNAL). Whole rather than borrowing the
 * stock BIO's other methods, as OpenSSL 3.5 deprecates reading them. The
 * descriptor is the BIO's data; the caller keeps ownership of it. Made
 * once per process, never freed. */
static int nosignal_fd(BIO *b)
{
    return (int)(intptr_t)BIO_get_data(b);
}

static int nosignal_write(BIO *b, const char *data, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t n = send(nosignal_fd(b), data, (size_t)len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        BIO_set_retry_write(b);
    return (int)n;
}

/* A timeout (SO_RCVTIMEO) is EAGAIN: a retry, as for the stock BIO. */
static int nosignal_read(BIO *b, char *data, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t n = recv(nosignal_fd(b), data, (size_t)len, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        BIO_set_retry_read(b);
    return (int)n;
}

/* Only what the TLS layer asks of a transport BIO: its descriptor (set
 * and read), and a flush, which for a socket has nothing to do. */
static long nosignal_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)num;
    switch (cmd) {
    case BIO_C_SET_FD:
        BIO_set_data(b, (void *)(intptr_t)*(int *)ptr);
        BIO_set_init(b, 1);
        return 1;
    case BIO_C_GET_FD:
        if (!BIO_get_init(b))
            return -1;
        if (ptr != NULL)
            *(int *)ptr = nosignal_fd(b);
        return nosignal_fd(b);
    case BIO_CTRL_FLUSH:
        return 1;
    default:
        return 0;
    }
}

static BIO_METHOD    *nosignal;
static pthread_once_t nosignal_once = PTHREAD_ONCE_INIT;

static void make_nosignal(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOCKET, "sekali socket");
    if (m == NULL)
        return;
    BIO_meth_set_write(m, nosignal_write);
    BIO_meth_set_read(m, nosignal_read);
    BIO_meth_set_ctrl(m, nosignal_ctrl);
    nosignal = m;
}

static BIO_METHOD *nosignal_method(void)
{
    pthread_once(&nosignal_once, make_nosignal);
    return nosignal;
}
