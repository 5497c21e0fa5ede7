/* plugin.h - loads handler shared objects and checks their ABI.
 *
 * Plugins are loaded by the supervisor before it forks, so a bad plugin stops
 * sekalid at start instead of crash-looping its workers. An accepted one is
 * never dlclose()d: a handler may have started threads or registered atexit
 * callbacks that would point into unmapped code. A refused one is: only its
 * descriptor function and check() ran, and neither may keep anything. */
#ifndef SK_PLUGIN_H
#define SK_PLUGIN_H

#include <stdbool.h>

#include <sekali/handler.h>

#include "common.h"
#include "config.h"

/* Returned by sk_plugin_load() for a file that loaded but describes a
 * handler this sekalid cannot run (another ABI major version, a descriptor
 * too small, no handle()): sekalid exits SK_EXIT_ABI for it alone. A missing,
 * unsafe, unloadable file, or one that is no sekali handler, is SK_ERR: a
 * configuration mistake (SK_EXIT_CONFIG). */
#define SK_PLUGIN_ABI (-20)

struct sk_plugin {
    const char                  *path;     /* borrowed from the config */
    const struct sekali_handler *handler;
    void                        *dl;       /* the dlopen() handle */
    int                          fd;       /* kept open while loaded, or -1 */
};

/* dlopen()s path with RTLD_NOW|RTLD_LOCAL, finds sekali_handler_v1 and checks
 * the descriptor. Returns SK_OK; SK_PLUGIN_ABI with a message naming the
 * file, the field and both values; or SK_ERR. A refused object is
 * dlclose()d again. */
int sk_plugin_load(const char *path, struct sk_plugin *out, struct sk_err *err);

/* Runs the handler's check() (ABI 1.3, optional) on config. SK_OK, or SK_ERR
 * with the handler's own message. host is what check() gets. */
int sk_plugin_check_config(const struct sk_plugin *p, const struct sekali_host *host,
                           const char *config, struct sk_err *err);

/* Loads the handler of every queue of conf and checks its handler config:
 * *out is a new array (the caller frees it; the handlers stay loaded) with
 * (*out)[i] serving queue i. On failure nothing stays loaded that was not
 * loaded before, the message names the queue, and the code is that of
 * sk_plugin_load(). Supervisor only (check() runs here). */
int sk_plugin_load_queues(const struct sk_conf *conf, const struct sekali_host *host,
                          struct sk_plugin **out, struct sk_err *err);

/* Whether h has ready() (ABI 1.4, optional), which the worker then calls
 * before each delivery. */
bool sk_plugin_has_ready(const struct sekali_handler *h);

/* sekalid -t only: for each queue whose handler has ready(), runs init(),
 * ready() on a new PostgreSQL connection of the configuration's, and
 * fini(), and passes what it found to say(): a statement that does not
 * prepare now, or a database that could not be asked. Findings, not
 * errors: a deploy that creates the function after sekali starts is
 * legal (the workers hold the queue's jobs until ready() says yes), and
 * `sekalid -t` is the unit's ExecStartPre. Blocks for a dial per queue. */
void sk_plugin_try_ready(const struct sk_conf *conf, const struct sk_plugin *plugins,
                         const struct sekali_host *host,
                         void (*say)(const char *text, void *arg), void *arg);

/* The descriptor checks alone, for a descriptor already in hand. */
int sk_plugin_check(const struct sekali_handler *h, const char *path, struct sk_err *err);

#endif
