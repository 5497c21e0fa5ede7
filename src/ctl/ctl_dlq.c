/* ctl_dlq.c - sekalictl dlq: list, show, replay and purge the dead letters
 * of a queue, so that nothing sekali records as failed is a dead end.
 *
 *   dlq list   QUEUE [SELECTORS] [--offset N] [--limit N] [--json]
 *   dlq groups QUEUE [--json]
 *   dlq show   QUEUE KEY [--json]
 *   dlq replay QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] [--json]
 *   dlq purge  QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] [--json]
 *
 * SELECTORS are --key K (repeatable), --reason R and --fingerprint F, all
 * of which a letter must match. Every command also takes --scan-max N: read
 * at most N letters, so that a queue of a million is looked at in bounded
 * time. The console (console.c) runs the same code through sk_ctl_dlq_run()
 * and serves the same JSON.
 *
 * The dead letters are read from <queue>.dead by a broker scan
 * (sk_broker_scan_*: basic.consume within a prefetch window, no ack): each
 * stays the broker's until we take it (replayed or purged), and the rest
 * go back to where they were when the scan ends, also if we die. One letter
 * is in memory at a time, whatever the queue holds. What
 * PostgreSQL knows of each key is read and changed only through the
 * functions of sql/007_dead_letters.sql.
 *
 * A replay is one transaction (sekali.dlq_replay: re-arm the key, enqueue
 * the job in the outbox, write the audit row), then the ack of the dead
 * letter. Should we die between the two, the dead letter comes back; its
 * next replay finds its audit row and only removes it, and even without
 * that the idempotency key would absorb the second copy. */
#include <ctype.h>
#include <errno.h>
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
#include "ctl_reports.h"
#include "envelope.h"
#include "failpoint.h"
#include "pg.h"

#define TEXT_ERROR_MAX 60   /* longest error shown in list's table */
#define PREVIEW_MAX    256  /* body bytes shown by show */
#define GROUPS_MAX     200  /* distinct groups kept; the rest are counted as "other" */
#define FINGERPRINT_MAX 160 /* bytes of a fingerprint */
#define KEYS_MAX       500  /* --key given at most this often */

/* Dead letters of one reason whose errors differ only in numbers and ids. */
struct group {
    char   reason[64];
    char   fingerprint[FINGERPRINT_MAX];
    long   count, replayable;
    char   first[64], last[64];   /* earliest first and latest last failure seen */
    char   example_key[SK_KEY_MAX + 1];
};

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
    struct sk_broker_scan      *scan;      /* while scan() runs */
    PGconn                     *pg;
    bool                        json;
    FILE                       *out;       /* where the report goes */
    const struct sk_ctl_dlq_req *req;
    char                        actor[256], os_user[256];
    int                         seen, matched, done, already, refused;
    uint32_t                    depth;      /* letters in the queue when the scan began */
    bool                        stop;       /* a visitor has seen enough */
    struct group               *groups;
    size_t                      n_groups;
    long                        other;      /* letters past GROUPS_MAX groups */
    bool                        first_item;  /* JSON: no comma before the next item */
    struct sk_err               err;
};

static int open_dlq(struct dlq *d, const struct sk_conf *conf, const char *queue,
                    bool need_pg);
static void close_dlq(struct dlq *d);
static int scan(struct dlq *d, visit_fn visit);
static uint32_t scan_want(const struct dlq *d);
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
static bool dlq_options(int argc, char **argv, struct sk_ctl_dlq_req *req);
static int visit_groups(struct dlq *d, struct letter *l);
static void print_groups(struct dlq *d);
static void print_head(const struct dlq *d, const char *queue, const char *sub, int rc);
static void show_json(struct dlq *d, const struct letter *l, const amqp_table_t *h,
                      size_t preview);
static void show_text_headers(FILE *out, const amqp_table_t *h);
static void show_text(const struct dlq *d, const struct letter *l, const amqp_table_t *h,
                      size_t preview);

