/* letter.c - writes a dead letter's row (sql/023_dead_letter_store.sql).
 *
 * The row is the dead letter: sekalictl and the console read, replay and
 * purge it there, never in the broker, where a read hands a letter back
 * and a quorum queue's delivery limit counts it. So it is written before
 * the ack, and for a key recorded failed in the very transaction that
 * records it: a failed key without its letter, or an acked job without
 * either, cannot be seen. Everything in it came from a producer, so every
 * text is made valid UTF-8 without NUL here, and the body and headers are
 * bounded. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "headers_json.h"
#include "letter.h"
#include "pg.h"
#include "text.h"

#define HEADERS_MAX (64 * 1024)  /* JSON bytes of headers kept */
#define TEXT_MAX    SK_TEXT_ERROR_MAX  /* bytes of the error kept, as everywhere (text.h) */

/* P_EXTRA: the fence for sekali.fail_dead, why it is malformed for
 * sekali.dlq_record. */
enum { P_QUEUE, P_KEY, P_OWNER, P_EXTRA, P_JOB_ID, P_JOB_TYPE, P_RESOURCE, P_REASON, P_ERROR,
       P_BODY, P_BODY_SIZE, P_HEADERS, P_CONTENT_TYPE, P_ATTEMPTS, P_FIRST, P_HOST, P_N };

/* The parameters of one letter, and the storage they point into. */
struct params {
    const char *values[P_N];
    int         lengths[P_N], formats[P_N];
    char        job_id[1024], job_type[1024], content_type[512], first[128], error[TEXT_MAX];
    char        body_size[24], attempts[16], host[256];
    char       *headers;
    size_t      headers_cap;
};

static void fill(struct params *pr, const struct sk_letter *l, const amqp_envelope_t *delivery);
static const char *property(char *out, size_t size, const amqp_basic_properties_t *p,
                            amqp_flags_t flag, amqp_bytes_t value, const char *parsed);
static void headers(struct params *pr, const amqp_basic_properties_t *p);
static int exec(PGconn *pg, struct params *pr, const char *sql, int n, const char *what,
                PGresult **res, struct sk_err *err);

int sk_letter_fail(PGconn *pg, const struct sk_letter *l, const amqp_envelope_t *delivery,
                   struct sk_err *err)
{
    struct params pr;
    fill(&pr, l, delivery);
    PGresult *res;
    int rc = exec(pg, &pr, "SELECT sekali.fail_dead($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
                  "$11, $12::jsonb, $13, $14, sekali.dlq_time($15), $16)", P_N,
                  "sekali.fail_dead", &res, err);
    if (rc != SK_OK)
        return rc;
    rc = strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? SK_OK : SK_BUSY;
    PQclear(res);
    return rc;
}

int sk_letter_record(PGconn *pg, const struct sk_letter *l, const amqp_envelope_t *delivery,
                     struct sk_err *err)
{
    struct params pr;
    fill(&pr, l, delivery);
    pr.values[P_EXTRA] = l->malformed != NULL ? pr.error : NULL;
    PGresult *res;
    int rc = exec(pg, &pr, "SELECT sekali.dlq_record($1, $2, $5, $6, $7, $8, $9, $4, $10, "
                  "$11, $12::jsonb, $13, $14, sekali.dlq_time($15), $16, $3)", P_N,
                  "sekali.dlq_record", &res, err);
    if (rc == SK_OK)
        PQclear(res);
    return rc;
}

/* A lock timeout is no fence: SK_BUSY means fenced out to the caller. */
static int exec(PGconn *pg, struct params *pr, const char *sql, int n, const char *what,
                PGresult **res, struct sk_err *err)
{
    const struct sk_pg_stmt st = {
        .sql = sql, .n_params = n, .values = pr->values, .lengths = pr->lengths,
        .formats = pr->formats, .one_row = true, .what = what,
    };
    int rc = sk_pg_exec(pg, &st, res, err);
    free(pr->headers);
    return rc == SK_BUSY ? SK_ERR : rc;
}

