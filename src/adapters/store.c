/* store.c - claims, completes and fails idempotency keys in PostgreSQL.
 *
 * The SQL lives in sql/ as functions of schema `sekali` (claim, complete,
 * fail) so that the daemon, the benchmark's pgbench script and an operator at
 * psql all run the very same statements. Here they are prepared once per
 * connection, and the two per-job round trips use libpq's pipeline mode:
 * BEGIN travels with the claim, and a result (if any) with the COMMIT. A
 * job alone in its transaction is claimed completed at once
 * (sekali.claim_completed, sql/017): only its COMMIT makes that true, and a
 * failed handler rolls the claim back with the transaction. Except a job
 * that may hold a dedupe key (sk_keyref_may_hold_dedupe()): claimed processing and
 * completed before the COMMIT, as before 017, so that the dedupe row its
 * completion releases is locked for an instant, not for the whole run of
 * its handler (a producer enqueueing with the same dedupe key would wait).
 *
 * A connection that breaks is reset lazily at the next claim; a job whose
 * commit outcome is unknown is never acked, so the broker redelivers it and
 * the claim of the redelivery tells what happened. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "store.h"
#include "text.h"

struct sk_store {
    const struct sk_postgres_conf *conf;
    char                           application_name[64];  /* copied: reconnects need it */
    PGconn                        *conn;
    struct sk_rtt                  rtt;       /* claims, COMMITs, the preparing */
    const struct sk_pg_stmt       *first;    /* sk_store_send_first()'s, for the next finish */
    size_t                         n_first;
};

static const struct {
    const char *name, *sql;
} statements[] = {
    { "sk_claim", "SELECT * FROM sekali.claim($1, $2, $3, $4, $5)" },
    { "sk_claim_completed", "SELECT * FROM sekali.claim_completed($1, $2, $3, $4, $5)" },
    { "sk_complete", "SELECT sekali.complete($1, $2, $3, $4)" },
    { "sk_set_result", "SELECT sekali.set_result($1, $2, $3, $4)" },
    { "sk_fail", "SELECT sekali.fail($1, $2, $3, $4, $5, $6)" },
};

static int connect_and_prepare(struct sk_store *s, struct sk_err *err);
static int prepare_all(PGconn *pg, struct sk_err *err);
static int claim_array(struct sk_store *s, const char *function, const struct sk_keyref *refs,
                       size_t n, struct sk_claim *out, bool *dup, struct sk_err *err);
static int finish_array(struct sk_store *s, const struct sk_pg_stmt *shape,
                        const struct sk_keyref *const *refs, const void *const *results,
                        const size_t *result_lens, size_t n, const struct sk_keyref *back,
                        size_t n_back, struct sk_err *err);
static int count_query(struct sk_store *s, const char *what, const char *sql, const char *queue,
                       const char *key, int *out, struct sk_err *err);
static int timed_pipeline(struct sk_store *s, const struct sk_pg_stmt *steps, int n,
                          PGresult **last, struct sk_err *err);

void sk_keyref_set_fence(struct sk_keyref *ref, int64_t fence)
{
    ref->fence = fence;
    snprintf(ref->fence_text, sizeof(ref->fence_text), "%lld", (long long)fence);
}

int sk_store_open(struct sk_store **out, const struct sk_postgres_conf *conf,
                  const char *application_name, struct sk_err *err)
{
    struct sk_store *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(store)");
    s->conf = conf;
    snprintf(s->application_name, sizeof(s->application_name), "%s", application_name);
    int rc = connect_and_prepare(s, err);
    if (rc != SK_OK) {
        sk_store_close(s);
        return rc;
    }
    *out = s;
    return SK_OK;
}

void sk_store_close(struct sk_store *s)
{
    if (s == NULL)
        return;
    PQfinish(s->conn);
    free(s);
}

PGconn *sk_store_conn(struct sk_store *s)
{
    return s->conn;
}

int sk_store_reconnect(struct sk_store *s, struct sk_err *err)
{
    if (s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK)
        return SK_OK;
    return connect_and_prepare(s, err);
}

int sk_store_claim(struct sk_store *s, const struct sk_keyref *ref, struct sk_claim *out,
                   struct sk_err *err)
{
    int rc = sk_store_reconnect(s, err);
    if (rc != SK_OK)
        return rc;

