/* http.c - the stock HTTP handler: each job is one POST to a service.
 *
 *     handler: http
 *     mode: external
 *     config:
 *       url: "https://payments.internal/charge"
 *       timeout: 10s                   # below the queue's lease
 *       headers: {Authorization: {file: /etc/sekali/payments.token}}
 *
 * External mode only: an HTTP call must never run inside an open database
 * transaction (it would hold the job's locks for the call's length, and a
 * rollback cannot take the call back). The service makes the effect once by
 * honouring the Idempotency-Key header, which is the same on every attempt
 * of a job; X-Sekali-Fence grows with each claim, so a service may also
 * refuse a request older than one it has seen. sekali's lease and fence do
 * the rest: a worker that stalled past its lease has its outcome fenced out.
 *
 * libcurl does the HTTP: one easy handle per worker process keeps its
 * connection alive between jobs; TLS is verified unless the URL is plain
 * http; redirects are not followed; proxies come from the config only,
 * never from the environment. Header values read from files or environment
 * variables are secrets: they never appear in an error, and are blanked
 * from everything made of a response (its excerpt in an error, the result
 * a producer's reply_to gets), whole, as their credentials part ("Bearer
 * X": X), and in base64, URL-encoding and JSON's "\/" of each.
 *
 * Built like examples/: against sekali/handler.h, libcurl, libyaml (for
 * the nested `headers:` mapping) and libpq (for the mode check). HANDLER_CFLAGS
 * is plain C11: strdup() and strndup() are POSIX 2008's. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include <curl/curl.h>
#include <libpq-fe.h>
#include <sekali/handler.h>
#include <yaml.h>

/* src/base/file.c, compiled into this handler with hidden visibility (the
 * Makefile): the daemon's one check of a configured file, not its symbol. */
#include "file.h"

#define MAX_HEADERS   32
#define MAX_SECRET    8192
#define MAX_RESPONSE  (64 * 1024)   /* a saved result's limit */
#define EXCERPT       200           /* of a failed response's body, in the dead letter */
#define DEFAULT_TIMEOUT_MS 10000
#define MAX_REDACT    (MAX_HEADERS * 8)  /* forms of the secrets blanked from responses */
#define REDACT_MIN    4             /* shorter forms would blank ordinary text */

struct header {
    char *name;
    char *value;
    bool  secret;          /* from a file or the environment */
    char *from;            /* the file or variable, for messages */
};

struct http_conf {
    char         *url, *ca_file, *cert_file, *key_file, *proxy;
    long          timeout_ms;
    struct header headers[MAX_HEADERS];
    int           n_headers;
};

struct http_state {
    struct http_conf conf;
    CURL            *curl;
    char            *response;     /* MAX_RESPONSE + 1 bytes */
    size_t           response_len;
    bool             truncated;
    char             curl_error[CURL_ERROR_SIZE];
    char            *redact[MAX_REDACT];  /* the secrets' forms, blanked from responses */
    size_t           redact_len[MAX_REDACT];
    int              n_redact;
};

static void conf_free(struct http_conf *c)
{
    free(c->url);
    free(c->ca_file);
    free(c->cert_file);
    free(c->key_file);
    free(c->proxy);
    for (int i = 0; i < c->n_headers; i++) {
        if (c->headers[i].value != NULL)
            memset(c->headers[i].value, 0, strlen(c->headers[i].value));
        free(c->headers[i].name);
        free(c->headers[i].value);
        free(c->headers[i].from);
    }
    memset(c, 0, sizeof(*c));
}

static char *scalar(yaml_node_t *n)
{
    if (n == NULL || n->type != YAML_SCALAR_NODE)
        return NULL;
    return strndup((const char *)n->data.scalar.value, n->data.scalar.length);
}

/* "10s", "500ms", "1m"; -1 if none of those. */
static long duration_ms(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || v < 0 || v > 86400000)
        return -1;
    if (strcmp(end, "ms") == 0)
        return v;
    if (strcmp(end, "s") == 0)
        return v * 1000;
    if (strcmp(end, "m") == 0 && v <= 1440)
        return v * 60000;
    return -1;
}

static bool header_name_ok(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s != '\0'; s++)
        if (!isalnum((unsigned char)*s) && strchr("!#$%&'*+-.^_`|~", *s) == NULL)
            return false;
    return true;
}

