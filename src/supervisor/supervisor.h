/* supervisor.h - the parent process: forks the workers and keeps them running. */
#ifndef SK_SUPERVISOR_H
#define SK_SUPERVISOR_H

#include "config.h"
#include "plugin.h"

/* Forks queue->workers workers for every queue (plugins[i] serves
 * conf->queues[i]), restarts those that die, reloads conf->path on SIGHUP,
 * and on SIGTERM or SIGINT stops them all within shutdown_timeout. Takes
 * ownership of conf and of the plugins array. Returns the process exit code:
 * 0 after a requested stop, or a worker's SK_EXIT_CONFIG/SK_EXIT_ABI, which
 * would only repeat if respawned. */
int sk_supervisor_run(struct sk_conf *conf, struct sk_plugin *plugins);

#endif
