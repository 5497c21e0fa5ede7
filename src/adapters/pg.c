/* pg.c - connecting to PostgreSQL with sekali's session settings, and running
 * statements with one reading of their outcome (see pg.h).
 *
 * Every caller must tell a lost connection from an SQL error the same way,
 * so it is told here once: PQstatus() after a failure decides SK_AGAIN, the
 * SQLSTATE decides SK_BUSY, and the rest is SK_ERR. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "failpoint.h"
#include "log.h"
#include "pg.h"

#define SQLSTATE_LOCK_TIMEOUT "55P03"  /* lock_not_available: lock_timeout expired */
/* read_only_sql_transaction: the session reached a standby, or a primary
 * that was demoted under it. Only a new connection (with
 * target_session_attrs=read-write) can find the primary, so it is treated
 * as a lost connection, not as the statement's error. */
#define SQLSTATE_READ_ONLY    "25006"

static char *user_options(const char *conninfo);
static int durable_commits(PGconn *pg, struct sk_err *err);
static bool refused_login(PGconn *pg);
static const char *name_of(const struct sk_pg_stmt *st);
static int send_one(PGconn *pg, const struct sk_pg_stmt *st);
static int failed(PGconn *pg, const PGresult *res, const char *what, struct sk_err *err);
static int lost(PGconn *pg, const char *what, struct sk_err *err);
static int again(struct sk_err *err);
static int trimmed(struct sk_err *err, int rc);
static void server_said(void *unused, const PGresult *res);

PGconn *sk_pg_dial(const struct sk_postgres_conf *conf, const char *application_name,
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
    PQsetNoticeReceiver(pg, server_said, NULL);
    /* Once per process, at its first connection, not per reconnect. */
    static bool warned;
    if (!warned && sk_pg_clear_text_remote(pg)) {
        warned = true;
        sk_log_warn("PostgreSQL at %s:%s is reached without TLS: passwords and job data cross "
                    "the network in clear text; add sslmode=verify-full and sslrootcert to "
                    "postgres.conninfo (docs/tls.md)", PQhost(pg), PQport(pg));
    }
    bool chosen = user != NULL && strstr(user, "synchronous_commit") != NULL;
    free(user);
    if (!chosen && durable_commits(pg, err) != SK_OK) {
        PQfinish(pg);
        return NULL;
    }
    return pg;
}

int sk_pg_reset(PGconn *pg, struct sk_err *err)
{
    if (PQstatus(pg) != CONNECTION_OK || PQtransactionStatus(pg) != PQTRANS_IDLE)
        return sk_err_set(err, SK_AGAIN, "sk_pg_reset: the connection is lost or inside a "
                          "transaction");
    /* RESET ALL (in DISCARD ALL) returns every setting to the value the
     * session started with, the dial's options included; only what
     * durable_commits() SET afterwards needs setting again. */
    int rc = sk_pg_run(pg, "DISCARD ALL", err);
    return rc != SK_OK ? rc : durable_commits(pg, err);
}

char *sk_pg_text_array(size_t n, const char *(*at)(const void *items, size_t i),
                       const void *items)
{
    size_t size = 3;
    for (size_t i = 0; i < n; i++)
        size += 2 * strlen(at(items, i) != NULL ? at(items, i) : "") + 3;
    char *out = malloc(size), *p = out;
    if (out == NULL)
        return NULL;
    *p++ = '{';
    for (size_t i = 0; i < n; i++) {
        const char *v = at(items, i) != NULL ? at(items, i) : "";
        if (i > 0)
            *p++ = ',';
        *p++ = '"';
        for (; *v != '\0'; v++) {
            if (*v == '"' || *v == '\\')
                *p++ = '\\';
            *p++ = *v;
        }
        *p++ = '"';
    }
    *p++ = '}';
    *p = '\0';
    return out;
}

