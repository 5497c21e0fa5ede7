/* metrics_http.h - the supervisor's HTTP endpoint: GET /metrics (Prometheus),
 * /livez and /readyz (health), and GET /inflight (the jobs in flight).
 *
 * Served from the supervisor's own poll() loop, no thread: each turn the
 * loop adds the endpoint's descriptor and timeout with sk_metrics_http_poll()
 * and lets it answer with sk_metrics_http_serve(). It reads the shared
 * metrics and the configuration, never the supervisor's own state: what
 * health needs, the supervisor hands over with sk_metrics_http_health(). A
 * supervisor stuck in its loop answers nothing, which is how a liveness
 * probe (which times out) sees it. */
#ifndef SK_METRICS_HTTP_H
#define SK_METRICS_HTTP_H

#include <poll.h>
#include <stdbool.h>

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

/* Closes every connection and the listening socket. Accepts NULL. */
void sk_metrics_http_stop(struct sk_metrics_http *h);

/* In a child forked from the process that started h: closes the child's
 * copies of the server's descriptors. fork() duplicates them and nothing
 * would close them: a worker still draining after its supervisor died would
 * keep the port, and the next sekalid could not listen; an inherited
 * connection would stay open after the supervisor closed it, and its
 * client wait for an answer. Accepts NULL. */
void sk_metrics_http_close_in_child(struct sk_metrics_http *h);

/* After a reload: serve the new generation's configuration and metrics;
 * the old ones are not read again and may be freed. /readyz says "not
 * ready" until the supervisor reports the new generation ready. The
 * listening address stays the one of the start: changing metrics.listen
 * takes a restart. */
void sk_metrics_http_switch(struct sk_metrics_http *h, const struct sk_conf *conf,
                            struct sk_metrics *m);

/* GET /inflight: render returns a malloc'ed document (the jobs in flight,
 * inflight.h) and sets *len, or NULL when out of memory. Until this is
 * called, /inflight answers 500. Accepts NULL. */
typedef char *(*sk_metrics_http_render_fn)(void *arg, size_t *len);
void sk_metrics_http_inflight(struct sk_metrics_http *h, sk_metrics_http_render_fn render,
                              void *arg);

/* Each turn of the supervisor's loop, before poll(): sets *pfd to the
 * descriptor to watch for input (fd -1 when h is NULL, which poll()
 * skips), and lowers *timeout (ms, -1: none) to when libmicrohttpd has
 * timed work. */
void sk_metrics_http_poll(struct sk_metrics_http *h, struct pollfd *pfd, int *timeout);

/* After poll(): answers what arrived, and closes idle connections, if pfd
 * shows input or libmicrohttpd's timeout has come; otherwise returns at
 * once. Never blocks; a /metrics answer is a read of the shared counters.
 * Accepts NULL. */
void sk_metrics_http_serve(struct sk_metrics_http *h, const struct pollfd *pfd);

/* Called by the supervisor at every turn of its loop: tells /readyz
 * whether the current generation is ready (every worker consuming, every
 * relay and the janitor up) and, as a line of text, how its workers stand,
 * e.g. "invoices: 1/2 workers consuming". Accepts NULL. */
void sk_metrics_http_health(struct sk_metrics_http *h, bool ready, const char *status);

#endif