/* A header value may not end the header early. */
static bool header_value_ok(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 && s[i] != '\t')
            return false;
    return s[len] == '\0' && memchr(s, 0x7f, len) == NULL;
}

/* A secret from a file, its trailing newline dropped. Returns a new
 * string, or NULL with err naming the file (never the content). */
static char *read_secret(const char *path, char *err, size_t err_size, const char *name)
{
    struct stat st;
    int fd, e = sk_file_open(path, 0, &fd, &st);
    FILE *f = e == 0 ? fdopen(fd, "r") : NULL;
    if (f == NULL) {
        snprintf(err, err_size, "headers: %s: cannot read %s: %s", name, path,
                 sk_file_error(e != 0 ? e : errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char *buf = calloc(1, MAX_SECRET + 2);
    size_t n = buf != NULL ? fread(buf, 1, MAX_SECRET + 1, f) : 0;
    fclose(f);
    if (buf == NULL || n > MAX_SECRET) {
        snprintf(err, err_size, "headers: %s: %s is larger than %d bytes", name, path,
                 MAX_SECRET);
        free(buf);
        return NULL;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    if (!header_value_ok(buf, n)) {
        snprintf(err, err_size, "headers: %s: %s holds a line break or a control character",
                 name, path);
        memset(buf, 0, n);
        free(buf);
        return NULL;
    }
    return buf;
}

/* One entry of `headers:`: "value", {file: PATH} or {env: NAME}. */
static int parse_header(yaml_document_t *doc, yaml_node_t *k, yaml_node_t *v,
                        struct http_conf *c, char *err, size_t err_size)
{
    if (c->n_headers == MAX_HEADERS) {
        snprintf(err, err_size, "headers: more than %d", MAX_HEADERS);
        return -1;
    }
    struct header *h = &c->headers[c->n_headers++];
    h->name = scalar(k);
    if (h->name == NULL || !header_name_ok(h->name)) {
        snprintf(err, err_size, "headers: a header name must be a token (letters, digits, -)");
        return -1;
    }
    if (v->type == YAML_SCALAR_NODE) {
        h->value = scalar(v);
        if (h->value == NULL || !header_value_ok(h->value, strlen(h->value))) {
            snprintf(err, err_size, "headers: %s: a value must be one line", h->name);
            return -1;
        }
        return 0;
    }
    if (v->type != YAML_MAPPING_NODE ||
        v->data.mapping.pairs.top - v->data.mapping.pairs.start != 1) {
        snprintf(err, err_size, "headers: %s: expected a string, {file: PATH} or {env: NAME}",
                 h->name);
        return -1;
    }
    yaml_node_pair_t *p = v->data.mapping.pairs.start;
    char *how = scalar(yaml_document_get_node(doc, p->key));
    h->from = scalar(yaml_document_get_node(doc, p->value));
    h->secret = true;
    int rc = -1;
    if (how == NULL || h->from == NULL || h->from[0] == '\0')
        snprintf(err, err_size, "headers: %s: expected {file: PATH} or {env: NAME}", h->name);
    else if (strcmp(how, "file") == 0)
        rc = (h->value = read_secret(h->from, err, err_size, h->name)) != NULL ? 0 : -1;
    else if (strcmp(how, "env") == 0) {
        const char *val = getenv(h->from);
        if (val == NULL)
            snprintf(err, err_size, "headers: %s: environment variable %s is not set", h->name,
                     h->from);
        else if (!header_value_ok(val, strlen(val)))
            snprintf(err, err_size, "headers: %s: environment variable %s holds a line break "
                     "or a control character", h->name, h->from);
        else
            rc = (h->value = strdup(val)) != NULL ? 0 : -1;
    } else {
        snprintf(err, err_size, "headers: %s: expected {file: PATH} or {env: NAME}, not %s",
                 h->name, how);
    }
    free(how);
    return rc;
}

/* A TLS file libcurl will read at each request: a regular file we can
 * read now (a FIFO would hang the worker's first request). NULL is fine. */
static bool readable(const char *path, const char *key, char *err, size_t err_size)
{
    struct stat st;
    int fd, e;
    if (path == NULL)
        return true;
    if ((e = sk_file_open(path, 0, &fd, &st)) != 0) {
        snprintf(err, err_size, "`%s:` cannot read %s: %s", key, path, sk_file_error(e));
        return false;
    }
    close(fd);
    return true;
}

static int parse_conf(const char *config, struct http_conf *c, char *err, size_t err_size)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = -1;

    memset(c, 0, sizeof(*c));
    c->timeout_ms = DEFAULT_TIMEOUT_MS;
    if (config == NULL) {
        snprintf(err, err_size, "`url:` is missing: where each job is POSTed");
        return -1;
    }
    if (!yaml_parser_initialize(&parser)) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)config, strlen(config));
    if (!yaml_parser_load(&parser, &doc)) {
        snprintf(err, err_size, "the config is not YAML");
        yaml_parser_delete(&parser);
        return -1;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root == NULL || root->type != YAML_MAPPING_NODE) {
        snprintf(err, err_size, "the config must be a mapping");
        goto out;
    }
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(&doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&doc, p->value);
        char *key = scalar(k);
        if (key == NULL) {
            snprintf(err, err_size, "config keys must be strings");
            goto out;
        }
        char **field = strcmp(key, "url") == 0         ? &c->url
                       : strcmp(key, "ca_file") == 0   ? &c->ca_file
                       : strcmp(key, "cert_file") == 0 ? &c->cert_file
                       : strcmp(key, "key_file") == 0  ? &c->key_file
                       : strcmp(key, "proxy") == 0     ? &c->proxy : NULL;
        int bad = 0;
        if (field != NULL) {
            free(*field);
            bad = (*field = scalar(v)) == NULL || (*field)[0] == '\0';
        } else if (strcmp(key, "timeout") == 0) {
            char *t = scalar(v);
            c->timeout_ms = t != NULL ? duration_ms(t) : -1;
            free(t);
            bad = c->timeout_ms <= 0;
        } else if (strcmp(key, "headers") == 0) {
            if (v->type != YAML_MAPPING_NODE) {
                bad = 1;
            } else {
                for (yaml_node_pair_t *h = v->data.mapping.pairs.start;
                     h < v->data.mapping.pairs.top; h++)
                    if (parse_header(&doc, yaml_document_get_node(&doc, h->key),
                                     yaml_document_get_node(&doc, h->value), c, err,
                                     err_size) != 0) {
                        free(key);
                        goto out;
                    }
            }
        } else {
            snprintf(err, err_size, "unknown key `%s:` (known: url, timeout, headers, ca_file, "
                     "cert_file, key_file, proxy)", key);
            free(key);
            goto out;
        }
        if (bad) {
            snprintf(err, err_size, "`%s:` %s", key, strcmp(key, "timeout") == 0
                     ? "must be a duration such as 10s or 500ms"
                     : strcmp(key, "headers") == 0 ? "must be a mapping of header names"
                     : "must be a non-empty string");
            free(key);
            goto out;
        }
        free(key);
    }
    if (c->url == NULL)
        snprintf(err, err_size, "`url:` is missing: where each job is POSTed");
    else if (strncmp(c->url, "https://", 8) != 0 && strncmp(c->url, "http://", 7) != 0)
        snprintf(err, err_size, "`url:` must be http:// or https://");
    else if (!header_value_ok(c->url, strlen(c->url)))
        snprintf(err, err_size, "`url:` holds a control character");
    else if ((c->cert_file == NULL) != (c->key_file == NULL))
        snprintf(err, err_size, "`cert_file:` and `key_file:` go together");
    else if (!readable(c->ca_file, "ca_file", err, err_size) ||
             !readable(c->cert_file, "cert_file", err, err_size) ||
             !readable(c->key_file, "key_file", err, err_size))
        ;
    else
        rc = 0;
out:
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (rc != 0)
        conf_free(c);
    return rc;
}