    const char *values[] = { ref->queue, ref->key, ref->owner, ref->job_id, ref->job_type };
    const struct sk_pg_stmt steps[] = {
        { .sql = "BEGIN" },
        { .prepared = sk_keyref_may_hold_dedupe(ref) ? "sk_claim" : "sk_claim_completed",
          .n_params = 5, .values = values },
    };
    PGresult *res = NULL;
    rc = timed_pipeline(s, steps, 2, &res, err);
    if (rc == SK_BUSY || rc == SK_ERR)
        sk_store_rollback(s, NULL);
    if (rc == SK_AGAIN && PQstatus(s->conn) == CONNECTION_OK) {
        /* A live session on a read-only server: after a failover it stays
         * on the standby or demoted primary unless dialled again. */
        PQfinish(s->conn);
        s->conn = NULL;
    }
    if (rc != SK_OK)
        return rc;

    if (res == NULL || PQntuples(res) != 1 || PQgetisnull(res, 0, 0)) {
        PQclear(res);
        sk_store_rollback(s, NULL);
        return sk_err_set(err, SK_ERR, "sekali.claim(%s/%s) returned no row", ref->queue,
                          ref->key);
    }
    const char *status = PQgetvalue(res, 0, 0);
    out->fence = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
    out->attempts = atoi(PQgetvalue(res, 0, 2));
    out->cancelled = strcmp(status, "cancelled") == 0;
    bool processing = strcmp(status, "processing") == 0;
    PQclear(res);
    if (processing)
        return SK_OK;

    /* Finished before: commit only the duplicate count, then tell the caller to ack. */
    const struct sk_pg_stmt commit[] = { { .sql = "COMMIT" } };
    rc = sk_pg_pipeline(s->conn, commit, 1, NULL, err);
    return rc == SK_OK ? SK_DUP : rc;
}

int sk_store_complete(struct sk_store *s, const struct sk_keyref *ref, const void *result,
                      size_t result_len, struct sk_err *err)
{
    if (sk_keyref_may_hold_dedupe(ref))
        return sk_store_complete_many(s, &ref, &result, &result_len, 1, NULL, 0, err);
    /* Claimed completed: the COMMIT alone, or the result and the COMMIT. */
    return sk_store_commit_results(s, &ref, &result, &result_len, result_len > 0 ? 1 : 0, NULL,
                                   0, err);
}

/* A job id sekali.enqueue() makes, the only kind a dedupe key can hold: a
 * version-4 UUID's text, as the release_dedupe trigger's WHEN tests it
 * (sql/014). Keep the two in step. */
bool sk_keyref_may_hold_dedupe(const struct sk_keyref *ref)
{
    return ref->job_id != NULL && strlen(ref->job_id) == 36 && ref->job_id[14] == '4';
}

static const struct sk_keyref *ref(const void *refs, size_t i)
{
    return &((const struct sk_keyref *)refs)[i];
}
static const char *ref_key(const void *refs, size_t i) { return ref(refs, i)->key; }
static const char *ref_job_id(const void *refs, size_t i) { return ref(refs, i)->job_id; }
static const char *ref_job_type(const void *refs, size_t i) { return ref(refs, i)->job_type; }

int sk_store_claim_many(struct sk_store *s, const struct sk_keyref *refs, size_t n,
                        struct sk_claim *out, bool *dup, struct sk_err *err)
{
    return claim_array(s, "sekali.claim_many", refs, n, out, dup, err);
}

int sk_store_claim_completing(struct sk_store *s, const struct sk_keyref *refs, size_t n,
                              struct sk_claim *out, bool *dup, struct sk_err *err)
{
    return claim_array(s, "sekali.claim_completing", refs, n, out, dup, err);
}

/* BEGIN and FUNCTION(queue, keys, owner, job ids, job types): one of the
 * two set-returning claims, whose rows are (ord, status, fence, attempts). */
