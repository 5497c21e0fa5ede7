/* broker.h - one RabbitMQ connection (librabbitmq): connect, declare, consume,
 * ack, publish with confirms.
 *
 * Named "broker" rather than "amqp" so that it never shadows librabbitmq's own
 * <amqp.h>. One struct sk_broker is one AMQP connection with one channel (and
 * a second while a scan runs); it is owned by one thread and never shared.
 * The module is six files, one per responsibility (broker.c says which
 * does what); this header is all of it that callers see. */
#ifndef SK_BROKER_H
#define SK_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "amqp_lib.h"

#include "common.h"
#include "tls.h"

struct sk_broker;

/* A cluster's nodes share users and vhosts: only host and port differ. */
#define SK_AMQP_MAX_NODES 16

struct sk_amqp_node {
    char    *host;
    int      port;
};

/* How sekali logs in: PLAIN sends user and password; EXTERNAL (RabbitMQ's
 * rabbitmq_auth_mechanism_ssl) logs in as the client certificate's name. */
enum sk_amqp_auth { SK_AMQP_AUTH_PLAIN, SK_AMQP_AUTH_EXTERNAL };

struct sk_amqp_conf {
    struct sk_amqp_node nodes[SK_AMQP_MAX_NODES];  /* amqp.url, in the order written */
    size_t   n_nodes;              /* at least 1 */
    char    *vhost;
    char    *user;
    char    *password;             /* never NULL: from url, password_env or password_file,
                                    * else "guest", the broker's default */
    bool     password_in_url;      /* url[0] wrote it (later nodes may only repeat it) */
    uint32_t heartbeat_ms;         /* AMQP heartbeat; 0 disables */
    uint32_t connect_timeout_ms;
    uint32_t consumer_timeout_ms;  /* the broker's, as the operator told it (AMQP does not
                                    * say); 0: not told. Only judged, never enforced here */
    struct sk_tls_conf tls;        /* enabled by amqps:// (every node, or none) */
    enum sk_amqp_auth  auth;       /* amqp.auth_mechanism */
};

/* broker_url.c: parses url, one node of amqp.url (amqp:// or amqps://,
 * [user[:password]@]host[:port]/[vhost]) and appends it to a->nodes. The
 * nodes of a cluster share users, vhosts and TLS: the first URL sets
 * user, password, vhost and a->tls.enabled; a later one may leave them out
 * or repeat them, never change them, and must name another node. label
 * ("url", "url[2]") starts every message; no message quotes the URL, which
 * may hold a password. *wrote_password says whether url held one, so that
 * the caller can check the password has one source. Returns SK_OK, or
 * SK_ERR with err filled and a unchanged but for strings it may have
 * replaced (the caller frees a either way). */
int sk_broker_url_add(struct sk_amqp_conf *a, const char *label, const char *url,
                      bool *wrote_password, struct sk_err *err);

/* A header to add to (or replace in) a republished message. */
struct sk_header {
    const char *key;
    const char *text;   /* a string value, or NULL for the number */
    int64_t     number;
};

/* A message to publish. Absent strings are NULL; headers are optional. */
struct sk_message {
    const char    *message_id;
    const char    *type;
    const char    *content_type;
    const char    *idempotency_key;  /* sent as header x-idempotency-key */
    const char    *resource_key;     /* sent as header x-resource-key */
    const char    *reply_to;
    const char    *correlation_id;
    const void    *body;
    size_t         body_len;
    uint8_t        priority;         /* AMQP priority; 0: none (the broker treats both alike) */
    const char    *traceparent;      /* W3C trace context headers, sent when not NULL */
    const char    *tracestate;
    const char    *tenant_header;    /* the queue's tenant_header, which carries tenant */
    const char    *tenant;           /* sent when both are set (lanes: lane.h) */
};

/* Connects, logs in and opens the channel. Blocks at most the configured
 * connect timeout. Returns SK_OK, SK_AGAIN (unreachable) or SK_ERR (refused
 * login, bad vhost). On success *out is owned by the caller. */
