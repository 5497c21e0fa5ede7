/* envelope.c - validation and key extraction for one delivery.
 *
 * The keys decide what "the same job" means, so their rules live in one place:
 *   job_id          = message_id (required)
 *   idempotency key = header x-idempotency-key, else job_id
 *   resource key    = header x-resource-key, else the idempotency key
 * Keys must be valid UTF-8 without NUL bytes: they end up in PostgreSQL text
 * columns and Redis key names, and a key that cannot be stored faithfully
 * cannot protect anything. */
#include <stdio.h>
#include <string.h>

#include "broker.h"
#include "envelope.h"
#include "text.h"

static int copy_key(char *dst, size_t dst_size, amqp_bytes_t src, const char *what,
                    struct sk_err *err);
static const amqp_field_value_t *find_header(const amqp_basic_properties_t *p,
                                             const char *name);
static int header_key(const amqp_basic_properties_t *p, const char *name, char *dst,
                      size_t dst_size, bool *present, struct sk_err *err);
static int64_t header_int(const amqp_basic_properties_t *p, const char *name);
static bool type_accepted(const struct sk_queue_conf *q, const char *type);
static int check_sizes(const amqp_basic_properties_t *p, const struct sk_queue_conf *q,
                       const struct sk_envelope *out, struct sk_err *err);
static int read_identity(const amqp_basic_properties_t *p, const struct sk_queue_conf *q,
                         struct sk_envelope *out, struct sk_err *err);
static int read_reply(const amqp_basic_properties_t *p, struct sk_envelope *out,
                      struct sk_err *err);
static int read_keys(const amqp_basic_properties_t *p, struct sk_envelope *out,
                     struct sk_err *err);
static void read_attempts(const amqp_basic_properties_t *p, const struct sk_queue_conf *q,
                          struct sk_envelope *out);
static int read_first_failure(const amqp_basic_properties_t *p, struct sk_envelope *out,
                              struct sk_err *err);
static const char *read_trace(const amqp_basic_properties_t *p, struct sk_trace *t);
static bool back_from_delay(const amqp_basic_properties_t *p, const char *queue);
static size_t headers_size(const amqp_basic_properties_t *p);
static bool bytes_eq(amqp_bytes_t b, const char *s);
static bool has_prefix(const char *s, const char *prefix, const char *rest);

int sk_envelope_parse(const amqp_envelope_t *env, const struct sk_queue_conf *q,
                      struct sk_envelope *out, struct sk_err *err)
{
    const amqp_basic_properties_t *p = &env->message.properties;
    out->body = env->message.body.bytes;
    out->body_len = env->message.body.len;
    out->redelivered = env->redelivered != 0;
    out->rescheduled = false;
    out->delivery_attempt = out->redelivered ? 2 : 1;
    out->scheduled_attempt = 1;
    out->first_failure[0] = '\0';
    out->job_type[0] = '\0';
    out->content_type[0] = '\0';
    out->published_s = p->_flags & AMQP_BASIC_TIMESTAMP_FLAG ? p->timestamp : 0;
    out->trace_dropped = read_trace(p, &out->trace);

    if (check_sizes(p, q, out, err) != SK_OK || read_identity(p, q, out, err) != SK_OK ||
        read_reply(p, out, err) != SK_OK || read_keys(p, out, err) != SK_OK)
        return SK_ERR;
    read_attempts(p, q, out);
    return read_first_failure(p, out, err);
}

static int check_sizes(const amqp_basic_properties_t *p, const struct sk_queue_conf *q,
                       const struct sk_envelope *out, struct sk_err *err)
{
    if (out->body_len > q->max_body)
        return sk_err_set(err, SK_ERR, "body of %zu bytes exceeds max_body %zu",
                          out->body_len, q->max_body);
    /* Checked before anything else reads them: headers too large to grow
     * through a retry and a dead-lettering within one frame could never be
     * retried (see config.c). */
    size_t headers = headers_size(p);
    if (headers > q->max_headers)
        return sk_err_set(err, SK_ERR, "headers of %zu bytes exceed max_headers %zu", headers,
                          q->max_headers);
    return SK_OK;
}

/* The job id (message_id) is required; the type, if any, must be one this
 * queue takes. */