static int http_check(const struct sekali_host *host, const char *config, char *err,
                      size_t err_size)
{
    struct http_conf c;
    char mode[32] = "", lease[32] = "";
    if (host->abi_minor < 4) {
        snprintf(err, err_size, "the http handler needs sekalid with handler ABI 1.4 or later");
        return SEKALI_FAIL;
    }
    if (host->config_queue(config, "mode", mode, sizeof(mode)) > 0 &&
        strcmp(mode, "external") != 0) {
        snprintf(err, err_size, "the http handler runs in `mode: external` only: an HTTP call "
                 "must never run inside an open database transaction");
        return SEKALI_FAIL;
    }
    if (parse_conf(config, &c, err, err_size) != 0)
        return SEKALI_FAIL;
    int rc = SEKALI_OK;
    if (host->config_queue(config, "lease", lease, sizeof(lease)) > 0 &&
        c.timeout_ms >= atol(lease)) {
        snprintf(err, err_size, "`timeout: %ldms` must be below the queue's lease (%sms): a call "
                 "still running when the lease ends would race the takeover's", c.timeout_ms,
                 lease);
        rc = SEKALI_FAIL;
    }
    conf_free(&c);
    return rc;
}

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    struct http_state *s = arg;
    size_t len = size * n, room = MAX_RESPONSE - s->response_len;
    if (len > room) {
        s->truncated = true;  /* read on, keep the connection; keep the start */
        memcpy(s->response + s->response_len, data, room);
        s->response_len += room;
    } else {
        memcpy(s->response + s->response_len, data, len);
        s->response_len += len;
    }
    return len;
}

