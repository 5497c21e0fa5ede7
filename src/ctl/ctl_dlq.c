/* ctl_dlq.c - sekalictl dlq: list, show, group, replay and purge the dead
 * letters of a queue, so that nothing sekali records as failed is a dead
 * end.
 *
 *   dlq list   QUEUE [SELECTORS] [--after ID | --offset N] [--limit N] [--json]
 *   dlq groups QUEUE [--json]
 *   dlq show   QUEUE (KEY | --id ID) [--json]
 *   dlq replay QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] [--json]
 *   dlq purge  QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] [--json]
 *   dlq import QUEUE [--dry-run] [--scan-max N] [--json]
 *
 * SELECTORS are --key K (repeatable), --id ID, --reason R and --fingerprint
 * F, all of which a letter must match. The console (console_api.c) runs
 * the same code through sk_ctl_dlq_run() and serves the same JSON.
 *
 * The dead letters are the rows of sekali.dead_letters (sql/023), which the
 * workers write before they ack: every command but import reads and
 * changes only them, never the broker, so reading a letter any number of
 * times leaves it as it was. A replay is one transaction
 * (sekali.dlq_replay_letter: re-arm the key, enqueue the job in the
 * outbox, write the audit row, delete the letter), and the letter's row
 * lock makes a second replay of it find it gone: refused. A purge is one
 * too (sekali.dlq_purge_letter). Selecting and printing letters is
 * ctl_dlq_read.c's; moving the letters a broker's <queue>.dead holds into
 * the table is ctl_dlq_import.c's. */
#include <getopt.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_dlq.h"
#include "ctl_out.h"
#include "pg.h"

#define KEYS_MAX   500  /* --key given at most this often */
#define PAGE       500  /* letters replayed or purged per read */

static bool dlq_options(int argc, char **argv, struct sk_ctl_dlq_req *req);
static void print_head(const struct sk_dlq *d, int rc);
static int act(struct sk_dlq *d, bool replay);
static int act_on(struct sk_dlq *d, const struct sk_dlq_letter *l, bool replay);
static void refuse_replayed_keys(struct sk_dlq *d);
static int finish(struct sk_dlq *d, int rc);
static void summary(const struct sk_dlq *d, char *out, size_t size);

static void dlq_usage(FILE *out)
{
    fprintf(out, "usage: sekalictl dlq list QUEUE [SELECTORS] [--after ID | --offset N] "
                 "[--limit N] [--json]\n"
                 "       sekalictl dlq groups QUEUE [--json]\n"
                 "       sekalictl dlq show QUEUE (KEY | --id ID) [--json]\n"
                 "       sekalictl dlq replay QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] "
                 "[--json]\n"
                 "       sekalictl dlq purge QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] "
                 "[--json]\n"
                 "       sekalictl dlq import QUEUE [--dry-run] [--scan-max N] [--json]\n"
                 "SELECTORS: --key K (repeatable), --id ID, --reason R, --fingerprint F\n");
}

int sk_ctl_dlq(const struct sk_conf *conf, int argc, char **argv)
{
    static const char *keys[KEYS_MAX];
    struct sk_ctl_dlq_req req = { .keys = keys };
    if (!dlq_options(argc, argv, &req)) {
        dlq_usage(stderr);
        return SK_CTL_USAGE;
    }
    /* argv[0] is "dlq"; optind has moved the operands to the end. */
    int left = argc - optind;
    req.command = left >= 1 ? argv[optind] : "";
    req.queue = left >= 2 ? argv[optind + 1] : NULL;
    if (strcmp(req.command, "show") == 0 && left == 3 && req.n_keys == 0) {
        keys[0] = argv[optind + 2];
        req.n_keys = 1;
    }
    if (!sk_ctl_dlq_req_ok(&req, left - 2)) {
        if (strcmp(req.command, "replay") == 0 || strcmp(req.command, "purge") == 0)
            fprintf(stderr, "sekalictl: dlq %s takes QUEUE and --all or selectors "
                            "(--key, --id, --reason, --fingerprint)\n", req.command);
        dlq_usage(stderr);
        return SK_CTL_USAGE;
    }
    return sk_ctl_dlq_run(conf, &req, stdout);
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
        { "id", required_argument, NULL, 'i' }, { "after", required_argument, NULL, 'A' },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    uint64_t v;
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
        case 'o': case 'l': case 's':
            if (!sk_ctl_whole_number(optarg, UINT32_MAX, &v))
                return false;
            *(opt == 'o' ? &req->offset : opt == 'l' ? &req->limit : &req->scan_max) = (size_t)v;
            break;
        case 'i': case 'A':
            if (!sk_ctl_whole_number(optarg, INT64_MAX, &v) || (opt == 'i' && v == 0))
                return false;
            *(opt == 'i' ? &req->id : &req->after) = v;
            break;
        default: return false;
        }
    }
    return true;
}