static int read_identity(const amqp_basic_properties_t *p, const struct sk_queue_conf *q,
                         struct sk_envelope *out, struct sk_err *err)
{
    if (!(p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) || p->message_id.len == 0)
        return sk_err_set(err, SK_ERR, "missing message_id");
    if (copy_key(out->job_id, sizeof(out->job_id), p->message_id, "message_id", err) != SK_OK)
        return SK_ERR;

    if (p->_flags & AMQP_BASIC_TYPE_FLAG &&
        copy_key(out->job_type, sizeof(out->job_type), p->type, "type", err) != SK_OK)
        return SK_ERR;
    if (!type_accepted(q, out->job_type)) {
        sk_err_set(err, SK_ERR, "unknown job type \"%s\"", out->job_type);
        /* Not a type of this queue: keep it out of the per-type metrics,
         * whose table a stream of made-up types would otherwise fill. */
        out->job_type[0] = '\0';
        return SK_ERR;
    }
    return SK_OK;
}

static int read_reply(const amqp_basic_properties_t *p, struct sk_envelope *out,
                      struct sk_err *err)
{
    /* Optional properties are checked only as far as sekali uses them: a
     * content type it cannot pass on as text, or an empty correlation id,
     * is treated as absent rather than failing a job that needs neither. */
    if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG &&
        copy_key(out->content_type, sizeof(out->content_type), p->content_type,
                 "content_type", NULL) != SK_OK)
        out->content_type[0] = '\0';

    out->reply_to[0] = '\0';
    out->correlation_id[0] = '\0';
    if (p->_flags & AMQP_BASIC_REPLY_TO_FLAG && p->reply_to.len > 0 &&
        copy_key(out->reply_to, sizeof(out->reply_to), p->reply_to, "reply_to", err) != SK_OK)
        return SK_ERR;
    /* The correlation id only travels with a reply: without one it is not
     * looked at; with one, it must be text the reply can carry back. */
    if (out->reply_to[0] != '\0' && p->_flags & AMQP_BASIC_CORRELATION_ID_FLAG &&
        p->correlation_id.len > 0 &&
        copy_key(out->correlation_id, sizeof(out->correlation_id), p->correlation_id,
                 "correlation_id", err) != SK_OK)
        return SK_ERR;
    return SK_OK;
}

/* Without headers, the idempotency key is the job id and the resource key
 * the idempotency key. */
static int read_keys(const amqp_basic_properties_t *p, struct sk_envelope *out,
                     struct sk_err *err)
{
    bool present;
    if (header_key(p, "x-idempotency-key", out->idempotency_key,
                   sizeof(out->idempotency_key), &present, err) != SK_OK)
        return SK_ERR;
    if (!present)
        memcpy(out->idempotency_key, out->job_id, strlen(out->job_id) + 1);

    if (header_key(p, "x-resource-key", out->resource_key, sizeof(out->resource_key),
                   &present, err) != SK_OK)
        return SK_ERR;
    if (!present)
        memcpy(out->resource_key, out->idempotency_key, strlen(out->idempotency_key) + 1);
    return SK_OK;
}

static void read_attempts(const amqp_basic_properties_t *p, const struct sk_queue_conf *q,
                          struct sk_envelope *out)
{
    /* The attempt is the one this copy was scheduled for (sekali's retry
     * header) plus the broker's redeliveries of the copy: exact with a
     * quorum queue's x-delivery-count, at least one with `redelivered`.
     * The retry header counts only on a copy that came back from one of
     * this queue's delay queues: from a producer it would skip retries. */
    out->rescheduled = back_from_delay(p, q->name);
    int64_t scheduled = out->rescheduled ? header_int(p, "x-sekali-attempt") : -1;
    out->scheduled_attempt = scheduled >= 1 && scheduled < UINT32_MAX / 2 ? (uint32_t)scheduled : 1;
    /* x-delivery-count is the quorum queue's count of redeliveries, which
     * it writes on each one; on a first delivery, or in a classic queue,
     * one there is the producer's. From RabbitMQ 4.3 it counts only the
     * returns its delivery limit counts, and x-acquired-count every earlier
     * delivery (a worker killed mid-job among them): the larger holds. */
    bool broker_counts = q->queue_type == SK_QUEUE_QUORUM && out->redelivered;
    int64_t redeliveries = broker_counts ? header_int(p, "x-delivery-count") : -1;
    int64_t acquired = broker_counts ? header_int(p, "x-acquired-count") : -1;
    if (acquired > redeliveries)
        redeliveries = acquired;
    if (redeliveries < 0 || redeliveries > UINT32_MAX / 2)
        redeliveries = out->redelivered ? 1 : 0;
    out->delivery_attempt = out->scheduled_attempt + (uint32_t)redeliveries;
}