static void dlq_usage(FILE *out)
{
    fprintf(out, "usage: sekalictl dlq list QUEUE [SELECTORS] [--offset N] [--limit N] [--json]\n"
                 "       sekalictl dlq groups QUEUE [--json]\n"
                 "       sekalictl dlq show QUEUE KEY [--json]\n"
                 "       sekalictl dlq replay QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] "
                 "[--json]\n"
                 "       sekalictl dlq purge QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] "
                 "[--json]\n"
                 "SELECTORS: --key K (repeatable), --reason R, --fingerprint F; every command "
                 "takes --scan-max N\n");
}

int sk_ctl_dlq(const struct sk_conf *conf, int argc, char **argv)
{
    static const char *keys[KEYS_MAX];
    struct sk_ctl_dlq_req req = { .keys = keys, .preview = PREVIEW_MAX };
    if (!dlq_options(argc, argv, &req)) {
        dlq_usage(stderr);
        return SK_CTL_USAGE;
    }
    /* argv[0] is "dlq"; optind has moved the operands to the end. */
    int left = argc - optind;
    req.command = left >= 1 ? argv[optind] : "";
    req.queue = left >= 2 ? argv[optind + 1] : NULL;
    if (strcmp(req.command, "show") == 0 && left == 3) {
        keys[0] = argv[optind + 2];
        req.n_keys = 1;
    }
    if (!sk_ctl_dlq_req_ok(&req, left - 2)) {
        if (strcmp(req.command, "replay") == 0 || strcmp(req.command, "purge") == 0)
            fprintf(stderr, "sekalictl: dlq %s takes QUEUE and --all or selectors "
                            "(--key, --reason, --fingerprint)\n", req.command);
        dlq_usage(stderr);
        return SK_CTL_USAGE;
    }
    return sk_ctl_dlq_run(conf, &req, stdout);
}

int sk_ctl_dlq_run(const struct sk_conf *conf, const struct sk_ctl_dlq_req *req, FILE *out)
{
    struct dlq d = { .first_item = true, .req = req, .json = req->json, .out = out };
    const char *sub = req->command;
    bool list = strcmp(sub, "list") == 0, show = strcmp(sub, "show") == 0;
    bool groups = strcmp(sub, "groups") == 0, replay = strcmp(sub, "replay") == 0;
    struct passwd pw, *found = NULL;
    char pwbuf[1024];
    getpwuid_r(geteuid(), &pw, pwbuf, sizeof(pwbuf), &found);
    snprintf(d.os_user, sizeof(d.os_user), "%s", found != NULL ? found->pw_name : "uid?");
    snprintf(d.actor, sizeof(d.actor), "%s", req->by != NULL ? req->by : d.os_user);

    bool writes = !list && !show && !groups && !req->dry_run;
    int rc = open_dlq(&d, conf, req->queue, writes);
    if (rc == SK_OK && replay && writes && conf->outbox.relays == 0)
        fprintf(stderr, "sekalictl: note: this configuration runs no outbox relay "
                        "(outbox.relays: 0); replayed jobs wait in sekali.outbox until a "
                        "sekalid with relays runs\n");
    print_head(&d, req->queue, sub, rc);
    if (rc == SK_OK)
        rc = scan(&d, list ? visit_list : show ? visit_show : groups ? visit_groups
                      : replay ? visit_replay : visit_purge);
    if (groups)
        print_groups(&d);
    int code = finish(&d, rc, sub);
    close_dlq(&d);
    free(d.groups);
    return code;
}

