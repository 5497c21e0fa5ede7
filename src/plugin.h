/* plugin.h - loads handler shared objects and checks their ABI.
 *
 * Plugins are loaded by the supervisor before it forks, so a bad plugin stops
 * sekalid at start instead of crash-looping its workers. They are never
 * dlclose()d: a handler may have started threads or registered atexit
 * callbacks that would point into unmapped code. */
#ifndef SK_PLUGIN_H
#define SK_PLUGIN_H

#include <sekali/handler.h>

#include "common.h"
#include "config.h"

struct sk_plugin {
    const char                  *path;     /* borrowed from the config */
    const struct sekali_handler *handler;
};

/* dlopen()s path with RTLD_NOW|RTLD_LOCAL, finds sekali_handler_v1 and checks
 * the descriptor. Returns SK_OK, or SK_ERR with a message naming the file,
 * the field and both values. */
int sk_plugin_load(const char *path, struct sk_plugin *out, struct sk_err *err);

/* Loads the handler of every queue of conf: *out is a new array (the caller
 * frees it; the handlers stay loaded) with (*out)[i] serving queue i. On
 * failure the message names the queue. */
int sk_plugin_load_queues(const struct sk_conf *conf, struct sk_plugin **out,
                          struct sk_err *err);

/* The descriptor checks alone, for a descriptor already in hand. */
int sk_plugin_check(const struct sekali_handler *h, const char *path, struct sk_err *err);

#endif