int  sk_broker_open(struct sk_broker **out, const struct sk_amqp_conf *conf, struct sk_err *err);

/* Ends the connection (NULL is fine): politely (channel.close,
 * connection.close) while it works; after any error librabbitmq reported on
 * it, by destroying it only, since librabbitmq may be half-way through a
 * frame it refused and must not read again. Acks left pending by
 * sk_broker_ack() are not sent: a consumer closes with
 * sk_broker_close_consumer(). */
void sk_broker_close(struct sk_broker *b);

/* sk_broker_close() for a consuming connection: first sends the acks
 * sk_broker_ack() left pending, unless the connection is broken. */
void sk_broker_close_consumer(struct sk_broker *b);

/* How a work queue is declared; it must be the same for every declarer, or
 * the broker refuses the second declaration. */
struct sk_queue_shape {
    bool     quorum;          /* a replicated quorum queue instead of a classic one */
    uint32_t delivery_limit;  /* quorum only: dead-letter past this many deliveries; 0: none
                               * (on RabbitMQ 4, whose own default is 20, declared as -1) */
    uint8_t  max_priority;    /* x-max-priority (quorum: RabbitMQ 4.3 and later, at most
                               * SK_QUORUM_MAX_PRIORITY); 0: none */
    bool     passive;         /* declared by someone else: only check that it exists */
    uint8_t  lanes;           /* <name>.lane.0 .. lanes-1 alike (lane.h); 0: none */
};

/* RabbitMQ 4.3 gives quorum queues strict priorities, levels 0 to 31. */
#define SK_QUORUM_MAX_PRIORITY 31

/* The broker's version as it gave it at login ("4.0.5"; "" if it gave
 * none), and its major number (0 if unknown). */
const char *sk_broker_version(const struct sk_broker *b);
int         sk_broker_major(const struct sk_broker *b);

/* Whether a quorum queue on this broker takes x-max-priority: RabbitMQ
 * 4.3 and later; 3.x and 4.0-4.2 refuse the argument. True when the broker
 * gave no version: its own answer to the declaration then decides. */
bool sk_broker_quorum_priorities(const struct sk_broker *b);

/* Writes the name of queue's dead-letter queue, `queue.dead`, into out:
 * the one place that spells it. SK_ERR if it does not fit in size. */
int sk_broker_dead_name(const char *queue, char *out, size_t size, struct sk_err *err);

/* Declares the durable work queue `name` with shape (NULL: classic), whose
 * rejected messages the broker dead-letters to the durable queue
 * `name.dead`. With shape->passive, `name.dead` is still declared but `name`
 * is only checked to exist, whatever its arguments. The error of a missing
 * passive queue, or of one whose arguments differ from sekali's, says what
 * to do about it. With shape->lanes, each lane `name.lane.<i>` (lane.h)
 * likewise, dead-lettering to `name.dead` too. */
int sk_broker_declare(struct sk_broker *b, const char *name, const struct sk_queue_shape *shape,
                      struct sk_err *err);

/* Message count of a queue (ready messages only), without creating it. */
int sk_broker_queue_depth(struct sk_broker *b, const char *name, uint32_t *messages,
                          uint32_t *consumers, struct sk_err *err);

/* Whether the existing queue `name` carries the arguments sekali declares
 * it with (shape as for sk_broker_declare()): *conforms, and when not, the
 * broker's words for the first difference in why. Declares the queue with
 * those arguments, so call it only for a queue that exists (a probe). The
 * channel the broker closes over a difference is opened again. */
int sk_broker_queue_conforms(struct sk_broker *b, const char *name,
                             const struct sk_queue_shape *shape, bool *conforms, char *why,
                             size_t why_size, struct sk_err *err);

/* As sk_broker_queue_depth(), but a queue that does not exist is an
 * answer (*exists false), not an error: the channel the broker closed is
 * opened again (without confirm mode). For tools that probe many names. */
