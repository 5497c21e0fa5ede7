/* ctl_dlq.c - sekalictl dlq: list, show, replay and purge the dead letters
 * of a queue, so that nothing sekali records as failed is a dead end.
 *
 *   dlq list   QUEUE [--json]
 *   dlq show   QUEUE KEY [--json]
 *   dlq replay QUEUE (--key K | --reason R | --all) [--by NAME] [--json]
 *   dlq purge  QUEUE (--key K | --reason R | --all) [--by NAME] [--json]
 *
 * The dead letters are read from <queue>.dead with basic.get and no ack:
 * each stays the broker's until we ack it (replayed or purged), and the rest
 * go back to where they were when our channel closes, also if we die. What
 * PostgreSQL knows of each key is read and changed only through the
 * functions of sql/007_dead_letters.sql.
 *
 * A replay is one transaction (sekali.dlq_replay: re-arm the key, enqueue
 * the job in the outbox, write the audit row), then the ack of the dead
 * letter. Should we die between the two, the dead letter comes back; its
 * next replay finds its audit row and only removes it, and even without
 * that the idempotency key would absorb the second copy. */
#include <ctype.h>
#include <getopt.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <libpq-fe.h>

#include "broker.h"
#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_http.h"
#include "ctl_out.h"
#include "envelope.h"
#include "failpoint.h"
#include "pg.h"

#define TEXT_ERROR_MAX 60   /* longest error shown in list's table */
#define PREVIEW_MAX    256  /* body bytes shown by show */

/* One dead letter as read from <queue>.dead; its strings point into msg. */
struct letter {
    amqp_message_t     msg;
    uint64_t           tag;
    struct sk_envelope env;
    bool               parsed;         /* valid under the queue's rules: replayable */
    char               parse_error[256];
    amqp_bytes_t       key, job_id, job_type;  /* key: empty when it has none */
    const char        *source;         /* "sekali", "broker", "unverified" or "unknown" */
    char               origin[1200];   /* where it came from, in words */
    char               reason[64];
    char               error[512];
    int64_t            attempts;       /* -1: unknown */
    char               first[64], last[64];
    /* From PostgreSQL; status "?" when it could not be read, "" without a key. */
    char               status[16];
    long               key_attempts, crashes, replays;
};

/* What a command does with each letter; returns SK_OK to go on. */
struct dlq;
typedef int (*visit_fn)(struct dlq *d, struct letter *l);

struct dlq {
    const struct sk_conf       *conf;
    const char                 *queue;
    char                        dead[600];
    struct sk_queue_conf        rules;      /* how a replayed copy would be validated */
    struct sk_broker           *broker;
    PGconn                     *pg;
    bool                        json;
    const char                 *sel_key, *sel_reason;
    bool                        sel_all;
    char                        actor[256], os_user[256];
    int                         seen, matched, done, already, refused;
    bool                        first_item;  /* JSON: no comma before the next item */
    struct sk_err               err;
};

static int open_dlq(struct dlq *d, const struct sk_conf *conf, const char *queue,
                    bool need_pg);
static void close_dlq(struct dlq *d);
static int scan(struct dlq *d, visit_fn visit);
static void decode(struct dlq *d, struct letter *l);
static bool recorded_by_sekali(const struct dlq *d, struct letter *l);
static bool recorded_by_broker(struct letter *l);
static bool bytes_are(amqp_bytes_t b, const char *s);
static void key_state(struct dlq *d, struct letter *l);
static bool selected(const struct dlq *d, const struct letter *l);
static int visit_list(struct dlq *d, struct letter *l);
static int visit_show(struct dlq *d, struct letter *l);
static int visit_replay(struct dlq *d, struct letter *l);
static int visit_purge(struct dlq *d, struct letter *l);
static int finish(struct dlq *d, int rc, const char *verb);
static void json_item(struct dlq *d);
static void json_letter_fields(FILE *f, const struct letter *l);
static void json_letter(FILE *f, const struct letter *l);
static void json_null_or(FILE *f, const char *name, const void *s, size_t len);
static bool dlq_options(int argc, char **argv, struct dlq *d, const char **by);
static bool operands_ok(const struct dlq *d, const char *sub, const char *queue, int left,
                        const char *by);
static void print_head(const struct dlq *d, const char *queue, const char *sub, int rc);
static void show_json(struct dlq *d, const struct letter *l, const amqp_table_t *h,
                      size_t preview);
static void show_text_headers(const amqp_table_t *h);
static void show_text(const struct dlq *d, const struct letter *l, const amqp_table_t *h,
                      size_t preview);