static int read_first_failure(const amqp_basic_properties_t *p, struct sk_envelope *out,
                              struct sk_err *err)
{
    out->first_failure[0] = '\0';
    /* Only sekali's own retry copies carry a first failure it wrote; a
     * producer's would pose as one (and reach an operator's terminal). */
    if (!out->rescheduled)
        return SK_OK;
    const amqp_field_value_t *first = find_header(p, "x-sekali-first-failure");
    if (first != NULL && first->kind == AMQP_FIELD_KIND_UTF8 &&
        copy_key(out->first_failure, sizeof(out->first_failure), first->value.bytes,
                 "x-sekali-first-failure", err) != SK_OK)
        return SK_ERR;
    return SK_OK;
}

/* The trace context is the producer's business and never fails the job:
 * a value that is not a string, or breaks the grammar, is dropped (the
 * reason returned, for the caller to count) and a new trace begins. */
static const char *read_trace(const amqp_basic_properties_t *p, struct sk_trace *t)
{
    const amqp_field_value_t *parent = find_header(p, "traceparent");
    const amqp_field_value_t *state = find_header(p, "tracestate");
    bool parent_text = parent != NULL && (parent->kind == AMQP_FIELD_KIND_UTF8 ||
                                          parent->kind == AMQP_FIELD_KIND_BYTES);
    bool state_text = state != NULL && (state->kind == AMQP_FIELD_KIND_UTF8 ||
                                        state->kind == AMQP_FIELD_KIND_BYTES);
    const char *why = sk_trace_begin(
        t, parent_text ? parent->value.bytes.bytes : NULL, parent_text ? parent->value.bytes.len : 0,
        state_text ? state->value.bytes.bytes : NULL, state_text ? state->value.bytes.len : 0);
    if ((parent != NULL && !parent_text) || (state != NULL && !state_text))
        return "traceparent or tracestate is not a string";
    return why;
}

static int copy_key(char *dst, size_t dst_size, amqp_bytes_t src, const char *what,
                    struct sk_err *err)
{
    if (src.len == 0)
        return sk_err_set(err, SK_ERR, "empty %s", what);
    if (src.len >= dst_size)
        return sk_err_set(err, SK_ERR, "%s of %zu bytes is longer than %zu", what, src.len,
                          dst_size - 1);
    if (memchr(src.bytes, '\0', src.len) != NULL)
        return sk_err_set(err, SK_ERR, "%s contains a NUL byte", what);
    if (!sk_text_valid(src.bytes, src.len))
        return sk_err_set(err, SK_ERR, "%s is not valid UTF-8", what);
    memcpy(dst, src.bytes, src.len);
    dst[src.len] = '\0';
    return SK_OK;
}

static const amqp_field_value_t *find_header(const amqp_basic_properties_t *p,
                                             const char *name)
{
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return NULL;
    size_t name_len = strlen(name);
    for (int i = 0; i < p->headers.num_entries; i++) {
        const amqp_table_entry_t *e = &p->headers.entries[i];
        if (e->key.len == name_len && memcmp(e->key.bytes, name, name_len) == 0)
            return &e->value;
    }
    return NULL;
}

static int header_key(const amqp_basic_properties_t *p, const char *name, char *dst,
                      size_t dst_size, bool *present, struct sk_err *err)
{
    const amqp_field_value_t *v = find_header(p, name);
    *present = v != NULL;
    if (v == NULL)
        return SK_OK;
    if (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES)
        return sk_err_set(err, SK_ERR, "header %s must be a string", name);
    return copy_key(dst, dst_size, v->value.bytes, name, err);
}

/* An integer header's value, or -1 when absent or not an integer. */
static int64_t header_int(const amqp_basic_properties_t *p, const char *name)
{
    return sk_broker_field_int(find_header(p, name));
}

