/* ctl_dlq_read.c - selecting dead letters from sekali.dead_letters and
 * printing them: dlq list, show and groups, as text or JSON.
 *
 * Reads are plain SELECTs: a letter read any number of times is the same
 * letter afterwards, whatever the broker and its queue types do. A page is
 * a keyset range of ids (--after) or an offset; groups are counted as
 * letters come and go (sql/029), so a million letters cost what their
 * groups cost. */
#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_common.h"
#include "ctl_dlq.h"
#include "ctl_out.h"
#include "pg.h"
#include "text.h"

#define TEXT_ERROR_MAX 60   /* longest error shown in list's table */
#define PREVIEW_MAX    256  /* body bytes shown by show */
#define ISO(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"

const char sk_dlq_columns[] =
    "SELECT d.id, d.key, d.job_id, d.job_type, d.reason, d.error, d.malformed, "
    ISO("coalesce(d.first_failure, d.failed_at)") ", " ISO("d.failed_at") ", "
    "d.recorded_by, d.origin, CASE WHEN d.key IS NOT NULL THEN "
    "coalesce(k.status, sekali.key_status(d.queue, d.key), 'absent') END, "
    "d.fingerprint, d.host, d.worker, d.body_size, d.attempts, k.attempts, "
    "CASE WHEN d.key IS NOT NULL THEN coalesce(c.crashes, 0) END, "
    "(SELECT count(*) FROM sekali.dlq_audit a WHERE a.queue = d.queue AND a.key = d.key "
    "AND a.action = 'replay'), d.body_truncated "
    "FROM sekali.dead_letters d "
    "LEFT JOIN sekali.idempotency_keys k ON k.queue = d.queue AND k.key = d.key "
    "LEFT JOIN sekali.job_crashes c ON c.queue = d.queue AND c.key = d.key ";
enum { C_ID, C_KEY, C_JOB_ID, C_JOB_TYPE, C_REASON, C_ERROR, C_MALFORMED, C_FIRST, C_LAST,
       C_RECORDED_BY, C_ORIGIN, C_STATUS, C_FINGERPRINT, C_HOST, C_WORKER, C_BODY_SIZE,
       C_ATTEMPTS, C_KEY_ATTEMPTS, C_CRASHES, C_REPLAYS, C_TRUNCATED, C_N };

static const char *text(PGresult *res, int row, int col);
static const char *str_at(const void *items, size_t i);
static long number(PGresult *res, int row, int col);
static void json_letter(FILE *f, const struct sk_dlq_letter *l);
static void text_row(FILE *out, const struct sk_dlq_letter *l);
static void show_text(struct sk_dlq *d, const struct sk_dlq_letter *l, const char *headers,
                      const unsigned char *body, size_t preview);
static void put_jsonb(FILE *out, const char *s);
static int count_letters(struct sk_dlq *d, const struct sk_dlq_where *w);

void sk_dlq_letter_of(PGresult *res, int row, struct sk_dlq_letter *l)
{
    *l = (struct sk_dlq_letter){
        .id = text(res, row, C_ID), .key = text(res, row, C_KEY),
        .job_id = text(res, row, C_JOB_ID), .job_type = text(res, row, C_JOB_TYPE),
        .reason = text(res, row, C_REASON), .error = text(res, row, C_ERROR),
        .malformed = text(res, row, C_MALFORMED), .first = text(res, row, C_FIRST),
        .last = text(res, row, C_LAST), .recorded_by = text(res, row, C_RECORDED_BY),
        .origin = text(res, row, C_ORIGIN), .status = text(res, row, C_STATUS),
        .fingerprint = text(res, row, C_FINGERPRINT), .host = text(res, row, C_HOST),
        .worker = text(res, row, C_WORKER), .body_size = number(res, row, C_BODY_SIZE),
        .attempts = number(res, row, C_ATTEMPTS), .key_attempts = number(res, row, C_KEY_ATTEMPTS),
        .crashes = number(res, row, C_CRASHES), .replays = number(res, row, C_REPLAYS),
        .truncated = strcmp(PQgetvalue(res, row, C_TRUNCATED), "t") == 0,
    };
}

/* Replayable: valid, and its key not completed since. */
bool sk_dlq_replayable(const struct sk_dlq_letter *l)
{
    return l->malformed == NULL && l->key != NULL &&
           (l->status == NULL || strcmp(l->status, "completed") != 0);
}

static const char *text(PGresult *res, int row, int col)
{
    return PQgetisnull(res, row, col) ? NULL : PQgetvalue(res, row, col);
}

