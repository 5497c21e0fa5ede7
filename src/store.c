/* store.c - claims, completes and fails idempotency keys in PostgreSQL.
 *
 * The SQL lives in sql/ as functions of schema `sekali` (claim, complete,
 * fail) so that the daemon, the benchmark's pgbench script and an operator at
 * psql all run the very same statements. Here they are prepared once per
 * connection, and the two per-job round trips use libpq's pipeline mode:
 * BEGIN travels with the claim, and the completion with its COMMIT.
 *
 * A connection that breaks is reset lazily at the next claim; a job whose
 * commit outcome is unknown is never acked, so the broker redelivers it and
 * the claim of the redelivery tells what happened. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"

struct sk_store {
    const struct sk_postgres_conf *conf;
    char                           application_name[64];  /* copied: reconnects need it */
    PGconn                        *conn;
};

/* One statement of a pipeline: a prepared statement's name, or SQL text. */
struct step {
    const char        *prepared;
    const char        *sql;
    int                n_params;
    const char *const *values;
    const int         *lengths;
    const int         *formats;
};

static const struct {
    const char *name, *sql;
} statements[] = {
    { "sk_claim", "SELECT * FROM sekali.claim($1, $2, $3, $4, $5)" },
    { "sk_complete", "SELECT sekali.complete($1, $2, $3, $4)" },
    { "sk_fail", "SELECT sekali.fail($1, $2, $3, $4, $5, $6)" },
};

static int connect_and_prepare(struct sk_store *s, struct sk_err *err);
static bool refused_login(PGconn *pg);
static char *user_options(const char *conninfo);
static int durable_commits(PGconn *pg, struct sk_err *err);
static int pipeline(struct sk_store *s, const struct step *steps, int n, PGresult **last,
                    struct sk_err *err);
static int connection_error(struct sk_store *s, const char *what, struct sk_err *err);
static int count_query(struct sk_store *s, const char *sql, const char *queue, const char *key,
                       int *out, struct sk_err *err);

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

int sk_store_claim(struct sk_store *s, const char *queue, const char *key, const char *owner,
                   const char *job_id, const char *job_type, struct sk_claim *out,
                   struct sk_err *err)
{
    int rc = sk_store_reconnect(s, err);
    if (rc != SK_OK)
        return rc;

    const char *values[] = { queue, key, owner, job_id, job_type };
    const struct step steps[] = {
        { .sql = "BEGIN" },
        { .prepared = "sk_claim", .n_params = 5, .values = values },
    };
    PGresult *res = NULL;
    rc = pipeline(s, steps, 2, &res, err);
    if (rc == SK_BUSY || rc == SK_ERR)
        sk_store_rollback(s, NULL);
    if (rc != SK_OK)
        return rc;

    if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0)) {
        PQclear(res);
        sk_store_rollback(s, NULL);
        return sk_err_set(err, SK_ERR, "sekali.claim(%s/%s) returned no row", queue, key);
    }
    const char *status = PQgetvalue(res, 0, 0);
    out->fence = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
    out->attempts = atoi(PQgetvalue(res, 0, 2));
    bool processing = strcmp(status, "processing") == 0;
    PQclear(res);
    if (processing)
        return SK_OK;

    /* Finished before: commit only the duplicate count, then tell the caller to ack. */
    const struct step commit[] = { { .sql = "COMMIT" } };
    rc = pipeline(s, commit, 1, NULL, err);
    return rc == SK_OK ? SK_DUP : rc;
}

int sk_store_complete(struct sk_store *s, const char *queue, const char *key, int64_t fence,
                      const void *result, size_t result_len, struct sk_err *err)
{
    char fence_text[24];
    snprintf(fence_text, sizeof(fence_text), "%lld", (long long)fence);
    const char *values[] = { queue, key, fence_text, result };
    const int lengths[] = { 0, 0, 0, (int)result_len };
    const int formats[] = { 0, 0, 0, 1 };  /* the result is bytea: send it raw */
    const struct step steps[] = {
        { .prepared = "sk_complete", .n_params = 4, .values = values, .lengths = lengths,
          .formats = formats },
        { .sql = "COMMIT" },
    };
    int rc = pipeline(s, steps, 2, NULL, err);
    if (rc == SK_ERR)
        sk_store_rollback(s, NULL);
    return rc;
}

