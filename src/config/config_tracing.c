/* config_tracing.c - the tracing: section: where a worker exports one span
 * per job run (OTLP/HTTP, span_export.c), under which service name, and
 * how long one export may take.
 *
 * The endpoint is checked here, so that a typo stops `sekalid -t` at its
 * line rather than turning into a stream of failed exports: an http:// or
 * https:// URL with a host, no blanks or control characters, and no
 * user:password@, since a URL is shown in errors and secrets never are. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "config_walk.h"

#define MAX_URL 2048

static int otlp_endpoint(struct loader *L, yaml_node_t *v, void *base);

const struct key sk_conf_tracing_keys[] = {
    CUSTOM("otlp_endpoint", otlp_endpoint, false),
    STR("service_name", sk_tracing_conf, service_name),
    /* At most 10s: a worker's stop waits this long for its spans, well inside
     * the default shutdown_timeout (30s). */
    DURATION("otlp_timeout", sk_tracing_conf, otlp_timeout_ms, 100, 10 * SEC),
    END
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
