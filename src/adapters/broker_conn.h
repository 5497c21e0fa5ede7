/* broker_conn.h - what the broker files (broker.c, broker_*.c) share and
 * nobody else sees: the connection's state and the helpers each of them
 * needs. Callers of the module use broker.h, where struct sk_broker stays
 * opaque, so that only these files touch librabbitmq's connection. Each
 * broker file includes broker.h itself: were this header to include it,
 * broker.c and broker_conn.h would form an include cycle, which
 * tests/unit/check_layers.c refuses. */
#ifndef SK_BROKER_CONN_H
#define SK_BROKER_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include <amqp.h>

#include "common.h"

/* Every connection opens this one channel and uses no other. */
#define SK_BROKER_CHANNEL 1

struct sk_broker {
    amqp_connection_state_t conn;
    bool                    confirming;
    uint64_t                next_publish_tag;
    uint64_t                ack_pending;      /* highest delivery tag acked but not sent */
    int64_t                 ack_flushed_ms;   /* when the last multiple-ack went out */
    int64_t                 keepalive_ms;     /* when sk_broker_keepalive() last sent */
    bool                    channel_closed;   /* by the broker, refusing what we sent */
    size_t                  max_body;         /* larger bodies are skipped unread; 0: none */
    size_t                  node;             /* index in amqp.url of the node we are on */
};

/* broker.c: SK_OK for a normal reply; otherwise fills err naming what and
 * returns SK_AGAIN (no reply, a library error: the connection failed) or
 * SK_ERR (the broker closed the channel or the connection). */
int sk_broker_rpc_check(amqp_rpc_reply_t reply, const char *what, struct sk_err *err);

/* broker_consume.c: sends the acks sk_broker_ack() left pending, as one
 * multiple-ack; sk_broker_close() calls it before closing. */
int sk_broker_flush_acks(struct sk_broker *b, struct sk_err *err);

/* broker_wire.c: a deep copy of decoded properties into pool (SK_OK, or
 * SK_ERR when out of memory), and table entries that borrow key and value. */
int sk_broker_clone_properties(const amqp_basic_properties_t *from, amqp_basic_properties_t *to,
                               amqp_pool_t *pool);
amqp_table_entry_t sk_broker_text_entry(const char *key, const char *value);
amqp_table_entry_t sk_broker_int_entry(const char *key, int64_t value);

static inline struct timeval sk_broker_timeval(uint32_t ms)
{
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
    return tv;
}

#endif
