/* http_server.c - the HTTP handler tests' server: see http_server.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <check.h>
#include <microhttpd.h>

#include "http_server.h"

#define MAX_REQUESTS 1024

struct hs {
    struct MHD_Daemon *d;
    int                port;
    pthread_mutex_t    lock;
    pthread_cond_t     released_cond;
    bool               released;
    struct hs_request  requests[MAX_REQUESTS];
    size_t             n;
    char              *cert, *key;   /* TLS: the PEM texts */
};

struct upload {
    char   body[256];
    size_t len;
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void header(struct MHD_Connection *c, const char *name, char *out, size_t size)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
    snprintf(out, size, "%s", v != NULL ? v : "");
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *text,
                              const char *retry_after)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                             MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    if (retry_after != NULL)
        MHD_add_response_header(r, "Retry-After", retry_after);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* s in base64 into out (at least 4/3 of s, plus 4). */
static char *b64(const char *s, char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = strlen(s);
    char *w = out;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned char)s[i] << 16 | (i + 1 < len ? (unsigned char)s[i + 1] << 8 : 0) |
                     (i + 2 < len ? (unsigned char)s[i + 2] : 0);
        *w++ = abc[v >> 18 & 63];
        *w++ = abc[v >> 12 & 63];
        *w++ = i + 1 < len ? abc[v >> 6 & 63] : '=';
        *w++ = i + 2 < len ? abc[v & 63] : '=';
    }
    *w = '\0';
    return out;
}

/* A service's 401 that repeats what it got: the bare token of "Bearer
 * TOKEN", the token in base64, and the whole header URL-encoded. */
static const char *echo_token(const struct hs_request *q, char *text, size_t size)
{
    const char *space = strrchr(q->authorization, ' ');
    const char *token = space != NULL ? space + 1 : q->authorization;
    char enc[400] = "", *w = enc;
    for (const char *r = q->authorization; *r != '\0' && w < enc + sizeof(enc) - 4; r++)
        w += *r == ' ' ? snprintf(w, 4, "%%20") : snprintf(w, 2, "%c", *r);
    snprintf(text, size, "invalid token %s (base64 %s, header %s)", token,
             b64(token, (char[400]){ 0 }), enc);
    return text;
}

static enum MHD_Result on_request(void *arg, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *data, size_t *data_size, void **cls)
{
    struct hs *s = arg;
    (void)url, (void)method, (void)version;
    struct upload *u = *cls;
    if (u == NULL) {
        *cls = u = calloc(1, sizeof(*u));
        return u != NULL ? MHD_YES : MHD_NO;
    }
    if (*data_size > 0) {
        size_t room = sizeof(u->body) - 1 - u->len;
        size_t n = *data_size < room ? *data_size : room;
        memcpy(u->body + u->len, data, n);
        u->len += n;
        *data_size = 0;
        return MHD_YES;
    }
    struct hs_request q = { .at_ms = now_ms() };
    header(c, "Idempotency-Key", q.key, sizeof(q.key));
    header(c, "X-Sekali-Job-Id", q.job_id, sizeof(q.job_id));
    header(c, "X-Sekali-Job-Type", q.job_type, sizeof(q.job_type));
    header(c, "Content-Type", q.content_type, sizeof(q.content_type));
    header(c, "Authorization", q.authorization, sizeof(q.authorization));
    header(c, "X-From-Env", q.from_env, sizeof(q.from_env));
    header(c, "traceparent", q.traceparent, sizeof(q.traceparent));
    header(c, "tracestate", q.tracestate, sizeof(q.tracestate));
    char num[32];
    header(c, "X-Sekali-Fence", num, sizeof(num));
    q.fence = atoll(num);
    header(c, "X-Sekali-Attempt", num, sizeof(num));
    q.attempt = atoi(num);
    snprintf(q.body, sizeof(q.body), "%s", u->body);

    pthread_mutex_lock(&s->lock);
    size_t earlier = 0;
    for (size_t i = 0; i < s->n; i++)
        earlier += strcmp(s->requests[i].key, q.key) == 0;
    if (s->n < MAX_REQUESTS)
        s->requests[s->n++] = q;
    pthread_mutex_unlock(&s->lock);

