/* invoice.c - example handler: one invoice row per order.
 *
 * The job body is JSON, {"order_id": "A-1", "amount_cents": 1250}. The
 * handler lets PostgreSQL parse it, so it needs no JSON library, and writes
 * the invoice on the connection sekali hands it: inside the transaction that
 * also marks the job's idempotency key completed. If the worker dies before
 * that COMMIT, neither exists; after it, a redelivery is recognised as a
 * duplicate and this function is not called again.
 *
 * Build (after `make install`; tests/integration/check_handler_build.c runs it):
 *     cc -fPIC -shared -o invoice.so invoice.c $(pkg-config --cflags --libs sekali libpq)
 * Config (the queue's `config:` section):
 *     table: invoices     # where invoices go; created by examples/invoice.sql */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <sekali/handler.h>

struct invoice_state {
    const struct sekali_host *host;
    char                      insert_sql[512];
};

/* Reads a top-level `key: value` scalar from the YAML text sekali passes to
 * init(). A handler with richer configuration would parse it with libyaml. */
static int config_scalar(const char *config, const char *key, char *out, size_t out_size)
{
    size_t key_len = strlen(key);
    for (const char *line = config; line != NULL && *line != '\0';) {
        if (strncmp(line, key, key_len) == 0 && line[key_len] == ':') {
            const char *v = line + key_len + 1;
            while (*v == ' ')
                v++;
            size_t n = strcspn(v, "\r\n");
            if (n == 0 || n >= out_size)
                return -1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 0;
        }
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    return -1;
}

static int valid_identifier(const char *s)
{
    if (*s == '\0' || isdigit((unsigned char)*s))
        return 0;
    for (; *s != '\0'; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.')
            return 0;
    return 1;
}

static int invoice_init(const struct sekali_host *host, const char *config, void **state)
{
    char table[128] = "invoices";
    if (config != NULL && config_scalar(config, "table", table, sizeof(table)) != 0 &&
        strstr(config, "table:") != NULL) {
        host->log(NULL, SEKALI_LOG_ERROR, "invoice: bad `table` in the handler config");
        return SEKALI_FAIL;
    }
    if (!valid_identifier(table)) {
        host->log(NULL, SEKALI_LOG_ERROR, "invoice: `%s` is not a table name", table);
        return SEKALI_FAIL;
    }
    struct invoice_state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return SEKALI_RETRY;
    s->host = host;
    snprintf(s->insert_sql, sizeof(s->insert_sql),
             "INSERT INTO %s (order_id, amount_cents, job_id) "
             "SELECT b->>'order_id', (b->>'amount_cents')::bigint, $2 "
             "FROM (SELECT $1::jsonb AS b) AS body RETURNING id",
             table);
    *state = s;
    return SEKALI_OK;
}

static int invoice_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    struct invoice_state *s = state;
    PGconn *pg = s->host->pg(ctx);

    /* The body is not NUL-terminated: pass it with its length, as text. */
    char *body = malloc(job->body_len + 1);
    if (body == NULL)
        return SEKALI_RETRY;
    memcpy(body, job->body, job->body_len);
    body[job->body_len] = '\0';

    const char *values[] = { body, job->job_id };
    PGresult *res = PQexecParams(pg, s->insert_sql, 2, NULL, values, NULL, NULL, 0);
    free(body);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        /* A body PostgreSQL cannot read as an order will never succeed. */
        s->host->set_error(ctx, PQresultErrorMessage(res));
        PQclear(res);
        return SEKALI_FAIL;
    }
    char receipt[64];
    int n = snprintf(receipt, sizeof(receipt), "invoice %s", PQgetvalue(res, 0, 0));
    PQclear(res);
    s->host->set_result(ctx, receipt, (size_t)n);
    s->host->log(ctx, SEKALI_LOG_DEBUG, "created %s", receipt);
    return SEKALI_OK;
}

static void invoice_fini(void *state)
{
    free(state);
}

SEKALI_HANDLER_DEFINE(.name = "invoice", .version = "1.0.0", .init = invoice_init,
                      .handle = invoice_handle, .fini = invoice_fini)
