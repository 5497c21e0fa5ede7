/* ctl_dlq_import.c - sekalictl dlq import QUEUE: moves the letters a
 * broker's <queue>.dead holds into sekali.dead_letters, where every other
 * dlq command finds them. They come from before sekali kept dead letters
 * in PostgreSQL, from the broker's own dead-lettering (a quorum queue's
 * delivery limit, a body over max_body, a rejected message), or from a
 * worker that could not reach PostgreSQL when it dead-lettered.
 *
 * Each letter is read by a broker scan (sk_broker_scan_*), recorded in a
 * statement of its own (sekali.dlq_record), and taken from the queue only
 * once that committed: a crash in between leaves it in the queue, and its
 * import again replaces the row of its key rather than doubling it (a
 * letter without a key may then appear twice). What the letter says about
 * itself is believed only as far as it can be checked: x-sekali-* headers
 * count as sekali's record when sekali's AMQP user published them for this
 * queue, x-death as the broker's; anything else is recorded "unverified"
 * or "unknown", and is never replayed. */
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#include "broker.h"
#include "ctl_common.h"
#include "ctl_dlq.h"
#include "ctl_out.h"
#include "envelope.h"
#include "pg.h"
#include "text.h"

#define MALFORMED_BODY_MAX (64 * 1024)
#define HEADERS_MAX        (64 * 1024)

/* One letter of <queue>.dead; its strings point into msg or the buffers. */
struct letter {
    amqp_message_t     msg;
    uint64_t           tag;
    struct sk_envelope env;
    bool               parsed;
    char               malformed[300];
    const char        *source;          /* sekali, broker, unverified, unknown */
    char               origin[1200], reason[64], error[1024], first[64], last[64];
    char               job_id[1024], job_type[300], key[SK_KEY_MAX + 1];
    int64_t            attempts;        /* -1: unknown */
};

static void decode(struct sk_dlq *d, const struct sk_queue_conf *rules, struct letter *l);
static bool recorded_by_sekali(const struct sk_dlq *d, struct letter *l);
static bool recorded_by_broker(struct letter *l);
static int record(struct sk_dlq *d, struct sk_broker_scan *scan, struct letter *l,
                  struct sk_err *err);
static char *headers_json(const amqp_message_t *m);
static void text_of(char *out, size_t size, amqp_bytes_t b);

int sk_dlq_import(struct sk_dlq *d)
{
    const struct sk_queue_conf *q = sk_conf_queue(d->conf, d->queue);
    /* A queue this configuration does not serve: only the rules every
     * queue has (a message id, UTF-8 keys) decide what is malformed. */
    struct sk_queue_conf rules = q != NULL ? *q : (struct sk_queue_conf){
        .name = (char *)d->queue, .max_body = SIZE_MAX };
    struct sk_broker *broker = NULL;
    struct sk_broker_scan *scan = NULL;
    uint32_t depth = 0, want = d->req->scan_max > UINT32_MAX ? UINT32_MAX
                                                             : (uint32_t)d->req->scan_max;
    struct sk_err why = { 0 };
    if (sk_broker_open(&broker, &d->conf->amqp, &d->err) != SK_OK)
        return SK_ERR;
    if (sk_broker_scan_open(broker, d->dead, want, &scan, &depth, &why) != SK_OK) {
        sk_broker_close(broker);
        return sk_err_set(&d->err, SK_ERR, "cannot read queue %s (does it exist?): %s",
                          d->dead, why.msg);
    }
    d->depth = depth;
    int rc = SK_OK;
    for (;;) {
        struct letter l = { .attempts = -1 };
        if ((rc = sk_broker_scan_next(scan, &l.msg, &l.tag, &d->err)) != SK_OK)
            break;
        d->matched++;
        decode(d, &rules, &l);
        rc = record(d, scan, &l, &why);
        amqp_destroy_message(&l.msg);
        if (rc != SK_OK)
            break;
        sk_broker_keepalive(broker, NULL);
    }
    if (rc == SK_BUSY)
        rc = SK_OK;
    /* The broker confirms the end once it has acted on our takes and put
     * the rest back, so what we report as imported has left the queue. */
    int end = sk_broker_scan_close(scan, &why);
    sk_broker_close(broker);
    if (rc == SK_OK && end != SK_OK)
        return sk_err_set(&d->err, SK_AGAIN, "the broker did not confirm the end of the scan "
                          "(run dlq import again: a letter imported twice is one row): %s",
                          why.msg);
    return rc;
}