/* false: a usage error. */
static bool dlq_options(int argc, char **argv, struct sk_ctl_dlq_req *req)
{
    static const struct option options[] = {
        { "json", no_argument, NULL, 'j' },  { "key", required_argument, NULL, 'k' },
        { "reason", required_argument, NULL, 'r' }, { "all", no_argument, NULL, 'a' },
        { "by", required_argument, NULL, 'b' }, { "fingerprint", required_argument, NULL, 'f' },
        { "dry-run", no_argument, NULL, 'n' }, { "offset", required_argument, NULL, 'o' },
        { "limit", required_argument, NULL, 'l' }, { "scan-max", required_argument, NULL, 's' },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'j': req->json = true; break;
        case 'k':
            if (req->n_keys == KEYS_MAX)
                return false;
            req->keys[req->n_keys++] = optarg;
            break;
        case 'r': req->reason = optarg; break;
        case 'f': req->fingerprint = optarg; break;
        case 'a': req->all = true; break;
        case 'b': req->by = optarg; break;
        case 'n': req->dry_run = true; break;
        case 'o': case 'l': case 's': {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno != 0 || end == optarg || *end != '\0' || optarg[0] == '-' ||
                v > UINT32_MAX)
                return false;
            *(opt == 'o' ? &req->offset : opt == 'l' ? &req->limit : &req->scan_max) = (size_t)v;
            break;
        }
        default: return false;
        }
    }
    return true;
}

/* list may select; show names its key as an operand; groups takes no
 * selector; replay and purge need --all or a selector, so "all" is never
 * implied. operands: how many came after the queue's name. */
bool sk_ctl_dlq_req_ok(const struct sk_ctl_dlq_req *req, int operands)
{
    const char *sub = req->command;
    bool selectors = req->n_keys > 0 || req->reason != NULL || req->fingerprint != NULL;
    bool paged = req->offset > 0 || req->limit > 0;
    if (req->queue == NULL || req->queue[0] == '\0' || (req->all && selectors))
        return false;
    if (strcmp(sub, "list") == 0)
        return operands == 0 && !req->all && req->by == NULL && !req->dry_run;
    if (strcmp(sub, "groups") == 0)
        return operands == 0 && !selectors && !req->all && req->by == NULL && !req->dry_run &&
               !paged;
    if (strcmp(sub, "show") == 0)
        return operands == 1 && req->n_keys == 1 && req->reason == NULL &&
               req->fingerprint == NULL && !req->all && req->by == NULL && !req->dry_run &&
               !paged;
    if (strcmp(sub, "replay") == 0 || strcmp(sub, "purge") == 0)
        return operands == 0 && (req->all || selectors) && !paged;
    return false;
}