static char *base64(const char *in, size_t len)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((len + 2) / 3 * 4 + 1), *w = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned char)in[i] << 16;
        v |= i + 1 < len ? (unsigned char)in[i + 1] << 8 : 0;
        v |= i + 2 < len ? (unsigned char)in[i + 2] : 0;
        *w++ = abc[v >> 18 & 63];
        *w++ = abc[v >> 12 & 63];
        *w++ = i + 1 < len ? abc[v >> 6 & 63] : '=';
        *w++ = i + 2 < len ? abc[v & 63] : '=';
    }
    *w = '\0';
    return out;
}

/* "/" as JSON may write it, "\/"; NULL when there is none. */
static char *json_slashes(const char *in)
{
    if (strchr(in, '/') == NULL)
        return NULL;
    char *out = malloc(strlen(in) * 2 + 1), *w = out;
    if (out == NULL)
        return NULL;
    for (const char *r = in; *r != '\0'; r++) {
        if (*r == '/')
            *w++ = '\\';
        *w++ = *r;
    }
    *w = '\0';
    return out;
}

/* Keeps form (owned) as a form to blank, unless too short or already kept. */
static void keep_form(struct http_state *s, char *form)
{
    size_t len = form != NULL ? strlen(form) : 0;
    bool known = false;
    for (int i = 0; i < s->n_redact && !known; i++)
        known = s->redact_len[i] == len && memcmp(s->redact[i], form, len) == 0;
    if (len < REDACT_MIN || known || s->n_redact == MAX_REDACT) {
        if (form != NULL)
            memset(form, 0, len);
        free(form);
        return;
    }
    s->redact[s->n_redact] = form;
    s->redact_len[s->n_redact++] = len;
}

static void keep_forms(struct http_state *s, const char *secret)
{
    char *url = curl_easy_escape(s->curl, secret, 0);
    keep_form(s, url != NULL ? strdup(url) : NULL);
    curl_free(url);
    keep_form(s, base64(secret, strlen(secret)));
    keep_form(s, json_slashes(secret));
    keep_form(s, strdup(secret));
}

/* Every form of every secret header that a response may echo: the value,
 * and the credentials of "Scheme credentials", each as it is, in base64,
 * URL-encoded and with JSON's escaped slashes. */
static void collect_secrets(struct http_state *s)
{
    for (int i = 0; i < s->conf.n_headers; i++) {
        const struct header *h = &s->conf.headers[i];
        if (!h->secret)
            continue;
        keep_forms(s, h->value);
        const char *space = strrchr(h->value, ' ');
        if (space != NULL)
            keep_forms(s, space + 1);
    }
}

/* Blanks every form of a secret in buf, and the start of one that buf's
 * end cuts (an excerpt, a result cut at MAX_RESPONSE). A whole value's
 * forms come before its credentials', so that no piece of one is left. */
static void redact(const struct http_state *s, char *buf, size_t n)
{
    for (int i = 0; i < s->n_redact; i++) {
        const char *f = s->redact[i];
        size_t len = s->redact_len[i];
        for (size_t at = 0; at + len <= n; at++)
            if (buf[at] == f[0] && memcmp(buf + at, f, len) == 0) {
                memset(buf + at, '*', len);
                at += len - 1;
            }
        for (size_t k = len - 1 < n ? len - 1 : n; k >= REDACT_MIN; k--)
            if (memcmp(buf + n - k, f, k) == 0) {
                memset(buf + n - k, '*', k);
                break;
            }
    }
}