static void dlq_usage(FILE *out)
{
    fprintf(out, "usage: sekalictl dlq list QUEUE [--json]\n"
                 "       sekalictl dlq show QUEUE KEY [--json]\n"
                 "       sekalictl dlq replay QUEUE (--key K | --reason R | --all) [--by NAME] "
                 "[--json]\n"
                 "       sekalictl dlq purge QUEUE (--key K | --reason R | --all) [--by NAME] "
                 "[--json]\n");
}

int sk_ctl_dlq(const struct sk_conf *conf, int argc, char **argv)
{
    struct dlq d = { .first_item = true };
    const char *by = NULL;
    if (!dlq_options(argc, argv, &d, &by)) {
        dlq_usage(stderr);
        return SK_CTL_USAGE;
    }
    /* argv[0] is "dlq"; optind has moved the operands to the end. */
    int left = argc - optind;
    const char *sub = left >= 1 ? argv[optind] : "";
    const char *queue = left >= 2 ? argv[optind + 1] : NULL;
    bool list = strcmp(sub, "list") == 0, show = strcmp(sub, "show") == 0;
    bool replay = strcmp(sub, "replay") == 0, purge = strcmp(sub, "purge") == 0;
    if (!operands_ok(&d, sub, queue, left, by)) {
        if (replay || purge)
            fprintf(stderr, "sekalictl: dlq %s takes QUEUE and exactly one of --key, "
                            "--reason or --all\n", sub);
        dlq_usage(stderr);
        return SK_CTL_USAGE;
    }
    if (show)
        d.sel_key = argv[optind + 2];

    struct passwd *pw = getpwuid(geteuid());
    snprintf(d.os_user, sizeof(d.os_user), "%s", pw != NULL ? pw->pw_name : "uid?");
    snprintf(d.actor, sizeof(d.actor), "%s", by != NULL ? by : d.os_user);

    int rc = open_dlq(&d, conf, queue, replay || purge);
    if (rc == SK_OK && replay && conf->outbox.relays == 0)
        fprintf(stderr, "sekalictl: note: this configuration runs no outbox relay "
                        "(outbox.relays: 0); replayed jobs wait in sekali.outbox until a "
                        "sekalid with relays runs\n");
    print_head(&d, queue, sub, rc);
    if (rc == SK_OK)
        rc = scan(&d, list ? visit_list : show ? visit_show : replay ? visit_replay : visit_purge);
    int code = finish(&d, rc, sub);
    close_dlq(&d);
    return code;
}

/* false: a usage error. */
static bool dlq_options(int argc, char **argv, struct dlq *d, const char **by)
{
    static const struct option options[] = {
        { "json", no_argument, NULL, 'j' },  { "key", required_argument, NULL, 'k' },
        { "reason", required_argument, NULL, 'r' }, { "all", no_argument, NULL, 'a' },
        { "by", required_argument, NULL, 'b' }, { NULL, 0, NULL, 0 },
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'j': d->json = true; break;
        case 'k': d->sel_key = optarg; break;
        case 'r': d->sel_reason = optarg; break;
        case 'a': d->sel_all = true; break;
        case 'b': *by = optarg; break;
        default: return false;
        }
    }
    return true;
}

/* list and show select nothing (show names its key as an operand); replay
 * and purge need exactly one selector, so "all" is never implied. */
static bool operands_ok(const struct dlq *d, const char *sub, const char *queue, int left,
                        const char *by)
{
    int selectors = (d->sel_key != NULL) + (d->sel_reason != NULL) + d->sel_all;
    if (queue == NULL || queue[0] == '\0')
        return false;
    if (strcmp(sub, "list") == 0)
        return left == 2 && selectors == 0 && by == NULL;
    if (strcmp(sub, "show") == 0)
        return left == 3 && selectors == 0 && by == NULL;
    if (strcmp(sub, "replay") == 0 || strcmp(sub, "purge") == 0)
        return left == 2 && selectors == 1;
    return false;
}

/* The JSON document's opening, or list's table header once the queue is open. */
static void print_head(const struct dlq *d, const char *queue, const char *sub, int rc)
{
    bool writes = strcmp(sub, "replay") == 0 || strcmp(sub, "purge") == 0;
    if (d->json) {
        printf("{\"queue\":");
        sk_ctl_put_jstr(stdout, queue);
        printf(",\"dead_letter_queue\":");
        sk_ctl_put_jstr(stdout, d->dead);
        printf(",\"command\":");
        sk_ctl_put_jstr(stdout, sub);
        printf(",\"%s\":[", writes ? "results" : "dead_letters");
    } else if (rc == SK_OK && strcmp(sub, "list") == 0) {
        printf("KEY | REASON | ATTEMPTS | KEY STATUS | FIRST FAILURE | LAST FAILURE | JOB ID | "
               "TYPE | ERROR\n");
    }
}

