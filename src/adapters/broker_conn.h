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

#include "amqp_lib.h"

#include "common.h"
#include "tls.h"

/* Every connection opens this channel; a scan (broker_scan.c) opens the
 * second one for itself and closes it when it ends. */
#define SK_BROKER_CHANNEL      1
#define SK_BROKER_SCAN_CHANNEL 2

struct sk_broker {
    amqp_connection_state_t conn;
    bool                    confirming;
    uint64_t                next_publish_tag;
    uint64_t                ack_pending;      /* highest delivery tag acked but not sent */
    int64_t                 ack_flushed_ms;   /* when the last multiple-ack went out */
    int64_t                 keepalive_ms;     /* when sk_broker_keepalive() last sent */
    bool                    channel_closed;   /* by the broker, refusing what we sent */
    size_t                  max_body;         /* larger bodies are skipped unread; 0: none */
    /* What sk_broker_consume() was given, one consumer each, tagged
     * "sk.<index>" by us (a delivery's tag says which queue it came from,
     * even one sent to a consumer since replaced). */
    struct sk_broker_sub_state {
        char     queue[256];
        uint16_t prefetch;
        bool     fixed;
    }                       subs[SK_BROKER_SUBS_MAX];
    size_t                  n_subs;
    bool                    subscribed;       /* the broker knows our consumers */
    size_t                  node;             /* index in amqp.url of the node we are on */
    int                     frame_max;        /* negotiated: what we may send */
    char                    user[256];        /* logged in as; "" if longer than AMQP allows */
    bool                    large_frames;     /* reads frames up to SK_BROKER_READ_FRAME_MAX */
    /* librabbitmq reported an error: the connection may only be destroyed.
     * librabbitmq 0.11 leaves its reader half-way through a frame it
     * refused (one over frame_max), aimed at a buffer too small for it, and
     * the next call that reads copies the frame's rest over the heap; a
     * failed send may have left half a frame on the wire. So after any
     * library error nothing more is sent or read on it: no ack, no
     * keepalive, no channel.close or connection.close. */
    bool                    broken;
    struct sk_tls_state    *tls;              /* amqps:// only; the SSL_CTX points to it */
    bool                    scanning;         /* a scan holds SK_BROKER_SCAN_CHANNEL */
    char                    version[32];      /* the broker's, as it says at login; "" if not */
    bool                    legacy_limit;     /* declaring a quorum queue made without
                                               * x-delivery-limit (broker_queue.c) */
};

/* The largest frame a reading connection (a consumer, sekalictl's dead
 * letter reader) accepts, whatever frame_max says. RabbitMQ checks
 * frame_max only on frames it receives: each dead-lettering adds to the
 * headers of a message (x-death, x-first-death-*), so a message that came
 * in at the limit can leave over it. Read whole, sekali can refuse such a
 * message and dead-letter a copy that fits; refused by librabbitmq, it
 * could only be handed back to the head of its queue. 1 MiB is eight
 * frames: a message would have to cross thousands of distinct dead-letter
 * queues to grow past it. Memory is taken per frame, as it arrives. */
#define SK_BROKER_READ_FRAME_MAX (1024 * 1024)

/* Fills err (SK_AGAIN) and marks b broken, for a library call that failed
 * with status. */
int sk_broker_lost(struct sk_broker *b, int status, const char *what, struct sk_err *err);

/* Every function of the module that would send or read starts with this:
 * on a broken connection it does nothing and says so (SK_AGAIN). */
#define SK_BROKER_USABLE(b, err)                                                       \
    do {                                                                               \
        if ((b)->broken)                                                               \
            return sk_err_set((err), SK_AGAIN, "the AMQP connection failed earlier "   \
                              "and is only good for closing");                         \
    } while (0)

/* broker.c: lets b read frames up to SK_BROKER_READ_FRAME_MAX. Only for a
 * connection that publishes no bodies: librabbitmq cuts a body into frames
 * of its own frame_max, which the broker would refuse. SK_OK or SK_AGAIN. */
int sk_broker_read_large_frames(struct sk_broker *b, struct sk_err *err);

/* broker.c: SK_OK for a normal reply; otherwise fills err naming what and
 * returns SK_AGAIN (no reply, a library error: the connection failed, and
 * b is marked broken) or SK_ERR (the broker closed the channel, or the
 * connection: then b is broken too). */
int sk_broker_rpc_check(struct sk_broker *b, amqp_rpc_reply_t reply, const char *what,
                        struct sk_err *err);

/* broker_consume.c: reads the rest of the delivery whose basic.deliver is
 * deliver (its header and body frames) into env, which the caller
 * releases with amqp_destroy_envelope(); a body over max_body (0: no
 * limit) is skipped unread, as sk_broker_next() says. SK_OK, or SK_ERR
 * with b broken when the delivery could not be read whole. */
int sk_broker_read_delivery(struct sk_broker *b, const amqp_frame_t *deliver, size_t max_body,
                            amqp_envelope_t *env, struct sk_err *err);

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