static int http_init(const struct sekali_host *host, const char *config, void **state)
{
    char why[512];
    struct http_state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return SEKALI_RETRY;
    if (parse_conf(config, &s->conf, why, sizeof(why)) != 0) {
        host->log(NULL, SEKALI_LOG_ERROR, "http handler: %s", why);
        free(s);
        return SEKALI_FAIL;
    }
    /* Once per process, before any thread of ours: curl's global set-up
     * (OpenSSL's) is not thread-safe. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK ||
        (s->curl = curl_easy_init()) == NULL ||
        (s->response = malloc(MAX_RESPONSE + 1)) == NULL) {
        conf_free(&s->conf);
        if (s->curl != NULL)
            curl_easy_cleanup(s->curl);
        free(s);
        return SEKALI_RETRY;
    }
    collect_secrets(s);
    CURL *c = s->curl;
    curl_easy_setopt(c, CURLOPT_URL, s->conf.url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, s->conf.timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                     s->conf.timeout_ms < 5000 ? s->conf.timeout_ms : 5000L);
    /* "" is no proxy at all: http_proxy and friends are not read. */
    curl_easy_setopt(c, CURLOPT_PROXY, s->conf.proxy != NULL ? s->conf.proxy : "");
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (s->conf.ca_file != NULL)
        curl_easy_setopt(c, CURLOPT_CAINFO, s->conf.ca_file);
    if (s->conf.cert_file != NULL) {
        curl_easy_setopt(c, CURLOPT_SSLCERT, s->conf.cert_file);
        curl_easy_setopt(c, CURLOPT_SSLKEY, s->conf.key_file);
    }
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, s->curl_error);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "sekali-http/1.0");
    *state = s;
    return SEKALI_OK;
}

static bool field_ok(const char *s)
{
    return header_value_ok(s, strlen(s));
}

/* Adds "Name: value" to the list; false when out of memory. */
static bool add_header(struct curl_slist **list, const char *name, const char *value)
{
    size_t n = strlen(name) + strlen(value) + 3;
    char *line = malloc(n);
    if (line == NULL)
        return false;
    snprintf(line, n, "%s: %s", name, value);
    struct curl_slist *grown = curl_slist_append(*list, line);
    memset(line, 0, n);  /* may hold a secret */
    free(line);
    if (grown == NULL)
        return false;
    *list = grown;
    return true;
}

/* The first bytes of a failed response (already redacted), for the dead
 * letter: control characters blanked, and a secret its end cuts too. */
static void excerpt(struct http_state *s, char *out, size_t size)
{
    size_t n = s->response_len < EXCERPT ? s->response_len : EXCERPT;
    if (n + 1 > size)
        n = size - 1;
    memcpy(out, s->response, n);
    out[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f)
            out[i] = ' ';
    redact(s, out, n);
}

/* Retry-After in seconds or as an HTTP date; 0 if absent or unreadable. */
static uint32_t retry_after_ms(CURL *c)
{
    struct curl_header *h = NULL;
    if (curl_easy_header(c, "Retry-After", 0, CURLH_HEADER, -1, &h) != CURLHE_OK || h == NULL)
        return 0;
    const char *v = h->value;
    if (isdigit((unsigned char)*v)) {
        long secs = strtol(v, NULL, 10);
        return secs > 0 && secs < 86400 ? (uint32_t)secs * 1000 : 0;
    }
    time_t when = curl_getdate(v, NULL), now = time(NULL);
    return when > now && when - now < 86400 ? (uint32_t)(when - now) * 1000 : 0;
}

