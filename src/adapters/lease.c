/* lease.c - claim, renew, checkpoint and finish under a lease and a fence
 * (see lease.h). Unprepared statements: external jobs wait on the outside
 * world, and a parse per call costs nothing next to that. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "text.h"

static int run(PGconn *pg, const struct sk_pg_stmt *st, PGresult **res, struct sk_err *err);
static int answer(PGconn *pg, const struct sk_pg_stmt *st, struct sk_err *err);
static int boolean_result(PGconn *pg, const char *sql, int n, const char *const *values,
                          struct sk_err *err);

int sk_lease_claim(PGconn *pg, const struct sk_keyref *ref, uint32_t lease_ms,
                   struct sk_claim *out, struct sk_err *err)
{
    char lease[16];
    snprintf(lease, sizeof(lease), "%u", lease_ms);
    const char *values[] = { ref->queue, ref->key, ref->owner, ref->job_id, ref->job_type,
                             lease };
    const struct sk_pg_stmt st = {
        .sql = "SELECT * FROM sekali.claim_lease($1, $2, $3, $4, $5, $6)", .n_params = 6,
        .values = values, .one_row = true, .what = "sekali.claim_lease",
    };
    PGresult *res;
    int rc = run(pg, &st, &res, err);
    if (rc != SK_OK)
        return rc;
    const char *status = PQgetvalue(res, 0, 0);
    out->fence = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
    out->attempts = atoi(PQgetvalue(res, 0, 2));
    out->cancelled = strcmp(status, "cancelled") == 0;
    rc = strcmp(status, "processing") == 0 ? SK_OK
       : strcmp(status, "busy") == 0       ? SK_BUSY
                                           : SK_DUP;
    PQclear(res);
    return rc;
}

int sk_lease_renew(PGconn *pg, const struct sk_keyref *ref, uint32_t lease_ms,
                   struct sk_err *err)
{
    char lease[16];
    snprintf(lease, sizeof(lease), "%u", lease_ms);
    const char *values[] = { ref->queue, ref->key, ref->fence_text, lease };
    return boolean_result(pg, "SELECT sekali.renew_lease($1, $2, $3, $4)", 4, values, err);
}

int sk_lease_finish(PGconn *pg, const struct sk_keyref *ref, const char *status,
                    const void *result, size_t result_len, const char *error,
                    struct sk_err *err)
{
    char text[SK_TEXT_ERROR_MAX];
    if (error != NULL)
        sk_text_copy(text, sizeof(text), error);
    const char *values[] = { ref->queue, ref->key, ref->fence_text, status, result,
                             error != NULL ? text : NULL };
    const int lengths[] = { 0, 0, 0, 0, (int)result_len, 0 };
    const int formats[] = { 0, 0, 0, 0, 1, 0 };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.finish_lease($1, $2, $3, $4, $5, $6)", .n_params = 6,
        .values = values, .lengths = lengths, .formats = formats, .one_row = true,
        .what = "sekali.finish_lease",
    };
    return answer(pg, &st, err);
}

int sk_lease_release(PGconn *pg, const struct sk_keyref *ref, struct sk_err *err)
{
    const char *values[] = { ref->queue, ref->key, ref->fence_text };
    return boolean_result(pg, "SELECT sekali.release_lease($1, $2, $3)", 3, values, err);
}

int sk_lease_save_checkpoint(PGconn *pg, const struct sk_keyref *ref, const char *name,
                             const char *value, struct sk_err *err)
{
    const char *values[] = { ref->queue, ref->key, ref->fence_text, name, value };
    return boolean_result(pg, "SELECT sekali.save_checkpoint($1, $2, $3, $4, $5)", 5, values,
                          err);
}

int sk_lease_load_checkpoints(PGconn *pg, const struct sk_keyref *ref,
                              struct sk_checkpoints *out, struct sk_err *err)
{
    sk_lease_checkpoints_clear(out);
    const char *values[] = { ref->queue, ref->key };
    const struct sk_pg_stmt st = {
        .sql = "SELECT name, value FROM sekali.checkpoints "
               "WHERE queue = $1 AND key = $2 ORDER BY created_at LIMIT 32",
        .n_params = 2, .values = values, .what = "checkpoints",
    };
    PGresult *res;
    int rc = run(pg, &st, &res, err);
    if (rc != SK_OK)
        return rc;
    for (int i = 0; i < PQntuples(res) && out->n < SK_CHECKPOINTS_MAX; i++) {
        struct sk_checkpoint *c = &out->items[out->n];
        c->name = strdup(PQgetvalue(res, i, 0));
        c->value = strdup(PQgetvalue(res, i, 1));
        if (c->name == NULL || c->value == NULL) {
            free(c->name);
            free(c->value);
            PQclear(res);
            return sk_err_errno(err, SK_ERR, "strdup(checkpoint)");
        }
        out->n++;
    }
    PQclear(res);
    return SK_OK;
}

void sk_lease_checkpoints_clear(struct sk_checkpoints *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->items[i].name);
        free(c->items[i].value);
    }
    c->n = 0;
}

/* sk_pg_exec(), with SK_BUSY kept for "not ours": a statement that waited
 * past lock_timeout is an error here, not a fence. */
static int run(PGconn *pg, const struct sk_pg_stmt *st, PGresult **res, struct sk_err *err)
{
    int rc = sk_pg_exec(pg, st, res, err);
    return rc == SK_BUSY ? SK_ERR : rc;
}

static int boolean_result(PGconn *pg, const char *sql, int n, const char *const *values,
                          struct sk_err *err)
{
    const struct sk_pg_stmt st = { .sql = sql, .n_params = n, .values = values,
                                   .one_row = true };
    return answer(pg, &st, err);
}

/* A lease function answers true when the fence was still ours: SK_OK, else
 * SK_BUSY. */
static int answer(PGconn *pg, const struct sk_pg_stmt *st, struct sk_err *err)
{
    PGresult *res;
    int rc = run(pg, st, &res, err);
    if (rc != SK_OK)
        return rc;
    rc = strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? SK_OK : SK_BUSY;
    PQclear(res);
    return rc;
}