int sk_broker_queue_probe(struct sk_broker *b, const char *name, bool *exists,
                          uint32_t *messages, uint32_t *consumers, struct sk_err *err);

/* One queue a consumer takes from, and its window (at most prefetch
 * unacked). fixed: sk_broker_set_prefetch() leaves this one's window as
 * given (a lane's intake, whose forwards are cheap, keeps a large one). */
struct sk_broker_sub {
    const char *queue;
    uint16_t    prefetch;
    bool        fixed;
};

/* A queue and its lanes (lane.h: at most 32). */
#define SK_BROKER_SUBS_MAX 33

/* The ready messages and the consumers of queue name's lanes
 * (`name.lane.0` .. `lanes-1`, lane.h), summed: sk_broker_queue_probe() of
 * each, a lane that does not exist counting none. For whatever reads a
 * queue's depth for an operator: a queue with lanes holds its jobs there. */
int sk_broker_lanes_probe(struct sk_broker *b, const char *name, unsigned lanes,
                          uint32_t *messages, uint32_t *consumers, struct sk_err *err);

/* A new prefetch window for every consumer not fixed: the channel's
 * basic.qos, and those consumers subscribed anew if they were (the
 * deliveries the old ones were sent stay ours, unacked, returned by
 * sk_broker_next()). Without consumers (a paused queue) the next
 * sk_broker_resubscribe() has it. */
int sk_broker_set_prefetch(struct sk_broker *b, uint16_t prefetch, struct sk_err *err);

/* Starts consuming each of the n (1 to SK_BROKER_SUBS_MAX) queues of subs
 * on the one channel, with manual acks: a consumer each, subscribed after
 * a basic.qos (per consumer, global=false) of its prefetch, so the broker
 * serves each queue up to its own window and none can fill another's.
 * Copies subs. A delivery whose body is over max_body bytes (0: no limit)
 * is not read into memory: see sk_broker_next(). */
int sk_broker_consume(struct sk_broker *b, const struct sk_broker_sub *subs, size_t n,
                      size_t max_body, struct sk_err *err);

/* The index in sk_broker_consume()'s subs of the queue env was delivered
 * from; -1 if its consumer tag is none of ours. */
int sk_broker_delivery_sub(const struct sk_broker *b, const amqp_envelope_t *env);

/* Whether b has consumers the broker knows (consumed, not unsubscribed). */
bool sk_broker_subscribed(const struct sk_broker *b);

/* Cancels b's consumers (basic.cancel) and gives the deliveries they held but
 * nobody took with sk_broker_next() back to the queue, requeued in one
 * multiple-nack; *returned says how many. The acks pending go out first.
 * The connection stays open; sk_broker_resubscribe() consumes again with
 * the same queues and prefetches. Nothing must be in hand (taken with
 * sk_broker_next() and not yet settled). SK_OK, SK_AGAIN if the connection
 * failed, SK_ERR if the broker refused. Blocks one round trip. */
int sk_broker_unsubscribe(struct sk_broker *b, size_t *returned, struct sk_err *err);
int sk_broker_resubscribe(struct sk_broker *b, struct sk_err *err);

/* Waits up to timeout_ms for the next delivery. Returns SK_OK with *env filled
 * (release it with sk_broker_release()), SK_AGAIN when nothing arrived in
 * time, or SK_ERR when the connection or channel is gone. A body over the
 * consumer's max_body is skipped unread: then env->message.body has its
 * length and NULL bytes, and no properties are set; such a delivery cannot
 * be republished (SK_ERR), only rejected. */
int  sk_broker_next(struct sk_broker *b, amqp_envelope_t *env, int timeout_ms,
                    struct sk_err *err);
void sk_broker_release(struct sk_broker *b, amqp_envelope_t *env);
/* Whether the broker sent something not yet taken (a delivery, or part of
 * one, in librabbitmq's buffer or the socket's): the next sk_broker_next()
 * will hardly wait. False for NULL. Never reads, never blocks. */
bool sk_broker_waiting(const struct sk_broker *b);