/* list may select; show names its key as an operand, or --id; groups
 * takes no selector; replay and purge need --all or a selector, so "all"
 * is never implied; import takes the queue alone. operands: how many came
 * after the queue's name. */
bool sk_ctl_dlq_req_ok(const struct sk_ctl_dlq_req *req, int operands)
{
    const char *sub = req->command;
    bool selectors = req->n_keys > 0 || req->reason != NULL || req->fingerprint != NULL ||
                     req->id > 0;
    bool paged = req->offset > 0 || req->limit > 0 || req->after > 0;
    bool plain = !req->all && req->by == NULL && !req->dry_run;
    if (req->queue == NULL || req->queue[0] == '\0' || (req->all && selectors) ||
        (req->offset > 0 && req->after > 0))
        return false;
    if (strcmp(sub, "list") == 0)
        return operands == 0 && plain;
    if (strcmp(sub, "groups") == 0)
        return operands == 0 && !selectors && plain && !paged;
    if (strcmp(sub, "show") == 0)
        return ((operands == 1 && req->n_keys == 1 && req->id == 0) ||
                (operands == 0 && req->n_keys == 0 && req->id > 0)) &&
               req->reason == NULL && req->fingerprint == NULL && plain && !paged;
    if (strcmp(sub, "replay") == 0 || strcmp(sub, "purge") == 0)
        return operands == 0 && (req->all || selectors) && !paged;
    if (strcmp(sub, "import") == 0)
        return operands == 0 && !selectors && !req->all && req->by == NULL && !paged;
    return false;
}

int sk_ctl_dlq_run(const struct sk_conf *conf, const struct sk_ctl_dlq_req *req, FILE *out)
{
    struct sk_dlq d = { .conf = conf, .req = req, .queue = req->queue, .out = out,
                        .json = req->json, .first_item = true };
    const char *sub = req->command;
    struct passwd pw, *found = NULL;
    char pwbuf[1024];
    getpwuid_r(geteuid(), &pw, pwbuf, sizeof(pwbuf), &found);
    snprintf(d.os_user, sizeof(d.os_user), "%s", found != NULL ? found->pw_name : "uid?");
    snprintf(d.actor, sizeof(d.actor), "%s", req->by != NULL ? req->by : d.os_user);
    int rc = sk_broker_dead_name(req->queue, d.dead, sizeof(d.dead), &d.err);
    if (rc == SK_OK && (d.pg = sk_ctl_pg_take(conf)) == NULL)
        rc = sk_err_set(&d.err, SK_AGAIN, "PostgreSQL unreachable: the dead letters are "
                        "kept there (sekali.dead_letters)");
    /* A worker's transaction holds a key's row while its handler runs:
     * a replay waits for it a while, not for ever. */
    if (rc == SK_OK)
        sk_pg_run(d.pg, "SET lock_timeout = '10s'", NULL);
    bool replay = strcmp(sub, "replay") == 0;
    if (rc == SK_OK && replay && !req->dry_run && conf->outbox.relays == 0)
        fprintf(stderr, "sekalictl: note: this configuration runs no outbox relay "
                        "(outbox.relays: 0); replayed jobs wait in sekali.outbox until a "
                        "sekalid with relays runs\n");
    print_head(&d, rc);
    if (rc == SK_OK) {
        if (strcmp(sub, "list") == 0)
            rc = sk_dlq_list(&d);
        else if (strcmp(sub, "show") == 0)
            rc = sk_dlq_show(&d);
        else if (strcmp(sub, "groups") == 0)
            rc = sk_dlq_groups(&d);
        else if (strcmp(sub, "import") == 0)
            rc = sk_dlq_import(&d);
        else
            rc = act(&d, replay);
    }
    int code = finish(&d, rc);
    sk_ctl_pg_give(d.pg);
    free(d.key_seen);
    return code;
}

