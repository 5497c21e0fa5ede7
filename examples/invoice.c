/* invoice.c - example handler: one invoice row per order.
 *
 * The job body is JSON, {"order_id": "A-1", "amount_cents": 1250}. The
 * handler lets PostgreSQL parse it, so it needs no JSON library, and writes
 * the invoice on the connection sekali hands it: inside the transaction that
 * also marks the job's idempotency key completed. If the worker dies before
 * that COMMIT, neither exists; after it, a redelivery is recognised as a
 * duplicate and this function is not called again.
 *
 * With `totals:` configured and a "customer" in the body, the invoice is
 * also added to the customer's running total. Several jobs may race on that
 * row (different orders of one customer, on a queue with `lock: false`), so
 * the handler reads the row's version and updates it only if the version is
 * still the one it read (optimistic concurrency): when another job got
 * there first, it reports a conflict and sekali runs it again, on the new
 * row, instead of losing one of the two additions.
 *
 * Build (after `make install`; tests/integration/check_handler_build.c runs it):
 *     cc -fPIC -shared -o invoice.so invoice.c $(pkg-config --cflags --libs sekali libpq)
 * Config (the queue's `config:` section; `sekalid -t` checks it):
 *     table: invoices          # where invoices go; created by examples/invoice.sql
 *     totals: customer_totals  # optional; created by examples/invoice.sql */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <sekali/handler.h>

struct invoice_state {
    char insert_sql[512];
    char read_total_sql[256];    /* "" without `totals:` */
    char update_total_sql[512];
};

static int valid_identifier(const char *s)
{
    if (*s == '\0' || isdigit((unsigned char)*s))
        return 0;
    for (; *s != '\0'; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.')
            return 0;
    return 1;
}

/* Reads `key:` into out (default: def). Returns 0, or -1 with err filled. */
static int table_name(const struct sekali_host *host, const char *config, const char *key,
                      const char *def, char *out, size_t size, char *err, size_t err_size)
{
    int n = host->config_get(config, key, out, size);
    if (n < 0)
        snprintf(out, size, "%s", def);
    else if ((size_t)n >= size || !valid_identifier(out)) {
        snprintf(err, err_size, "`%s: %s` is not a table name", key, out);
        return -1;
    }
    return 0;
}

/* Run by `sekalid -t` and before a reload: a bad table name is reported
 * there, and the running workers keep going. */
static int invoice_check(const struct sekali_host *host, const char *config, char *err,
                         size_t err_size)
{
    char table[128];
    if (table_name(host, config, "table", "invoices", table, sizeof(table), err, err_size) != 0 ||
        table_name(host, config, "totals", "", table, sizeof(table), err, err_size) != 0)
        return SEKALI_FAIL;
    return SEKALI_OK;
}

static int invoice_init(const struct sekali_host *host, const char *config, void **state)
{
    char table[128], totals[128], why[256];
    if (table_name(host, config, "table", "invoices", table, sizeof(table), why,
                   sizeof(why)) != 0 ||
        table_name(host, config, "totals", "", totals, sizeof(totals), why, sizeof(why)) != 0) {
        host->log(NULL, SEKALI_LOG_ERROR, "invoice: %s", why);
        return SEKALI_FAIL;
    }
    struct invoice_state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return SEKALI_RETRY;
    snprintf(s->insert_sql, sizeof(s->insert_sql),
             "INSERT INTO %s (order_id, amount_cents, job_id) "
             "SELECT b->>'order_id', (b->>'amount_cents')::bigint, $2 "
             "FROM (SELECT $1::jsonb AS b) AS body RETURNING id",
             table);
    if (totals[0] != '\0') {
        snprintf(s->read_total_sql, sizeof(s->read_total_sql),
                 "SELECT invoiced_cents, version, customer FROM %s "
                 "WHERE customer = $1::jsonb->>'customer'", totals);
        /* The guard: only the version this job read may be replaced. */
        snprintf(s->update_total_sql, sizeof(s->update_total_sql),
                 "UPDATE %s SET invoiced_cents = $2::bigint + "
                 "($3::jsonb->>'amount_cents')::bigint, version = version + 1 "
                 "WHERE customer = $1 AND version = $4::bigint",
                 totals);
    }
    *state = s;
    return SEKALI_OK;
}

/* An error another attempt can cure (a deadlock, a lock or statement
 * timeout, a lost connection) is retried; anything else will recur with
 * this body, so the job fails. */
static int sql_failed(const struct sekali_host *host, struct sekali_ctx *ctx, PGresult *res)
{
    host->set_error(ctx, PQresultErrorMessage(res));
    int status = sekali_sqlstate_transient(PQresultErrorField(res, PG_DIAG_SQLSTATE))
        ? SEKALI_RETRY : SEKALI_FAIL;
    PQclear(res);
    return status;
}

/* Adds the invoice to the customer's total: read, then update only if the
 * row is as read. A body without a customer, or a customer without a row,
 * has no total to keep. */
static int add_to_total(struct invoice_state *s, const struct sekali_job *job,
                        struct sekali_ctx *ctx)
{
    const struct sekali_host *host = job->host;
    PGconn *pg = host->pg(ctx);
    const char *body[] = { job->body };
    PGresult *res = PQexecParams(pg, s->read_total_sql, 1, NULL, body, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
        return sql_failed(host, ctx, res);
    if (PQntuples(res) == 0) {
        PQclear(res);
        return SEKALI_OK;
    }
    char total[32], version[32], customer[256];
    snprintf(total, sizeof(total), "%s", PQgetvalue(res, 0, 0));
    snprintf(version, sizeof(version), "%s", PQgetvalue(res, 0, 1));
    snprintf(customer, sizeof(customer), "%s", PQgetvalue(res, 0, 2));
    PQclear(res);

    /* ... the business logic between reading and writing goes here ... */

    const char *values[] = { customer, total, job->body, version };
    res = PQexecParams(pg, s->update_total_sql, 4, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        return sql_failed(host, ctx, res);
    int updated = atoi(PQcmdTuples(res));
    PQclear(res);
    if (updated == 0)
        return host->conflict(ctx, "customer total changed since it was read");
    return SEKALI_OK;
}

static int invoice_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    struct invoice_state *s = state;
    const struct sekali_host *host = job->host;

    /* The body is NUL-terminated (ABI 1.3): pass it as text. */
    const char *values[] = { job->body, job->job_id };
    PGresult *res = PQexecParams(host->pg(ctx), s->insert_sql, 2, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
        return sql_failed(host, ctx, res);
    char receipt[64];
    int n = snprintf(receipt, sizeof(receipt), "invoice %s", PQgetvalue(res, 0, 0));
    PQclear(res);
    if (s->read_total_sql[0] != '\0') {
        int status = add_to_total(s, job, ctx);
        if (status != SEKALI_OK)
            return status;  /* rolled back by sekali, the invoice with it */
    }
    host->set_result(ctx, receipt, (size_t)n);
    host->log(ctx, SEKALI_LOG_DEBUG, "created %s", receipt);
    return SEKALI_OK;
}

static void invoice_fini(void *state)
{
    free(state);
}

SEKALI_HANDLER_DEFINE(.name = "invoice", .version = "1.1.0", .check = invoice_check,
                      .init = invoice_init, .handle = invoice_handle, .fini = invoice_fini)
