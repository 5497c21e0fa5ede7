/* heartbeat.h - the renewal thread of a worker.
 *
 * While a job runs, this thread extends what the job owns: its Redis lock
 * (every lock ttl/3) and, in external mode, its PostgreSQL lease (every
 * lease/3), each on the thread's own connection (hiredis and libpq
 * connections are never shared between threads). When Redis or PostgreSQL
 * says the job no longer owns it, the thread raises the lost flag; the
 * handler sees it through host->lock_held().
 *
 * While a handler runs, the worker's RabbitMQ connections are lent to this
 * thread, which keeps them alive with heartbeat frames: the worker cannot
 * answer the broker then, and a handler longer than the AMQP heartbeat
 * would otherwise lose its connection, and its job be redelivered. */
#ifndef SK_HEARTBEAT_H
#define SK_HEARTBEAT_H

#include <stdatomic.h>
#include <stdint.h>

#include "broker.h"
#include "common.h"
#include "config.h"

struct sk_heartbeat;

/* Starts the thread with all signals blocked; it wakes every tick_ms. Redis
 * or PostgreSQL being down is not an error here: the thread keeps trying at
 * each tick. Returns SK_OK or SK_ERR (thread creation failed). */
int  sk_heartbeat_start(struct sk_heartbeat **out, const struct sk_conf *conf,
                        uint32_t tick_ms, struct sk_err *err);
/* Stops and joins the thread; accepts NULL. */
void sk_heartbeat_stop(struct sk_heartbeat *hb);

/* Renew the lock `key` (owned by token) for ttl_ms at each tick. Copies the
 * strings and clears the lost flag. Never blocks on a server. */
void sk_heartbeat_watch_lock(struct sk_heartbeat *hb, const char *key, const char *token,
                             uint32_t ttl_ms);

/* As sk_heartbeat_watch_lock() for the n locks of a batch (n >= 1): each
 * is renewed at each tick, and any one lost raises the flag. */
void sk_heartbeat_watch_locks(struct sk_heartbeat *hb, size_t n, const char *const *keys,
                              const char *const *tokens, uint32_t ttl_ms);

/* Renew the lease of (queue, key) under fence for lease_ms at each tick. */
void sk_heartbeat_watch_lease(struct sk_heartbeat *hb, const char *queue, const char *key,
                              int64_t fence, uint32_t lease_ms);

/* Lends the worker's connections (either may be NULL) to the thread, which
 * sends them heartbeats at each tick until sk_heartbeat_return_brokers().
 * Meanwhile the caller must not use them. */
void sk_heartbeat_lend_brokers(struct sk_heartbeat *hb, struct sk_broker *consumer,
                               struct sk_broker *publisher);
/* Takes them back; once it returns, the thread no longer touches them. */
void sk_heartbeat_return_brokers(struct sk_heartbeat *hb);

/* Stop renewing anything (the job is over). */
void sk_heartbeat_unwatch(struct sk_heartbeat *hb);

/* Raised when a watched lock or lease is found lost; cleared by a watch. */
const atomic_bool *sk_heartbeat_lost(struct sk_heartbeat *hb);

#endif
