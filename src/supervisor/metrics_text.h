/* metrics_text.h - the shared metrics (metrics.h) as Prometheus text,
 * for the supervisor's /metrics (metrics_http.c). In the supervisor's
 * folder, with the one file that defines it: metrics.h, a layer below,
 * declares only what every process uses. */
#ifndef SK_METRICS_TEXT_H
#define SK_METRICS_TEXT_H

#include <stddef.h>

#include "config.h"
#include "metrics.h"

/* Renders every metric in Prometheus' text format 0.0.4, with conf's queue
 * names and limits, into a new buffer the caller frees (malloc). Reads the
 * area only, so it may run concurrently with the counting. SK_OK, or
 * SK_ERR when out of memory. */
int sk_metrics_render(struct sk_metrics *m, const struct sk_conf *conf, char **out,
                      size_t *len);

#endif