/* Connects to RabbitMQ and PostgreSQL. Without PostgreSQL, list and show
 * still print what the broker holds, with "?" as each key's status, and
 * exit 1; replay and purge do not start. */
static int open_dlq(struct dlq *d, const struct sk_conf *conf, const char *queue,
                    bool need_pg)
{
    d->conf = conf;
    d->queue = queue;
    int rc = sk_broker_dead_name(queue, d->dead, sizeof(d->dead), &d->err);
    if (rc != SK_OK)
        return rc;
    const struct sk_queue_conf *q = sk_conf_queue(conf, queue);
    /* A queue this configuration does not serve: only the rules every
     * queue has (a message id, UTF-8 keys) decide what is malformed. */
    d->rules = q != NULL ? *q : (struct sk_queue_conf){ .name = (char *)queue,
                                                         .max_body = SIZE_MAX };
    if (sk_broker_open(&d->broker, &conf->amqp, &d->err) != SK_OK)
        return SK_ERR;
    d->pg = sk_ctl_pg_connect(conf);
    if (d->pg == NULL && need_pg)
        return sk_err_set(&d->err, SK_AGAIN, "PostgreSQL unreachable");
    if (d->pg == NULL)
        return SK_OK;
    /* A worker's transaction holds a key's row while its handler runs:
     * wait for it a while, not for ever. */
    sk_pg_run(d->pg, "SET lock_timeout = '10s'", NULL);
    return SK_OK;
}

static void close_dlq(struct dlq *d)
{
    /* Closing the channel hands every dead letter we did not ack back to
     * its place in the queue. */
    sk_broker_close(d->broker);
    PQfinish(d->pg);
}

/* Takes each dead letter present when the scan starts, in queue order,
 * decodes it and hands it to visit; one arriving meanwhile is left alone. */
static int scan(struct dlq *d, visit_fn visit)
{
    uint32_t depth = 0;
    struct sk_err why = { 0 };
    if (sk_broker_queue_depth(d->broker, d->dead, &depth, NULL, &why) != SK_OK)
        return sk_err_set(&d->err, SK_ERR, "cannot read queue %s (does it exist?): %s",
                          d->dead, why.msg);
    for (uint32_t i = 0; i < depth; i++) {
        struct letter l = { .attempts = -1 };
        int rc = sk_broker_peek(d->broker, d->dead, &l.msg, &l.tag, &d->err);
        if (rc == SK_BUSY)
            break;
        if (rc != SK_OK)
            return rc;
        d->seen++;
        decode(d, &l);
        rc = visit(d, &l);
        amqp_destroy_message(&l.msg);
        if (rc != SK_OK)
            return rc;
        sk_broker_keepalive(d->broker, NULL);
    }
    /* A synchronous round trip: the broker has acted on our acks once it
     * answers, so what we report as removed is removed. */
    uint32_t after;
    if (sk_broker_queue_depth(d->broker, d->dead, &after, NULL, &why) != SK_OK)
        return sk_err_set(&d->err, SK_AGAIN, "the broker did not confirm the end of the "
                          "scan (run dlq list to see what is left): %s", why.msg);
    return SK_OK;
}

/* What sekali (x-sekali-* headers) or the broker (x-death) recorded, and
 * whether a copy of the job would be valid: the same checks a worker makes. */