static const char *str_at(const void *items, size_t i)
{
    return ((const char *const *)items)[i];
}

static long number(PGresult *res, int row, int col)
{
    return PQgetisnull(res, row, col) ? -1 : atol(PQgetvalue(res, row, col));
}

/* --reason as sekali writes reasons: lower case, "_" for " ". */
bool sk_dlq_where(const struct sk_dlq *d, struct sk_dlq_where *w)
{
    const struct sk_ctl_dlq_req *r = d->req;
    memset(w, 0, sizeof(*w));
    w->values[w->n++] = d->queue;
    size_t len = (size_t)snprintf(w->sql, sizeof(w->sql), "WHERE d.queue = $1");
    if (r->n_keys > 0) {
        w->keys = sk_pg_text_array(r->n_keys, str_at, r->keys);
        if (w->keys == NULL)
            return false;
        w->values[w->n++] = w->keys;
        len += (size_t)snprintf(w->sql + len, sizeof(w->sql) - len,
                                " AND d.key = ANY($%d::text[])", w->n);
    }
    if (r->reason != NULL) {
        size_t i = 0;
        for (; r->reason[i] != '\0' && i + 1 < sizeof(w->reason); i++)
            w->reason[i] = r->reason[i] == ' ' ? '_' : (char)tolower((unsigned char)r->reason[i]);
        w->reason[i] = '\0';
        w->values[w->n++] = w->reason;
        len += (size_t)snprintf(w->sql + len, sizeof(w->sql) - len, " AND d.reason = $%d", w->n);
    }
    if (r->fingerprint != NULL) {
        w->values[w->n++] = r->fingerprint;
        len += (size_t)snprintf(w->sql + len, sizeof(w->sql) - len, " AND d.fingerprint = $%d",
                                w->n);
    }
    if (r->id > 0)
        snprintf(w->sql + len, sizeof(w->sql) - len, " AND d.id = %" PRIu64, r->id);
    return true;
}

void sk_dlq_where_free(struct sk_dlq_where *w)
{
    free(w->keys);
    w->keys = NULL;
}

/* The selected letters' number, into d->matched, and without selectors the
 * queue's, d->depth (else -1: one count of a million rows is enough). One
 * index-only scan: a page of a million letters costs one count. */
static int count_letters(struct sk_dlq *d, const struct sk_dlq_where *w)
{
    char sql[700];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM sekali.dead_letters d %s", w->sql);
    const struct sk_pg_stmt st = { .sql = sql, .n_params = w->n, .values = w->values,
                                   .one_row = true, .what = "counting dead letters" };
    PGresult *res;
    int rc = sk_pg_exec(d->pg, &st, &res, &d->err);
    if (rc != SK_OK)
        return rc;
    d->matched = atol(PQgetvalue(res, 0, 0));
    d->depth = w->n == 1 && d->req->id == 0 ? d->matched : -1;
    PQclear(res);
    return SK_OK;
}

/* A page is chosen among the ids alone (the (queue, id) index: an offset
 * skips index entries, not rows and their joins), then read whole. A page
 * is not counted, which would cost a scan of every selected letter: "more"
 * says what follows, and groups give the totals. */
int sk_dlq_list(struct sk_dlq *d)
{
    const struct sk_ctl_dlq_req *r = d->req;
    struct sk_dlq_where w;
    if (!sk_dlq_where(d, &w))
        return sk_err_set(&d->err, SK_ERR, "out of memory");
    int rc = SK_OK;
    if (r->limit > 0)
        d->matched = d->depth = -1;
    else
        rc = count_letters(d, &w);
    char sql[4096], limit[32] = "", after[40] = "";
    if (r->limit > 0)
        snprintf(limit, sizeof(limit), " LIMIT %zu", r->limit + 1);
    if (r->after > 0)
        snprintf(after, sizeof(after), " AND d.id > %" PRIu64, r->after);
    snprintf(sql, sizeof(sql), "WITH page AS (SELECT d.id FROM sekali.dead_letters d %s%s "
             "ORDER BY d.id%s OFFSET %zu) %sWHERE d.id IN (SELECT id FROM page) ORDER BY d.id",
             w.sql, after, limit, r->offset, sk_dlq_columns);
    const struct sk_pg_stmt st = { .sql = sql, .n_params = w.n, .values = w.values,
                                   .what = "listing dead letters" };
    PGresult *res = NULL;
    if (rc == SK_OK)
        rc = sk_pg_exec(d->pg, &st, &res, &d->err);
    sk_dlq_where_free(&w);
    if (rc != SK_OK)
        return rc;
    int n = PQntuples(res);
    d->more = r->limit > 0 && (size_t)n > r->limit;
    if (d->more)
        n = (int)r->limit;
    d->shown = n;
    for (int i = 0; i < n; i++) {
        struct sk_dlq_letter l;
        sk_dlq_letter_of(res, i, &l);
        d->done += sk_dlq_replayable(&l);
        d->last_id = atol(l.id);  /* where the next page starts (--after) */
        if (d->json) {
            sk_dlq_json_item(d);
            json_letter(d->out, &l);
        } else {
            text_row(d->out, &l);
        }
    }
    PQclear(res);
    return SK_OK;
}

