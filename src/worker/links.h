/* links.h - a worker process's connections to its servers, and their outages.
 *
 * A worker talks to RabbitMQ twice (the consumer it takes deliveries from,
 * and a publisher with confirms for retries, dead letters and replies), to
 * Redis (the resource locks) and to PostgreSQL (the store that runs the job
 * transaction). This module opens each after fork, lazily, and is the one
 * place that knows a server is down: it logs an outage once, logs its end
 * once, and spaces the attempts with jittered backoff. The pipeline (job.c)
 * takes connections from here and reports what a call on one said; it never
 * opens or closes one itself.
 *
 * One struct sk_links per worker process, used by its main thread only (the
 * heartbeat thread has connections of its own, and borrows the AMQP ones
 * only through sk_links_lend()). */
#ifndef SK_LINKS_H
#define SK_LINKS_H

#include <stdbool.h>

#include "common.h"
#include "config.h"

struct sk_broker;
struct sk_heartbeat;
struct sk_lock;
struct sk_log_job;
struct sk_slot;
struct sk_slot_lock;
struct sk_store;

enum sk_link {
    SK_LINK_CONSUMER,   /* RabbitMQ: subscribed to the worker's queue */
    SK_LINK_PUBLISHER,  /* RabbitMQ: confirmed copies (retries, dead letters, replies) */
    SK_LINK_LOCK,       /* Redis: the resource locks */
    SK_LINK_STORE,      /* PostgreSQL: the job transaction, claims and leases */
};

struct sk_links;

/* Connects to nothing yet. conf, queue and slot are borrowed for the
 * process's life; slot's consuming and ready flags are written here. Returns
 * SK_OK or SK_ERR (out of memory). */
int  sk_links_new(struct sk_links **out, const struct sk_conf *conf,
                  const struct sk_queue_conf *queue, struct sk_slot *slot, struct sk_err *err);
/* Closes every connection; accepts NULL. */
void sk_links_free(struct sk_links *l);

/* At the worker's start: opens the store, and for the first worker of its
 * slot (first) logs in once to RabbitMQ and, if the queue locks, to Redis.
 * Returns SK_OK (a server merely down is left to the loop's retries), SK_ERR
 * when retrying cannot help (the schema is missing, or a first worker's
 * password was refused) or SK_AGAIN (a restart later may succeed). */
int sk_links_open(struct sk_links *l, bool first, struct sk_err *err);

/* Before each delivery, from the worker loop: true once the store is open
 * and the consumer subscribed. Otherwise false after logging the outage
 * (once) and sleeping its backoff: the worker does not consume while it
 * could only hand deliveries back. Also waits out the store's backoff after
 * a failed claim, and keeps the idle publisher alive. Blocks. */
bool sk_links_ready(struct sk_links *l);

/* The store's half of sk_links_ready(), for what must be settled before
 * the worker subscribes (its handler's ready()). Blocks. */
bool sk_links_store_ready(struct sk_links *l);

/* Stops consuming, not for an outage: closes the consumer, which gives
 * back every delivery it holds that no job has started (after flushing the
 * acks of finished ones). The next sk_links_ready() subscribes again. */
void sk_links_stand_down(struct sk_links *l);

/* The consumer, or NULL once dropped (until the next sk_links_ready()). */
struct sk_broker *sk_links_consumer(struct sk_links *l);

/* The store; open whenever sk_links_ready() said true. Its connection
 * reconnects itself; a failure is reported with sk_links_drop(). */
struct sk_store *sk_links_store(struct sk_links *l);

/* The publisher, opened in confirm mode if it is not open. NULL (err says
 * why) when RabbitMQ cannot be reached now; the caller decides what to do
 * with its message and reports it with sk_links_drop(). Blocks at most a
 * connect. */
struct sk_broker *sk_links_publisher(struct sk_links *l, struct sk_err *err);