/* The JSON document's opening, or list's table header. */
static void print_head(const struct sk_dlq *d, int rc)
{
    FILE *out = d->out;
    const char *sub = d->req->command;
    bool writes = strcmp(sub, "replay") == 0 || strcmp(sub, "purge") == 0 ||
                  strcmp(sub, "import") == 0;
    if (d->json) {
        fprintf(out, "{\"queue\":");
        sk_ctl_put_jstr(out, d->queue);
        fprintf(out, ",\"dead_letter_queue\":");
        sk_ctl_put_jstr(out, d->dead);
        fprintf(out, ",\"store\":\"sekali.dead_letters\",\"command\":");
        sk_ctl_put_jstr(out, sub);
        fprintf(out, ",\"dry_run\":%s", d->req->dry_run ? "true" : "false");
        if (strcmp(sub, "groups") != 0)
            fprintf(out, ",\"%s\":[", writes ? "results" : "dead_letters");
    } else if (rc == SK_OK && strcmp(sub, "list") == 0) {
        fprintf(out, "ID | KEY | REASON | ATTEMPTS | KEY STATUS | FIRST FAILURE | LAST FAILURE | "
                "JOB ID | TYPE | ERROR\n");
    }
}

/* replay or purge every selected letter, a page of ids at a time: each
 * letter in a transaction of its own, so one refused or failed letter
 * leaves the others done. */
static int act(struct sk_dlq *d, bool replay)
{
    if (replay && d->req->n_keys > 0 &&
        (d->key_seen = calloc(d->req->n_keys, sizeof(*d->key_seen))) == NULL)
        return sk_err_set(&d->err, SK_ERR, "out of memory");
    struct sk_dlq_where w;
    if (!sk_dlq_where(d, &w))
        return sk_err_set(&d->err, SK_ERR, "out of memory");
    char last[24] = "0", sql[4096];
    w.values[w.n] = last;
    snprintf(sql, sizeof(sql), "%s%s AND d.id > $%d::bigint ORDER BY d.id LIMIT %d",
             sk_dlq_columns, w.sql, w.n + 1, PAGE);
    const struct sk_pg_stmt st = { .sql = sql, .n_params = w.n + 1, .values = w.values,
                                   .what = "selecting dead letters" };
    int rc = SK_OK;
    for (int n = PAGE; rc == SK_OK && n == PAGE;) {
        PGresult *res;
        if ((rc = sk_pg_exec(d->pg, &st, &res, &d->err)) != SK_OK)
            break;
        n = PQntuples(res);
        for (int i = 0; i < n && rc == SK_OK; i++) {
            struct sk_dlq_letter l;
            sk_dlq_letter_of(res, i, &l);
            snprintf(last, sizeof(last), "%s", l.id);
            d->matched++;
            rc = act_on(d, &l, replay);
        }
        PQclear(res);
    }
    sk_dlq_where_free(&w);
    if (rc == SK_OK && replay && d->key_seen != NULL)
        refuse_replayed_keys(d);
    return rc;
}

static const char *refusal(const char *outcome)
{
    return strcmp(outcome, "completed") == 0 ? "completed meanwhile"
         : strcmp(outcome, "gone") == 0 ? "gone" : outcome;
}