int sk_store_rollback(struct sk_store *s, struct sk_err *err)
{
    if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK)
        return sk_err_set(err, SK_AGAIN, "ROLLBACK: not connected");
    /* An explicit ROLLBACK is also what leaves an aborted pipeline's
     * transaction block; outside a transaction it only warns. */
    PGresult *res = PQexec(s->conn, "ROLLBACK");
    ExecStatusType status = PQresultStatus(res);
    PQclear(res);
    if (status != PGRES_COMMAND_OK)
        return connection_error(s, "ROLLBACK", err);
    return SK_OK;
}

int sk_store_fail(struct sk_store *s, const char *queue, const char *key, const char *owner,
                  const char *job_id, const char *job_type, const char *error,
                  struct sk_err *err)
{
    if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK)
        return sk_err_set(err, SK_AGAIN, "sekali.fail: not connected");
    const char *values[] = { queue, key, owner, job_id, job_type, error };
    PGresult *res = PQexecPrepared(s->conn, "sk_fail", 6, values, NULL, NULL, 0);
    ExecStatusType status = PQresultStatus(res);
    if (status != PGRES_TUPLES_OK) {
        sk_err_set(err, SK_ERR, "sekali.fail(%s/%s) failed: %s", queue, key,
                   PQresultErrorMessage(res));
        PQclear(res);
        return PQstatus(s->conn) == CONNECTION_OK ? SK_ERR : SK_AGAIN;
    }
    PQclear(res);
    return SK_OK;
}

int sk_store_reply_state(struct sk_store *s, const char *queue, const char *key,
                         bool *replied, char **result, size_t *result_len, struct sk_err *err)
{
    *result = NULL;
    *result_len = 0;
    *replied = true;
    if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK)
        return sk_err_set(err, SK_AGAIN, "reply state: not connected");
    const char *values[] = { queue, key };
    /* Binary results: the saved result is bytea, sent back as it was saved. */
    PGresult *res = PQexecParams(s->conn, "SELECT replied_at IS NOT NULL, result FROM "
                                          "sekali.idempotency_keys WHERE queue = $1 AND key = $2 "
                                          "AND status = 'completed'",
                                 2, NULL, values, NULL, NULL, 1);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        int rc = sk_err_set(err, PQstatus(s->conn) == CONNECTION_OK ? SK_ERR : SK_AGAIN,
                            "reply state of %s/%s: %s", queue, key, PQresultErrorMessage(res));
        PQclear(res);
        return rc;
    }
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
    return count_query(s, "SELECT sekali.record_crash($1, $2)", queue, key, crashes, err);
}

int sk_store_crashes(struct sk_store *s, const char *queue, const char *key, int *crashes,
                     struct sk_err *err)
{
    return count_query(s, "SELECT coalesce((SELECT crashes FROM sekali.job_crashes "
                          "WHERE queue = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM "
                          "sekali.idempotency_keys WHERE queue = $1 AND key = $2 AND status "
                          "IN ('completed', 'failed'))), 0)", queue, key, crashes, err);
}

/* Runs sql with (queue, key) and reads the one integer it returns. */
static int count_query(struct sk_store *s, const char *sql, const char *queue, const char *key,
                       int *out, struct sk_err *err)
{
    if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK)
        return sk_err_set(err, SK_AGAIN, "crash count: not connected");
    const char *values[] = { queue, key };
    PGresult *res = PQexecParams(s->conn, sql, 2, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        sk_err_set(err, SK_ERR, "crash count of %s/%s: %s", queue, key,
                   PQresultErrorMessage(res));
        PQclear(res);
        return PQstatus(s->conn) == CONNECTION_OK ? SK_ERR : SK_AGAIN;
    }
    *out = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return SK_OK;
}

int sk_store_mark_replied(struct sk_store *s, const char *queue, const char *key,
                          struct sk_err *err)
{
    if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK)
        return sk_err_set(err, SK_AGAIN, "mark replied: not connected");
    const char *values[] = { queue, key };
    PGresult *res = PQexecParams(s->conn, "UPDATE sekali.idempotency_keys SET replied_at = now() "
                                          "WHERE queue = $1 AND key = $2", 2, NULL, values, NULL,
                                 NULL, 0);
    int rc = PQresultStatus(res) == PGRES_COMMAND_OK ? SK_OK
           : sk_err_set(err, SK_AGAIN, "mark replied %s/%s: %s", queue, key,
                        PQresultErrorMessage(res));
    PQclear(res);
    return rc;
}