static void decode(struct dlq *d, struct letter *l)
{
    const amqp_basic_properties_t *p = &l->msg.properties;
    amqp_envelope_t env = { .message = l->msg };
    struct sk_err err = { 0 };
    l->parsed = sk_envelope_parse(&env, &d->rules, &l->env, &err) == SK_OK;
    snprintf(l->parse_error, sizeof(l->parse_error), "%s", l->parsed ? "" : err.msg);
    if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
        l->job_id = p->message_id;
    if (p->_flags & AMQP_BASIC_TYPE_FLAG)
        l->job_type = p->type;
    /* The key as a worker would take it, even from a malformed letter,
     * so that purge --key can name it. */
    const amqp_field_value_t *k = sk_ctl_header(&l->msg, "x-idempotency-key");
    if (k != NULL && (k->kind == AMQP_FIELD_KIND_UTF8 || k->kind == AMQP_FIELD_KIND_BYTES))
        l->key = k->value.bytes;
    else if (k == NULL)
        l->key = l->job_id;

    if (recorded_by_sekali(d, l))
        return;
    /* Headers that claim sekali's record without proof are shown, not
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

/* Whether sekali wrote this letter's x-sekali-* headers for this queue:
 * x-sekali-queue names it, the broker verified that the publisher logged
 * in as sekali's AMQP user (user_id, which RabbitMQ refuses from any other
 * login), and the broker did not dead-letter it from the work queue since
 * (its latest x-death would say so: a producer's copy of sekali's headers,
 * rejected). A client logged in as sekali's own user can still forge
 * them: producers should have users of their own. */
static bool recorded_by_sekali(const struct dlq *d, struct letter *l)
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
    sk_ctl_header_text(&l->msg, "x-sekali-reason", l->reason, sizeof(l->reason));
    l->source = "sekali";
    sk_ctl_header_text(&l->msg, "x-sekali-error", l->error, sizeof(l->error));
    l->attempts = sk_broker_field_int(sk_ctl_header(&l->msg, "x-sekali-attempts"));
    sk_ctl_header_text(&l->msg, "x-sekali-first-failure", l->first, sizeof(l->first));
    sk_ctl_header_text(&l->msg, "x-sekali-last-failure", l->last, sizeof(l->last));
    snprintf(l->origin, sizeof(l->origin), "sekali, dead-lettering it from queue %s as user %s",
             d->queue, d->conf->amqp.user);
    return true;
}

static bool bytes_are(amqp_bytes_t b, const char *s)
{
    return b.len == strlen(s) && memcmp(b.bytes, s, b.len) == 0;
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
        int len = (int)e->key.len;
        if (len == 6 && memcmp(e->key.bytes, "reason", 6) == 0 && text)
            snprintf(l->reason, sizeof(l->reason), "%.*s", (int)v->value.bytes.len,
                     (const char *)v->value.bytes.bytes);
        else if (len == 5 && memcmp(e->key.bytes, "queue", 5) == 0 && text)
            snprintf(from, sizeof(from), "%.*s", (int)v->value.bytes.len,
                     (const char *)v->value.bytes.bytes);
        else if (len == 5 && memcmp(e->key.bytes, "count", 5) == 0)
            count = sk_broker_field_int(v);
        else if (len == 4 && memcmp(e->key.bytes, "time", 4) == 0 &&
                 v->kind == AMQP_FIELD_KIND_TIMESTAMP)
            sk_ctl_iso_time(v->value.u64, l->last, sizeof(l->last));
    }
    snprintf(number, sizeof(number), "%lld", (long long)count);
    snprintf(l->error, sizeof(l->error), "dead-lettered by the broker from %s (%s, %s "
             "time%s)", from, l->reason, count >= 0 ? number : "?", count == 1 ? "" : "s");
    snprintf(l->origin, sizeof(l->origin), "the broker, dead-lettering it from queue %s", from);
    /* x-delivery-count is the quorum queue's, written as it dead-letters
     * past its delivery limit; one a producer wrote into a classic queue's
     * message would pass for a count of attempts. */
    int64_t deliveries = sk_broker_field_int(sk_ctl_header(&l->msg, "x-delivery-count"));
    l->attempts = deliveries >= 0 && strcmp(l->reason, "delivery_limit") == 0 ? deliveries : -1;
    return true;
}

/* Fills the key's PostgreSQL state (sekali.dlq_key_state). */
static void key_state(struct dlq *d, struct letter *l)
{
    l->status[0] = '\0';
    l->key_attempts = l->crashes = l->replays = -1;
    if (l->key.len == 0 || l->key.len > SK_KEY_MAX)
        return;
    /* Only a key PostgreSQL can hold: valid UTF-8 without NUL. */
    for (size_t i = 0, n; i < l->key.len; i += n)
        if ((n = sk_ctl_utf8_len((const unsigned char *)l->key.bytes + i, l->key.len - i)) == 0 ||
            ((const char *)l->key.bytes)[i] == '\0')
            return;
    snprintf(l->status, sizeof(l->status), "?");
    if (d->pg == NULL)
        return;
    char key[SK_KEY_MAX + 1];
    snprintf(key, sizeof(key), "%.*s", (int)l->key.len, (const char *)l->key.bytes);
    const char *values[] = { d->queue, key };
    const struct sk_pg_stmt st = {
        .sql = "SELECT status, attempts, crashes, replays FROM sekali.dlq_key_state($1, $2)",
        .n_params = 2, .values = values, .one_row = true, .what = "sekali.dlq_key_state",
    };
    struct sk_err err = { 0 };
    PGresult *res;
    if (sk_pg_exec(d->pg, &st, &res, &err) != SK_OK) {
        fprintf(stderr, "sekalictl: %s\n", err.msg);
        return;
    }
    snprintf(l->status, sizeof(l->status), "%s", PQgetvalue(res, 0, 0));
    l->key_attempts = PQgetisnull(res, 0, 1) ? -1 : atol(PQgetvalue(res, 0, 1));
    l->crashes = PQgetisnull(res, 0, 2) ? 0 : atol(PQgetvalue(res, 0, 2));
    l->replays = atol(PQgetvalue(res, 0, 3));
    PQclear(res);
}