/* Acks delivery_tag (and every earlier delivery this consumer settled).
 * The ack is sent lazily, by sk_broker_next() once no delivery is waiting
 * in our buffers, or by sk_broker_close(): if the connection dies first, the
 * broker redelivers those messages, which the caller must treat as
 * duplicates (it does: their keys are completed). Tags must be acked in
 * delivery order. */
int sk_broker_ack(struct sk_broker *b, uint64_t delivery_tag, struct sk_err *err);

/* Sends the acks sk_broker_ack() left pending now, for a consumer that will
 * not ask for a delivery for a while (a batch still running after some of
 * its jobs committed). SK_OK, or SK_ERR with the connection lost. */
int sk_broker_flush_acks(struct sk_broker *b, struct sk_err *err);

/* requeue: hand the message back to the queue; otherwise the broker
 * dead-letters it to `queue.dead`. */
int sk_broker_reject(struct sk_broker *b, uint64_t delivery_tag, bool requeue,
                     struct sk_err *err);

/* Takes one message from queue (basic.get, acked on receipt). Returns SK_OK
 * with *msg filled (free it with amqp_destroy_message()), SK_BUSY when the
 * queue is empty, or SK_AGAIN/SK_ERR. For tools and tests, not the workers. */
int sk_broker_get(struct sk_broker *b, const char *queue, amqp_message_t *msg,
                  struct sk_err *err);

/* Takes the next message of queue without acking it (basic.get): it stays
 * the broker's until sk_broker_ack_one() removes it, or until the channel
 * closes, when the broker puts it back where it was. Returns SK_OK with
 * *msg (free it with amqp_destroy_message()) and *delivery_tag, SK_BUSY when
 * nothing is left to take, or SK_AGAIN/SK_ERR. One round trip a message:
 * for tests that take one message; a tool reading a whole queue scans it
 * (sk_broker_scan_open()). */
int sk_broker_peek(struct sk_broker *b, const char *queue, amqp_message_t *msg,
                   uint64_t *delivery_tag, struct sk_err *err);

/* broker_scan.c: reads a queue without consuming it, by basic.consume
 * within a bounded prefetch window on a channel of its own, not by a
 * basic.get round trip per message. Each message stays the broker's until
 * the reader takes it (sk_broker_scan_take()); the scan's end hands every
 * other one back to its place in the queue, as the broker also does should
 * the process die. For tools (sekalictl dlq, the console), not the workers;
 * one scan at a time on a connection. */
struct sk_broker_scan;

/* Starts a scan of queue: *depth is its count of ready messages now (a
 * passive declare); the scan hands out at most that many, and at most max
 * (0: no limit), in the queue's order, so that a message arriving during
 * the scan is never handed out. SK_OK with *out (end it with
 * sk_broker_scan_close()); SK_ERR when the queue does not exist (the
 * connection stays usable) or the broker refused; SK_AGAIN if the
 * connection failed. Blocks four round trips. */
int sk_broker_scan_open(struct sk_broker *b, const char *queue, uint32_t max,
                        struct sk_broker_scan **out, uint32_t *depth, struct sk_err *err);

/* The next message: SK_OK with *msg (free it with amqp_destroy_message())
 * and *tag; SK_BUSY when the scan is over: it handed out what it may, or
 * the queue has nothing left to send (its messages went to another reader,
 * expired or were purged meanwhile); SK_AGAIN or SK_ERR when the
 * connection, or the scan's channel, failed (what was not taken is back
 * in the queue). Blocks while the broker sends, at most 15 s without a
 * message while the broker says some are ready. */
int sk_broker_scan_next(struct sk_broker_scan *s, amqp_message_t *msg, uint64_t *tag,
                        struct sk_err *err);

/* Takes the message of tag out of the queue (an ack of exactly it). Sent at
 * once, not waited for: sk_broker_scan_close() confirms it. */
int sk_broker_scan_take(struct sk_broker_scan *s, uint64_t tag, struct sk_err *err);

