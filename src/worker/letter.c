/* letter.c - writes a dead letter's row (sql/023_dead_letter_store.sql).
 *
 * The row is the dead letter: sekalictl and the console read, replay and
 * purge it there, never in the broker, where a read hands a letter back
 * and a quorum queue's delivery limit counts it. So it is written before
 * the ack, and for a key recorded failed in the very transaction that
 * records it: a failed key without its letter, or an acked job without
 * either, cannot be seen. Everything in it came from a producer, so every
 * text is made valid UTF-8 without NUL here, and the body and headers are
 * bounded.
 *
 * The second half is how a job becomes a dead letter (sk_letter_give_up(),
 * sk_letter_dead()): its row, then its ack, with a copy to <queue>.dead
 * where the row cannot be written or the queue mirrors. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "headers_json.h"
#include "job_steps.h"
#include "letter.h"
#include "links.h"
#include "log.h"
#include "pg.h"
#include "pipeline.h"
#include "reschedule.h"
#include "text.h"

#define HEADERS_MAX (64 * 1024)  /* JSON bytes of headers kept */
#define TEXT_MAX    SK_TEXT_ERROR_MAX  /* bytes of the error kept, as everywhere (text.h) */
/* Bytes of a malformed message's body its dead letter keeps: it can never
 * be replayed, and may be as large as a frame. */
#define LETTER_MALFORMED_BODY_MAX (64 * 1024)

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
static struct sk_letter letter_of(struct sk_pipeline *p, struct sk_job *j, bool parsed,
                                  enum sk_metrics_reason reason, const char *why);
static void settle_dead(struct sk_pipeline *p, struct sk_job *j, bool parsed, bool recorded,
                        enum sk_metrics_reason reason, const char *why);

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

/* Records the key as failed and its dead letter (sekali.dead_letters) in
 * one transaction, then acks. Without the failed row a later copy would
 * run again, so while PostgreSQL cannot take it (down, or a condition that
 * passes) the message goes back to the broker, after a pause. A failure
 * PostgreSQL refuses for good (its SQLSTATE, sk_pg_refused_for_good())
 * would be refused at every copy: handed back, the job came straight back
 * for ever, past max_attempts, ahead of the jobs behind it. It ends here
 * instead: see sk_letter_unrecorded(). A leased job (external mode) fails
 * under its fence. */
void sk_letter_give_up(struct sk_pipeline *p, struct sk_job *j, enum sk_metrics_reason reason,
                       const char *why)
{
    struct sk_err err = { 0 };
    struct sk_store *store = sk_links_store(p->links);
    struct sk_letter l = letter_of(p, j, true, reason, why);
    l.fence_text = j->leased ? j->ref.fence_text : NULL;
    int rc = sk_letter_fail(sk_store_conn(store), &l, j->delivery, &err);
    if (rc != SK_OK && rc != SK_BUSY && sk_pg_refused_for_good(&err)) {
        sk_letter_unrecorded(p, j, "its failure", why, &err);
        return;
    }
    if (rc == SK_BUSY) {
        sk_metrics_inc(j->metrics, SK_METRIC_FENCED_OUT);
        sk_log_event(SK_LOG_WARN, SK_EVENT_FENCED_OUT, NULL, &j->log,
                     "failure fenced out: another worker owns the job");
        sk_job_finish(j, SK_ACK, SK_OUTCOME_FENCED_OUT, "failure", "fenced out");
        return;
    }
    if (rc != SK_OK) {
        sk_log_job(SK_LOG_ERROR, &j->log, "recording failure failed: %s", err.msg);
        sk_job_hand_back(j, "failure_not_recorded",
                         "failure not recorded, handed back to the broker");
        return;
    }
    sk_log_job(SK_LOG_WARN, &j->log, "job %s: %s", sk_metrics_reason_name(reason), why);
    settle_dead(p, j, true, true, reason, why);
}

/* An outcome PostgreSQL refused for good: the job is dead-lettered with
 * reason unrecorded, its error saying what could not be recorded and why,
 * and its key is left as it stands for an operator (a replay runs the job
 * again). The dead letter keeps the message where an operator looks;
 * handed back, it would only come straight back. */
void sk_letter_unrecorded(struct sk_pipeline *p, struct sk_job *j, const char *what,
                          const char *why, const struct sk_err *refusal)
{
    char text[SK_TEXT_ERROR_MAX];
    snprintf(text, sizeof(text), "%s could not be recorded (%s); it was: %s", what,
             refusal->msg, why);
    sk_log_job(SK_LOG_ERROR, &j->log, "job %s: %s", sk_metrics_reason_name(SK_METRICS_UNRECORDED),
               text);
    sk_letter_dead(p, j, true, SK_METRICS_UNRECORDED, text);
}