/* Records one letter, then takes it from the queue; a letter PostgreSQL
 * refuses stays in the queue, reported. */
static int record(struct sk_dlq *d, struct sk_broker_scan *scan, struct letter *l,
                  struct sk_err *why)
{
    const char *key = l->key[0] != '\0' ? l->key : NULL;
    if (d->req->dry_run) {
        d->done++;
        sk_dlq_result(d, key, l->job_id, l->reason, "would_import", NULL, l->source);
        return SK_OK;
    }
    char *headers = headers_json(&l->msg);
    char body_size[24], attempts[24];
    snprintf(body_size, sizeof(body_size), "%zu", l->msg.body.len);
    snprintf(attempts, sizeof(attempts), "%lld", (long long)l->attempts);
    size_t keep = l->parsed ? l->msg.body.len
                : l->msg.body.len < MALFORMED_BODY_MAX ? l->msg.body.len : MALFORMED_BODY_MAX;
    bool replay_ok = l->parsed && l->env.job_type[0] != '\0' && strcmp(l->source, "unverified") != 0;
    const char *malformed = replay_ok ? NULL : !l->parsed ? l->malformed
        : l->env.job_type[0] == '\0' ? "no job type (the outbox needs one)"
        : "its x-sekali-* headers are not sekali's record for this queue";
    const char *resource = l->parsed && strcmp(l->env.resource_key, l->env.idempotency_key) != 0
        ? l->env.resource_key : NULL;
    const char *values[] = { d->queue, key, l->job_id[0] ? l->job_id : NULL,
                             l->job_type[0] ? l->job_type : NULL, resource, l->reason, l->error,
                             malformed, l->msg.body.bytes != NULL ? l->msg.body.bytes : "",
                             body_size, headers != NULL ? headers : "{}",
                             l->attempts >= 0 ? attempts : NULL, l->first[0] ? l->first : NULL,
                             l->source, l->origin, l->last[0] ? l->last : NULL };
    int lengths[SK_ARRAY_LEN(values)] = { [8] = (int)keep };
    int formats[SK_ARRAY_LEN(values)] = { [8] = 1 };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.dlq_record($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, "
               "NULL, $12, sekali.dlq_time($13), NULL, NULL, $14, $15, sekali.dlq_time($16))",
        .n_params = (int)SK_ARRAY_LEN(values), .values = values, .lengths = lengths,
        .formats = formats, .one_row = true, .what = "sekali.dlq_record",
    };
    PGresult *res;
    int rc = sk_pg_exec(d->pg, &st, &res, why);
    free(headers);
    if (rc == SK_AGAIN)
        return sk_err_set(&d->err, SK_AGAIN, "%s", why->msg);
    if (rc != SK_OK) {
        d->refused++;
        sk_dlq_result(d, key, l->job_id, l->reason, "refused", NULL, why->msg);
        return SK_OK;
    }
    bool kept = PQgetisnull(res, 0, 0);
    PQclear(res);
    /* Committed: from here the queue's copy is only a copy. */
    if (sk_broker_scan_take(scan, l->tag, &d->err) != SK_OK)
        return SK_ERR;
    d->done++;
    sk_dlq_result(d, key, l->job_id, l->reason, kept ? "duplicate" : "imported", NULL, kept
                  ? "sekali's own letter of this key is kept; the copy is removed" : l->source);
    return SK_OK;
}

/* What sekali (x-sekali-* headers) or the broker (x-death) recorded, and
 * whether a copy of the job would be valid: the same checks a worker makes. */
