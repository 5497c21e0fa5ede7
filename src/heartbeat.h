/* heartbeat.h - the lock-renewal thread of a worker.
 *
 * While a job runs, this thread extends its Redis lease every ttl/3 on its own
 * Redis connection (hiredis contexts are never shared between threads). If
 * Redis says the lease is gone, it raises the lost flag; the handler can see
 * it through host->lock_held(), and the worker logs it. */
#ifndef SK_HEARTBEAT_H
#define SK_HEARTBEAT_H

#include <stdatomic.h>
#include <stdint.h>

#include "common.h"
#include "config.h"

struct sk_heartbeat;

/* Starts the thread with all signals blocked. ttl_ms sets its tick (ttl/3).
 * Returns SK_OK or SK_ERR (thread creation failed). Redis being down is not
 * an error here: the thread keeps trying at each tick. */
int  sk_heartbeat_start(struct sk_heartbeat **out, const struct sk_redis_conf *conf,
                        uint32_t ttl_ms, struct sk_err *err);
/* Stops and joins the thread; accepts NULL. */
void sk_heartbeat_stop(struct sk_heartbeat *hb);

/* Renew key (owned by token) until unwatch. Copies both strings; clears the
 * lost flag. Never blocks on Redis. Worker main thread only. */
void sk_heartbeat_watch(struct sk_heartbeat *hb, const char *key, const char *token);
void sk_heartbeat_unwatch(struct sk_heartbeat *hb);

/* Raised when Redis reports the watched lease gone; reset by watch(). */
const atomic_bool *sk_heartbeat_lost(struct sk_heartbeat *hb);

#endif