static int claim_array(struct sk_store *s, const char *function, const struct sk_keyref *refs,
                       size_t n, struct sk_claim *out, bool *dup, struct sk_err *err)
{
    int rc = sk_store_reconnect(s, err);
    if (rc != SK_OK)
        return rc;
    char *keys = sk_pg_text_array(n, ref_key, refs);
    char *ids = sk_pg_text_array(n, ref_job_id, refs);
    char *types = sk_pg_text_array(n, ref_job_type, refs);
    if (keys == NULL || ids == NULL || types == NULL) {
        free(keys);
        free(ids);
        free(types);
        return sk_err_set(err, SK_ERR, "out of memory for a batch's claim");
    }
    const char *values[] = { refs[0].queue, keys, refs[0].owner, ids, types };
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT * FROM %s($1, $2::text[], $3, $4::text[], $5::text[])",
             function);
    const struct sk_pg_stmt steps[] = {
        { .sql = "BEGIN" },
        { .sql = sql, .n_params = 5, .values = values, .what = function },
    };
    PGresult *res = NULL;
    rc = timed_pipeline(s, steps, 2, &res, err);
    free(keys);
    free(ids);
    free(types);
    if (rc == SK_BUSY || rc == SK_ERR)
        sk_store_rollback(s, NULL);
    if (rc != SK_OK)
        return rc;
    if (res == NULL || (size_t)PQntuples(res) != n) {
        PQclear(res);
        sk_store_rollback(s, NULL);
        return sk_err_set(err, SK_ERR, "%s(%s) returned %d rows for %zu keys", function,
                          refs[0].queue, res != NULL ? PQntuples(res) : 0, n);
    }
    for (size_t i = 0; i < n; i++) {
        size_t at = (size_t)atoi(PQgetvalue(res, (int)i, 0)) - 1;
        if (at >= n)
            continue;
        dup[at] = strcmp(PQgetvalue(res, (int)i, 1), "processing") != 0;
        out[at].cancelled = strcmp(PQgetvalue(res, (int)i, 1), "cancelled") == 0;
        out[at].fence = strtoll(PQgetvalue(res, (int)i, 2), NULL, 10);
        out[at].attempts = atoi(PQgetvalue(res, (int)i, 3));
    }
    PQclear(res);
    return SK_OK;
}

static const char *ref_fence(const void *refs, size_t i) { return ref(refs, i)->fence_text; }

int sk_store_savepoint(struct sk_store *s, bool first, struct sk_err *err)
{
    int rc = sk_pg_run(s->conn, first ? "SAVEPOINT sk_job"
                                      : "RELEASE SAVEPOINT sk_job; SAVEPOINT sk_job", err);
    return rc == SK_BUSY ? SK_ERR : rc;
}

int sk_store_rollback_job(struct sk_store *s, const struct sk_keyref *ref, struct sk_err *err)
{
    const char *values[] = { ref->queue, ref->key, ref->fence_text };
    const struct sk_pg_stmt steps[] = {
        { .sql = "ROLLBACK TO SAVEPOINT sk_job" },
        { .sql = "SELECT sekali.unclaim($1, $2, $3)", .n_params = 3, .values = values,
          .what = "sekali.unclaim" },
    };
    int rc = sk_pg_pipeline(s->conn, steps, 2, NULL, err);
    return rc == SK_BUSY ? SK_ERR : rc;
}

int sk_store_complete_many(struct sk_store *s, const struct sk_keyref *const *refs,
                           const void *const *results, const size_t *result_lens, size_t n,
                           const struct sk_keyref *back, size_t n_back, struct sk_err *err)
{
    const struct sk_pg_stmt complete = { .prepared = "sk_complete" };
    return finish_array(s, &complete, refs, results, result_lens, n, back, n_back, err);
}

int sk_store_commit_results(struct sk_store *s, const struct sk_keyref *const *refs,
                            const void *const *results, const size_t *result_lens, size_t n,
                            const struct sk_keyref *back, size_t n_back, struct sk_err *err)
{
    const struct sk_pg_stmt set_result = { .prepared = "sk_set_result",
                                           .what = "sekali.set_result" };
    return finish_array(s, &set_result, refs, results, result_lens, n, back, n_back, err);
}

/* sekali.unclaim_many() of the n_back keys given back (if any), SHAPE(queue,
 * key, fence, result) for each of n keys, then COMMIT, in one round trip;
 * the transaction is rolled back if any of it failed. */
