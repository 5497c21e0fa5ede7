/* heartbeat.h - the renewal thread of a worker.
 *
 * While a span of jobs runs, this thread extends what it owns: its Redis
 * locks (every lock ttl/3, one round trip for all) and, in external mode,
 * its PostgreSQL lease (every lease/3), each on the thread's own
 * connection (hiredis and libpq connections are never shared between
 * threads). When Redis or PostgreSQL
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
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker.h"
#include "common.h"
#include "config.h"

struct sk_heartbeat;

/* How often the thread must wake for a worker of queue: a third of the
 * lock's and of the lease's time, and often enough to keep the broker
 * connections of a long handler alive. UINT32_MAX when it has nothing to
 * do (no lock, no lease, no AMQP heartbeat): then start no thread. */
uint32_t sk_heartbeat_tick(const struct sk_queue_conf *queue, const struct sk_amqp_conf *amqp);

/* Starts the thread with all signals blocked; it wakes every tick_ms and
 * opens its own connections from redis and postgres (borrowed: they must
 * outlive the thread). Redis or PostgreSQL being down is not an error here:
 * the thread keeps trying at each tick. Returns SK_OK or SK_ERR (thread
 * creation failed). */
int  sk_heartbeat_start(struct sk_heartbeat **out, const struct sk_redis_conf *redis,
                        const struct sk_postgres_conf *postgres, uint32_t tick_ms,
                        struct sk_err *err);
/* Stops and joins the thread; accepts NULL. */
void sk_heartbeat_stop(struct sk_heartbeat *hb);

/* Renew the n locks of a span of jobs (n >= 1; key i owned by token i) for
 * ttl_ms at each tick, all in one round trip; any one lost raises the flag.
 * Replaces what was watched before, copies the strings and clears the lost
 * flag. Never blocks on a server. */
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

/* Stop renewing anything (the span is over). lost[i], for the first n
 * locks last watched (n may be 0), tells whether lock i was found lost.
 * Returns the lost flag as it ended: true when any lock or the lease was. */
bool sk_heartbeat_unwatch(struct sk_heartbeat *hb, bool *lost, size_t n);

/* Raised when a watched lock or lease is found lost; cleared by a watch. */
const atomic_bool *sk_heartbeat_lost(struct sk_heartbeat *hb);

#endif