/* The Redis connection for the locks, opened if needed; the queue's
 * on_redis_down decides what a job does while Redis is down. Returns SK_OK
 * with *out set: ask Redis. While Redis is down (it just failed, or its
 * backoff has not run out), *out is NULL and the result is the policy:
 * SK_OK, go on without the lock (`proceed`); SK_AGAIN, hold the job back
 * (`wait`, and always while Redis refuses sekali's password). */
int sk_links_lock(struct sk_links *l, struct sk_lock **out);

/* Redis's round trip as the lock connection measures it (sk_lock_rtt_ns());
 * 0 until measured, or while there is no connection. */
uint64_t sk_links_redis_rtt_ns(const struct sk_links *l);

/* Deletes each of a dead worker's n locks (its slot's orphans) whose token
 * still owns it, in one round trip on the lock connection and under its
 * outage: while Redis is down it is asked again only when the backoff
 * allows. Returns SK_OK once Redis answered for every lock, with *freed
 * set to how many were still the dead worker's (the others had expired or
 * changed hands), which also ends a Redis outage as sk_links_up() does;
 * SK_AGAIN (try them all again later; logged once); or SK_BUSY if Redis
 * refused the command (not worth asking again). */
int sk_links_free_orphans(struct sk_links *l, const struct sk_slot_lock *locks, size_t n,
                          size_t *freed);

/* A call on `which` failed (why: the adapter's error; job: the job it was
 * for, named in the store's log line, or NULL). Starts an outage, logged
 * once per outage where the server is gone, and:
 *   CONSUMER   closes it and stops consuming; sk_links_ready() reopens it.
 *   PUBLISHER  closes it if it failed (sk_broker_broken()); the next
 *              sk_links_publisher() reopens it. One the broker answered
 *              (a nack, a refused message) is sound, and kept.
 *   LOCK       keeps it (lock.c reconnects), and Redis is asked again only
 *              when the backoff allows.
 *   STORE      keeps it (store.c reconnects); why->code SK_AGAIN or SK_AUTH
 *              means PostgreSQL is gone, anything else that only this call
 *              failed (logged each time). sk_links_ready() then waits out
 *              the backoff before the next delivery, so the caller can hand
 *              its job back first and hold no lock through the pause.
 * Returns SK_AGAIN; for LOCK, sk_links_lock()'s policy (SK_OK: go on
 * without the lock). */
int sk_links_drop(struct sk_links *l, enum sk_link which, const struct sk_log_job *job,
                  const struct sk_err *why);

/* A call on LOCK or STORE succeeded: ends an outage (its end logged once)
 * and resets the backoff. */
void sk_links_up(struct sk_links *l, enum sk_link which);

/* Whether the consumer subscribed anew (opened after an outage, or at
 * start) since the last call: a paused queue's worker must cancel such a
 * consumer before it takes a delivery. */
bool sk_links_fresh(struct sk_links *l);

/* The consumer's prefetch window from now on, reopenings included: a new
 * consumer with it at once if one is subscribed (sk_broker_set_prefetch()).
 * Between batches only: should the broker fail the change, the consumer
 * is dropped, and sk_links_ready() reopens it with the new window. */
void sk_links_set_prefetch(struct sk_links *l, int prefetch);
/* The consumer's prefetch window now: the queue's until set. */
int sk_links_prefetch(const struct sk_links *l);

/* Pausing: cancels the consumer (the prefetched deliveries not yet taken go
 * back to the queue, *returned of them); resuming: subscribes it again. Also
 * the slot's paused and consuming flags. SK_OK; SK_AGAIN when the consumer
 * is not open or failed (dropped: sk_links_ready() reopens it, subscribed,
 * and sk_links_fresh() then says so). */
int sk_links_pause(struct sk_links *l, bool paused, size_t *returned, struct sk_err *err);

/* Lends the open AMQP connections to hb's thread for the length of a
 * handler call, and takes them back; in between the caller must not use
 * them (see sk_heartbeat_lend_brokers()). hb may be NULL. */
void sk_links_lend(struct sk_links *l, struct sk_heartbeat *hb);
void sk_links_take_back(struct sk_links *l, struct sk_heartbeat *hb);

#endif
