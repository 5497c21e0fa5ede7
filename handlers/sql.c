/* sql.c - the stock SQL handler: one statement, run exactly once per job.
 *
 * The queue's `config:` names a statement; each job runs it on the job's own
 * connection, inside the transaction that also records the job completed
 * (in a savepoint of it with `batch:`), so the statement's effect and the
 * completion commit together or not at all: a PL/pgSQL function becomes a
 * job handler without a line of C.
 *
 *     handler: sql
 *     config:
 *       statement: "SELECT app.create_invoice(:body::jsonb, :idempotency_key)"
 *
 * Named parameters (:body, ...) are rewritten to $n and bound as text, never
 * put into the SQL: a job's values cannot change what the statement does.
 * The scanner that finds them skips what is not SQL code (quoted strings
 * and identifiers, comments, dollar-quoted bodies) and the `::` of a cast.
 * The statement is prepared once per connection; the first column of its
 * first row, if any, is the job's result. Rows are read one at a time, and
 * more than `max_rows:` (10 000 unless configured) fail the job.
 *
 * Outcome by SQLSTATE: the transient classes of sekali_sqlstate_transient()
 * retry, and every other error fails the job with the server's message,
 * detail and SQLSTATE. A function decides for itself with SQLSTATEs of
 * class SK, which PostgreSQL leaves to applications (it uses none of the
 * classes from S to Z): RAISE ... USING ERRCODE = 'SKRTY' retries, 'SKFAL'
 * fails, 'SKCNF' reports an optimistic-concurrency conflict. They are codes
 * and not config lists so that the decision stays with the code that knows
 * why, and a new reason in the function needs no change of sekali's config.
 *
 * Built like examples/: against sekali/handler.h and libpq only. */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <sekali/handler.h>

#define STATEMENT_NAME "sekali_sql"
#define MAX_PARAMS     16
#define MAX_STATEMENT  (64 * 1024)
#define MAX_SHIFTS     64         /* parameter uses whose positions are mapped back */
#define MAX_MESSAGE    400        /* of the server's error, in the dead letter */
#define DEFAULT_ROWS   10000      /* max_rows: rows a statement may return */
#define LIMIT_ROWS     100000000

/* What a parameter binds. Adding one: a line here and one in param_value(). */
enum param {
    P_JOB_ID, P_IDEMPOTENCY_KEY, P_RESOURCE_KEY, P_JOB_TYPE, P_ATTEMPT, P_BODY,
    P_CONTENT_TYPE, P_HEADERS, P_FENCE, P_QUEUE, N_PARAM_KINDS
};
static const char *const param_names[N_PARAM_KINDS] = {
    "job_id", "idempotency_key", "resource_key", "job_type", "attempt", "body",
    "content_type", "headers", "fence", "queue",
};

/* Where a parameter was rewritten: to map the server's positions, which
 * count in the rewritten text, back to the statement as configured. */
struct shift {
    size_t at;     /* offset in the rewritten statement, after the $n */
    long   delta;  /* what to add to offsets from there on */
};

struct sql_state {
    char       *sql;                 /* the statement with $1..$n */
    char       *statement;           /* ... and as configured */
    struct shift shifts[MAX_SHIFTS];
    int         n_shifts;
    enum param  params[MAX_PARAMS];  /* $i+1 binds params[i] */
    int         n_params;
    PGconn     *prepared_on;         /* the connection it is prepared on, and */
    int         prepared_pid;        /* its server process: a new one needs it again */
    long        max_rows;            /* more rows than this fail the job */
};

struct rewrite {
    char       *sql;
    enum param  params[MAX_PARAMS];
    int         n_params;
    struct shift shifts[MAX_SHIFTS];
    int         n_shifts;
    size_t      error_at;            /* offset of the mistake in the statement */
    char        error[256];
};

static int rewrite(const char *in, struct rewrite *out);
static const char *second_statement(const char *start, const char *p, struct rewrite *out);

static int ident_start(int c)
{
    return isalpha(c) || c == '_' || c >= 0x80;
}

static int ident_char(int c)
{
    return isalnum(c) || c == '_' || c >= 0x80;
}

/* Where a dollar-quote opening at s ($$ or $tag$) ends, or NULL if s is no
 * such opening (a "$1" is a positional parameter, "$" alone an operator
 * character). */