PGconn *sk_store_dial(const struct sk_postgres_conf *conf, const char *application_name,
                      struct sk_err *err)
{
    /* lock_timeout bounds how long a claim waits for a row that another
     * worker holds (a duplicate delivery racing a live job): past it the
     * claim fails with SK_BUSY and the delivery is re-scheduled. It applies
     * to the handler's statements in the job's transaction as well. The
     * user's own options (from the conninfo, else PGOPTIONS) come first, so
     * that they are kept and sekali's two settings win over theirs. */
    char *user = user_options(conf->conninfo);
    char *options = NULL;
    if (asprintf(&options, "%s%s-c lock_timeout=%u -c idle_in_transaction_session_timeout=%u",
                 user != NULL ? user : "", user != NULL ? " " : "", conf->lock_timeout_ms,
                 conf->idle_in_transaction_timeout_ms) < 0) {
        free(user);
        sk_err_set(err, SK_AGAIN, "asprintf(options): out of memory");
        return NULL;
    }
    /* expand_dbname: the first "dbname" is the whole conninfo string; the
     * later keywords override what it says. */
    const char *keywords[] = { "dbname", "application_name", "options", "password", NULL };
    const char *values[] = { conf->conninfo, application_name, options, conf->password, NULL };
    if (conf->password == NULL)
        keywords[3] = NULL;
    PGconn *pg = PQconnectdbParams(keywords, values, 1);
    free(options);
    if (pg == NULL) {
        free(user);
        sk_err_set(err, SK_AGAIN, "PQconnectdbParams: out of memory");
        return NULL;
    }
    if (PQstatus(pg) != CONNECTION_OK) {
        free(user);
        sk_err_set(err, SK_AGAIN, "PostgreSQL connection failed: %s", PQerrorMessage(pg));
        if (refused_login(pg))
            sk_err_mark_auth(err, SK_AGAIN);
        PQfinish(pg);
        return NULL;
    }
    bool chosen = user != NULL && strstr(user, "synchronous_commit") != NULL;
    free(user);
    if (!chosen && durable_commits(pg, err) != SK_OK) {
        PQfinish(pg);
        return NULL;
    }
    return pg;
}

/* The options the user's conninfo sets, else PGOPTIONS, or NULL; the caller
 * frees them. Passing "options" to libpq replaces both, so they are read
 * here and handed on. */
static char *user_options(const char *conninfo)
{
    char *found = NULL;
    PQconninfoOption *parsed = PQconninfoParse(conninfo, NULL);
    for (PQconninfoOption *o = parsed; o != NULL && o->keyword != NULL; o++)
        if (strcmp(o->keyword, "options") == 0 && o->val != NULL && o->val[0] != '\0')
            found = strdup(o->val);
    PQconninfoFree(parsed);
    const char *env = getenv("PGOPTIONS");
    if (found == NULL && env != NULL && env[0] != '\0')
        found = strdup(env);
    return found;
}

/* A server whose default is synchronous_commit = off acknowledges a COMMIT
 * before it is durable, and sekali acks the message right after: a crash of
 * PostgreSQL then loses a job whose message is gone (the chaos soak lost
 * some that way). Such a session is raised to `on`; any stronger setting
 * (remote_write, remote_apply) is left as it is, and so is a value the
 * user's options choose. */
static int durable_commits(PGconn *pg, struct sk_err *err)
{
    const char *value = PQparameterStatus(pg, "synchronous_commit");
    PGresult *res = NULL;
    if (value == NULL) {
        res = PQexec(pg, "SHOW synchronous_commit");
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
            sk_err_set(err, SK_AGAIN, "SHOW synchronous_commit failed: %s",
                       PQresultErrorMessage(res));
            PQclear(res);
            return SK_AGAIN;
        }
        value = PQgetvalue(res, 0, 0);
    }
    bool off = strcmp(value, "off") == 0;
    PQclear(res);
    if (!off)
        return SK_OK;
    res = PQexec(pg, "SET synchronous_commit = on");
    int rc = PQresultStatus(res) == PGRES_COMMAND_OK ? SK_OK : SK_AGAIN;
    if (rc != SK_OK)
        sk_err_set(err, SK_AGAIN, "SET synchronous_commit failed: %s", PQresultErrorMessage(res));
    PQclear(res);
    return rc;
}

/* libpq keeps no SQLSTATE for a failed connection, so the server's message
 * tells 28P01 (invalid_password) and 28000 (invalid_authorization_
 * specification: unknown role, no pg_hba.conf entry, failed peer or ident
 * check) from an outage; a server with lc_messages in another language is
 * taken for down. libpq's own "no password supplied" is the same mistake. */