int sk_pg_exec(PGconn *pg, const struct sk_pg_stmt *st, PGresult **out, struct sk_err *err)
{
    if (out != NULL)
        *out = NULL;
    if (pg == NULL || PQstatus(pg) != CONNECTION_OK)
        return sk_err_set(err, SK_AGAIN, "%s: PostgreSQL not connected", name_of(st));
    PGresult *res;
    if (st->prepared != NULL)
        res = PQexecPrepared(pg, st->prepared, st->n_params, st->values, st->lengths,
                             st->formats, st->binary);
    else if (st->n_params == 0 && st->binary == 0)
        res = PQexec(pg, st->sql);  /* the simple protocol: a script may hold several */
    else
        res = PQexecParams(pg, st->sql, st->n_params, NULL, st->values, st->lengths,
                           st->formats, st->binary);
    ExecStatusType status = PQresultStatus(res);
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        int rc = failed(pg, res, name_of(st), err);
        PQclear(res);
        return rc;
    }
    if (st->one_row && PQntuples(res) != 1) {
        int n = PQntuples(res);
        PQclear(res);
        return sk_err_set(err, SK_ERR, "%s returned %d rows, not one", name_of(st), n);
    }
    if (out != NULL)
        *out = res;
    else
        PQclear(res);
    return SK_OK;
}

int sk_pg_run(PGconn *pg, const char *sql, struct sk_err *err)
{
    const struct sk_pg_stmt st = { .sql = sql };
    return sk_pg_exec(pg, &st, NULL, err);
}

int sk_pg_pipeline(PGconn *pg, const struct sk_pg_stmt *st, int n, PGresult **last,
                   struct sk_err *err)
{
    if (last != NULL)
        *last = NULL;
    if (pg == NULL || PQstatus(pg) != CONNECTION_OK)
        return sk_err_set(err, SK_AGAIN, "%s: PostgreSQL not connected", name_of(&st[0]));
    if (PQenterPipelineMode(pg) != 1)
        return lost(pg, "PQenterPipelineMode", err);
    for (int i = 0; i < n; i++) {
        if (send_one(pg, &st[i]) != 1) {
            PQexitPipelineMode(pg);
            return lost(pg, "PQsendQuery", err);
        }
    }
    if (PQpipelineSync(pg) != 1) {
        PQexitPipelineMode(pg);
        return lost(pg, "PQpipelineSync", err);
    }
    /* Flushed (a blocking connection's PQpipelineSync() sends it all), no
     * answer read: the fault build dies here, named by the last statement,
     * so "pipeline_sent:COMMIT" kills a worker with its COMMIT on the wire
     * and its outcome unknown to it. */
    sk_failpoint("pipeline_sent", name_of(&st[n - 1]));