static const char *dollar_tag_end(const char *s)
{
    const char *p = s + 1;
    if (*p != '$' && !ident_start((unsigned char)*p))
        return NULL;
    while (*p != '$') {
        if (!ident_char((unsigned char)*p))
            return NULL;
        p++;
    }
    return p + 1;
}

/* Skips what cannot hold a parameter, starting at p: returns where the
 * quoted or commented part ends, p itself if none starts there, or NULL
 * if it never ends (the offset of the opening goes to out). */
static const char *skip_non_code(const char *start, const char *p, struct rewrite *out)
{
    const char *open = p;
    if (p[0] == '\'' || p[0] == '"') {
        char q = p[0];
        /* E'...' takes backslash escapes; the E must start a word. */
        int escapes = q == '\'' && p > start && (p[-1] == 'E' || p[-1] == 'e') &&
                      (p - 1 == start || !ident_char((unsigned char)p[-2]));
        for (p++; *p != '\0'; p++) {
            if (escapes && *p == '\\' && p[1] != '\0')
                p++;
            else if (*p == q && p[1] == q)
                p++;
            else if (*p == q)
                return p + 1;
        }
        snprintf(out->error, sizeof(out->error), "unterminated %s",
                 q == '\'' ? "quoted string" : "quoted identifier");
    } else if (p[0] == '-' && p[1] == '-') {
        while (*p != '\0' && *p != '\n')
            p++;
        return p;
    } else if (p[0] == '/' && p[1] == '*') {
        int depth = 1;  /* PostgreSQL's block comments nest */
        for (p += 2; *p != '\0'; p++) {
            if (p[0] == '/' && p[1] == '*') {
                depth++;
                p++;
            } else if (p[0] == '*' && p[1] == '/') {
                p++;
                if (--depth == 0)
                    return p + 1;
            }
        }
        snprintf(out->error, sizeof(out->error), "unterminated comment");
    } else if (p[0] == '$' && (p == start || !ident_char((unsigned char)p[-1])) &&
               dollar_tag_end(p) != NULL) {
        const char *tag_end = dollar_tag_end(p);
        size_t tag_len = (size_t)(tag_end - p);
        const char *close;
        for (close = tag_end; (close = strchr(close, '$')) != NULL; close++)
            if (strncmp(close, p, tag_len) == 0)
                return close + tag_len;
        snprintf(out->error, sizeof(out->error), "unterminated dollar-quoted string %.*s",
                 (int)tag_len, p);
    } else {
        return p;
    }
    out->error_at = (size_t)(open - start);
    return NULL;
}

/* After a ';' at p - 1: where a second statement starts (out->error set),
 * or NULL if only blanks, comments and semicolons follow. PostgreSQL
 * refuses to prepare two statements (SQLSTATE 42601) whatever the
 * database holds, so this is said by `sekalid -t`, at its position,
 * instead of by a worker that could never take a job. */
static const char *second_statement(const char *start, const char *p, struct rewrite *out)
{
    for (;;) {
        while (isspace((unsigned char)*p) || *p == ';')
            p++;
        if (!((p[0] == '-' && p[1] == '-') || (p[0] == '/' && p[1] == '*')))
            break;
        const char *end = skip_non_code(start, p, out);
        if (end == NULL)
            return NULL;  /* an unterminated comment: the main loop says so */
        p = end;
    }
    if (*p == '\0')
        return NULL;
    out->error_at = (size_t)(p - start);
    snprintf(out->error, sizeof(out->error), "a second statement: the sql handler runs one "
             "(put several steps in a function, and call that)");
    return p;
}

/* Rewrites in's :name parameters to $n. Returns 0, or -1 with out->error
 * and out->error_at set. */