/* Ends the scan (NULL is fine) and frees s: every message handed out and
 * not taken, and those sent but not handed out, go back to their places.
 * SK_OK once the broker confirmed it did so and acted on every take;
 * SK_AGAIN if it did not within 60 s or the connection failed (the
 * messages are handed back when the connection closes). */
int sk_broker_scan_close(struct sk_broker_scan *s, struct sk_err *err);

/* Acks exactly one message taken with sk_broker_peek(), at once (not
 * batched, not `multiple`). The broker acts on it before it answers any
 * later synchronous call on the channel, e.g. sk_broker_queue_depth(). */
int sk_broker_ack_one(struct sk_broker *b, uint64_t delivery_tag, struct sk_err *err);

/* Sends a heartbeat frame if this did not send one for half the negotiated
 * heartbeat, so that the broker keeps a connection nobody is using now:
 * librabbitmq sends heartbeats only inside its own calls, and RabbitMQ
 * closes a connection silent for about two heartbeats. Never reads (a
 * consuming connection may hold deliveries for sk_broker_next()). Another
 * thread than the owner's may call it while the owner keeps off the
 * connection. SK_OK, or SK_AGAIN if the connection is broken. */
int sk_broker_keepalive(struct sk_broker *b, struct sk_err *err);

/* How often to call sk_broker_keepalive() on an idle connection: a quarter
 * of the heartbeat asked of the broker (whole seconds, so at least 250 ms);
 * 0 when heartbeats are off. */
uint32_t sk_broker_keepalive_period_ms(const struct sk_amqp_conf *conf);

/* Whether a connection that neither consumes nor scans, and that nobody
 * uses now, may be used again: not broken, its channel open, and nothing
 * from the broker waiting to be read (a connection.close, a heartbeat, the
 * socket's end), which a pool then need not risk a request on. Never
 * reads or blocks. */
bool sk_broker_idle_ok(const struct sk_broker *b);

/* Puts the channel in confirm mode; needed once before sk_broker_publish(). */
int sk_broker_confirm_select(struct sk_broker *b, struct sk_err *err);

/* Publishes a persistent, mandatory message to the default exchange and waits
 * for the broker's confirm. Returns SK_OK once confirmed, SK_ERR if the broker
 * returned it (no such queue) or if AMQP cannot carry it (see
 * sk_broker_publish_async()), SK_AGAIN if the connection failed or the
 * broker nacked it (a quorum queue without a leader, a full queue under
 * reject-publish: the queue's state, not the message's).
 * Only for connections that do not consume: it reads frames synchronously. */
int sk_broker_publish(struct sk_broker *b, const char *routing_key,
                      const struct sk_message *msg, struct sk_err *err);

/* One publish whose confirm is awaited later, so that a batch of messages
 * costs one wait for the broker (and lets it write them to disk together)
 * instead of one wait each. */
struct sk_publish {
    const char *message_id;  /* recognises the publish in a basic.return; may be NULL */
    uint64_t    tag;         /* the channel's publish sequence number */
    bool        returned;    /* the broker could not route it */
    bool        settled;     /* confirmed (acked or nacked) */
    int         rc;          /* once settled: SK_OK; SK_AGAIN (nacked) or SK_ERR (returned,
                              * or refused before sending) with why */
    const char *why;         /* static text (or the caller's): why it was not accepted */
};

/* Sends msg as sk_broker_publish() does, without waiting: fills *p. SK_OK;
 * SK_ERR if the message can never be sent (a routing key or property over
 * AMQP's 255 bytes, properties and headers over one frame): nothing was sent,
 * the connection is as it was, and *p is settled with rc SK_ERR and why; or
 * SK_AGAIN if the connection failed. */
int sk_broker_publish_async(struct sk_broker *b, const char *routing_key,
                            const struct sk_message *msg, struct sk_publish *p,
                            struct sk_err *err);

/* Waits until each of the n publishes, made in this order and the latest of
 * this channel, is settled (those refused before sending already are); then
 * each p[i].rc says whether the broker took it. A return is matched by
 * message id (or, alone in flight, to the one). SK_OK, or SK_AGAIN if the
 * connection failed first: then none of them may be taken as published. */