static int finish_array(struct sk_store *s, const struct sk_pg_stmt *shape,
                        const struct sk_keyref *const *refs, const void *const *results,
                        const size_t *result_lens, size_t n, const struct sk_keyref *back,
                        size_t n_back, struct sk_err *err)
{
    /* Per step: its 4 values, lengths and formats, kept alive for the call. */
    struct step_args {
        const char *values[4];
        int lengths[4], formats[4];
    } *args = calloc(n + 2, sizeof(*args));
    size_t n_first = s->n_first;
    const struct sk_pg_stmt *first = s->first;
    s->first = NULL;
    s->n_first = 0;
    struct sk_pg_stmt *steps = calloc(n + n_first + 2, sizeof(*steps));
    char *keys = n_back > 0 ? sk_pg_text_array(n_back, ref_key, back) : NULL;
    char *fences = n_back > 0 ? sk_pg_text_array(n_back, ref_fence, back) : NULL;
    if (args == NULL || steps == NULL || (n_back > 0 && (keys == NULL || fences == NULL))) {
        free(args);
        free(steps);
        free(keys);
        free(fences);
        sk_store_rollback(s, NULL);
        return sk_err_set(err, SK_ERR, "out of memory for a batch's completion");
    }
    size_t k = 0;
    if (n_back > 0) {
        /* The keys of the jobs a batch closed early did not run: given
         * back (sql/021) before the COMMIT makes the others true. */
        struct step_args *a = &args[n + 1];
        a->values[0] = back[0].queue;
        a->values[1] = keys;
        a->values[2] = fences;
        steps[k++] = (struct sk_pg_stmt){
            .sql = "SELECT sekali.unclaim_many($1, $2::text[], $3::bigint[])", .n_params = 3,
            .values = a->values, .what = "sekali.unclaim_many",
        };
    }
    /* The handlers' queued statements, before the completions: a failing
     * one aborts the pipeline, and the COMMIT with it. */
    for (size_t i = 0; i < n_first; i++)
        steps[k++] = first[i];
    for (size_t i = 0; i < n; i++, k++) {
        struct step_args *a = &args[i];
        a->values[0] = refs[i]->queue;
        a->values[1] = refs[i]->key;
        a->values[2] = refs[i]->fence_text;
        a->values[3] = results[i];
        a->lengths[3] = (int)result_lens[i];
        a->formats[3] = 1;  /* the result is bytea: sent raw */
        steps[k] = *shape;
        steps[k].n_params = 4;
        steps[k].values = a->values;
        steps[k].lengths = a->lengths;
        steps[k].formats = a->formats;
    }
    steps[k++] = (struct sk_pg_stmt){ .sql = "COMMIT" };
    int rc = timed_pipeline(s, steps, (int)k, NULL, err);
    free(args);
    free(steps);
    free(keys);
    free(fences);
    if (rc == SK_ERR || rc == SK_BUSY)
        sk_store_rollback(s, NULL);
    return rc == SK_BUSY ? SK_ERR : rc;
}

void sk_store_send_first(struct sk_store *s, const struct sk_pg_stmt *steps, size_t n)
{
    s->first = steps;
    s->n_first = n;
}

int sk_store_rollback(struct sk_store *s, struct sk_err *err)
{
    s->first = NULL;
    s->n_first = 0;
    /* An explicit ROLLBACK is also what leaves an aborted pipeline's
     * transaction block; outside a transaction it only warns. */
    int rc = sk_pg_run(s->conn, "ROLLBACK", err);
    return rc == SK_BUSY ? SK_ERR : rc;
}

int sk_store_fail(struct sk_store *s, const struct sk_keyref *ref, const char *error,
                  struct sk_err *err)
{
    char text[SK_TEXT_ERROR_MAX];
    sk_text_copy(text, sizeof(text), error);
    const char *values[] = { ref->queue, ref->key, ref->owner, ref->job_id, ref->job_type,
                             text };
    const struct sk_pg_stmt fail = { .prepared = "sk_fail", .n_params = 6, .values = values,
                                     .what = "sekali.fail" };
    int rc = sk_pg_exec(s->conn, &fail, NULL, err);
    return rc == SK_BUSY ? SK_ERR : rc;
}

int sk_store_reply_state(struct sk_store *s, const struct sk_keyref *ref, bool *replied,
                         char **result, size_t *result_len, struct sk_err *err)
{
    *result = NULL;
    *result_len = 0;
    *replied = true;
    const char *values[] = { ref->queue, ref->key };
    /* Binary results: the saved result is bytea, sent back as it was saved. */
    const struct sk_pg_stmt st = {
        .sql = "SELECT replied_at IS NOT NULL, result FROM sekali.idempotency_keys "
               "WHERE queue = $1 AND key = $2 AND status = 'completed'",
        .n_params = 2, .values = values, .binary = 1, .what = "reply state",
    };
    PGresult *res;
    int rc = sk_pg_exec(s->conn, &st, &res, err);
    if (rc != SK_OK)
        return rc == SK_BUSY ? SK_ERR : rc;
    if (PQntuples(res) == 0) {  /* failed, not completed: there is no result to send */
        PQclear(res);
        return SK_OK;
    }
    *replied = PQgetvalue(res, 0, 0)[0] != 0;
    if (!PQgetisnull(res, 0, 1)) {
        size_t len = (size_t)PQgetlength(res, 0, 1);
        *result = malloc(len + 1);
        if (*result == NULL) {
            PQclear(res);
            return sk_err_errno(err, SK_ERR, "malloc(result)");
        }
        memcpy(*result, PQgetvalue(res, 0, 1), len);
        *result_len = len;
    }
    PQclear(res);
    return SK_OK;
}