static bool type_accepted(const struct sk_queue_conf *q, const char *type)
{
    if (q->n_job_types == 0)
        return true;
    for (size_t i = 0; i < q->n_job_types; i++)
        if (strcmp(q->job_types[i], type) == 0)
            return true;
    return false;
}

/* The headers' wire size, x-death included. A producer can write x-death
 * as well as the broker, and every byte of it travels on with each retry
 * copy and dead letter: what max_headers must bound is what the next copy
 * carries. The growth still to come (the broker's records of the delay
 * queues yet to cross, sekali's own headers) is what config.c keeps out of
 * max_headers' reach. */
static size_t headers_size(const amqp_basic_properties_t *p)
{
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return 0;
    return sk_broker_table_size(&p->headers);
}

/* Whether the latest death in x-death is an expiry in one of queue's delay
 * queues, which is how sekali's retry copies come back. The broker puts the
 * latest death first. A producer could forge x-death as well, but then it
 * has to mean to; a stray or copied x-sekali-attempt alone no longer counts. */
static bool back_from_delay(const amqp_basic_properties_t *p, const char *queue)
{
    const amqp_field_value_t *deaths = find_header(p, "x-death");
    if (deaths == NULL || deaths->kind != AMQP_FIELD_KIND_ARRAY ||
        deaths->value.array.num_entries < 1 ||
        deaths->value.array.entries[0].kind != AMQP_FIELD_KIND_TABLE)
        return false;
    const amqp_table_t *latest = &deaths->value.array.entries[0].value.table;
    bool expired = false, from_delay = false;
    for (int i = 0; i < latest->num_entries; i++) {
        const amqp_table_entry_t *e = &latest->entries[i];
        if (e->value.kind != AMQP_FIELD_KIND_UTF8 && e->value.kind != AMQP_FIELD_KIND_BYTES)
            continue;
        amqp_bytes_t v = e->value.value.bytes;
        if (bytes_eq(e->key, "reason")) {
            expired = bytes_eq(v, "expired");
        } else if (bytes_eq(e->key, "queue")) {
            size_t qlen = strlen(queue);
            from_delay = v.len > qlen + 7 && memcmp(v.bytes, queue, qlen) == 0 &&
                         memcmp((const char *)v.bytes + qlen, ".delay.", 7) == 0;
        }
    }
    return expired && from_delay;
}

static bool bytes_eq(amqp_bytes_t b, const char *s)
{
    return b.len == strlen(s) && memcmp(b.bytes, s, b.len) == 0;
}

const char *sk_envelope_reply_refused(const char *reply_to, const struct sk_conf *conf)
{
    if (strcmp(reply_to, "amq.rabbitmq.reply-to") == 0 ||
        strncmp(reply_to, "amq.rabbitmq.reply-to.", 22) == 0)
        return NULL;
    if (strncmp(reply_to, "amq.", 4) == 0)
        return "reply_to names a queue reserved by the broker (amq.*)";
    for (size_t i = 0; i < conf->n_queues; i++) {
        const char *name = conf->queues[i].name;
        if (strcmp(reply_to, name) == 0 || has_prefix(reply_to, name, ".dead") ||
            has_prefix(reply_to, name, ".delay."))
            return "reply_to names a queue sekali consumes, or its dead letters or delay queues";
    }
    return NULL;
}

/* Whether s is prefix followed by rest (rest ".dead": exactly; ".delay.":
 * and anything after). */
static bool has_prefix(const char *s, const char *prefix, const char *rest)
{
    size_t n = strlen(prefix), r = strlen(rest);
    if (strncmp(s, prefix, n) != 0 || strncmp(s + n, rest, r) != 0)
        return false;
    return rest[r - 1] == '.' || s[n + r] == '\0';
}

bool sk_envelope_beyond_retention(const struct sk_envelope *env, const struct sk_queue_conf *q,
                                  uint64_t now_s)
{
    /* In whole seconds, as AMQP stamps: a second's rounding is nothing
     * beside a retention of days. A stamp from the future is not late. */
    return env->published_s != 0 && q->retention_ms != SK_RETENTION_FOREVER &&
           now_s > env->published_s && now_s - env->published_s > q->retention_ms / 1000;
}
