/* config_tracing.c - the tracing: section: where a worker exports one span
 * per job run (OTLP/HTTP, span_export.c), under which service name, with
 * which headers, and how long one export may take.
 *
 * The endpoint is checked here, so that a typo stops `sekalid -t` at its
 * line rather than turning into a stream of failed exports: an http:// or
 * https:// URL with a host, no blanks or control characters, and no
 * user:password@, since a URL is shown in errors and secrets never are.
 * A managed collector's API key goes in otlp_headers instead, read from a
 * file or a variable as the servers' passwords are (value_file,
 * value_env); no message quotes a header's value, secret or not. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "config_walk.h"

#define MAX_URL 2048
#define MAX_HEADERS      16
#define MAX_HEADER_NAME  128
#define MAX_HEADER_VALUE 4096
/* RFC 9110's token, the characters of a field name. */
#define TOKEN_CHARS "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

static int otlp_endpoint(struct loader *L, yaml_node_t *v, void *base);
static int otlp_headers(struct loader *L, yaml_node_t *v, void *base);
static int header_name(struct loader *L, yaml_node_t *k, const struct sk_tracing_conf *t,
                       const char **out);
static int header_value(struct loader *L, yaml_node_t *v, const char *name,
                        struct sk_otlp_header *h);

const struct key sk_conf_tracing_keys[] = {
    CUSTOM("otlp_endpoint", otlp_endpoint, false),
    STR("service_name", sk_tracing_conf, service_name),
    /* At most 10s: a worker's stop waits this long for its spans, well inside
     * the default shutdown_timeout (30s). */
    DURATION("otlp_timeout", sk_tracing_conf, otlp_timeout_ms, 100, 10 * SEC),
    CUSTOM("otlp_headers", otlp_headers, false),
    END
};

/* A header's value in its long form: one of the three. */
struct value_src {
    char *value;
    char *secret;
};

static const struct key value_keys[] = {
    STR("value", value_src, value),
    { .name = "value_env",  .type = T_PASSWORD_ENV,  .offset = OF(value_src, secret) },
    { .name = "value_file", .type = T_PASSWORD_FILE, .offset = OF(value_src, secret) },
    END
};

/* The exporter sets these, or they change how the request is framed. */
static const char *const reserved[] = {
    "content-type", "content-length", "content-encoding", "transfer-encoding", "host",
    "connection", "expect", "te", "upgrade", NULL
};

/* "" or null: no export, as an absent key. */
static int otlp_endpoint(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_tracing_conf *t = base;
    const char *s;
    int rc = sk_walk_scalar(L, v, "otlp_endpoint", "a URL", &s);
    if (rc != SK_OK)
        return rc;
    if (*s == '\0' || sk_walk_is_null(v)) {
        free(t->otlp_endpoint);
        t->otlp_endpoint = NULL;
        return SK_OK;
    }
    size_t len = strlen(s);
    size_t scheme = strncasecmp(s, "http://", 7) == 0    ? 7
                  : strncasecmp(s, "https://", 8) == 0   ? 8 : 0;
    if (scheme == 0)
        return sk_walk_fail(L, v, "otlp_endpoint: expected an http:// or https:// URL");
    if (len > MAX_URL)
        return sk_walk_fail(L, v, "otlp_endpoint: longer than %d bytes", MAX_URL);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f)
            return sk_walk_fail(L, v, "otlp_endpoint: a blank or control character at "
                                "byte %zu", i + 1);
    size_t host = strcspn(s + scheme, "/?#");
    if (host == 0)
        return sk_walk_fail(L, v, "otlp_endpoint: the URL has no host");
    if (memchr(s + scheme, '@', host) != NULL)
        return sk_walk_fail(L, v, "otlp_endpoint: no user or password in the URL "
                            "(it would show in errors); authenticate at a local collector");
    return sk_walk_store(L, v, &t->otlp_endpoint, s);
}

/* otlp_headers: {Name: value, Name: {value_file: path}, ...}, at most
 * MAX_HEADERS. Null or {}: none. */
