/* ctl_http.c - one HTTP/1.0 GET of sekalid's own /metrics endpoint, so that
 * sekalictl can read the supervisor's figures (workers up, last rounds)
 * without a client library: the endpoint is ours, local, and answers a
 * plain request with a plain body. Bounded in time and in size. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ctl_http.h"

#define HTTP_MAX_BYTES (8u << 20)  /* far above any /metrics sekalid renders */

static bool send_all(int fd, const char *data, size_t n, int64_t deadline);
static char *receive_all(int fd, int64_t deadline, int timeout_ms, size_t *len, char *why,
                         size_t why_size);
static char *body_of(char *buf, size_t len, bool verdict, char *why, size_t why_size);

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Connects to host:port within the deadline; a socket, or -1. */
static int dial(const char *host, int port, int64_t deadline, char *why, size_t why_size)
{
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *list = NULL;
    int gai = getaddrinfo(host, service, &hints, &list);
    if (gai != 0) {
        snprintf(why, why_size, "%s: %s", host, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = list; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        struct pollfd p = { .fd = fd, .events = POLLOUT };
        int left = (int)(deadline - mono_ms());
        int err = errno;
        if (err == EINPROGRESS && left > 0 && poll(&p, 1, left) == 1) {
            socklen_t len = sizeof(err);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err == 0)
                break;
        }
        snprintf(why, why_size, "connect to %s:%d: %s", host, port,
                 err == EINPROGRESS ? "timed out" : strerror(err));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    return fd;
}

char *sk_ctl_http_get(const char *host, int port, const char *path, const char *token,
                      int timeout_ms, char *why, size_t why_size)
{
    int64_t deadline = mono_ms() + timeout_ms;
    why[0] = '\0';
    int fd = dial(host, port, deadline, why, why_size);
    if (fd < 0)
        return NULL;
    char request[1200];  /* a token is at most 512 characters (config.c) */
    int n = snprintf(request, sizeof(request),
                     "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n%s%s%s\r\n", path,
                     host, token != NULL ? "Authorization: Bearer " : "",
                     token != NULL ? token : "", token != NULL ? "\r\n" : "");
    char *buf = NULL;
    size_t len = 0;
    bool sent = send_all(fd, request, (size_t)n, deadline);
    explicit_bzero(request, sizeof(request));
    if (sent) {
        buf = receive_all(fd, deadline, timeout_ms, &len, why, why_size);
        if (buf == NULL && why[0] == '\0')
            snprintf(why, why_size, "out of memory");
    } else {
        snprintf(why, why_size, "sending the request failed");
    }
    close(fd);
    /* /readyz's 503 carries its verdict too: why it is not ready. */
    return buf != NULL ? body_of(buf, len, strcmp(path, "/readyz") == 0, why, why_size) : NULL;
}

static bool send_all(int fd, const char *data, size_t n, int64_t deadline)
{
    size_t sent = 0;
    while (sent < n) {
        ssize_t w = send(fd, data + sent, n - sent, MSG_NOSIGNAL);
        if (w > 0) {
            sent += (size_t)w;
            continue;
        }
        struct pollfd p = { .fd = fd, .events = POLLOUT };
        int left = (int)(deadline - mono_ms());
        if ((w < 0 && errno != EAGAIN) || left <= 0 || poll(&p, 1, left) != 1)
            return false;
    }
    return true;
}

/* Reads until the server closes (HTTP/1.0), up to HTTP_MAX_BYTES.
 * Returns a NUL-terminated copy the caller frees, or NULL. */
static char *receive_all(int fd, int64_t deadline, int timeout_ms, size_t *len, char *why,
                         size_t why_size)
{
    size_t cap = 65536;
    char *buf = malloc(cap);
    *len = 0;
    while (buf != NULL) {
        if (cap - *len < 4096) {
            if (cap >= HTTP_MAX_BYTES) {
                snprintf(why, why_size, "answer over %u bytes", HTTP_MAX_BYTES);
                break;
            }
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL)
                break;
            buf = bigger;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + *len, cap - *len - 1, 0);
        if (r > 0) {
            *len += (size_t)r;
            continue;
        }
        if (r == 0) {
            buf[*len] = '\0';
            return buf;
        }
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int left = (int)(deadline - mono_ms());
        if (errno != EAGAIN || left <= 0 || poll(&p, 1, left) != 1) {
            snprintf(why, why_size, "no complete answer within %d ms", timeout_ms);
            break;
        }
    }
    free(buf);
    return NULL;
}

/* "HTTP/1.x 200 ...": anything else is not the metrics (verdict: or 503, a
 * health check's "not ready"). Takes buf; returns it holding only the
 * body, or NULL. */
static char *body_of(char *buf, size_t len, bool verdict, char *why, size_t why_size)
{
    char *body = strstr(buf, "\r\n\r\n");
    bool ok = len >= 12 && (strncmp(buf + 8, " 200", 4) == 0 ||
                            (verdict && strncmp(buf + 8, " 503", 4) == 0));
    if (strncmp(buf, "HTTP/1.", 7) != 0 || !ok || body == NULL) {
        char *eol = strpbrk(buf, "\r\n");
        snprintf(why, why_size, "answered %.*s", eol != NULL ? (int)(eol - buf) : 40, buf);
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, len - (size_t)(body + 4 - buf) + 1);
    return buf;
}

double sk_ctl_metric(const char *text, const char *name, const char *queue, bool *found)
{
    size_t nlen = strlen(name);
    *found = false;
    for (const char *line = text; line != NULL && *line != '\0';) {
        const char *next = strchr(line, '\n');
        if (strncmp(line, name, nlen) == 0 && (line[nlen] == ' ' || line[nlen] == '{')) {
            const char *value = line + nlen;
            bool match = queue == NULL;
            if (*value == '{') {
                const char *close = strchr(value, '}');
                if (close == NULL || (next != NULL && close > next))
                    goto skip;
                if (queue != NULL) {
                    /* Queue names in a label are escaped: compare that way. */
                    char want[1100];
                    size_t w = (size_t)snprintf(want, sizeof(want), "queue=\"");
                    for (const char *q = queue; *q != '\0' && w + 3 < sizeof(want); q++) {
                        if (*q == '\\' || *q == '"')
                            want[w++] = '\\';
                        want[w++] = *q;
                    }
                    want[w++] = '"';
                    want[w] = '\0';
                    const char *at = strstr(value, want);
                    match = at != NULL && at < close && (at[-1] == '{' || at[-1] == ',');
                }
                value = close + 1;
            }
            if (match) {
                char *end;
                double v = strtod(value, &end);
                if (end != value) {
                    *found = true;
                    return v;
                }
            }
        }
    skip:
        line = next != NULL ? next + 1 : NULL;
    }
    return 0;
}
