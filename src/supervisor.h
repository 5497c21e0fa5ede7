/* supervisor.h - the parent process: forks the workers and keeps them running. */
#ifndef SK_SUPERVISOR_H
#define SK_SUPERVISOR_H

#include "config.h"
#include "plugin.h"

/* Forks queue->workers workers for every queue (plugins[i] serves
 * conf->queues[i]), restarts those that die, and on SIGTERM or SIGINT stops
 * them all within shutdown_timeout. Returns the process exit code: 0 after a
 * requested stop, or a worker's SK_EXIT_CONFIG/SK_EXIT_ABI, which would only
 * repeat if respawned. */
int sk_supervisor_run(const struct sk_conf *conf, const struct sk_plugin *plugins);

#endif