static bool refused_login(PGconn *pg)
{
    static const char *const signs[] = {
        "authentication failed", "no pg_hba.conf entry", "no password supplied",
    };
    const char *msg = PQerrorMessage(pg);

    if (PQconnectionNeedsPassword(pg))
        return true;
    for (size_t i = 0; i < SK_ARRAY_LEN(signs); i++)
        if (strstr(msg, signs[i]) != NULL)
            return true;
    return strstr(msg, "role \"") != NULL && strstr(msg, "\" does not exist") != NULL;
}

static int connect_and_prepare(struct sk_store *s, struct sk_err *err)
{
    PQfinish(s->conn);
    s->conn = sk_store_dial(s->conf, s->application_name, err);
    if (s->conn == NULL)
        return SK_AGAIN;
    for (size_t i = 0; i < SK_ARRAY_LEN(statements); i++) {
        PGresult *res = PQprepare(s->conn, statements[i].name, statements[i].sql, 0, NULL);
        ExecStatusType status = PQresultStatus(res);
        if (status != PGRES_COMMAND_OK) {
            sk_err_set(err, SK_ERR, "PQprepare(%s) failed: %s(is the schema migrated? "
                       "run sekalictl migrate)", statements[i].name, PQresultErrorMessage(res));
            PQclear(res);
            PQfinish(s->conn);
            s->conn = NULL;
            return SK_ERR;
        }
        PQclear(res);
    }
    return SK_OK;
}

/* Sends steps as one pipeline and reads every result up to the sync, so the
 * connection is always left idle and out of pipeline mode. Keeps the last
 * step's result in *last if asked. Returns SK_OK, SK_ERR (a statement failed;
 * the first error is in err and the transaction is aborted) or SK_AGAIN. */
static int pipeline(struct sk_store *s, const struct step *steps, int n, PGresult **last,
                    struct sk_err *err)
{
    if (PQenterPipelineMode(s->conn) != 1)
        return connection_error(s, "PQenterPipelineMode", err);
    for (int i = 0; i < n; i++) {
        int sent = steps[i].prepared != NULL
            ? PQsendQueryPrepared(s->conn, steps[i].prepared, steps[i].n_params,
                                  steps[i].values, steps[i].lengths, steps[i].formats, 0)
            : PQsendQueryParams(s->conn, steps[i].sql, 0, NULL, NULL, NULL, NULL, 0);
        if (sent != 1) {
            PQexitPipelineMode(s->conn);
            return connection_error(s, "PQsendQuery", err);
        }
    }
    if (PQpipelineSync(s->conn) != 1) {
        PQexitPipelineMode(s->conn);
        return connection_error(s, "PQpipelineSync", err);
    }

    int rc = SK_OK;
    int step = 0;
    int nulls = 0;
    for (;;) {
        PGresult *res = PQgetResult(s->conn);
        if (res == NULL) {
            /* Each statement's results end with one NULL; a second in a row
             * means no more will come: the connection died under us. */
            if (++nulls > 1 || PQstatus(s->conn) != CONNECTION_OK) {
                rc = connection_error(s, "PQgetResult", err);
                break;
            }
            continue;
        }
        nulls = 0;
        ExecStatusType status = PQresultStatus(res);
        if (status == PGRES_PIPELINE_SYNC) {
            PQclear(res);
            break;
        }
        const char *what = step < n ? (steps[step].prepared != NULL ? steps[step].prepared
                                                                    : steps[step].sql)
                                    : "pipeline";
        if (status == PGRES_FATAL_ERROR && rc == SK_OK) {
            const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
            rc = PQstatus(s->conn) != CONNECTION_OK ? SK_AGAIN
               : state != NULL && strcmp(state, "55P03") == 0 ? SK_BUSY  /* lock_timeout */
               : SK_ERR;
            sk_err_set(err, rc, "%s failed: %s", what, PQresultErrorMessage(res));
        }
        if (last != NULL && step == n - 1 && rc == SK_OK && status == PGRES_TUPLES_OK)
            *last = res;
        else
            PQclear(res);
        step++;
    }
    PQexitPipelineMode(s->conn);
    if (rc != SK_OK && last != NULL && *last != NULL) {
        PQclear(*last);
        *last = NULL;
    }
    return rc;
}

static int connection_error(struct sk_store *s, const char *what, struct sk_err *err)
{
    if (PQstatus(s->conn) != CONNECTION_OK)
        return sk_err_set(err, SK_AGAIN, "%s: PostgreSQL connection lost: %s", what,
                          PQerrorMessage(s->conn));
    return sk_err_set(err, SK_ERR, "%s failed: %s", what, PQerrorMessage(s->conn));
}