int sk_broker_await_confirms(struct sk_broker *b, struct sk_publish *p, size_t n,
                             struct sk_err *err);

/* After sk_broker_await_confirms() failed: whether the broker closed the
 * channel refusing one of the publishes (406 or 403: a body over its
 * max_message_size, a queue the user may not write to), rather than the
 * connection or the broker failing. The connection is of no further use
 * either way. */
bool sk_broker_channel_refused(const struct sk_broker *b);

/* After a call on b failed with SK_AGAIN: whether b is of no further use
 * (its connection or its channel failed), or the failure was the broker's
 * answer to one message on a sound connection (a nack: a quorum queue
 * without a leader, a full queue rejecting publishes), which the next
 * publish on b may not meet. A failed connection is closed and opened
 * anew; a sound one is kept. */
bool sk_broker_broken(const struct sk_broker *b);

/* Declares the delay queue for `queue` and delay_ms, and writes its name to
 * name (size bytes): messages sit there for delay_ms, then the broker
 * dead-letters them back to `queue`. The queue deletes itself once unused
 * for 10 minutes longer than its delay, which cannot happen while it still
 * holds a message, provided it is declared again before each publish.
 * quorum (the work queue is one): a replicated quorum queue, unless a
 * classic one of that name exists already. */
int sk_broker_declare_delay(struct sk_broker *b, const char *queue, bool quorum,
                            uint32_t delay_ms, char *name, size_t size, struct sk_err *err);

/* Publishes a persistent copy of original (properties and body) to
 * routing_key, with `extra` headers added or replacing those of the same
 * name, and waits for the confirm. Same results as sk_broker_publish(),
 * and SK_ERR, before anything is sent, when the copy's properties would not
 * fit in one frame of this connection: a fault of the message, which no
 * retry can cure, unlike SK_AGAIN (the connection failed). */
int sk_broker_republish(struct sk_broker *b, const char *routing_key,
                        const amqp_envelope_t *original, const struct sk_header *extra,
                        size_t n_extra, struct sk_err *err);

/* sk_broker_republish() with no extra headers, without waiting for the
 * confirm: fills *p (whose message_id the caller set, for a return; it
 * must outlive the wait) for sk_broker_await_confirms(). SK_ERR as for
 * sk_broker_republish() (nothing sent), SK_AGAIN if the connection failed. */
int sk_broker_republish_async(struct sk_broker *b, const char *routing_key,
                              const amqp_envelope_t *original, struct sk_publish *p,
                              struct sk_err *err);

/* sk_broker_republish() for a copy that must be kept whatever its
 * producer put in it (a dead letter): when it would not fit in one frame
 * with 2 KiB to spare, the largest of the original's headers are left out
 * of it, one at a time, until it does (sekali's own keys last), and header
 * x-sekali-headers-dropped says how many, how many bytes, and which. */
int sk_broker_republish_fitted(struct sk_broker *b, const char *routing_key,
                               const amqp_envelope_t *original, const struct sk_header *extra,
                               size_t n_extra, struct sk_err *err);

/* An integer field's value, or -1 when absent (NULL), not an integer, or
 * an unsigned value past INT64_MAX. Pure. */
int64_t sk_broker_field_int(const amqp_field_value_t *v);

/* Bytes an AMQP 0-9-1 field table takes on the wire (without its own
 * 4-byte length), and the bytes of a content header frame's properties
 * (flags included). Pure: for validation and for checks before sending. */
size_t sk_broker_table_size(const amqp_table_t *t);
size_t sk_broker_properties_size(const amqp_basic_properties_t *p);

/* Wire bytes of a content header frame around its properties: the frame's
 * type, channel, size and end octet (8), then class, weight, body size (12).
 * The whole frame must fit in the connection's frame_max. */
#define SK_BROKER_HEADER_FRAME_OVERHEAD 20

#endif