/* The letter of a job, as far as its delivery was understood. */
static struct sk_letter letter_of(struct sk_pipeline *p, struct sk_job *j, bool parsed,
                                  enum sk_metrics_reason reason, const char *why)
{
    const struct sk_envelope *e = &j->env;
    bool own_resource = parsed && strcmp(e->resource_key, e->idempotency_key) != 0;
    return (struct sk_letter){
        .queue = p->queue->name,
        .key = parsed ? e->idempotency_key : NULL,
        .job_id = parsed ? e->job_id : NULL,
        .job_type = parsed ? e->job_type : NULL,
        .resource_key = own_resource ? e->resource_key : NULL,
        .reason = sk_metrics_reason_name(reason),
        .error = why,
        .owner = p->owner,
        .first_failure = parsed ? e->first_failure : NULL,
        .attempts = (int)e->delivery_attempt,
        /* A valid job's body is bounded by max_body already, and is kept
         * whole so that a replay sends it as it was. */
        .body_max = parsed ? SIZE_MAX : LETTER_MALFORMED_BODY_MAX,
    };
}

/* A letter whose key is not recorded failed (malformed, beyond retention):
 * its row, in a statement of its own, then the ack. A valid job (parsed)
 * keeps its key, so that it can be replayed. */
void sk_letter_dead(struct sk_pipeline *p, struct sk_job *j, bool parsed,
                    enum sk_metrics_reason reason, const char *why)
{
    struct sk_err err = { 0 };
    struct sk_letter l = letter_of(p, j, parsed, reason, why);
    if (!parsed)
        l.malformed = why;
    bool recorded = sk_letter_record(sk_store_conn(sk_links_store(p->links)), &l, j->delivery,
                                     &err) == SK_OK;
    if (!recorded)
        sk_log_job(SK_LOG_ERROR, &j->log, "recording the dead letter failed, so it goes to "
                   "the broker's dead-letter queue (sekalictl dlq import takes it): %s", err.msg);
    settle_dead(p, j, parsed, recorded, reason, why);
}

/* Acks a dead letter whose row is written (recorded), after its copy to
 * <queue>.dead when the queue mirrors (dead_letter_mirror); a lost copy
 * loses nothing then. An unrecorded one (PostgreSQL unreachable) must
 * reach <queue>.dead: a confirmed copy, else the broker's own
 * dead-lettering (reject), without the reason headers, which the log line
 * gives. Counted once recorded or copied. */
static void settle_dead(struct sk_pipeline *p, struct sk_job *j, bool parsed, bool recorded,
                        enum sk_metrics_reason reason, const char *why)
{
    struct sk_err err = { 0 };
    /* A body over max_body was never read (broker_consume.c): only the
     * broker's own dead-lettering keeps it, so its row is only a note. */
    const amqp_bytes_t *body = &j->delivery->message.body;
    char text[1200];
    if (body->bytes == NULL && body->len > 0) {
        snprintf(text, sizeof(text), "dead-lettered by the broker (body not read; %s: %s)",
                 sk_metrics_reason_name(reason), why);
        j->exit.dead_reason = reason;
        sk_job_finish(j, SK_DEAD_LETTER, SK_OUTCOME_DEAD, sk_metrics_reason_name(reason), text);
        return;
    }
    bool copy = !recorded || p->queue->dead_letter_mirror;
    struct sk_broker *pub = copy ? sk_links_publisher(p->links, &err) : NULL;
    bool copied = pub != NULL &&
        sk_reschedule_dead(pub, p->queue->name, j->delivery, parsed ? &j->env : NULL,
                           sk_metrics_reason_name(reason), why, &err) == SK_OK;
    if (copy && !copied) {
        /* A copy refused for its own sake (too large) or nacked leaves the
         * connection sound, and sk_links_drop() keeps it. */
        sk_links_drop(p->links, SK_LINK_PUBLISHER, &j->log, &err);
        if (recorded)
            sk_log_job(SK_LOG_WARN, &j->log, "dead letter recorded, its mirror copy to "
                       "%s.dead failed: %s", p->queue->name, err.msg);
    }
    if (recorded || copied) {
        sk_metrics_dead_letter(j->metrics, reason);
        sk_job_finish(j, SK_ACK, SK_OUTCOME_DEAD, sk_metrics_reason_name(reason), "dead-lettered");
        /* Acked at once, alone, not with its span: a malformed message has
         * no key whose row would make its redelivery a duplicate, so a
         * worker dying before the span's ack (a batch-mate's handler may
         * kill it) would dead-letter it a second time. */
        struct sk_broker *consumer = sk_links_consumer(p->links);
        if (consumer != NULL &&
            sk_broker_ack_one(consumer, j->delivery->delivery_tag, &err) == SK_OK)
            j->exit.how = SK_ACKED;
        return;
    }
    snprintf(text, sizeof(text), "dead-lettered by the broker (no reason headers; %s: %s; "
             "no copy: %s)", sk_metrics_reason_name(reason), why, err.msg);
    /* Counted by the exit, once the broker took the reject. */
    j->exit.dead_reason = reason;
    sk_job_finish(j, SK_DEAD_LETTER, SK_OUTCOME_DEAD, sk_metrics_reason_name(reason), text);
}