static void text_row(FILE *out, const struct sk_dlq_letter *l)
{
    fprintf(out, "%s | ", l->id);
    if (l->key != NULL)
        sk_ctl_put_text(out, l->key, strlen(l->key), 24);
    else
        fprintf(out, "(no key)");
    /* Every field that came from a message is escaped (ctl_out.c). */
    fprintf(out, " | ");
    sk_ctl_put_tstr(out, l->reason);
    if (l->attempts >= 0)
        fprintf(out, " | %ld | ", l->attempts);
    else
        fprintf(out, " | ? | ");
    sk_ctl_put_tstr(out, l->status != NULL ? l->status : "-");
    fprintf(out, " | %s | %s | ", l->first != NULL ? l->first : "-", l->last);
    sk_ctl_put_text(out, l->job_id != NULL ? l->job_id : "", l->job_id ? strlen(l->job_id) : 0, 36);
    fprintf(out, " | ");
    sk_ctl_put_text(out, l->job_type != NULL ? l->job_type : "",
                    l->job_type ? strlen(l->job_type) : 0, 12);
    fprintf(out, " | ");
    sk_ctl_put_text(out, l->error, strlen(l->error), TEXT_ERROR_MAX);
    fprintf(out, "\n");
}

void sk_dlq_json_item(struct sk_dlq *d)
{
    if (!d->first_item)
        fputc(',', d->out);
    d->first_item = false;
}

void sk_dlq_json_null_or(FILE *f, const char *name, const char *s)
{
    fprintf(f, "\"%s\":", name);
    if (s == NULL)
        fputs("null", f);
    else
        sk_ctl_put_jstr(f, s);
}

static void json_number(FILE *f, const char *name, long v)
{
    if (v >= 0)
        fprintf(f, ",\"%s\":%ld", name, v);
    else
        fprintf(f, ",\"%s\":null", name);
}

/* One letter as a JSON object, left open: show appends headers and body. */
static void json_fields(FILE *f, const struct sk_dlq_letter *l)
{
    fprintf(f, "{\"id\":%s,", l->id);
    sk_dlq_json_null_or(f, "key", l->key);
    fputc(',', f);
    sk_dlq_json_null_or(f, "job_id", l->job_id);
    fputc(',', f);
    sk_dlq_json_null_or(f, "job_type", l->job_type);
    fprintf(f, ",\"reason\":");
    sk_ctl_put_jstr(f, l->reason);
    fprintf(f, ",\"recorded_by\":\"%s\",", l->recorded_by);
    sk_dlq_json_null_or(f, "from", l->origin);
    fprintf(f, ",\"error\":");
    sk_ctl_put_jstr(f, l->error);
    json_number(f, "attempts", l->attempts);
    fputc(',', f);
    sk_dlq_json_null_or(f, "first_failure", l->first);
    fputc(',', f);
    sk_dlq_json_null_or(f, "last_failure", l->last);
    fprintf(f, ",\"body_size\":%ld,\"body_truncated\":%s,\"replayable\":%s,", l->body_size,
            l->truncated ? "true" : "false", sk_dlq_replayable(l) ? "true" : "false");
    sk_dlq_json_null_or(f, "malformed", l->malformed);
    fputc(',', f);
    sk_dlq_json_null_or(f, "key_status", l->status);
    json_number(f, "key_attempts", l->key_attempts);
    json_number(f, "crashes", l->crashes);
    json_number(f, "replays", l->replays);
    fputc(',', f);
    sk_dlq_json_null_or(f, "fingerprint", l->fingerprint);
    fputc(',', f);
    sk_dlq_json_null_or(f, "host", l->host);
    fputc(',', f);
    sk_dlq_json_null_or(f, "worker", l->worker);
}

static void json_letter(FILE *f, const struct sk_dlq_letter *l)
{
    json_fields(f, l);
    fputc('}', f);
}