static int rewrite(const char *in, struct rewrite *out)
{
    size_t len = strlen(in);
    memset(out, 0, sizeof(*out));
    if (len == 0 || len > MAX_STATEMENT) {
        snprintf(out->error, sizeof(out->error), "the statement is empty or longer than %d bytes",
                 MAX_STATEMENT);
        return -1;
    }
    /* Each ":name" (2+ bytes) becomes "$n" (at most 3): room for all. */
    size_t cap = len + len / 2 + 2;
    char *sql = malloc(cap), *w = sql;
    if (sql == NULL) {
        snprintf(out->error, sizeof(out->error), "out of memory");
        return -1;
    }
    const char *p = in;
    while (*p != '\0') {
        const char *end = skip_non_code(in, p, out);
        if (end == NULL)
            goto fail;
        if (end != p) {
            memcpy(w, p, (size_t)(end - p));
            w += end - p;
            p = end;
            continue;
        }
        if (p[0] == ':' && p[1] == ':') {  /* a cast, not a parameter */
            *w++ = *p++;
            *w++ = *p++;
            continue;
        }
        if (p[0] == ';' && second_statement(in, p + 1, out) != NULL)
            goto fail;
        if (p[0] == '$' && isdigit((unsigned char)p[1])) {
            out->error_at = (size_t)(p - in);
            snprintf(out->error, sizeof(out->error), "positional parameter %.*s: name it "
                     "instead (:body, :idempotency_key, ...)", p[2] != '\0' ? 3 : 2, p);
            goto fail;
        }
        if (p[0] != ':' || !ident_start((unsigned char)p[1])) {
            *w++ = *p++;
            continue;
        }
        const char *name = p + 1, *name_end = name;
        while (ident_char((unsigned char)*name_end))
            name_end++;
        size_t n = (size_t)(name_end - name);
        int kind = -1;
        for (int k = 0; k < N_PARAM_KINDS; k++)
            if (strlen(param_names[k]) == n && strncmp(param_names[k], name, n) == 0)
                kind = k;
        if (kind < 0) {
            out->error_at = (size_t)(p - in);
            snprintf(out->error, sizeof(out->error), "unknown parameter :%.*s (known: :job_id, "
                     ":idempotency_key, :resource_key, :job_type, :attempt, :body, "
                     ":content_type, :headers, :fence, :queue)", n > 64 ? 64 : (int)n, name);
            goto fail;
        }
        /* The same name twice binds the same value: one $n for both. */
        int index = -1;
        for (int i = 0; i < out->n_params; i++)
            if (out->params[i] == (enum param)kind)
                index = i;
        if (index < 0) {
            if (out->n_params == MAX_PARAMS) {
                out->error_at = (size_t)(p - in);
                snprintf(out->error, sizeof(out->error), "too many parameters");
                goto fail;
            }
            index = out->n_params++;
            out->params[index] = (enum param)kind;
        }
        w += sprintf(w, "$%d", index + 1);
        p = name_end;
        if (out->n_shifts < MAX_SHIFTS)
            out->shifts[out->n_shifts++] = (struct shift){
                .at = (size_t)(w - sql), .delta = (long)(p - in) - (long)(w - sql) };
    }
    *w = '\0';
    out->sql = sql;
    return 0;
fail:
    free(sql);
    return -1;
}

/* Reads and rewrites the statement; the error names the position in the
 * configuration file when the host can say it (ABI 1.4). */
static int load_statement(const struct sekali_host *host, const char *config,
                          struct rewrite *out, char *err, size_t err_size)
{
    char *statement = malloc(MAX_STATEMENT + 1);
    if (statement == NULL) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    int n = host->config_get(config, "statement", statement, MAX_STATEMENT + 1);
    int rc = -1;
    if (n < 0)
        snprintf(err, err_size, "`statement:` is missing: the SQL each job runs, e.g. "
                 "\"SELECT app.create_invoice(:body::jsonb, :idempotency_key)\"");
    else if (n > MAX_STATEMENT)
        snprintf(err, err_size, "`statement:` is longer than %d bytes", MAX_STATEMENT);
    else if (rewrite(statement, out) == 0)
        rc = 0;
    else {
        char where[512] = "";
        if (host->abi_minor >= 4 &&
            host->config_where(config, "statement", out->error_at, where, sizeof(where)) > 0)
            snprintf(err, err_size, "%s: statement: %s", where, out->error);
        else
            snprintf(err, err_size, "statement, at offset %zu: %s", out->error_at, out->error);
    }
    free(statement);
    return rc;
}