static int act_on(struct sk_dlq *d, const struct sk_dlq_letter *l, bool replay)
{
    for (size_t i = 0; d->key_seen != NULL && l->key != NULL && i < d->req->n_keys; i++)
        d->key_seen[i] |= strcmp(d->req->keys[i], l->key) == 0;
    char why[1200];
    if (d->req->dry_run) {
        bool can = !replay || sk_dlq_replayable(l);
        d->done += can;
        d->refused += !can;
        snprintf(why, sizeof(why), "%s", !can ? (l->malformed != NULL ? l->malformed
                 : "its key completed since, or it has no key")
                 : replay ? "would be re-armed and enqueued (dry run)" : "would be removed (dry run)");
        sk_dlq_result(d, l->key, l->job_id, l->reason, can ? (replay ? "would_replay" : "would_purge")
               : "refused", NULL, why);
        return SK_OK;
    }
    const char *values[] = { l->id, d->actor, d->os_user };
    const struct sk_pg_stmt st = {
        .sql = replay ? "SELECT outcome, job_id, detail FROM sekali.dlq_replay_letter($1, $2, $3)"
                      : "SELECT sekali.dlq_purge_letter($1, $2, $3)",
        .n_params = 3, .values = values, .one_row = true,
        .what = replay ? "sekali.dlq_replay_letter" : "sekali.dlq_purge_letter",
    };
    PGresult *res;
    struct sk_err err = { 0 };
    if (sk_pg_exec(d->pg, &st, &res, &err) != SK_OK)
        return sk_err_set(&d->err, SK_ERR, "%s (dead letter %s)", err.msg, l->id);
    const char *outcome = PQgetvalue(res, 0, 0);
    if (!replay) {
        bool purged = strcmp(outcome, "t") == 0;
        d->done += purged;
        d->refused += !purged;
        sk_dlq_result(d, l->key, l->job_id, l->reason, purged ? "purged" : "refused", NULL,
               purged ? "removed; its key stays as it is" : "gone: purged or replayed meanwhile");
    } else if (strcmp(outcome, "replayed") == 0 || strcmp(outcome, "already_replayed") == 0) {
        const char *job_id = PQgetvalue(res, 0, 1);
        bool again = outcome[0] == 'a';
        d->done += !again;
        d->already += again;
        if (again)
            snprintf(why, sizeof(why), "dead letter removed: %s", PQgetvalue(res, 0, 2));
        else
            snprintf(why, sizeof(why), "enqueued as job %s (%s)", job_id, PQgetvalue(res, 0, 2));
        sk_dlq_result(d, l->key, l->job_id, l->reason, outcome, job_id, why);
    } else {
        d->refused++;
        snprintf(why, sizeof(why), "%s: %s", refusal(outcome), PQgetvalue(res, 0, 2));
        sk_dlq_result(d, l->key, l->job_id, l->reason, "refused", NULL, why);
    }
    PQclear(res);
    return SK_OK;
}

/* A --key with no letter left whose latest letter was replayed: refused,
 * saying when and by whom, so that a replay run twice says why the second
 * did nothing. */
static void refuse_replayed_keys(struct sk_dlq *d)
{
    for (size_t i = 0; i < d->req->n_keys; i++) {
        if (d->key_seen[i])
            continue;
        const char *values[] = { d->queue, d->req->keys[i] };
        const struct sk_pg_stmt st = {
            .sql = "SELECT dead_job_id, format('replayed before as job %s by %s at %s', "
                   "new_job_id, actor, at) FROM sekali.dlq_audit WHERE queue = $1 AND key = $2 "
                   "AND action = 'replay' ORDER BY id DESC LIMIT 1",
            .n_params = 2, .values = values, .what = "reading the replay audit",
        };
        PGresult *res;
        if (sk_pg_exec(d->pg, &st, &res, NULL) != SK_OK)
            continue;
        if (PQntuples(res) == 1) {
            d->matched++;
            d->refused++;
            sk_dlq_result(d, d->req->keys[i], PQgetisnull(res, 0, 0) ? NULL : PQgetvalue(res, 0, 0),
                   "-", "refused", NULL, PQgetvalue(res, 0, 1));
        }
        PQclear(res);
    }
}


/* A count, or null when it was not counted (-1). */
static void put_count(FILE *out, long n)
{
    if (n >= 0)
        fprintf(out, "%ld", n);
    else
        fputs("null", out);
}