/* show: the letters of one key (or --id), with headers and a body preview. */
int sk_dlq_show(struct sk_dlq *d)
{
    size_t limit = d->req->preview > 0 ? d->req->preview : PREVIEW_MAX;
    struct sk_dlq_where w;
    if (!sk_dlq_where(d, &w))
        return sk_err_set(&d->err, SK_ERR, "out of memory");
    char sql[4096];
    snprintf(sql, sizeof(sql), "SELECT l.*, d.headers::text, substring(d.body FROM 1 FOR %zu) "
             "FROM (%s%s) l JOIN sekali.dead_letters d ON d.id = l.id ORDER BY l.id",
             limit, sk_dlq_columns, w.sql);
    const struct sk_pg_stmt st = { .sql = sql, .n_params = w.n, .values = w.values,
                                   .what = "reading a dead letter" };
    PGresult *res;
    int rc = sk_pg_exec(d->pg, &st, &res, &d->err);
    sk_dlq_where_free(&w);
    if (rc != SK_OK)
        return rc;
    for (int i = 0; i < PQntuples(res); i++) {
        struct sk_dlq_letter l;
        sk_dlq_letter_of(res, i, &l);
        d->matched++;
        size_t preview = 0;
        unsigned char *body = PQunescapeBytea((const unsigned char *)PQgetvalue(res, i, C_N + 1),
                                              &preview);
        const char *headers = PQgetvalue(res, i, C_N);
        if (d->json) {
            sk_dlq_json_item(d);
            json_fields(d->out, &l);
            fprintf(d->out, ",\"headers\":");
            put_jsonb(d->out, headers);
            fprintf(d->out, ",\"body_preview\":");
            sk_ctl_put_json(d->out, body != NULL ? body : (const unsigned char *)"", preview);
            fputc('}', d->out);
        } else {
            show_text(d, &l, headers, body, preview);
        }
        PQfreemem(body);
    }
    PQclear(res);
    return SK_OK;
}

/* jsonb's own text: valid JSON whatever the message held, but with the
 * characters JSON allows raw and a terminal must not get (C1 controls,
 * bidi controls, line separators) as \u escapes, as sk_ctl_put_json()
 * writes them. They occur only inside strings, where an escape is valid. */
static void put_jsonb(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p != '\0') {
        size_t n = *p < 0x80 ? 1 : sk_ctl_utf8_len(p, strlen((const char *)p));
        if (n < 2) {
            fputc(*p++, out);
            continue;
        }
        uint32_t cp = sk_text_disguising(p, n);
        if (cp != 0)
            fprintf(out, "\\u%04x", (unsigned)cp);
        else
            fwrite(p, 1, n, out);
        p += n;
    }
}

static void show_field(FILE *out, const char *name, const char *value)
{
    fprintf(out, "  %-16s", name);
    sk_ctl_put_tstr(out, value != NULL ? value : "-");
    fputc('\n', out);
}

static void show_text(struct sk_dlq *d, const struct sk_dlq_letter *l, const char *headers,
                      const unsigned char *body, size_t preview)
{
    FILE *out = d->out;
    fprintf(out, "dead letter %s of queue ", l->id);
    sk_ctl_put_tstr(out, d->queue);
    fputc('\n', out);
    show_field(out, "key:", l->key);
    show_field(out, "job id:", l->job_id);
    show_field(out, "job type:", l->job_type);
    show_field(out, "reason:", l->reason);
    show_field(out, "recorded by:", l->recorded_by);
    show_field(out, "from:", l->origin);
    show_field(out, "error:", l->error);
    fprintf(out, "  %-16s", "attempts:");
    fprintf(out, l->attempts >= 0 ? "%ld\n" : "?\n", l->attempts);
    show_field(out, "first failure:", l->first);
    show_field(out, "last failure:", l->last);
    show_field(out, "host:", l->host);
    show_field(out, "worker:", l->worker);
    fprintf(out, "  %-16s%s", "replayable:", sk_dlq_replayable(l) ? "yes" : "no: ");
    if (!sk_dlq_replayable(l))
        sk_ctl_put_tstr(out, l->malformed != NULL ? l->malformed : l->key == NULL
                        ? "it has no key" : "its key completed since");
    fprintf(out, "\n  key in PostgreSQL: ");
    sk_ctl_put_tstr(out, l->status != NULL ? l->status : "-");
    if (l->key_attempts >= 0)
        fprintf(out, ", %ld attempts", l->key_attempts);
    if (l->crashes > 0)
        fprintf(out, ", %ld crashes", l->crashes);
    if (l->replays > 0)
        fprintf(out, ", replayed %ld times before", l->replays);
    fprintf(out, "\n  headers:        ");
    sk_ctl_put_tstr(out, headers);
    fprintf(out, "\n  body (%ld bytes%s): ", l->body_size, l->truncated ? ", kept in part" : "");
    sk_ctl_put_text(out, body, preview, 0);
    fprintf(out, "%s\n", (long)preview < l->body_size ? "..." : "");
}

