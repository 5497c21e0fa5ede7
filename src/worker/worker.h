/* worker.h - one worker process: consumes one queue, one job at a time. */
#ifndef SK_WORKER_H
#define SK_WORKER_H

#include <stdbool.h>

#include "config.h"
#include "metrics.h"
#include "plugin.h"
#include "scoreboard.h"

/* Runs the worker loop in the calling (freshly forked) process until SIGTERM
 * or SIGINT, then finishes the job in flight and returns the process exit
 * code (SK_EXIT_*). conf and plugin are borrowed from the supervisor; slot is
 * this worker's place in the shared scoreboard, and metrics its queue's part
 * of the shared metrics. With doctor, the first process of its slot runs
 * doctor's start checks (doctor.h) once it can serve, before its first
 * delivery. */
int sk_worker_run(const struct sk_conf *conf, const struct sk_queue_conf *queue,
                  const struct sk_plugin *plugin, struct sk_slot *slot,
                  struct sk_metrics_queue *metrics, bool doctor);

#endif