/* `max_rows:`, 1 to 100 000 000; DEFAULT_ROWS when absent. */
static int load_max_rows(const struct sekali_host *host, const char *config, long *out,
                         char *err, size_t err_size)
{
    char text[32], *end;
    int n = host->config_get(config, "max_rows", text, sizeof(text));
    *out = DEFAULT_ROWS;
    if (n < 0)
        return 0;
    errno = 0;
    long v = n < (int)sizeof(text) ? strtol(text, &end, 10) : 0;
    if (n >= (int)sizeof(text) || errno != 0 || end == text || *end != '\0' || v < 1 ||
        v > LIMIT_ROWS) {
        snprintf(err, err_size, "`max_rows:` must be a whole number from 1 to %d", LIMIT_ROWS);
        return -1;
    }
    *out = v;
    return 0;
}

static int sql_check(const struct sekali_host *host, const char *config, char *err,
                     size_t err_size)
{
    struct rewrite r;
    if (host->abi_minor < 4) {
        snprintf(err, err_size, "the sql handler needs sekalid with handler ABI 1.4 or later");
        return SEKALI_FAIL;
    }
    char mode[32];
    if (host->config_queue(config, "mode", mode, sizeof(mode)) > 0 &&
        strcmp(mode, "transactional") != 0) {
        snprintf(err, err_size, "the sql handler runs in `mode: transactional` only: its "
                 "statement must commit with the job's completion");
        return SEKALI_FAIL;
    }
    long rows;
    if (load_statement(host, config, &r, err, err_size) != 0)
        return SEKALI_FAIL;
    free(r.sql);
    return load_max_rows(host, config, &rows, err, err_size) == 0 ? SEKALI_OK : SEKALI_FAIL;
}

static int sql_init(const struct sekali_host *host, const char *config, void **state)
{
    struct rewrite r;
    char why[768];
    long max_rows;
    if (load_max_rows(host, config, &max_rows, why, sizeof(why)) != 0 ||
        load_statement(host, config, &r, why, sizeof(why)) != 0) {
        host->log(NULL, SEKALI_LOG_ERROR, "sql handler: %s", why);
        return SEKALI_FAIL;
    }
    struct sql_state *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        free(r.sql);
        return SEKALI_RETRY;
    }
    char *statement = malloc(MAX_STATEMENT + 1);
    if (statement == NULL) {
        free(r.sql);
        free(s);
        return SEKALI_RETRY;
    }
    host->config_get(config, "statement", statement, MAX_STATEMENT + 1);
    s->statement = statement;
    s->sql = r.sql;
    memcpy(s->params, r.params, sizeof(s->params));
    s->n_params = r.n_params;
    memcpy(s->shifts, r.shifts, sizeof(s->shifts));
    s->n_shifts = r.n_shifts;
    s->max_rows = max_rows;
    *state = s;
    return SEKALI_OK;
}

/* The server's words, bounded and with control characters (a hostile
 * body's NULs and newlines, quoted back in a JSON error) made visible. */