/* --reason matches regardless of case, and "_" matches " " (so
 * retries_exhausted needs no quotes). */
static bool selected(const struct dlq *d, const struct letter *l)
{
    if (d->sel_all)
        return true;
    if (d->sel_key != NULL)
        return l->key.len == strlen(d->sel_key) &&
               memcmp(l->key.bytes, d->sel_key, l->key.len) == 0;
    const char *a = d->sel_reason, *b = l->reason;
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        char x = *a == '_' ? ' ' : (char)tolower((unsigned char)*a);
        char y = *b == '_' ? ' ' : (char)tolower((unsigned char)*b);
        if (x != y)
            return false;
    }
    return *a == '\0' && *b == '\0';
}

static int visit_list(struct dlq *d, struct letter *l)
{
    key_state(d, l);
    d->matched++;
    if (l->parsed && l->job_type.len > 0 && strcmp(l->status, "completed") != 0)
        d->done++;  /* replayable */
    if (d->json) {
        json_item(d);
        json_letter(stdout, l);
        return SK_OK;
    }
    if (l->key.len > 0)
        sk_ctl_put_text(stdout, l->key.bytes, l->key.len, 24);
    else
        printf("(no key)");
    /* Every field that came from the letter is escaped (ctl_out.c). */
    printf(" | ");
    sk_ctl_put_text(stdout, l->reason, strlen(l->reason), 0);
    if (l->attempts >= 0)
        printf(" | %lld | ", (long long)l->attempts);
    else
        printf(" | ? | ");
    sk_ctl_put_tstr(stdout, l->status[0] != '\0' ? l->status : "-");
    printf(" | ");
    sk_ctl_put_tstr(stdout, l->first[0] != '\0' ? l->first : "-");
    printf(" | ");
    sk_ctl_put_tstr(stdout, l->last[0] != '\0' ? l->last : "-");
    printf(" | ");
    sk_ctl_put_text(stdout, l->job_id.bytes, l->job_id.len, 36);
    printf(" | ");
    sk_ctl_put_text(stdout, l->job_type.bytes, l->job_type.len, 12);
    printf(" | ");
    sk_ctl_put_text(stdout, l->parsed ? l->error : l->parse_error,
             strlen(l->parsed ? l->error : l->parse_error), TEXT_ERROR_MAX);
    printf("\n");
    return SK_OK;
}

static int visit_show(struct dlq *d, struct letter *l)
{
    if (!selected(d, l))
        return SK_OK;
    key_state(d, l);
    d->matched++;
    const amqp_basic_properties_t *p = &l->msg.properties;
    const amqp_table_t *h = (p->_flags & AMQP_BASIC_HEADERS_FLAG) ? &p->headers : NULL;
    size_t preview = l->msg.body.len < PREVIEW_MAX ? l->msg.body.len : PREVIEW_MAX;
    if (d->json)
        show_json(d, l, h, preview);
    else
        show_text(d, l, h, preview);
    return SK_OK;
}