static void fill(struct params *pr, const struct sk_letter *l, const amqp_envelope_t *delivery)
{
    const amqp_basic_properties_t *p = &delivery->message.properties;
    memset(pr, 0, sizeof(*pr));
    const char **v = pr->values;
    v[P_QUEUE] = l->queue;
    v[P_KEY] = l->key;
    v[P_OWNER] = l->owner;
    v[P_EXTRA] = l->fence_text;
    v[P_JOB_ID] = property(pr->job_id, sizeof(pr->job_id), p, AMQP_BASIC_MESSAGE_ID_FLAG,
                           p->message_id, l->job_id);
    v[P_JOB_TYPE] = property(pr->job_type, sizeof(pr->job_type), p, AMQP_BASIC_TYPE_FLAG,
                             p->type, l->job_type);
    v[P_RESOURCE] = l->resource_key;
    v[P_REASON] = l->reason;
    /* A malformed letter's error is why it is malformed. */
    const char *error = l->malformed != NULL ? l->malformed : l->error;
    v[P_ERROR] = error != NULL
        ? sk_letter_text(pr->error, sizeof(pr->error), error, strlen(error)) : "";
    /* A body over max_body was never read: its length is announced, its
     * bytes are not there (broker_consume.c), so none are kept. */
    size_t body = delivery->message.body.len;
    bool read = delivery->message.body.bytes != NULL;
    v[P_BODY] = read ? delivery->message.body.bytes : "";
    pr->lengths[P_BODY] = !read ? 0 : (int)(body < l->body_max ? body : l->body_max);
    pr->formats[P_BODY] = 1;
    snprintf(pr->body_size, sizeof(pr->body_size), "%zu", body);
    v[P_BODY_SIZE] = pr->body_size;
    headers(pr, p);
    v[P_CONTENT_TYPE] = property(pr->content_type, sizeof(pr->content_type), p,
                                 AMQP_BASIC_CONTENT_TYPE_FLAG, p->content_type, NULL);
    if (l->attempts > 0) {
        snprintf(pr->attempts, sizeof(pr->attempts), "%d", l->attempts);
        v[P_ATTEMPTS] = pr->attempts;
    }
    if (l->first_failure != NULL && l->first_failure[0] != '\0')
        v[P_FIRST] = sk_letter_text(pr->first, sizeof(pr->first), l->first_failure,
                                    strlen(l->first_failure));
    char host[256] = "";
    if (gethostname(host, sizeof(host) - 1) == 0)
        v[P_HOST] = sk_letter_text(pr->host, sizeof(pr->host), host, strlen(host));
}

/* The validated value when there is one, else the message's property made
 * text, else NULL. */
static const char *property(char *out, size_t size, const amqp_basic_properties_t *p,
                            amqp_flags_t flag, amqp_bytes_t value, const char *parsed)
{
    if (parsed != NULL && parsed[0] != '\0')
        return parsed;
    if (!(p->_flags & flag) || value.len == 0)
        return NULL;
    return sk_letter_text(out, size, value.bytes, value.len);
}

/* The headers as JSON; past HEADERS_MAX, a note of their size instead. */
static void headers(struct params *pr, const amqp_basic_properties_t *p)
{
    static const amqp_table_t none = { 0 };
    const amqp_table_t *h = (p->_flags & AMQP_BASIC_HEADERS_FLAG) ? &p->headers : &none;
    long n = sk_headers_json(h, &pr->headers, &pr->headers_cap);
    if (n < 0 || n > HEADERS_MAX) {
        free(pr->headers);
        pr->headers = NULL;
        pr->values[P_HEADERS] = n < 0 ? "{}" : "{\"(omitted)\": \"headers over 64 KiB\"}";
        return;
    }
    pr->values[P_HEADERS] = pr->headers;
}

char *sk_letter_text(char *out, size_t size, const void *s, size_t len)
{
    sk_text_bound(out, size, s, len);
    return out;
}