static void describe(PGresult *res, const char *what, char *out, size_t size)
{
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    const char *message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    const char *detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
    char text[MAX_MESSAGE + 1];
    int n = snprintf(text, sizeof(text), "%s%s%s", message != NULL ? message
                     : PQresultErrorMessage(res), detail != NULL ? " (detail: " : "",
                     detail != NULL ? detail : "");
    if (detail != NULL && n > 0 && (size_t)n < sizeof(text) - 1) {
        text[n] = ')';
        text[n + 1] = '\0';
    }
    for (char *c = text; *c != '\0'; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = ' ';
    snprintf(out, size, "%s failed: SQLSTATE %s: %s", what, state != NULL ? state : "none",
             text);
}

/* Prepares the statement on pg unless it already is. Returns 0, or -1 with
 * res holding the server's answer (the caller clears it) or NULL. */
static int prepare(struct sql_state *s, PGconn *pg, PGresult **res)
{
    *res = NULL;
    if (s->prepared_on == pg && s->prepared_pid == PQbackendPID(pg))
        return 0;
    *res = PQprepare(pg, STATEMENT_NAME, s->sql, 0, NULL);
    if (PQresultStatus(*res) != PGRES_COMMAND_OK) {
        /* A statement of that name from a handle() that failed halfway: gone
         * on a new server process, so only on this one is it dropped. */
        const char *state = PQresultErrorField(*res, PG_DIAG_SQLSTATE);
        if (state == NULL || strcmp(state, "42P05") != 0)
            return -1;
        PQclear(*res);
        *res = NULL;
        if (PQtransactionStatus(pg) != PQTRANS_IDLE)
            return -1;
        PQclear(PQexec(pg, "DEALLOCATE " STATEMENT_NAME));
        *res = PQprepare(pg, STATEMENT_NAME, s->sql, 0, NULL);
        if (PQresultStatus(*res) != PGRES_COMMAND_OK)
            return -1;
    }
    PQclear(*res);
    *res = NULL;
    s->prepared_on = pg;
    s->prepared_pid = PQbackendPID(pg);
    return 0;
}

/* Before the worker takes a job: a statement that does not prepare (its
 * function not created yet, a typo) keeps the queue's jobs waiting. */
static int sql_ready(void *state, PGconn *pg, char *err, size_t err_size)
{
    struct sql_state *s = state;
    PGresult *res;
    if (pg == NULL || PQstatus(pg) != CONNECTION_OK)
        return SEKALI_OK;  /* the worker's own reconnect comes first */
    if (prepare(s, pg, &res) == 0)
        return SEKALI_OK;
    /* The connection broke under the prepare: that is for the worker's
     * reconnect to mend, which only a job's path sets off. */
    if (PQstatus(pg) != CONNECTION_OK) {
        PQclear(res);
        return SEKALI_OK;
    }
    char why[512];
    if (res != NULL) {
        describe(res, "preparing the statement", why, sizeof(why));
        const char *pos = PQresultErrorField(res, PG_DIAG_STATEMENT_POSITION);
        if (pos != NULL && atol(pos) > 0) {
            /* The server counts in the rewritten text, from 1. */
            size_t at = (size_t)atol(pos) - 1;
            long delta = 0;
            for (int i = 0; i < s->n_shifts && s->shifts[i].at <= at; i++)
                delta = s->shifts[i].delta;
            size_t orig = (size_t)((long)at + delta);
            if (orig > strlen(s->statement))
                orig = strlen(s->statement);
            snprintf(err, err_size, "%s, at character %zu of the statement: \"%.60s\"", why,
                     orig + 1, s->statement + orig);
        } else
            snprintf(err, err_size, "%s", why);
    } else {
        snprintf(err, err_size, "preparing the statement failed: %s", PQerrorMessage(pg));
    }
    PQclear(res);
    return SEKALI_RETRY;
}

static const char *param_value(const struct sekali_job *job, struct sekali_ctx *ctx,
                               enum param p, char *num, size_t num_size)
{
    switch (p) {
    case P_JOB_ID:          return job->job_id;
    case P_IDEMPOTENCY_KEY: return job->idempotency_key;
    case P_RESOURCE_KEY:    return job->resource_key;
    case P_JOB_TYPE:        return job->job_type;
    case P_BODY:            return job->body;
    case P_CONTENT_TYPE:    return job->content_type;
    case P_QUEUE:           return job->queue;
    case P_ATTEMPT:
        snprintf(num, num_size, "%u", (unsigned)job->delivery_attempt);
        return num;
    case P_FENCE:
        snprintf(num, num_size, "%lld", (long long)job->fence);
        return num;
    case P_HEADERS:  /* NULL (out of memory) is checked by the caller */
        return job->host->headers_json(ctx);
    case N_PARAM_KINDS:
        break;
    }
    return "";
}

/* What an error means for the job: the function's own SK codes first,
 * then the transient classes. */
static int outcome(const struct sekali_host *host, struct sekali_ctx *ctx, PGresult *res,
                   struct sql_state *s)
{
    /* Copied: the field lives in res. */
    char code[6] = "";
    const char *field = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (field != NULL)
        snprintf(code, sizeof(code), "%s", field);
    const char *state = field != NULL ? code : NULL;
    char why[512];
    describe(res, "statement", why, sizeof(why));
    PQclear(res);
    host->set_error(ctx, why);
    if (state != NULL && strcmp(state, "SKCNF") == 0)
        return host->conflict(ctx, why);
    if (state != NULL && strcmp(state, "SKRTY") == 0)
        return SEKALI_RETRY;
    if (state != NULL && strcmp(state, "SKFAL") == 0)
        return SEKALI_FAIL;
    /* The prepared statement went away under us (DISCARD ALL by a pooler):
     * prepare it again on the next attempt. */
    if (state != NULL && strcmp(state, "26000") == 0) {
        s->prepared_on = NULL;
        return SEKALI_RETRY;
    }
    return sekali_sqlstate_transient(state) ? SEKALI_RETRY : SEKALI_FAIL;
}

/* The job's trace context for the rest of its transaction, as settings
 * local to it: a statement reads current_setting('sekali.traceparent',
 * true), and sekali.enqueue() writes it on the jobs the statement enqueues
 * (sql/031), so they continue the trace. Settings rather than
 * application_name: they end with the transaction (the next job cannot
 * inherit them), hold the tracestate too, and are not cut at 63 bytes. Set
 * only when the host gives a trace (ABI 1.7), and sent ahead of the
 * statement in the same round trip (run()). */
#define SET_TRACE "SELECT set_config('sekali.traceparent', $1, true), " \
                  "set_config('sekali.tracestate', $2, true)"

/* Whether the job has a trace context; then trace[] holds it. */
static bool trace_of(const struct sekali_job *job, const char *trace[2])
{
    bool traced = job->host->abi_minor >= 7 &&
                  job->struct_size >= offsetof(struct sekali_job, tracestate) +
                                          sizeof(job->tracestate) &&
                  job->traceparent != NULL && job->tracestate != NULL;
    if (traced) {
        trace[0] = job->traceparent;
        trace[1] = job->tracestate;
    }
    return traced;
}

/* Asks the server to stop the statement; what it sent meanwhile is still
 * read (and dropped) by the caller. */
static void cancel(PGconn *pg)
{
    char buf[256];
    PGcancel *c = PQgetCancel(pg);
    if (c != NULL)
        PQcancel(c, buf, sizeof(buf));
    PQfreeCancel(c);
}

/* Sends the trace settings (when traced) and the prepared statement in one
 * round trip: libpq's pipeline mode, neither waiting for the other's
 * answer, in the job's transaction (the pipeline's sync ends no
 * transaction block). A setting the server refuses aborts the statement
 * unrun. 0, or -1 with the error set. */
static int send_statement(struct sql_state *s, const struct sekali_host *host,
                          struct sekali_ctx *ctx, PGconn *pg, const char *const *values,
                          const char *const *trace)
{
    bool sent = PQenterPipelineMode(pg) == 1 &&
                (trace == NULL ||
                 PQsendQueryParams(pg, SET_TRACE, 2, NULL, trace, NULL, NULL, 0) == 1) &&
                PQsendQueryPrepared(pg, STATEMENT_NAME, s->n_params, values, NULL, NULL, 0) == 1 &&
                PQpipelineSync(pg) == 1;
    if (sent)
        return 0;
    char why[512];
    snprintf(why, sizeof(why), "sending the statement failed: %s", PQerrorMessage(pg));
    host->set_error(ctx, why);
    PQexitPipelineMode(pg);
    return -1;
}

/* The trace settings' answer: NULL when they were set, else the failed
 * result (the caller's to clear). */
static PGresult *trace_answer(PGconn *pg)
{
    PGresult *res = PQgetResult(pg);
    if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK) {
        PQclear(res);
        res = NULL;
    }
    PGresult *end;
    while ((end = PQgetResult(pg)) != NULL)
        PQclear(end);
    return res;
}