static int http_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    struct http_state *s = state;
    const struct sekali_host *host = job->host;
    char why[512];

    PGconn *pg = host->pg(ctx);
    if (pg != NULL && PQtransactionStatus(pg) == PQTRANS_INTRANS) {
        host->set_error(ctx, "the http handler runs in `mode: external` only");
        return SEKALI_FAIL;
    }
    /* The job's own fields become header values: a line break in one
     * would end the header and start another of the producer's choice. */
    const char *content_type = job->content_type[0] != '\0' ? job->content_type
                                                            : "application/octet-stream";
    if (!field_ok(job->idempotency_key) || !field_ok(job->job_id) ||
        !field_ok(job->job_type) || !field_ok(content_type)) {
        host->set_error(ctx, "the job's id, key, type or content type holds a control "
                             "character: it cannot be sent as an HTTP header");
        return SEKALI_FAIL;
    }
    char attempt[16], fence[24];
    snprintf(attempt, sizeof(attempt), "%u", (unsigned)job->delivery_attempt);
    snprintf(fence, sizeof(fence), "%lld", (long long)job->fence);
    struct curl_slist *headers = NULL;
    bool ok = add_header(&headers, "Content-Type", content_type) &&
              add_header(&headers, "Idempotency-Key", job->idempotency_key) &&
              add_header(&headers, "X-Sekali-Job-Id", job->job_id) &&
              add_header(&headers, "X-Sekali-Attempt", attempt) &&
              add_header(&headers, "X-Sekali-Fence", fence) &&
              add_header(&headers, "X-Sekali-Job-Type", job->job_type) &&
              add_header(&headers, "Expect", "");
    /* Since ABI 1.7: the job's span as the parent of the service's, so the
     * service's trace continues the producer's. The host checked both
     * values against the W3C grammar (printable ASCII only). */
    if (ok && host->abi_minor >= 7 &&
        job->struct_size >= offsetof(struct sekali_job, tracestate) + sizeof(job->tracestate)) {
        if (job->traceparent != NULL && job->traceparent[0] != '\0')
            ok = add_header(&headers, "traceparent", job->traceparent);
        if (ok && job->tracestate != NULL && job->tracestate[0] != '\0')
            ok = add_header(&headers, "tracestate", job->tracestate);
    }
    for (int i = 0; ok && i < s->conf.n_headers; i++)
        ok = add_header(&headers, s->conf.headers[i].name, s->conf.headers[i].value);
    if (!ok) {
        curl_slist_free_all(headers);
        host->set_error(ctx, "out of memory building the request");
        return SEKALI_RETRY;
    }

    CURL *c = s->curl;
    s->response_len = 0;
    s->truncated = false;
    s->curl_error[0] = '\0';
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, job->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)job->body_len);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    uint32_t after = rc == CURLE_OK ? retry_after_ms(c) : 0;
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(headers);
    s->response[s->response_len] = '\0';
    /* Whatever leaves the handler is made of these: a service may echo
     * the request's headers in an error or in its answer. */
    redact(s, s->response, s->response_len);
    redact(s, s->curl_error, strlen(s->curl_error));

    if (rc != CURLE_OK) {
        /* Unreachable, refused, reset, timed out, a certificate not
         * trusted: the request may or may not have arrived, and the
         * Idempotency-Key makes sending it again safe. */
        snprintf(why, sizeof(why), "POST failed: %s", s->curl_error[0] != '\0'
                 ? s->curl_error : curl_easy_strerror(rc));
        host->set_error(ctx, why);
        return SEKALI_RETRY;
    }
    if (status >= 200 && status < 300) {
        if (s->truncated)
            host->log(ctx, SEKALI_LOG_WARN, "http: the response's body is longer than %d bytes: "
                      "its start is the result", MAX_RESPONSE);
        host->set_result(ctx, s->response, s->response_len);
        return SEKALI_OK;
    }
    char text[EXCERPT + 1];
    excerpt(s, text, sizeof(text));
    snprintf(why, sizeof(why), "HTTP %ld: %s", status, text);
    host->set_error(ctx, why);
    if (status == 408 || status == 425 || status == 429 || status >= 500) {
        if (after > 0)
            host->retry_after(ctx, after);
        return SEKALI_RETRY;
    }
    return SEKALI_FAIL;
}

static void http_fini(void *state)
{
    struct http_state *s = state;
    curl_easy_cleanup(s->curl);
    conf_free(&s->conf);
    free(s->response);
    for (int i = 0; i < s->n_redact; i++) {
        memset(s->redact[i], 0, s->redact_len[i]);
        free(s->redact[i]);
    }
    free(s);
}

SEKALI_HANDLER_DEFINE(.name = "http", .version = "1.0.0", .check = http_check, .init = http_init,
                      .handle = http_handle, .fini = http_fini)
