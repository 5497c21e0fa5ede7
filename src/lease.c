/* lease.c - claim, renew, checkpoint and finish under a lease and a fence
 * (see lease.h). Unprepared statements: external jobs wait on the outside
 * world, and a parse per call costs nothing next to that. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"

static PGresult *run(PGconn *pg, const char *sql, int n, const char *const *values,
                     const int *lengths, const int *formats, bool one_row, int *rc,
                     struct sk_err *err);
static int boolean_result(PGconn *pg, const char *sql, int n, const char *const *values,
                          struct sk_err *err);

int sk_lease_claim(PGconn *pg, const char *queue, const char *key, const char *owner,
                   const char *job_id, const char *job_type, uint32_t lease_ms,
                   struct sk_claim *out, struct sk_err *err)
{
    char lease[16];
    snprintf(lease, sizeof(lease), "%u", lease_ms);
    const char *values[] = { queue, key, owner, job_id, job_type, lease };
    int rc;
    PGresult *res = run(pg, "SELECT * FROM sekali.claim_lease($1, $2, $3, $4, $5, $6)", 6,
                        values, NULL, NULL, true, &rc, err);
    if (res == NULL)
        return rc;
    const char *status = PQgetvalue(res, 0, 0);
    out->fence = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
    out->attempts = atoi(PQgetvalue(res, 0, 2));
    rc = strcmp(status, "processing") == 0 ? SK_OK
       : strcmp(status, "busy") == 0       ? SK_BUSY
                                           : SK_DUP;
    PQclear(res);
    return rc;
}

int sk_lease_renew(PGconn *pg, const char *queue, const char *key, int64_t fence,
                   uint32_t lease_ms, struct sk_err *err)
{
    char fence_text[24], lease[16];
    snprintf(fence_text, sizeof(fence_text), "%lld", (long long)fence);
    snprintf(lease, sizeof(lease), "%u", lease_ms);
    const char *values[] = { queue, key, fence_text, lease };
    return boolean_result(pg, "SELECT sekali.renew_lease($1, $2, $3, $4)", 4, values, err);
}

int sk_lease_finish(PGconn *pg, const char *queue, const char *key, int64_t fence,
                    const char *status, const void *result, size_t result_len,
                    const char *error, struct sk_err *err)
{
    char fence_text[24];
    snprintf(fence_text, sizeof(fence_text), "%lld", (long long)fence);
    const char *values[] = { queue, key, fence_text, status, result, error };
    const int lengths[] = { 0, 0, 0, 0, (int)result_len, 0 };
    const int formats[] = { 0, 0, 0, 0, 1, 0 };
    int rc;
    PGresult *res = run(pg, "SELECT sekali.finish_lease($1, $2, $3, $4, $5, $6)", 6, values,
                        lengths, formats, true, &rc, err);
    if (res == NULL)
        return rc;
    rc = strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? SK_OK : SK_BUSY;
    PQclear(res);
    return rc;
}

int sk_lease_release(PGconn *pg, const char *queue, const char *key, int64_t fence,
                     struct sk_err *err)
{
    char fence_text[24];
    snprintf(fence_text, sizeof(fence_text), "%lld", (long long)fence);
    const char *values[] = { queue, key, fence_text };
    return boolean_result(pg, "SELECT sekali.release_lease($1, $2, $3)", 3, values, err);
}

int sk_lease_save_checkpoint(PGconn *pg, const char *queue, const char *key, int64_t fence,
                             const char *name, const char *value, struct sk_err *err)
{
    char fence_text[24];
    snprintf(fence_text, sizeof(fence_text), "%lld", (long long)fence);
    const char *values[] = { queue, key, fence_text, name, value };
    return boolean_result(pg, "SELECT sekali.save_checkpoint($1, $2, $3, $4, $5)", 5, values,
                          err);
}

int sk_lease_load_checkpoints(PGconn *pg, const char *queue, const char *key,
                              struct sk_checkpoints *out, struct sk_err *err)
{
    sk_lease_checkpoints_clear(out);
    const char *values[] = { queue, key };
    int rc;
    PGresult *res = run(pg, "SELECT name, value FROM sekali.checkpoints "
                            "WHERE queue = $1 AND key = $2 ORDER BY created_at LIMIT 32",
                        2, values, NULL, NULL, false, &rc, err);
    if (res == NULL)
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

/* Runs one statement (expecting exactly one row if one_row); NULL with *rc
 * set on failure. */
static PGresult *run(PGconn *pg, const char *sql, int n, const char *const *values,
                     const int *lengths, const int *formats, bool one_row, int *rc,
                     struct sk_err *err)
{
    if (pg == NULL || PQstatus(pg) != CONNECTION_OK) {
        *rc = sk_err_set(err, SK_AGAIN, "PostgreSQL not connected");
        return NULL;
    }
    PGresult *res = PQexecParams(pg, sql, n, NULL, values, lengths, formats, 0);
    if (PQresultStatus(res) == PGRES_TUPLES_OK && (PQntuples(res) == 1 || !one_row))
        return res;
    *rc = sk_err_set(err, PQstatus(pg) == CONNECTION_OK ? SK_ERR : SK_AGAIN, "%.40s: %s", sql,
                     PQresultErrorMessage(res));
    PQclear(res);
    return NULL;
}

static int boolean_result(PGconn *pg, const char *sql, int n, const char *const *values,
                          struct sk_err *err)
{
    int rc;
    PGresult *res = run(pg, sql, n, values, NULL, NULL, true, &rc, err);
    if (res == NULL)
        return rc;
    rc = strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? SK_OK : SK_BUSY;
    PQclear(res);
    return rc;
}