/* Runs the statement one row at a time (libpq's single-row mode, asked
 * for the statement once the settings' answer is read): only the first
 * row's first column is the job's result, and a statement that returns
 * millions of rows would otherwise be held whole in the worker's memory.
 * Past s->max_rows the statement is cancelled and the job fails, its
 * effect rolled back with its transaction: a statement that returns more
 * rows than anyone reads is a mistake to show, not to wait on. */
static int run(struct sql_state *s, const struct sekali_host *host, struct sekali_ctx *ctx,
               PGconn *pg, const char *const *values, const char *const *trace)
{
    char why[512];
    if (send_statement(s, host, ctx, pg, values, trace) != 0)
        return SEKALI_RETRY;
    PGresult *res, *failed = trace != NULL ? trace_answer(pg) : NULL;
    bool trace_failed = failed != NULL;
    PQsetSingleRowMode(pg);  /* if refused, rows come whole: still correct */
    long rows = 0;
    int too_large = -1;
    while ((res = PQgetResult(pg)) != NULL) {
        ExecStatusType st = PQresultStatus(res);
        int n = st == PGRES_SINGLE_TUPLE || st == PGRES_TUPLES_OK ? PQntuples(res) : 0;
        if (rows == 0 && n > 0 && PQnfields(res) > 0 && !PQgetisnull(res, 0, 0) &&
            host->set_result(ctx, PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0)) != 0)
            too_large = PQgetlength(res, 0, 0);
        if (rows <= s->max_rows && rows + n > s->max_rows)
            cancel(pg);
        rows += n;
        if (st != PGRES_SINGLE_TUPLE && st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK &&
            failed == NULL)
            failed = res;
        else
            PQclear(res);
    }
    /* The sync's answer; none if the connection went (the host then finds
     * it broken, and dials again). */
    res = PQgetResult(pg);
    bool synced = res != NULL && PQresultStatus(res) == PGRES_PIPELINE_SYNC;
    PQclear(res);
    if (synced)
        PQexitPipelineMode(pg);
    if (!trace_failed && rows > s->max_rows) {
        PQclear(failed);
        snprintf(why, sizeof(why), "the statement returned more than %ld rows (max_rows), and "
                 "only the first row's first column is the job's result: return one row (a "
                 "LIMIT), or raise max_rows", s->max_rows);
        host->set_error(ctx, why);
        return SEKALI_FAIL;
    }
    if (failed != NULL)
        return outcome(host, ctx, failed, s);
    if (!synced) {
        snprintf(why, sizeof(why), "the statement's answer was cut off: %s", PQerrorMessage(pg));
        host->set_error(ctx, why);
        return SEKALI_RETRY;
    }
    if (too_large >= 0) {
        snprintf(why, sizeof(why), "the statement's result (%d bytes) is larger than a saved "
                 "result may be", too_large);
        host->set_error(ctx, why);
        return SEKALI_FAIL;
    }
    return SEKALI_OK;
}