/* The summary (text, or the end of the JSON document) and the exit code. */
static int finish(struct sk_dlq *d, int rc)
{
    FILE *out = d->out;
    const struct sk_ctl_dlq_req *r = d->req;
    const char *verb = r->command;
    bool list = strcmp(verb, "list") == 0, groups = strcmp(verb, "groups") == 0;
    bool selectors = r->n_keys > 0 || r->reason != NULL || r->fingerprint != NULL || r->id > 0;
    int code = SK_CTL_OK;
    if (rc != SK_OK)
        code = SK_CTL_FAILED;
    else if (d->refused > 0)
        code = SK_CTL_REFUSED;
    else if (d->matched == 0 && (strcmp(verb, "show") == 0 || (selectors && !list)))
        code = SK_CTL_NOT_FOUND;
    char text[1400];
    summary(d, text, sizeof(text));
    if (d->json) {
        fprintf(out, "%s,\"summary\":{\"text\":", groups ? "" : "]");
        sk_ctl_put_jstr(out, text);
        fprintf(out, ",\"depth\":");
        put_count(out, d->depth);
        fprintf(out, ",\"scanned\":");
        put_count(out, d->matched);
        fprintf(out, ",\"selected\":");
        put_count(out, d->matched);
        fprintf(out, ",\"partial\":false");
        if (strcmp(verb, "replay") == 0)
            fprintf(out, ",\"replayed\":%ld,\"already_replayed\":%ld,\"refused\":%ld", d->done,
                    d->already, d->refused);
        else if (strcmp(verb, "purge") == 0)
            fprintf(out, ",\"purged\":%ld,\"refused\":%ld", d->done, d->refused);
        else if (strcmp(verb, "import") == 0)
            fprintf(out, ",\"imported\":%ld,\"refused\":%ld", d->done, d->refused);
        else if (list || groups)
            fprintf(out, ",\"replayable\":%ld", d->done);
        if (list)
            fprintf(out, ",\"offset\":%zu,\"limit\":%zu,\"more\":%s,\"next_after\":%ld", r->offset,
                    r->limit, d->more ? "true" : "false", d->more ? d->last_id : 0);
        fprintf(out, "},\"error\":");
        if (rc != SK_OK)
            sk_ctl_put_jstr(out, d->err.msg);
        else
            fprintf(out, "null");
        fprintf(out, ",\"exit_code\":%d}\n", code);
    } else if (rc == SK_OK || d->matched > 0) {
        fprintf(out, "%s\n", text);
    }
    if (rc != SK_OK)
        fprintf(stderr, "sekalictl: dlq %s %s: %s\n", verb, d->queue, d->err.msg);
    else if (code == SK_CTL_NOT_FOUND)
        fprintf(stderr, "sekalictl: no dead letter of %s matches\n", d->queue);
    return code;
}

static void summary(const struct sk_dlq *d, char *out, size_t size)
{
    const struct sk_ctl_dlq_req *r = d->req;
    const char *verb = r->command, *dry = r->dry_run ? "dry run: would have " : "";
    const char *q = d->queue;
    /* The key as typed may be one pasted from a hostile letter: escaped,
     * as every other value sekalictl prints. */
    char shown_key[1000] = "";
    FILE *m = r->n_keys > 0 ? fmemopen(shown_key, sizeof(shown_key), "w") : NULL;
    if (m != NULL) {
        sk_ctl_put_text(m, r->keys[0], strlen(r->keys[0]), 160);
        fclose(m);
    }
    char of[160] = "";
    if (d->matched >= 0)
        snprintf(of, sizeof(of), " of the %ld selected", d->matched);
    else if (r->after > 0)
        snprintf(of, sizeof(of), " after id %" PRIu64, r->after);
    if (strcmp(verb, "list") == 0 && (r->limit > 0 || r->after > 0 || r->offset > 0))
        snprintf(out, size, "a page of %ld%s dead letters of %s%s, %ld replayable", d->shown, of,
                 q, d->more ? " (more follow)" : "", d->done);
    else if (strcmp(verb, "list") == 0)
        snprintf(out, size, "%ld dead letter%s of %s, %ld replayable", d->matched,
                 d->matched == 1 ? "" : "s", q, d->done);
    else if (strcmp(verb, "groups") == 0)
        snprintf(out, size, "%ld dead letter%s in %ld group%s of %s, %ld replayable",
                 d->depth, d->depth == 1 ? "" : "s", d->groups, d->groups == 1 ? "" : "s", q,
                 d->done);
    else if (strcmp(verb, "show") == 0)
        snprintf(out, size, "%ld dead letter%s for %s in %s", d->matched,
                 d->matched == 1 ? "" : "s", r->id > 0 ? "that id" : shown_key, q);
    else if (strcmp(verb, "replay") == 0)
        snprintf(out, size, "%sreplayed %ld, already replayed (removed) %ld, refused %ld, of "
                 "%ld selected of %s%s", dry, d->done, d->already, d->refused, d->matched, q,
                 d->done > 0 && !r->dry_run ? "; an outbox relay publishes them" : "");
    else if (strcmp(verb, "purge") == 0)
        snprintf(out, size, "%spurged %ld of %ld selected of %s", dry, d->done, d->matched, q);
    else
        snprintf(out, size, "%simported %ld of the %ld letters read from %s, refused %ld", dry,
                 d->done, d->matched, d->dead, d->refused);
}