int sk_store_record_crash(struct sk_store *s, const char *queue, const char *key, int *crashes,
                          struct sk_err *err)
{
    return count_query(s, "sekali.record_crash", "SELECT sekali.record_crash($1, $2)", queue,
                       key, crashes, err);
}

int sk_store_crashes(struct sk_store *s, const struct sk_keyref *ref, int *crashes,
                     struct sk_err *err)
{
    return count_query(s, "crash count",
                       "SELECT coalesce((SELECT crashes FROM sekali.job_crashes "
                       "WHERE queue = $1 AND key = $2 AND coalesce(sekali.key_status($1, $2), "
                       "'processing') = 'processing'), 0)", ref->queue, ref->key, crashes, err);
}

/* Runs sql with (queue, key) and copies the one value it returns into
 * out (size bytes, cut); SK_BUSY is SK_ERR here, as for every statement
 * but the claim. */
static int ask_one(struct sk_store *s, const char *what, const char *sql, const char *queue,
                   const char *key, char *out, size_t size, struct sk_err *err)
{
    const char *values[] = { queue, key };
    const struct sk_pg_stmt st = { .sql = sql, .n_params = 2, .values = values,
                                   .one_row = true, .what = what };
    PGresult *res;
    int rc = sk_pg_exec(s->conn, &st, &res, err);
    if (rc != SK_OK)
        return rc == SK_BUSY ? SK_ERR : rc;
    snprintf(out, size, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return SK_OK;
}

/* ask_one() of a statement that returns one integer. */
static int count_query(struct sk_store *s, const char *what, const char *sql, const char *queue,
                       const char *key, int *out, struct sk_err *err)
{
    char text[24];
    int rc = ask_one(s, what, sql, queue, key, text, sizeof(text), err);
    if (rc == SK_OK)
        *out = atoi(text);
    return rc;
}

int sk_store_settle_cancelled(struct sk_store *s, const struct sk_keyref *ref, bool *cancelled,
                              struct sk_err *err)
{
    char answer[8] = "";
    int rc = ask_one(s, "sekali.settle_cancelled", "SELECT sekali.settle_cancelled($1, $2)",
                     ref->queue, ref->key, answer, sizeof(answer), err);
    *cancelled = rc == SK_OK && answer[0] == 't';
    return rc;
}

int sk_store_is_cancelled(PGconn *pg, const char *queue, const char *key, bool *cancelled,
                          struct sk_err *err)
{
    *cancelled = false;
    const char *values[] = { queue, key };
    const struct sk_pg_stmt st = { .sql = "SELECT sekali.is_cancelled($1, $2)", .n_params = 2,
                                   .values = values, .one_row = true,
                                   .what = "sekali.is_cancelled" };
    PGresult *res;
    int rc = sk_pg_exec(pg, &st, &res, err);
    if (rc != SK_OK)
        return rc == SK_BUSY ? SK_ERR : rc;
    *cancelled = PQgetvalue(res, 0, 0)[0] == 't';
    PQclear(res);
    return SK_OK;
}

int sk_store_mark_replied(struct sk_store *s, const struct sk_keyref *ref, struct sk_err *err)
{
    const char *values[] = { ref->queue, ref->key };
    const struct sk_pg_stmt st = {
        .sql = "UPDATE sekali.idempotency_keys SET replied_at = now() "
               "WHERE queue = $1 AND key = $2",
        .n_params = 2, .values = values, .what = "mark replied",
    };
    int rc = sk_pg_exec(s->conn, &st, NULL, err);
    return rc == SK_BUSY ? SK_ERR : rc;
}

static const char *ref_ptr_key(const void *refs, size_t i)
{
    return ((const struct sk_keyref *const *)refs)[i]->key;
}

int sk_store_count_duplicates(struct sk_store *s, const struct sk_keyref *const *refs, size_t n,
                              struct sk_err *err)
{
    char *keys = sk_pg_text_array(n, ref_ptr_key, refs);
    if (keys == NULL)
        return sk_err_set(err, SK_ERR, "out of memory for a batch's duplicate count");
    const char *values[] = { refs[0]->queue, keys };
    const struct sk_pg_stmt st = {
        .sql = "UPDATE sekali.idempotency_keys SET duplicates = duplicates + 1, "
               "updated_at = now() WHERE queue = $1 AND key = ANY ($2::text[])",
        .n_params = 2, .values = values, .what = "count duplicates",
    };
    int rc = sk_pg_exec(s->conn, &st, NULL, err);
    free(keys);
    return rc == SK_BUSY ? SK_ERR : rc;
}

uint64_t sk_store_rtt_ns(const struct sk_store *s)
{
    return sk_rtt_least(&s->rtt);
}

/* sk_pg_pipeline() of the span's own statements, each call one round trip:
 * what it took is a sample of the server's round trip (a failed one too:
 * an error answers as late as a result). */
static int timed_pipeline(struct sk_store *s, const struct sk_pg_stmt *steps, int n,
                          PGresult **last, struct sk_err *err)
{
    uint64_t started = sk_now_ns();
    int rc = sk_pg_pipeline(s->conn, steps, n, last, err);
    if (rc != SK_AGAIN)
        sk_rtt_add(&s->rtt, started);
    return rc;
}

/* The statements are prepared in one pipeline: one round trip for all of
 * them, not one each, which a worker starting (or replacing a dead one)
 * against a far PostgreSQL pays before its first job. */
static int connect_and_prepare(struct sk_store *s, struct sk_err *err)
{
    PQfinish(s->conn);
    s->conn = sk_pg_dial(s->conf, s->application_name, err);
    if (s->conn == NULL)
        return SK_AGAIN;
    /* A new connection may reach another server (a failover): its round
     * trips are measured afresh, the first from the preparing. */
    s->rtt = (struct sk_rtt){ .next = 0 };
    uint64_t started = sk_now_ns();
    int rc = prepare_all(s->conn, err);
    if (rc == SK_OK)
        sk_rtt_add(&s->rtt, started);
    if (rc != SK_OK) {
        PQfinish(s->conn);
        s->conn = NULL;
    }
    return rc;
}

static int prepare_all(PGconn *pg, struct sk_err *err)
{
    bool sent = PQenterPipelineMode(pg) == 1;
    for (size_t i = 0; sent && i < SK_ARRAY_LEN(statements); i++)
        sent = PQsendPrepare(pg, statements[i].name, statements[i].sql, 0, NULL) == 1;
    if (!sent || PQpipelineSync(pg) != 1)
        return sk_err_set(err, SK_AGAIN, "PQsendPrepare failed: %s", PQerrorMessage(pg));
    /* Each statement's result, then its NULL; the sync's result ends it. A
     * failed statement aborts the ones after it (PGRES_PIPELINE_ABORTED):
     * the first failure is the one reported. */
    int rc = SK_OK;
    for (size_t i = 0; i <= SK_ARRAY_LEN(statements); i++) {
        PGresult *res = PQgetResult(pg);
        if (res == NULL)
            return sk_err_set(err, SK_AGAIN, "PQprepare: the connection failed: %s",
                              PQerrorMessage(pg));
        ExecStatusType status = PQresultStatus(res);
        if (i == SK_ARRAY_LEN(statements)) {
            PQclear(res);
            if (status != PGRES_PIPELINE_SYNC)
                return sk_err_set(err, SK_AGAIN, "PQprepare: no pipeline sync");
            break;
        }
        if (status != PGRES_COMMAND_OK && rc == SK_OK)
            rc = sk_err_set(err, SK_ERR, "PQprepare(%s) failed: %s(is the schema migrated? "
                            "run sekalictl migrate)", statements[i].name,
                            status == PGRES_PIPELINE_ABORTED ? "aborted " : PQresultErrorMessage(res));
        PQclear(res);
        PQclear(PQgetResult(pg));  /* the NULL that ends this statement's results */
    }
    if (PQexitPipelineMode(pg) != 1 && rc == SK_OK)
        rc = sk_err_set(err, SK_AGAIN, "PQexitPipelineMode failed: %s", PQerrorMessage(pg));
    return rc;
}