static int sql_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    struct sql_state *s = state;
    const struct sekali_host *host = job->host;
    PGconn *pg = host->pg(ctx);
    char why[512];

    /* Only inside the job's transaction is the effect once: in external
     * mode the statement would commit on its own. check() cannot see the
     * mode, so the first job says it. */
    if (pg == NULL || PQtransactionStatus(pg) != PQTRANS_INTRANS) {
        host->set_error(ctx, "the sql handler needs `mode: transactional`: its statement must "
                             "commit with the job's completion");
        return SEKALI_FAIL;
    }
    char nums[MAX_PARAMS][24];
    const char *values[MAX_PARAMS];
    for (int i = 0; i < s->n_params; i++) {
        values[i] = param_value(job, ctx, s->params[i], nums[i], sizeof(nums[i]));
        if (values[i] == NULL) {
            host->set_error(ctx, "out of memory building the headers' JSON");
            return SEKALI_RETRY;
        }
        /* Text parameters end at a NUL: a body holding one would be cut
         * short, silently. */
        if (s->params[i] == P_BODY && strlen(job->body) != job->body_len) {
            snprintf(why, sizeof(why), "the body holds a NUL byte at offset %zu: it cannot be "
                     "passed as text to the statement", strlen(job->body));
            host->set_error(ctx, why);
            return SEKALI_FAIL;
        }
    }
    PGresult *res;
    if (prepare(s, pg, &res) != 0) {
        /* The transaction is aborted now: this attempt is over. Retried,
         * and the worker's next ready() holds further jobs until the
         * statement prepares again. */
        if (res != NULL)
            describe(res, "preparing the statement", why, sizeof(why));
        else
            snprintf(why, sizeof(why), "preparing the statement failed: %s", PQerrorMessage(pg));
        PQclear(res);
        host->set_error(ctx, why);
        s->prepared_on = NULL;
        return SEKALI_RETRY;
    }
    const char *trace[2];
    return run(s, host, ctx, pg, values, trace_of(job, trace) ? trace : NULL);
}

static void sql_fini(void *state)
{
    struct sql_state *s = state;
    free(s->sql);
    free(s->statement);
    free(s);
}

SEKALI_HANDLER_DEFINE(.name = "sql", .version = "1.0.0", .check = sql_check, .init = sql_init,
                      .handle = sql_handle, .fini = sql_fini, .ready = sql_ready)