    int rc = SK_OK;
    int step = 0;
    int nulls = 0;
    PGresult *kept = NULL;
    for (;;) {
        PGresult *res = PQgetResult(pg);
        if (res == NULL) {
            /* Each statement's results end with one NULL; a second in a row
             * means no more will come: the connection died under us. */
            if (++nulls > 1 || PQstatus(pg) != CONNECTION_OK) {
                rc = lost(pg, "PQgetResult", err);
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
        if (status == PGRES_FATAL_ERROR && rc == SK_OK)
            rc = failed(pg, res, step < n ? name_of(&st[step]) : "pipeline", err);
        if (step == n - 1 && rc == SK_OK && status == PGRES_TUPLES_OK && kept == NULL)
            kept = res;
        else
            PQclear(res);
        step++;
    }
    PQexitPipelineMode(pg);
    if (rc != SK_OK || last == NULL)
        PQclear(kept);
    else
        *last = kept;
    return rc;
}

static const char *name_of(const struct sk_pg_stmt *st)
{
    return st->what != NULL ? st->what : st->prepared != NULL ? st->prepared : st->sql;
}

static int send_one(PGconn *pg, const struct sk_pg_stmt *st)
{
    return st->prepared != NULL
        ? PQsendQueryPrepared(pg, st->prepared, st->n_params, st->values, st->lengths,
                              st->formats, st->binary)
        : PQsendQueryParams(pg, st->sql, st->n_params, NULL, st->values, st->lengths,
                            st->formats, st->binary);
}

/* The one reading of a failed statement. */
static int failed(PGconn *pg, const PGresult *res, const char *what, struct sk_err *err)
{
    if (PQstatus(pg) != CONNECTION_OK)
        return lost(pg, what, err);
    const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    int rc = SK_ERR;
    if (state != NULL && strcmp(state, SQLSTATE_LOCK_TIMEOUT) == 0)
        rc = SK_BUSY;
    else if (state != NULL && strcmp(state, SQLSTATE_READ_ONLY) == 0)
        rc = SK_AGAIN;
    const char *msg = res != NULL ? PQresultErrorMessage(res) : PQerrorMessage(pg);
    if (msg[0] == '\0')
        msg = PQerrorMessage(pg);
    sk_err_set(err, rc, "%.60s failed: %s", what, msg);
    if (err != NULL && state != NULL)
        snprintf(err->sqlstate, sizeof(err->sqlstate), "%s", state);
    return trimmed(err, rc);
}

bool sk_pg_refused_for_good(const struct sk_err *err)
{
    /* The classes of a condition that passes: the server's, not the
     * statement's. */
    static const char passing[][3] = { "08", "40", "53", "55", "57", "58", "XX" };
    if (err == NULL || err->code != SK_ERR || strlen(err->sqlstate) != 5)
        return false;
    for (size_t i = 0; i < SK_ARRAY_LEN(passing); i++)
        if (strncmp(err->sqlstate, passing[i], 2) == 0)
            return false;
    return true;
}

static int lost(PGconn *pg, const char *what, struct sk_err *err)
{
    if (PQstatus(pg) != CONNECTION_OK)
        sk_err_set(err, SK_AGAIN, "%.60s: PostgreSQL connection lost: %s", what,
                   PQerrorMessage(pg));
    else
        sk_err_set(err, SK_ERR, "%.60s failed: %s", what, PQerrorMessage(pg));
    return trimmed(err, PQstatus(pg) != CONNECTION_OK ? SK_AGAIN : SK_ERR);
}

/* libpq ends its messages with a newline; a log line adds its own. */
static int trimmed(struct sk_err *err, int rc)
{
    if (err == NULL)
        return rc;
    size_t n = strlen(err->msg);
    while (n > 0 && (err->msg[n - 1] == '\n' || err->msg[n - 1] == ' '))
        err->msg[--n] = '\0';
    return rc;
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
        const struct sk_pg_stmt show = { .sql = "SHOW synchronous_commit", .one_row = true };
        if (sk_pg_exec(pg, &show, &res, err) != SK_OK)
            return again(err);
        value = PQgetvalue(res, 0, 0);
    }
    bool off = strcmp(value, "off") == 0;
    PQclear(res);
    if (!off)
        return SK_OK;
    if (sk_pg_run(pg, "SET synchronous_commit = on", err) != SK_OK)
        return again(err);
    return SK_OK;
}

/* A dial that fails after connecting is still an outage to its caller. */
static int again(struct sk_err *err)
{
    if (err != NULL)
        err->code = SK_AGAIN;
    return SK_AGAIN;
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

bool sk_pg_clear_text_remote(PGconn *pg)
{
    return PQstatus(pg) == CONNECTION_OK && !PQsslInUse(pg) &&
           !sk_pg_is_local(PQhost(pg), PQhostaddr(pg));
}

bool sk_pg_is_local(const char *host, const char *hostaddr)
{
    unsigned char a[sizeof(struct in6_addr)];
    static const unsigned char v4_mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

    if (host != NULL && (host[0] == '/' || host[0] == '@'))
        return true;
    if (hostaddr == NULL || hostaddr[0] == '\0')
        return host != NULL && strcmp(host, "localhost") == 0;
    if (inet_pton(AF_INET, hostaddr, a) == 1)
        return a[0] == 127;
    if (inet_pton(AF_INET6, hostaddr, a) == 1)
        return IN6_IS_ADDR_LOOPBACK((struct in6_addr *)a) ||
               (memcmp(a, v4_mapped, sizeof(v4_mapped)) == 0 && a[12] == 127);
    return false;
}

/* What the server sends outside a statement's result: a handler's RAISE
 * NOTICE, and the FATAL a shutting-down server sends its idle sessions.
 * libpq's default writes it raw to stderr, which is sekalid's log: it
 * would break the log's one-JSON-object-per-line form. */
static void server_said(void *unused, const PGresult *res)
{
    (void)unused;
    const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    if (severity == NULL)
        severity = "NOTICE";
    if (message == NULL)
        message = "(no message)";
    enum sk_log_level level = SK_LOG_INFO;
    if (strcmp(severity, "DEBUG") == 0)
        level = SK_LOG_DEBUG;
    else if (strcmp(severity, "NOTICE") != 0 && strcmp(severity, "INFO") != 0 &&
             strcmp(severity, "LOG") != 0)
        level = SK_LOG_WARN;
    sk_log(level, "PostgreSQL %s: %s", severity, message);
}