/* The JSON document's opening, or list's table header once the queue is open. */
static void print_head(const struct dlq *d, const char *queue, const char *sub, int rc)
{
    FILE *out = d->out;
    bool writes = strcmp(sub, "replay") == 0 || strcmp(sub, "purge") == 0;
    if (d->json) {
        fprintf(out, "{\"queue\":");
        sk_ctl_put_jstr(out, queue);
        fprintf(out, ",\"dead_letter_queue\":");
        sk_ctl_put_jstr(out, d->dead);
        fprintf(out, ",\"command\":");
        sk_ctl_put_jstr(out, sub);
        fprintf(out, ",\"dry_run\":%s", d->req->dry_run ? "true" : "false");
        if (strcmp(sub, "groups") != 0)
            fprintf(out, ",\"%s\":[", writes ? "results" : "dead_letters");
    } else if (rc == SK_OK && strcmp(sub, "list") == 0) {
        fprintf(out, "KEY | REASON | ATTEMPTS | KEY STATUS | FIRST FAILURE | LAST FAILURE | JOB ID | "
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
    /* scan() ended its scan; should it not have, closing the connection
     * hands every letter back all the same. */
    sk_broker_close(d->broker);
    PQfinish(d->pg);
}

/* Takes each dead letter present when the scan starts, in queue order,
 * decodes it and hands it to visit; one arriving meanwhile is left alone.
 * The scan is ended here, before the report's last line, so that a reader
 * of the answer (the console's next page) finds the letters back. */
static int scan(struct dlq *d, visit_fn visit)
{
    uint32_t depth = 0;
    struct sk_err why = { 0 };
    if (sk_broker_scan_open(d->broker, d->dead, scan_want(d), &d->scan, &depth, &why) != SK_OK)
        return sk_err_set(&d->err, SK_ERR, "cannot read queue %s (does it exist?): %s",
                          d->dead, why.msg);
    d->depth = depth;
    int rc = SK_OK;
    while (!d->stop) {
        struct letter l = { .attempts = -1 };
        rc = sk_broker_scan_next(d->scan, &l.msg, &l.tag, &d->err);
        if (rc == SK_BUSY) {
            rc = SK_OK;
            break;
        }
        if (rc != SK_OK)
            break;
        d->seen++;
        decode(d, &l);
        rc = visit(d, &l);
        amqp_destroy_message(&l.msg);
        if (rc != SK_OK)
            break;
        sk_broker_keepalive(d->broker, NULL);
    }
    /* The broker confirms the end once it has acted on our takes and put
     * the rest back, so what we report as removed is removed. */
    int end = sk_broker_scan_close(d->scan, &why);
    d->scan = NULL;
    if (rc == SK_OK && end != SK_OK)
        return sk_err_set(&d->err, SK_AGAIN, "the broker did not confirm the end of the "
                          "scan (run dlq list to see what is left): %s", why.msg);
    return rc;
}

/* The most letters the command may look at: --scan-max, and for a plain
 * page of list, the page and one more (to tell whether more follow), so
 * that no more letters are sent to us than we read. 0: the whole queue. */
static uint32_t scan_want(const struct dlq *d)
{
    const struct sk_ctl_dlq_req *r = d->req;
    size_t want = r->scan_max;
    bool selectors = r->n_keys > 0 || r->reason != NULL || r->fingerprint != NULL;
    if (strcmp(r->command, "list") == 0 && r->limit > 0 && !selectors &&
        (want == 0 || r->offset + r->limit + 1 < want))
        want = r->offset + r->limit + 1;
    return want > UINT32_MAX ? UINT32_MAX : (uint32_t)want;
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
static bool reason_is(const char *a, const char *b)
{
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        char x = *a == '_' ? ' ' : (char)tolower((unsigned char)*a);
        char y = *b == '_' ? ' ' : (char)tolower((unsigned char)*b);
        if (x != y)
            return false;
    }
    return *a == '\0' && *b == '\0';
}

/* A letter is selected by --all, or when it matches every selector given. */
static bool selected(const struct dlq *d, const struct letter *l)
{
    const struct sk_ctl_dlq_req *r = d->req;
    if (r->all)
        return true;
    if (r->n_keys > 0) {
        bool any = false;
        for (size_t i = 0; i < r->n_keys && !any; i++)
            any = l->key.len == strlen(r->keys[i]) &&
                  memcmp(l->key.bytes, r->keys[i], l->key.len) == 0;
        if (!any)
            return false;
    }
    if (r->reason != NULL && !reason_is(r->reason, l->reason))
        return false;
    if (r->fingerprint != NULL) {
        char fp[FINGERPRINT_MAX];
        sk_ctl_fingerprint(l->parsed ? l->error : l->parse_error, fp, sizeof(fp));
        if (strcmp(fp, r->fingerprint) != 0)
            return false;
    }
    return true;
}

static int visit_list(struct dlq *d, struct letter *l)
{
    FILE *out = d->out;
    const struct sk_ctl_dlq_req *r = d->req;
    if (!selected(d, l))
        return SK_OK;
    /* A page: the letters before it are counted, not looked up. */
    if ((size_t)d->matched < r->offset) {
        d->matched++;
        return SK_OK;
    }
    if (r->limit > 0 && (size_t)d->matched >= r->offset + r->limit) {
        d->stop = true;  /* one past the page: there is more */
        return SK_OK;
    }
    key_state(d, l);
    d->matched++;
    if (l->parsed && l->job_type.len > 0 && strcmp(l->status, "completed") != 0)
        d->done++;  /* replayable */
    if (d->json) {
        json_item(d);
        json_letter(out, l);
        return SK_OK;
    }
    if (l->key.len > 0)
        sk_ctl_put_text(out, l->key.bytes, l->key.len, 24);
    else
        fprintf(out, "(no key)");
    /* Every field that came from the letter is escaped (ctl_out.c). */
    fprintf(out, " | ");
    sk_ctl_put_text(out, l->reason, strlen(l->reason), 0);
    if (l->attempts >= 0)
        fprintf(out, " | %lld | ", (long long)l->attempts);
    else
        fprintf(out, " | ? | ");
    sk_ctl_put_tstr(out, l->status[0] != '\0' ? l->status : "-");
    fprintf(out, " | ");
    sk_ctl_put_tstr(out, l->first[0] != '\0' ? l->first : "-");
    fprintf(out, " | ");
    sk_ctl_put_tstr(out, l->last[0] != '\0' ? l->last : "-");
    fprintf(out, " | ");
    sk_ctl_put_text(out, l->job_id.bytes, l->job_id.len, 36);
    fprintf(out, " | ");
    sk_ctl_put_text(out, l->job_type.bytes, l->job_type.len, 12);
    fprintf(out, " | ");
    sk_ctl_put_text(out, l->parsed ? l->error : l->parse_error,
             strlen(l->parsed ? l->error : l->parse_error), TEXT_ERROR_MAX);
    fprintf(out, "\n");
    return SK_OK;
}

/* Counts the letter into its group: its reason and its error's fingerprint. */
static int visit_groups(struct dlq *d, struct letter *l)
{
    char fp[FINGERPRINT_MAX];
    sk_ctl_fingerprint(l->parsed ? l->error : l->parse_error, fp, sizeof(fp));
    d->matched++;
    bool replayable = l->parsed && l->job_type.len > 0;
    struct group *g = NULL;
    for (size_t i = 0; i < d->n_groups && g == NULL; i++)
        if (strcmp(d->groups[i].reason, l->reason) == 0 &&
            strcmp(d->groups[i].fingerprint, fp) == 0)
            g = &d->groups[i];
    if (g == NULL) {
        if (d->groups == NULL && (d->groups = calloc(GROUPS_MAX, sizeof(*d->groups))) == NULL)
            return sk_err_set(&d->err, SK_ERR, "out of memory");
        if (d->n_groups == GROUPS_MAX) {
            d->other++;
            return SK_OK;
        }
        g = &d->groups[d->n_groups++];
        snprintf(g->reason, sizeof(g->reason), "%s", l->reason);
        snprintf(g->fingerprint, sizeof(g->fingerprint), "%s", fp);
        snprintf(g->example_key, sizeof(g->example_key), "%.*s",
                 (int)(l->key.len < SK_KEY_MAX ? l->key.len : SK_KEY_MAX),
                 (const char *)l->key.bytes);
    }
    g->count++;
    if (replayable)
        g->replayable++;
    d->done += replayable;
    /* ISO 8601 times in UTC compare as text. */
    if (l->first[0] != '\0' && (g->first[0] == '\0' || strcmp(l->first, g->first) < 0))
        snprintf(g->first, sizeof(g->first), "%s", l->first);
    if (l->last[0] != '\0' && strcmp(l->last, g->last) > 0)
        snprintf(g->last, sizeof(g->last), "%s", l->last);
    return SK_OK;
}

static int by_count(const void *a, const void *b)
{
    const struct group *x = a, *y = b;
    return (x->count < y->count) - (x->count > y->count);
}

/* The groups, largest first. */
static void print_groups(struct dlq *d)
{
    FILE *out = d->out;
    if (d->n_groups > 0)
        qsort(d->groups, d->n_groups, sizeof(*d->groups), by_count);
    if (!d->json)
        fprintf(out, "COUNT | REPLAYABLE | REASON | FIRST FAILURE | LAST FAILURE | FINGERPRINT\n");
    else
        fprintf(out, ",\"groups\":[");
    for (size_t i = 0; i < d->n_groups; i++) {
        const struct group *g = &d->groups[i];
        if (!d->json) {
            fprintf(out, "%ld | %ld | ", g->count, g->replayable);
            sk_ctl_put_tstr(out, g->reason);
            fprintf(out, " | %s | %s | ", g->first[0] ? g->first : "-", g->last[0] ? g->last : "-");
            sk_ctl_put_text(out, g->fingerprint, strlen(g->fingerprint), 0);
            fprintf(out, "\n");
            continue;
        }
        fprintf(out, "%s{\"reason\":", i > 0 ? "," : "");
        sk_ctl_put_jstr(out, g->reason);
        fprintf(out, ",\"fingerprint\":");
        sk_ctl_put_jstr(out, g->fingerprint);
        fprintf(out, ",\"count\":%ld,\"replayable\":%ld,", g->count, g->replayable);
        json_null_or(out, "first_failure", g->first, strlen(g->first));
        fputc(',', out);
        json_null_or(out, "last_failure", g->last, strlen(g->last));
        fputc(',', out);
        json_null_or(out, "example_key", g->example_key, strlen(g->example_key));
        fputc('}', out);
    }
    if (d->json)
        fprintf(out, "],\"other\":%ld", d->other);
    else if (d->other > 0)
        fprintf(out, "%ld more in groups past the first %d\n", d->other, GROUPS_MAX);
}

static int visit_show(struct dlq *d, struct letter *l)
{
    if (!selected(d, l))
        return SK_OK;
    key_state(d, l);
    d->matched++;
    const amqp_basic_properties_t *p = &l->msg.properties;
    const amqp_table_t *h = (p->_flags & AMQP_BASIC_HEADERS_FLAG) ? &p->headers : NULL;
    size_t limit = d->req->preview > 0 ? d->req->preview : PREVIEW_MAX;
    size_t preview = l->msg.body.len < limit ? l->msg.body.len : limit;
    if (d->json)
        show_json(d, l, h, preview);
    else
        show_text(d, l, h, preview);
    return SK_OK;
}

static void show_text(const struct dlq *d, const struct letter *l, const amqp_table_t *h,
                      size_t preview)
{
    FILE *out = d->out;
    fprintf(out, "dead letter %d of %s\n  key:            ", d->seen, d->dead);
    sk_ctl_put_text(out, l->key.bytes, l->key.len, 0);
    fprintf(out, "\n  job id:         ");
    sk_ctl_put_text(out, l->job_id.bytes, l->job_id.len, 0);
    fprintf(out, "\n  job type:       ");
    sk_ctl_put_text(out, l->job_type.bytes, l->job_type.len, 0);
    fprintf(out, "\n  reason:         ");
    sk_ctl_put_tstr(out, l->reason);
    fprintf(out, " (recorded by %s)\n  from:           ", l->source);
    sk_ctl_put_tstr(out, l->origin);
    fprintf(out, "\n  error:          ");
    sk_ctl_put_text(out, l->error, strlen(l->error), 0);
    fprintf(out, "\n  attempts:       ");
    if (l->attempts >= 0)
        fprintf(out, "%lld\n", (long long)l->attempts);
    else
        fprintf(out, "?\n");
    fprintf(out, "  first failure:  ");
    sk_ctl_put_tstr(out, l->first[0] ? l->first : "-");
    fprintf(out, "\n  last failure:   ");
    sk_ctl_put_tstr(out, l->last[0] ? l->last : "-");
    fprintf(out, "\n");
    fprintf(out, "  replayable:     %s", l->parsed && l->job_type.len > 0 ? "yes" : "no: ");
    if (!l->parsed)
        sk_ctl_put_text(out, l->parse_error, strlen(l->parse_error), 0);
    else if (l->job_type.len == 0)
        fprintf(out, "no job type (the outbox needs one)");
    fprintf(out, "\n  key in PostgreSQL: ");
    sk_ctl_put_tstr(out, l->status[0] != '\0' ? l->status : "-");
    if (l->key_attempts >= 0)
        fprintf(out, ", %ld attempts", l->key_attempts);
    if (l->crashes > 0)
        fprintf(out, ", %ld crashes", l->crashes);
    if (l->replays > 0)
        fprintf(out, ", replayed %ld times before", l->replays);
    fprintf(out, "\n");
    show_text_headers(out, h);
    fprintf(out, "  body (%zu bytes): ", l->msg.body.len);
    sk_ctl_put_text(out, l->msg.body.bytes, preview, 0);
    fprintf(out, "%s\n", preview < l->msg.body.len ? "..." : "");
}

static void show_json(struct dlq *d, const struct letter *l, const amqp_table_t *h,
                      size_t preview)
{
    FILE *out = d->out;
    json_item(d);
    json_letter_fields(out, l);
    fprintf(out, ",\"headers\":{");
    for (int i = 0; h != NULL && i < h->num_entries; i++) {
        fprintf(out, i > 0 ? "," : "");
        sk_ctl_put_json(out, h->entries[i].key.bytes, h->entries[i].key.len);
        fprintf(out, ":");
        sk_ctl_put_field(out, &h->entries[i].value, true);
    }
    fprintf(out, "},\"body_preview\":");
    sk_ctl_put_json(out, l->msg.body.bytes, preview);
    fprintf(out, "}");
}

static void show_text_headers(FILE *out, const amqp_table_t *h)
{
    fprintf(out, "  headers:\n");
    for (int i = 0; h != NULL && i < h->num_entries; i++) {
        fprintf(out, "    ");
        sk_ctl_put_text(out, h->entries[i].key.bytes, h->entries[i].key.len, 0);
        fprintf(out, " = ");
        sk_ctl_put_field(out, &h->entries[i].value, false);
        fprintf(out, "\n");
    }
}

/* One result line (or JSON object) of replay or purge. */
static void result(struct dlq *d, const struct letter *l, const char *outcome,
                   const char *new_job_id, const char *detail)
{
    FILE *out = d->out;
    if (d->json) {
        json_item(d);
        fprintf(out, "{\"key\":");
        if (l->key.len > 0)
            sk_ctl_put_json(out, l->key.bytes, l->key.len);
        else
            fprintf(out, "null");
        fprintf(out, ",");
        json_null_or(out, "dead_job_id", l->job_id.bytes, l->job_id.len);
        fprintf(out, ",\"reason\":");
        sk_ctl_put_jstr(out, l->reason);
        fprintf(out, ",\"outcome\":");
        sk_ctl_put_jstr(out, outcome);
        fprintf(out, ",");
        json_null_or(out, "new_job_id", new_job_id, new_job_id ? strlen(new_job_id) : 0);
        fprintf(out, ",\"detail\":");
        sk_ctl_put_jstr(out, detail);
        fprintf(out, "}");
        return;
    }
    fprintf(out, "%-17s ", outcome);
    if (l->key.len > 0)
        sk_ctl_put_text(out, l->key.bytes, l->key.len, 0);
    else
        fprintf(out, "(no key)");
    fprintf(out, " [");
    sk_ctl_put_tstr(out, l->reason);
    fprintf(out, "]: ");
    sk_ctl_put_text(out, detail, strlen(detail), 0);
    fprintf(out, "\n");
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
    if (d->req->dry_run) {
        d->done++;
        result(d, l, "would_replay", NULL, "would be re-armed and enqueued (dry run)");
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
        rc = sk_broker_scan_take(d->scan, l->tag, &d->err);
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
    if (d->req->dry_run) {
        d->done++;
        result(d, l, "would_purge", NULL, "would be removed (dry run)");
        return SK_OK;
    }
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
    int rc = sk_broker_scan_take(d->scan, l->tag, &d->err);
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
    FILE *out = d->out;
    const struct sk_ctl_dlq_req *r = d->req;
    bool list = strcmp(verb, "list") == 0, show = strcmp(verb, "show") == 0;
    bool groups = strcmp(verb, "groups") == 0, replay = strcmp(verb, "replay") == 0;
    bool selectors = r->n_keys > 0 || r->reason != NULL || r->fingerprint != NULL;
    int code = SK_CTL_OK;
    if (rc == SK_OK && d->pg == NULL && !groups)
        rc = sk_err_set(&d->err, SK_AGAIN, "PostgreSQL unreachable: the keys' status is "
                        "unknown (\"?\")");
    if (rc != SK_OK)
        code = SK_CTL_FAILED;
    else if (d->refused > 0)
        code = SK_CTL_REFUSED;
    else if (d->matched == 0 && (show || selectors))
        code = SK_CTL_NOT_FOUND;

    /* Read only part of the queue: say so, so no one takes it for all. */
    bool partial = d->stop || (r->scan_max > 0 && d->depth > r->scan_max);
    char summary[1400], scope[200] = "";
    if (partial && !d->stop)
        snprintf(scope, sizeof(scope), " (the first %d of %u letters read)", d->seen, d->depth);
    const char *dry = r->dry_run ? "dry run: would have " : "";
    if (list && r->limit > 0)
        snprintf(summary, sizeof(summary), "dead letters %zu to %zu of %s%s, %d replayable%s",
                 r->offset + 1 < (size_t)d->matched ? r->offset + 1 : (size_t)d->matched,
                 (size_t)d->matched, d->dead, d->stop ? " (more follow)" : "", d->done, scope);
    else if (list)
        snprintf(summary, sizeof(summary), "%d dead letter%s in %s, %d replayable%s", d->matched,
                 d->matched == 1 ? "" : "s", d->dead, d->done, scope);
    else if (groups)
        snprintf(summary, sizeof(summary), "%d dead letter%s in %zu group%s in %s, %d "
                 "replayable%s", d->matched, d->matched == 1 ? "" : "s", d->n_groups,
                 d->n_groups == 1 ? "" : "s", d->dead, d->done, scope);
    else if (show)
        snprintf(summary, sizeof(summary), "%d dead letter%s for key %s in %s", d->matched,
                 d->matched == 1 ? "" : "s", r->keys[0], d->dead);
    else if (replay)
        snprintf(summary, sizeof(summary), "%sreplayed %d, already replayed (removed) %d, "
                 "refused %d, of %d selected in %s%s%s", dry, d->done, d->already, d->refused,
                 d->matched, d->dead, d->done > 0 && !r->dry_run
                 ? "; an outbox relay publishes them" : "", scope);
    else
        snprintf(summary, sizeof(summary), "%spurged %d of %d selected in %s%s", dry, d->done,
                 d->matched, d->dead, scope);

    if (d->json) {
        fprintf(out, "%s,\"summary\":{\"text\":", groups ? "" : "]");
        sk_ctl_put_jstr(out, summary);
        fprintf(out, ",\"depth\":%u,\"scanned\":%d,\"selected\":%d,\"partial\":%s", d->depth,
                d->seen, d->matched, partial ? "true" : "false");
        if (replay)
            fprintf(out, ",\"replayed\":%d,\"already_replayed\":%d,\"refused\":%d", d->done,
                   d->already, d->refused);
        else if (strcmp(verb, "purge") == 0)
            fprintf(out, ",\"purged\":%d", d->done);
        else if (list || groups)
            fprintf(out, ",\"replayable\":%d", d->done);
        if (list)
            fprintf(out, ",\"offset\":%zu,\"limit\":%zu,\"more\":%s", r->offset, r->limit,
                    d->stop ? "true" : "false");
        fprintf(out, "},\"error\":");
        if (rc != SK_OK)
            sk_ctl_put_jstr(out, d->err.msg);
        else
            fprintf(out, "null");
        fprintf(out, ",\"exit_code\":%d}\n", code);
    } else {
        if (rc == SK_OK || d->matched > 0)
            fprintf(out, "%s\n", summary);
    }
    if (rc != SK_OK)
        fprintf(stderr, "sekalictl: dlq %s %s: %s\n", verb, d->queue, d->err.msg);
    else if (code == SK_CTL_NOT_FOUND)
        fprintf(stderr, "sekalictl: no dead letter in %s matches\n", d->dead);
    return code;
}

static void json_item(struct dlq *d)
{
    FILE *out = d->out;
    if (!d->first_item)
        fprintf(out, ",");
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