static void decode(struct sk_dlq *d, const struct sk_queue_conf *rules, struct letter *l)
{
    const amqp_basic_properties_t *p = &l->msg.properties;
    amqp_envelope_t env = { .message = l->msg };
    struct sk_err err = { 0 };
    l->parsed = sk_envelope_parse(&env, rules, &l->env, &err) == SK_OK;
    snprintf(l->malformed, sizeof(l->malformed), "%s", l->parsed ? "" : err.msg);
    if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
        text_of(l->job_id, sizeof(l->job_id), p->message_id);
    if (p->_flags & AMQP_BASIC_TYPE_FLAG)
        text_of(l->job_type, sizeof(l->job_type), p->type);
    /* Only a validated key: it is what a replay re-arms. */
    if (l->parsed)
        snprintf(l->key, sizeof(l->key), "%s", l->env.idempotency_key);
    if (recorded_by_sekali(d, l))
        return;
    /* Headers that claim sekali's record without proof are kept, not
     * believed: the reason, the attempts and the failure times are the
     * broker's, or unknown. */
    bool claims = sk_ctl_header(&l->msg, "x-sekali-reason") != NULL;
    if (recorded_by_broker(l)) {
        if (claims)
            l->source = "unverified";
        return;
    }
    l->source = claims ? "unverified" : "unknown";
    snprintf(l->reason, sizeof(l->reason), "unknown");
    snprintf(l->error, sizeof(l->error), "%s", claims
             ? "its x-sekali-* headers are not sekali's record for this queue"
             : "no x-sekali-reason or x-death header");
    snprintf(l->origin, sizeof(l->origin), "published into %s directly, by neither sekali "
             "nor the broker's dead-lettering", d->dead);
}

static bool bytes_are(amqp_bytes_t b, const char *s)
{
    return b.len == strlen(s) && memcmp(b.bytes, s, b.len) == 0;
}

/* Whether sekali wrote this letter's x-sekali-* headers for this queue:
 * x-sekali-queue names it, the broker verified that the publisher logged
 * in as sekali's AMQP user (user_id, which RabbitMQ refuses from any other
 * login), and the broker did not dead-letter it from the work queue since
 * (its latest x-death would say so: a producer's copy of sekali's headers,
 * rejected). */
static bool recorded_by_sekali(const struct sk_dlq *d, struct letter *l)
{
    const amqp_basic_properties_t *p = &l->msg.properties;
    const amqp_field_value_t *queue = sk_ctl_header(&l->msg, "x-sekali-queue");
    if (sk_ctl_header(&l->msg, "x-sekali-reason") == NULL || queue == NULL ||
        queue->kind != AMQP_FIELD_KIND_UTF8 || !bytes_are(queue->value.bytes, d->queue) ||
        !(p->_flags & AMQP_BASIC_USER_ID_FLAG) || !bytes_are(p->user_id, d->conf->amqp.user))
        return false;
    const amqp_field_value_t *deaths = sk_ctl_header(&l->msg, "x-death");
    if (deaths != NULL && deaths->kind == AMQP_FIELD_KIND_ARRAY &&
        deaths->value.array.num_entries > 0 &&
        deaths->value.array.entries[0].kind == AMQP_FIELD_KIND_TABLE) {
        const amqp_table_t *t = &deaths->value.array.entries[0].value.table;
        for (int i = 0; i < t->num_entries; i++)
            if (bytes_are(t->entries[i].key, "queue") &&
                t->entries[i].value.kind == AMQP_FIELD_KIND_UTF8 &&
                bytes_are(t->entries[i].value.value.bytes, d->queue))
                return false;
    }
    char reason[sizeof(l->reason)], error[sizeof(l->error)];
    sk_ctl_header_text(&l->msg, "x-sekali-reason", reason, sizeof(reason));
    sk_ctl_header_text(&l->msg, "x-sekali-error", error, sizeof(error));
    text_of(l->reason, sizeof(l->reason), (amqp_bytes_t){ strlen(reason), reason });
    text_of(l->error, sizeof(l->error), (amqp_bytes_t){ strlen(error), error });
    l->source = "sekali";
    l->attempts = sk_broker_field_int(sk_ctl_header(&l->msg, "x-sekali-attempts"));
    sk_ctl_header_text(&l->msg, "x-sekali-first-failure", l->first, sizeof(l->first));
    sk_ctl_header_text(&l->msg, "x-sekali-last-failure", l->last, sizeof(l->last));
    snprintf(l->origin, sizeof(l->origin), "sekali, dead-lettering it from queue %s as user %s",
             d->queue, d->conf->amqp.user);
    return true;
}

