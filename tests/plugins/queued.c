/* queued.c - a test handler whose one INSERT waits for the COMMIT.
 *
 * Each job queues (host->queue_sql(), ABI 1.8) one row into
 * sekali_test.queued_effects (queue, key, gap_ms): gap_ms is how long after
 * the transaction's BEGIN the INSERT ran, on PostgreSQL's clock, so a test
 * counts round trips without a wall clock. The body "dup" inserts the key
 * "taken" instead, which the test has already inserted: a unique violation
 * at the COMMIT, the job's own fault. Built against an older handler.h (or
 * run by an older host) it runs the INSERT at once, the way a handler had
 * to before 1.8, so the suites show what the old way costs.
 *
 * Built as handlers are, with -std=c11 and nothing more. */
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <sekali/handler.h>

#define INSERT_SQL "INSERT INTO sekali_test.queued_effects (queue, key, gap_ms) VALUES " \
                   "($1, $2, extract(epoch FROM clock_timestamp() - now()) * 1000)"

static int queued_init(const struct sekali_host *host, const char *config, void **out)
{
    (void)config;
    *out = (void *)host;
    return SEKALI_OK;
}

static int queued_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    const struct sekali_host *host = state;
    const char *key = job->body_len == 3 && memcmp(job->body, "dup", 3) == 0
                          ? "taken" : job->idempotency_key;
    const char *values[] = { job->queue, key };
#if SEKALI_HANDLER_ABI_MINOR >= 8
    if (host->abi_minor >= 8)
        return host->queue_sql(ctx, INSERT_SQL, 2, values) == 0 ? SEKALI_OK : SEKALI_RETRY;
#endif
    PGresult *res = PQexecParams(host->pg(ctx), INSERT_SQL, 2, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        host->set_error(ctx, PQresultErrorMessage(res));
    PQclear(res);
    return ok ? SEKALI_OK : SEKALI_RETRY;
}

static void queued_fini(void *state)
{
    (void)state;
}

SEKALI_HANDLER_DEFINE(.name = "queued", .version = "test", .init = queued_init,
                      .handle = queued_handle, .fini = queued_fini)