static void show_text(const struct dlq *d, const struct letter *l, const amqp_table_t *h,
                      size_t preview)
{
    printf("dead letter %d of %s\n  key:            ", d->seen, d->dead);
    sk_ctl_put_text(stdout, l->key.bytes, l->key.len, 0);
    printf("\n  job id:         ");
    sk_ctl_put_text(stdout, l->job_id.bytes, l->job_id.len, 0);
    printf("\n  job type:       ");
    sk_ctl_put_text(stdout, l->job_type.bytes, l->job_type.len, 0);
    printf("\n  reason:         ");
    sk_ctl_put_tstr(stdout, l->reason);
    printf(" (recorded by %s)\n  from:           ", l->source);
    sk_ctl_put_tstr(stdout, l->origin);
    printf("\n  error:          ");
    sk_ctl_put_text(stdout, l->error, strlen(l->error), 0);
    printf("\n  attempts:       ");
    if (l->attempts >= 0)
        printf("%lld\n", (long long)l->attempts);
    else
        printf("?\n");
    printf("  first failure:  ");
    sk_ctl_put_tstr(stdout, l->first[0] ? l->first : "-");
    printf("\n  last failure:   ");
    sk_ctl_put_tstr(stdout, l->last[0] ? l->last : "-");
    printf("\n");
    printf("  replayable:     %s", l->parsed && l->job_type.len > 0 ? "yes" : "no: ");
    if (!l->parsed)
        sk_ctl_put_text(stdout, l->parse_error, strlen(l->parse_error), 0);
    else if (l->job_type.len == 0)
        printf("no job type (the outbox needs one)");
    printf("\n  key in PostgreSQL: ");
    sk_ctl_put_tstr(stdout, l->status[0] != '\0' ? l->status : "-");
    if (l->key_attempts >= 0)
        printf(", %ld attempts", l->key_attempts);
    if (l->crashes > 0)
        printf(", %ld crashes", l->crashes);
    if (l->replays > 0)
        printf(", replayed %ld times before", l->replays);
    printf("\n");
    show_text_headers(h);
    printf("  body (%zu bytes): ", l->msg.body.len);
    sk_ctl_put_text(stdout, l->msg.body.bytes, preview, 0);
    printf("%s\n", preview < l->msg.body.len ? "..." : "");
}

static void show_json(struct dlq *d, const struct letter *l, const amqp_table_t *h,
                      size_t preview)
{
    json_item(d);
    json_letter_fields(stdout, l);
    printf(",\"headers\":{");
    for (int i = 0; h != NULL && i < h->num_entries; i++) {
        printf(i > 0 ? "," : "");
        sk_ctl_put_json(stdout, h->entries[i].key.bytes, h->entries[i].key.len);
        printf(":");
        sk_ctl_put_field(stdout, &h->entries[i].value, true);
    }
    printf("},\"body_preview\":");
    sk_ctl_put_json(stdout, l->msg.body.bytes, preview);
    printf("}");
}

static void show_text_headers(const amqp_table_t *h)
{
    printf("  headers:\n");
    for (int i = 0; h != NULL && i < h->num_entries; i++) {
        printf("    ");
        sk_ctl_put_text(stdout, h->entries[i].key.bytes, h->entries[i].key.len, 0);
        printf(" = ");
        sk_ctl_put_field(stdout, &h->entries[i].value, false);
        printf("\n");
    }
}

/* One result line (or JSON object) of replay or purge. */
static void result(struct dlq *d, const struct letter *l, const char *outcome,
                   const char *new_job_id, const char *detail)
{
    if (d->json) {
        json_item(d);
        printf("{\"key\":");
        if (l->key.len > 0)
            sk_ctl_put_json(stdout, l->key.bytes, l->key.len);
        else
            printf("null");
        printf(",");
        json_null_or(stdout, "dead_job_id", l->job_id.bytes, l->job_id.len);
        printf(",\"reason\":");
        sk_ctl_put_jstr(stdout, l->reason);
        printf(",\"outcome\":");
        sk_ctl_put_jstr(stdout, outcome);
        printf(",");
        json_null_or(stdout, "new_job_id", new_job_id, new_job_id ? strlen(new_job_id) : 0);
        printf(",\"detail\":");
        sk_ctl_put_jstr(stdout, detail);
        printf("}");
        return;
    }
    printf("%-17s ", outcome);
    if (l->key.len > 0)
        sk_ctl_put_text(stdout, l->key.bytes, l->key.len, 0);
    else
        printf("(no key)");
    printf(" [");
    sk_ctl_put_tstr(stdout, l->reason);
    printf("]: ");
    sk_ctl_put_text(stdout, detail, strlen(detail), 0);
    printf("\n");
}

