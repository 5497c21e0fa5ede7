/* envelope.h - turns an AMQP delivery into a validated job envelope.
 *
 * This is where untrusted input is checked: everything a producer controls
 * (properties, headers, body size) is validated here, and a failure yields a
 * dead-letter reason instead of reaching the pipeline. */
#ifndef SK_ENVELOPE_H
#define SK_ENVELOPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "amqp_lib.h"

#include "common.h"
#include "config.h"
#include "trace_context.h"

struct sk_envelope {
    char        job_id[SK_KEY_MAX + 1];
    char        job_type[256];
    char        idempotency_key[SK_KEY_MAX + 1];
    char        resource_key[SK_KEY_MAX + 1];
    char        content_type[256];
    char        reply_to[256];      /* "" when no reply is wanted */
    char        correlation_id[256];
    const void *body;              /* borrowed from the delivery */
    size_t      body_len;
    uint32_t    delivery_attempt;  /* 1 on the first delivery */
    uint32_t    scheduled_attempt; /* x-sekali-attempt: the attempt this copy was sent for */
    char        first_failure[64]; /* x-sekali-first-failure, or "" */
    bool        redelivered;
    bool        rescheduled;       /* a copy back from one of the queue's delay queues */
    uint64_t    published_s;       /* AMQP timestamp (Unix s) of its first publish, or 0 */
    /* This run's span in the trace of the headers traceparent/tracestate,
     * or of a new trace; read first, so even a malformed delivery's lines
     * carry it. trace_dropped: why something the producer sent was
     * dropped (static text), or NULL. */
    struct sk_trace trace;
    const char *trace_dropped;
};

/* Fills out from env for queue q. Returns SK_OK, or SK_ERR with the
 * dead-letter reason in err->msg; then out->job_type is the message's type
 * if it was valid and accepted by q, else "", and out->redelivered is set.
 * The body stays owned by env. */
int sk_envelope_parse(const amqp_envelope_t *env, const struct sk_queue_conf *q,
                      struct sk_envelope *out, struct sk_err *err);

/* Whether env was first published longer ago than q's key retention, at
 * now_s (Unix seconds): its key may be purged already, so a duplicate of
 * it could not be recognised. False without a timestamp. */
bool sk_envelope_beyond_retention(const struct sk_envelope *env, const struct sk_queue_conf *q,
                                  uint64_t now_s);

/* Why a reply may not go to reply_to, or NULL if it may. Replies must not
 * feed a queue sekali itself consumes (the reply, carrying the job's id and
 * key, would run there as a job or pose as a dead letter or retry copy),
 * nor the broker's amq.* names, except direct reply-to
 * (amq.rabbitmq.reply-to). */
const char *sk_envelope_reply_refused(const char *reply_to, const struct sk_conf *conf);

#endif