    char text[2048];
    snprintf(text, sizeof(text), "done %s fence=%lld", q.key, (long long)q.fence);
    const char *b = q.body;
    if (strcmp(b, "400") == 0) {
        snprintf(text, sizeof(text), "bad request: %s", q.authorization);
        return answer(c, 400, text, NULL);
    }
    if (strcmp(b, "401") == 0)
        return answer(c, 401, echo_token(&q, text, sizeof(text)), NULL);
    if (strcmp(b, "echo") == 0) {
        snprintf(text, sizeof(text), "{\"headers\":{\"Authorization\":\"%s\",\"X-From-Env\":"
                 "\"%s\"},\"auth_b64\":\"%s\"}", q.authorization, q.from_env,
                 b64(q.authorization, (char[400]){ 0 }));
        return answer(c, 200, text, NULL);
    }
    /* Dropped on every try of attempt 1: libcurl's own resend on a fresh
     * connection is dropped too, so sekali sees the failure. */
    if (strcmp(b, "drop") == 0 && q.attempt <= 1)
        return MHD_NO;
    if (strcmp(b, "500always") == 0)
        return answer(c, 500, "oops", NULL);
    if (strcmp(b, "cut") == 0) {
        /* "x" and 150 é: the handler's 200-byte excerpt ends inside one. */
        strcpy(text, "x");
        for (int i = 0; i < 150; i++)
            strcat(text, "\xc3\xa9");
        return answer(c, 500, text, NULL);
    }
    if (earlier > 0 || strcmp(b, "ok") == 0)
        return answer(c, 200, text, NULL);
    if (strcmp(b, "429") == 0)
        return answer(c, 429, "slow down", "1");
    if (strcmp(b, "500") == 0)
        return answer(c, 500, "oops", NULL);
    if (strcmp(b, "slow") == 0) {
        struct timespec t = { .tv_sec = 3 };
        nanosleep(&t, NULL);
        return answer(c, 200, text, NULL);
    }
    if (strcmp(b, "hang") == 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 60;
        pthread_mutex_lock(&s->lock);
        while (!s->released && pthread_cond_timedwait(&s->released_cond, &s->lock, &until) == 0)
            ;
        pthread_mutex_unlock(&s->lock);
        snprintf(text, sizeof(text), "late fence=%lld", (long long)q.fence);
        return answer(c, 200, text, NULL);
    }
    return answer(c, 200, text, NULL);
}

static void on_done(void *arg, struct MHD_Connection *c, void **cls,
                    enum MHD_RequestTerminationCode why)
{
    (void)arg, (void)c, (void)why;
    free(*cls);
    *cls = NULL;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    char *buf = calloc(1, 65536);
    ck_assert_ptr_nonnull(buf);
    size_t n = fread(buf, 1, 65535, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static struct hs *start(const char *cert_file, const char *key_file)
{
    struct hs *s = calloc(1, sizeof(*s));
    ck_assert_ptr_nonnull(s);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->released_cond, NULL);
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    /* No MHD_USE_ERROR_LOG: a "drop" is an error by MHD's lights. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD;
    if (cert_file == NULL) {
        s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                                MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_NOTIFY_COMPLETED,
                                on_done, s, MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_END);
    } else {
        /* MHD keeps pointers to these for the daemon's life. */
        s->cert = slurp(cert_file);
        s->key = slurp(key_file);
        s->d = MHD_start_daemon(flags | MHD_USE_TLS, 0, NULL, NULL, on_request, s,
                                MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_NOTIFY_COMPLETED,
                                on_done, s, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
                                MHD_OPTION_HTTPS_MEM_CERT, s->cert,
                                MHD_OPTION_HTTPS_MEM_KEY, s->key, MHD_OPTION_END);
    }
    ck_assert_msg(s->d != NULL, "the test HTTP server did not start");
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    ck_assert_ptr_nonnull(info);
    s->port = info->port;
    return s;
}

struct hs *hs_start(void)
{
    return start(NULL, NULL);
}

struct hs *hs_start_tls(const char *cert_file, const char *key_file)
{
    return start(cert_file, key_file);
}

int hs_port(const struct hs *s)
{
    return s->port;
}

size_t hs_count(struct hs *s, const char *key)
{
    size_t n = 0;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->n; i++)
        n += key == NULL || strcmp(s->requests[i].key, key) == 0;
    pthread_mutex_unlock(&s->lock);
    return n;
}

bool hs_get(struct hs *s, const char *key, size_t want, struct hs_request *out)
{
    bool found = false;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0, seen = 0; i < s->n && !found; i++)
        if (strcmp(s->requests[i].key, key) == 0 && seen++ == want) {
            *out = s->requests[i];
            found = true;
        }
    pthread_mutex_unlock(&s->lock);
    return found;
}

void hs_release(struct hs *s)
{
    pthread_mutex_lock(&s->lock);
    s->released = true;
    pthread_cond_broadcast(&s->released_cond);
    pthread_mutex_unlock(&s->lock);
}

void hs_stop(struct hs *s)
{
    hs_release(s);
    MHD_stop_daemon(s->d);
    pthread_cond_destroy(&s->released_cond);
    pthread_mutex_destroy(&s->lock);
    free(s->cert);
    free(s->key);
    free(s);
}
