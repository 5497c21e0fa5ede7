/* ctl_http.h - sekalictl's scrape of sekalid's /metrics (ctl_http.c): a
 * plain HTTP GET on a loopback or configured address, and reading one
 * sample out of Prometheus text. */
#ifndef SK_CTL_HTTP_H
#define SK_CTL_HTTP_H

#include <stdbool.h>
#include <stddef.h>

/* GET http://host:port/path within timeout_ms, with "Authorization: Bearer
 * token" unless token is NULL. The body of a 200 answer (or of /readyz's 503,
 * which says why it is not ready) (NUL-terminated;
 * the caller frees it), or NULL with why (which never holds the token). */
char *sk_ctl_http_get(const char *host, int port, const char *path, const char *token,
                      int timeout_ms, char *why, size_t why_size);
/* The value of the first sample of metric `name` in Prometheus text (with
 * label queue="queue" when queue is not NULL); *found says whether there
 * was one. */
double sk_ctl_metric(const char *text, const char *name, const char *queue, bool *found);

#endif