static int otlp_headers(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_tracing_conf *t = base;
    sk_conf_tracing_free_headers(t);
    if (sk_walk_is_null(v))
        return SK_OK;
    if (v->type != YAML_MAPPING_NODE)
        return sk_walk_fail(L, v, "otlp_headers: expected a mapping of header name to value, "
                            "got %s", sk_walk_kind(v));
    size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n > MAX_HEADERS)
        return sk_walk_fail(L, v, "otlp_headers: at most %d headers, got %zu", MAX_HEADERS, n);
    if (n == 0)
        return SK_OK;
    if ((t->otlp_headers = calloc(n, sizeof(*t->otlp_headers))) == NULL)
        return sk_walk_fail(L, v, "out of memory");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        const char *name = NULL;
        int rc = header_name(L, sk_walk_node(L, p->key), t, &name);
        if (rc != SK_OK)
            return rc;
        struct sk_otlp_header *h = &t->otlp_headers[t->n_otlp_headers];
        if ((h->name = strdup(name)) == NULL)
            return sk_walk_fail(L, v, "out of memory");
        t->n_otlp_headers++;
        if ((rc = header_value(L, sk_walk_node(L, p->value), name, h)) != SK_OK)
            return rc;
    }
    return SK_OK;
}

/* A token, not one the exporter sets, not given twice (in any case). */
static int header_name(struct loader *L, yaml_node_t *k, const struct sk_tracing_conf *t,
                       const char **out)
{
    const char *s;
    int rc = sk_walk_scalar(L, k, "otlp_headers", "a header name", &s);
    if (rc != SK_OK)
        return rc;
    size_t len = strlen(s), bad = strspn(s, TOKEN_CHARS);
    if (len == 0 || len > MAX_HEADER_NAME)
        return sk_walk_fail(L, k, "otlp_headers: a header name is 1 to %d characters",
                            MAX_HEADER_NAME);
    if (bad < len)
        return sk_walk_fail(L, k, "otlp_headers: a header name has only A-Z a-z 0-9 and "
                            "! # $ %% & ' * + - . ^ _ ` | ~ (RFC 9110's token); "
                            "byte %zu is not one", bad + 1);
    for (const char *const *r = reserved; *r != NULL; r++)
        if (strcasecmp(s, *r) == 0)
            return sk_walk_fail(L, k, "otlp_headers: %s is set by sekali itself", s);
    for (size_t i = 0; i < t->n_otlp_headers; i++)
        if (strcasecmp(s, t->otlp_headers[i].name) == 0)
            return sk_walk_fail(L, k, "otlp_headers: %s is given twice (names ignore case)", s);
    *out = s;
    return SK_OK;
}

/* A plain scalar, or {value | value_env | value_file: ...}; then 1 to
 * MAX_HEADER_VALUE bytes with no control character but a tab. The
 * messages place the value and never show it. */
static int header_value(struct loader *L, yaml_node_t *v, const char *name,
                        struct sk_otlp_header *h)
{
    char label[MAX_HEADER_NAME + 32];
    snprintf(label, sizeof(label), "otlp_headers: %s", name);
    struct value_src src = { 0 };
    int rc;
    if (v->type == YAML_MAPPING_NODE) {
        /* Each header's secret is its own: none conflicts with a password. */
        const char *saved = L->secret_from;
        L->secret_from = NULL;
        rc = sk_walk_map(L, v, label, value_keys, &src);
        L->secret_from = saved;
        if (rc == SK_OK && (src.value == NULL) == (src.secret == NULL))
            rc = sk_walk_fail(L, v, "%s: give one of value, value_env or value_file", label);
    } else {
        const char *s;
        rc = sk_walk_scalar(L, v, label, "a value or {value_file: path}", &s);
        if (rc == SK_OK && sk_walk_is_null(v))
            rc = sk_walk_fail(L, v, "%s: the value is empty", label);
        if (rc == SK_OK)
            rc = sk_walk_store(L, v, &src.value, s);
    }
    h->secret = src.secret != NULL;
    h->value = h->secret ? src.secret : src.value;
    if (rc != SK_OK) {
        sk_conf_value_wipe(h->secret ? src.value : src.secret);
        return rc;
    }
    size_t len = strlen(h->value);
    const char *from = h->secret ? " (from value_env or value_file)" : "";
    if (len == 0 || len > MAX_HEADER_VALUE)
        return sk_walk_fail(L, v, "%s: the value%s must be 1 to %d bytes", label, from,
                            MAX_HEADER_VALUE);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)h->value[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return sk_walk_fail(L, v, "%s: the value%s has a control character (CR, LF or "
                                "another) at byte %zu", label, from, i + 1);
    }
    return SK_OK;
}

void sk_conf_tracing_free_headers(struct sk_tracing_conf *t)
{
    for (size_t i = 0; i < t->n_otlp_headers; i++) {
        free(t->otlp_headers[i].name);
        sk_conf_value_wipe(t->otlp_headers[i].value);
    }
    free(t->otlp_headers);
    t->otlp_headers = NULL;
    t->n_otlp_headers = 0;
}