static int visit_replay(struct dlq *d, struct letter *l)
{
    if (!selected(d, l))
        return SK_OK;
    d->matched++;
    char why[600];
    if (!l->parsed || l->job_type.len == 0) {
        /* It would be dead-lettered as malformed again. */
        snprintf(why, sizeof(why), "malformed: %s",
                 l->parsed ? "no job type (the outbox needs one)" : l->parse_error);
        d->refused++;
        result(d, l, "refused", NULL, why);
        return SK_OK;
    }
    if (strcmp(l->source, "unverified") == 0) {
        /* Replaying re-arms the key: a letter made to look like sekali's
         * must not re-arm someone's failed job with its own body. */
        d->refused++;
        result(d, l, "refused", NULL, "its x-sekali-* headers are not sekali's record for this "
               "queue (see dlq show): purge it, or publish the job anew");
        return SK_OK;
    }
    const char *resource = strcmp(l->env.resource_key, l->env.idempotency_key) != 0
        ? l->env.resource_key : NULL;
    const char *values[] = { d->queue, l->env.idempotency_key, l->env.job_id, l->env.job_type,
                             l->msg.body.bytes, resource, l->reason, l->error, d->actor,
                             d->os_user };
    int lengths[SK_ARRAY_LEN(values)] = { [4] = (int)l->msg.body.len };
    int formats[SK_ARRAY_LEN(values)] = { [4] = 1 };
    const struct sk_pg_stmt st = {
        .sql = "SELECT outcome, job_id, detail FROM sekali.dlq_replay("
               "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        .n_params = (int)SK_ARRAY_LEN(values), .values = values, .lengths = lengths,
        .formats = formats, .one_row = true, .what = "sekali.dlq_replay",
    };
    struct sk_err err = { 0 };
    PGresult *res;
    if (sk_pg_exec(d->pg, &st, &res, &err) != SK_OK)
        return sk_err_set(&d->err, SK_ERR, "%s (key %s)", err.msg, l->env.idempotency_key);
    const char *outcome = PQgetvalue(res, 0, 0);
    const char *job_id = PQgetisnull(res, 0, 1) ? NULL : PQgetvalue(res, 0, 1);
    const char *detail = PQgetvalue(res, 0, 2);
    int rc = SK_OK;
    if (strcmp(outcome, "replayed") == 0 || strcmp(outcome, "already_replayed") == 0) {
        /* Committed: from here the dead letter is only a stale copy. */
        sk_failpoint("dlq_after_commit", l->env.idempotency_key);
        rc = sk_broker_ack_one(d->broker, l->tag, &d->err);
        if (strcmp(outcome, "replayed") == 0) {
            d->done++;
            snprintf(why, sizeof(why), "enqueued as job %s (%s)", job_id, detail);
        } else {
            d->already++;
            snprintf(why, sizeof(why), "dead letter removed: %s", detail);
        }
        result(d, l, outcome, job_id, why);
    } else {
        d->refused++;
        snprintf(why, sizeof(why), "%s: %s",
                 strcmp(outcome, "completed") == 0 ? "completed meanwhile" : outcome, detail);
        result(d, l, "refused", NULL, why);
    }
    PQclear(res);
    return rc;
}

static int visit_purge(struct dlq *d, struct letter *l)
{
    if (!selected(d, l))
        return SK_OK;
    d->matched++;
    char key[SK_KEY_MAX + 1], job_id[SK_KEY_MAX + 1];
    key_state(d, l);  /* also tells whether PostgreSQL can hold the key */
    snprintf(key, sizeof(key), "%.*s", (int)l->key.len, (const char *)l->key.bytes);
    snprintf(job_id, sizeof(job_id), "%.*s", (int)l->job_id.len, (const char *)l->job_id.bytes);
    bool storable_id = true;
    for (size_t i = 0, n; i < l->job_id.len; i += n)
        if ((n = sk_ctl_utf8_len((const unsigned char *)l->job_id.bytes + i, l->job_id.len - i)) == 0 ||
            job_id[i] == '\0')
            storable_id = false;
    const char *values[] = { d->queue, l->status[0] != '\0' ? key : NULL,
                             l->job_id.len > 0 && storable_id ? job_id : NULL, l->reason,
                             l->error, d->actor, d->os_user };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.dlq_purge($1, $2, $3, $4, $5, $6, $7)",
        .n_params = (int)SK_ARRAY_LEN(values), .values = values, .what = "sekali.dlq_purge",
    };
    struct sk_err err = { 0 };
    if (sk_pg_exec(d->pg, &st, NULL, &err) != SK_OK)
        return sk_err_set(&d->err, SK_ERR, "%s", err.msg);
    int rc = sk_broker_ack_one(d->broker, l->tag, &d->err);
    if (rc == SK_OK) {
        d->done++;
        result(d, l, "purged", NULL, l->status[0] != '\0' && strcmp(l->status, "?") != 0
                                         ? "removed; the key stays as it is" : "removed");
    }
    return rc;
}