/* groups: counted by PostgreSQL, largest first; past SK_DLQ_GROUPS_MAX
 * groups, the rest are counted as "other". */
int sk_dlq_groups(struct sk_dlq *d)
{
    char sql[600];
    /* sekali.dlq_groups() (sql/029): the groups' counts are kept as letters
     * come and go, and each group shown costs two index probes, so a
     * million letters cost what a few hundred groups cost. */
    snprintf(sql, sizeof(sql),
             "SELECT reason, fingerprint, letters, replayable, " ISO("first_failure") ", "
             ISO("last_failure") ", example_key, total FROM sekali.dlq_groups($1, %d) "
             "ORDER BY letters DESC, reason, fingerprint",
             SK_DLQ_GROUPS_MAX);
    const char *values[] = { d->queue };
    const struct sk_pg_stmt st = { .sql = sql, .n_params = 1, .values = values,
                                   .what = "grouping dead letters" };
    PGresult *res;
    int rc = sk_pg_exec(d->pg, &st, &res, &d->err);
    if (rc != SK_OK)
        return rc;
    FILE *out = d->out;
    fprintf(out, d->json ? ",\"groups\":[" : "COUNT | REPLAYABLE | REASON | FIRST FAILURE | "
            "LAST FAILURE | FINGERPRINT\n");
    int n = PQntuples(res);
    for (int i = 0; i < n; i++) {
        long count = atol(PQgetvalue(res, i, 2)), replayable = atol(PQgetvalue(res, i, 3));
        d->matched += count;
        d->done += replayable;
        d->depth = atol(PQgetvalue(res, i, 7));
        if (!d->json) {
            fprintf(out, "%ld | %ld | ", count, replayable);
            sk_ctl_put_tstr(out, PQgetvalue(res, i, 0));
            fprintf(out, " | %s | %s | ", PQgetvalue(res, i, 4), PQgetvalue(res, i, 5));
            sk_ctl_put_tstr(out, PQgetvalue(res, i, 1));
            fputc('\n', out);
            continue;
        }
        fprintf(out, "%s{\"reason\":", i > 0 ? "," : "");
        sk_ctl_put_jstr(out, PQgetvalue(res, i, 0));
        fprintf(out, ",\"fingerprint\":");
        sk_ctl_put_jstr(out, PQgetvalue(res, i, 1));
        fprintf(out, ",\"count\":%ld,\"replayable\":%ld,\"first_failure\":\"%s\","
                "\"last_failure\":\"%s\",", count, replayable, PQgetvalue(res, i, 4),
                PQgetvalue(res, i, 5));
        sk_dlq_json_null_or(out, "example_key", text(res, i, 6));
        fputc('}', out);
    }
    d->groups = n;
    d->other = d->depth - d->matched;
    if (d->json)
        fprintf(out, "],\"other\":%ld", d->other);
    else if (d->other > 0)
        fprintf(out, "%ld more in groups past the first %d\n", d->other, SK_DLQ_GROUPS_MAX);
    PQclear(res);
    return SK_OK;
}

/* One result line (or JSON object) of replay, purge or import. */
void sk_dlq_result(struct sk_dlq *d, const char *key, const char *id, const char *reason,
                   const char *outcome, const char *new_job_id, const char *detail)
{
    FILE *out = d->out;
    if (d->json) {
        sk_dlq_json_item(d);
        fputc('{', out);
        sk_dlq_json_null_or(out, "key", key);
        fputc(',', out);
        sk_dlq_json_null_or(out, "dead_job_id", id);
        fprintf(out, ",\"reason\":");
        sk_ctl_put_jstr(out, reason);
        fprintf(out, ",\"outcome\":");
        sk_ctl_put_jstr(out, outcome);
        fputc(',', out);
        sk_dlq_json_null_or(out, "new_job_id", new_job_id);
        fprintf(out, ",\"detail\":");
        sk_ctl_put_jstr(out, detail);
        fputc('}', out);
        return;
    }
    fprintf(out, "%-17s ", outcome);
    sk_ctl_put_tstr(out, key != NULL ? key : "(no key)");
    fprintf(out, " [");
    sk_ctl_put_tstr(out, reason);
    fprintf(out, "]: ");
    sk_ctl_put_tstr(out, detail);
    fprintf(out, "\n");
}
