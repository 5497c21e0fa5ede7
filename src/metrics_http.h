/* metrics_http.h - the supervisor's Prometheus endpoint: GET /metrics.
 *
 * libmicrohttpd serves it from a thread of its own in the supervisor, with
 * every signal blocked, so that signals keep arriving only at the
 * supervisor's signalfd. The thread reads the shared metrics and the
 * configuration, never the supervisor's own state. */
#ifndef SK_METRICS_HTTP_H
#define SK_METRICS_HTTP_H

#include "common.h"
#include "config.h"
#include "metrics.h"

struct sk_metrics_http;

/* Listens on conf->metrics (when it has an address; otherwise sets *out to
 * NULL and does nothing) and starts serving m. conf and m are borrowed and
 * must outlive sk_metrics_http_stop(). Returns SK_OK; SK_ERR when the
 * configured address cannot be resolved or listened on (a configuration
 * problem: sekalid exits 2); SK_AGAIN when the server itself could not
 * start (a restart may succeed). */
int sk_metrics_http_start(struct sk_metrics_http **out, const struct sk_conf *conf,
                          struct sk_metrics *m, struct sk_err *err);

/* Stops the thread, closes every connection and the listening socket.
 * Accepts NULL. */
void sk_metrics_http_stop(struct sk_metrics_http *h);

/* In a child forked from the process that started h: closes the child's copy
 * of the listening socket. fork() duplicates it and nothing would close it,
 * so a worker still draining after its supervisor died would keep the port,
 * and the next sekalid could not listen. Accepts NULL. */
void sk_metrics_http_close_in_child(struct sk_metrics_http *h);

/* After a reload: serve the new generation's configuration and metrics.
 * Waits for a scrape in progress; afterwards the old ones are not read
 * again and may be freed. The listening address stays the one of the
 * start: changing metrics.listen takes a restart. */
void sk_metrics_http_switch(struct sk_metrics_http *h, const struct sk_conf *conf,
                            struct sk_metrics *m);

#endif