/* The broker's x-death: its latest death first. */
static bool recorded_by_broker(struct letter *l)
{
    const amqp_field_value_t *deaths = sk_ctl_header(&l->msg, "x-death");
    if (deaths == NULL || deaths->kind != AMQP_FIELD_KIND_ARRAY ||
        deaths->value.array.num_entries <= 0 ||
        deaths->value.array.entries[0].kind != AMQP_FIELD_KIND_TABLE)
        return false;
    const amqp_table_t *t = &deaths->value.array.entries[0].value.table;
    char from[256] = "?", number[32];
    int64_t count = -1;
    l->source = "broker";
    snprintf(l->reason, sizeof(l->reason), "?");
    for (int i = 0; i < t->num_entries; i++) {
        const amqp_table_entry_t *e = &t->entries[i];
        const amqp_field_value_t *v = &e->value;
        bool text = v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES;
        if (bytes_are(e->key, "reason") && text)
            text_of(l->reason, sizeof(l->reason), v->value.bytes);
        else if (bytes_are(e->key, "queue") && text)
            text_of(from, sizeof(from), v->value.bytes);
        else if (bytes_are(e->key, "count"))
            count = sk_broker_field_int(v);
        else if (bytes_are(e->key, "time") && v->kind == AMQP_FIELD_KIND_TIMESTAMP)
            sk_ctl_iso_time(v->value.u64, l->last, sizeof(l->last));
    }
    snprintf(number, sizeof(number), "%lld", (long long)count);
    snprintf(l->error, sizeof(l->error), "dead-lettered by the broker from %s (%s, %s time%s)",
             from, l->reason, count >= 0 ? number : "?", count == 1 ? "" : "s");
    snprintf(l->origin, sizeof(l->origin), "the broker, dead-lettering it from queue %s", from);
    /* x-delivery-count is the quorum queue's, written as it dead-letters
     * past its delivery limit; one a producer wrote into a classic queue's
     * message would pass for a count of attempts. */
    int64_t deliveries = sk_broker_field_int(sk_ctl_header(&l->msg, "x-delivery-count"));
    l->attempts = deliveries >= 0 && strcmp(l->reason, "delivery_limit") == 0 ? deliveries : -1;
    return true;
}

/* b as text PostgreSQL takes (sk_text_bound()). */
static void text_of(char *out, size_t size, amqp_bytes_t b)
{
    sk_text_bound(out, size, b.bytes, b.len);
}

/* The headers as a JSON object (sk_ctl_put_field's), bounded; NULL: "{}". */
static char *headers_json(const amqp_message_t *m)
{
    const amqp_basic_properties_t *p = &m->properties;
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return NULL;
    fputc('{', f);
    for (int i = 0; i < p->headers.num_entries; i++) {
        fprintf(f, i > 0 ? "," : "");
        sk_ctl_put_json(f, p->headers.entries[i].key.bytes, p->headers.entries[i].key.len);
        fputc(':', f);
        sk_ctl_put_field(f, &p->headers.entries[i].value, true);
    }
    fputc('}', f);
    if (fclose(f) != 0 || len > HEADERS_MAX) {
        free(buf);
        return strdup("{\"(omitted)\": \"headers over 64 KiB\"}");
    }
    /* jsonb refuses \u0000 (text cannot hold NUL), and a letter is kept
     * whatever it carries: NUL becomes U+FFFD, as invalid bytes do. */
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] != '\\')
            continue;
        if (buf[i + 1] == 'u' && i + 5 < len && memcmp(buf + i + 2, "0000", 4) == 0)
            memcpy(buf + i + 2, "fffd", 4);
        i++;  /* the escaped character is not a backslash of its own */
    }
    return buf;
}