/* The summary (text, or the end of the JSON document) and the exit code. */
static int finish(struct dlq *d, int rc, const char *verb)
{
    bool list = strcmp(verb, "list") == 0, show = strcmp(verb, "show") == 0;
    int code = SK_CTL_OK;
    if (rc == SK_OK && d->pg == NULL)
        rc = sk_err_set(&d->err, SK_AGAIN, "PostgreSQL unreachable: the keys' status is "
                        "unknown (\"?\")");
    if (rc != SK_OK)
        code = SK_CTL_FAILED;
    else if (d->refused > 0)
        code = SK_CTL_REFUSED;
    else if (d->matched == 0 && (show || d->sel_key != NULL || d->sel_reason != NULL))
        code = SK_CTL_NOT_FOUND;

    char summary[1400];
    if (list)
        snprintf(summary, sizeof(summary), "%d dead letter%s in %s, %d replayable", d->matched,
                 d->matched == 1 ? "" : "s", d->dead, d->done);
    else if (show)
        snprintf(summary, sizeof(summary), "%d dead letter%s for key %s in %s", d->matched,
                 d->matched == 1 ? "" : "s", d->sel_key, d->dead);
    else if (strcmp(verb, "replay") == 0)
        snprintf(summary, sizeof(summary), "replayed %d, already replayed (removed) %d, "
                 "refused %d, of %d selected in %s%s", d->done, d->already, d->refused,
                 d->matched, d->dead, d->done > 0 ? "; an outbox relay publishes them" : "");
    else
        snprintf(summary, sizeof(summary), "purged %d of %d selected in %s", d->done,
                 d->matched, d->dead);

    if (d->json) {
        printf("],\"summary\":{\"text\":");
        sk_ctl_put_jstr(stdout, summary);
        printf(",\"scanned\":%d,\"selected\":%d", d->seen, d->matched);
        if (strcmp(verb, "replay") == 0)
            printf(",\"replayed\":%d,\"already_replayed\":%d,\"refused\":%d", d->done,
                   d->already, d->refused);
        else if (strcmp(verb, "purge") == 0)
            printf(",\"purged\":%d", d->done);
        else if (list)
            printf(",\"replayable\":%d", d->done);
        printf("},\"error\":");
        if (rc != SK_OK)
            sk_ctl_put_jstr(stdout, d->err.msg);
        else
            printf("null");
        printf(",\"exit_code\":%d}\n", code);
    } else {
        if (rc == SK_OK || d->matched > 0)
            printf("%s\n", summary);
    }
    if (rc != SK_OK)
        fprintf(stderr, "sekalictl: dlq %s %s: %s\n", verb, d->queue, d->err.msg);
    else if (code == SK_CTL_NOT_FOUND)
        fprintf(stderr, "sekalictl: no dead letter in %s matches\n", d->dead);
    return code;
}

static void json_item(struct dlq *d)
{
    if (!d->first_item)
        printf(",");
    d->first_item = false;
}

static void json_null_or(FILE *f, const char *name, const void *s, size_t len)
{
    fprintf(f, "\"%s\":", name);
    if (s == NULL || len == 0)
        fputs("null", f);
    else
        sk_ctl_put_json(f, s, len);
}

/* One dead letter's summary as a JSON object, left open: show appends its
 * headers and body. */
static void json_letter_fields(FILE *f, const struct letter *l)
{
    fputc('{', f);
    json_null_or(f, "key", l->key.bytes, l->key.len);
    fputc(',', f);
    json_null_or(f, "job_id", l->job_id.bytes, l->job_id.len);
    fputc(',', f);
    json_null_or(f, "job_type", l->job_type.bytes, l->job_type.len);
    fprintf(f, ",\"reason\":");
    sk_ctl_put_jstr(f, l->reason);
    fprintf(f, ",\"recorded_by\":\"%s\",\"from\":", l->source);
    sk_ctl_put_jstr(f, l->origin);
    fprintf(f, ",\"error\":");
    sk_ctl_put_jstr(f, l->error);
    if (l->attempts >= 0)
        fprintf(f, ",\"attempts\":%lld", (long long)l->attempts);
    else
        fprintf(f, ",\"attempts\":null");
    fputc(',', f);
    json_null_or(f, "first_failure", l->first, strlen(l->first));
    fputc(',', f);
    json_null_or(f, "last_failure", l->last, strlen(l->last));
    fprintf(f, ",\"body_size\":%zu,\"replayable\":%s,", l->msg.body.len,
            l->parsed && l->job_type.len > 0 ? "true" : "false");
    json_null_or(f, "malformed", l->parse_error, strlen(l->parse_error));
    fputc(',', f);
    json_null_or(f, "key_status", l->status, strlen(l->status));
    if (l->key_attempts >= 0)
        fprintf(f, ",\"key_attempts\":%ld", l->key_attempts);
    if (l->crashes >= 0)
        fprintf(f, ",\"crashes\":%ld,\"replays\":%ld", l->crashes, l->replays);
}

static void json_letter(FILE *f, const struct letter *l)
{
    json_letter_fields(f, l);
    fputc('}', f);
}
