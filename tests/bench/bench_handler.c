/* bench_handler.c - the benchmark's handler: one INSERT per job.
 *
 * Inserts (queue, key, published_us, clock_timestamp()) into
 * sekali_bench.jobs inside the job's transaction. The body is the producer's
 * CLOCK_REALTIME in microseconds as decimal text, so `committed - published`
 * is the job's latency from publish to its effect, computed by PostgreSQL.
 *
 * The INSERT is a prepared statement, as pgbench -M prepared runs it in the
 * baseline (tests/bench/job.pgbench): the comparison should measure sekali's
 * pipeline, not one side parsing and planning the same INSERT every time.
 * The statement lives in the connection, so it is prepared again whenever the
 * host hands over a different connection (sekali reconnects after a failure);
 * the backend pid tells a new connection apart even if libpq reuses the
 * address. A prepared statement is not transactional: rolling back the job
 * transaction it was prepared in does not drop it.
 *
 * Config `work_us: N` makes each job take N microseconds more (a sleep
 * before the INSERT), a handler with work to do (tests/bench/fairness.sh). */
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <sekali/handler.h>

/* Keep in step with the INSERT in tests/bench/job.pgbench. */
#define INSERT_SQL "INSERT INTO sekali_bench.jobs (queue, key, published_us, committed) " \
                   "VALUES ($1, $2, $3, clock_timestamp())"
#define STATEMENT  "sekali_bench_insert"

struct state {
    const struct sekali_host *host;
    PGconn                   *prepared_on;
    int                       prepared_pid;
    long                      work_us;       /* config work_us: a sleep per job */
};

static int bench_init(const struct sekali_host *host, const char *config, void **out)
{
    struct state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return SEKALI_RETRY;
    const char *work = config != NULL ? strstr(config, "work_us:") : NULL;
    if (work != NULL)
        s->work_us = strtol(work + 8, NULL, 10);
    s->host = host;
    *out = s;
    return SEKALI_OK;
}

/* Returns 1 once STATEMENT exists on pg, 0 after set_error(). */
static int prepare(struct state *s, PGconn *pg, struct sekali_ctx *ctx)
{
    if (s->prepared_on == pg && s->prepared_pid == PQbackendPID(pg))
        return 1;
    PGresult *res = PQprepare(pg, STATEMENT, INSERT_SQL, 0, NULL);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (ok) {
        s->prepared_on = pg;
        s->prepared_pid = PQbackendPID(pg);
    } else {
        s->host->set_error(ctx, PQresultErrorMessage(res));
    }
    PQclear(res);
    return ok;
}

static int bench_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    struct state *s = state;
    PGconn *pg = s->host->pg(ctx);
    if (s->work_us > 0) {
        struct timespec t = { .tv_sec = s->work_us / 1000000,
                              .tv_nsec = (s->work_us % 1000000) * 1000 };
        nanosleep(&t, NULL);
    }

    /* The body is not NUL-terminated; anything that is not a plain number
     * becomes 0, which only makes that job's latency meaningless. */
    char published[24] = "0";
    const char *body = job->body;
    size_t digits = 0;
    while (digits < job->body_len && body[digits] >= '0' && body[digits] <= '9')
        digits++;
    if (digits > 0 && digits == job->body_len && digits < sizeof(published)) {
        memcpy(published, body, digits);
        published[digits] = '\0';
    }

    const char *values[] = { job->queue, job->idempotency_key, published };
    /* Sent with the COMMIT (ABI 1.8): at distance a batch's INSERTs cost
     * one round trip, not one each. committed is then the INSERT's time in
     * the COMMIT's pipeline, a little later than a job's own statement. */
    if (s->host->abi_minor >= 8)
        return s->host->queue_sql(ctx, INSERT_SQL, 3, values) == 0 ? SEKALI_OK : SEKALI_RETRY;
    if (!prepare(s, pg, ctx))
        return SEKALI_RETRY;
    PGresult *res = PQexecPrepared(pg, STATEMENT, 3, values, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        s->host->set_error(ctx, PQresultErrorMessage(res));
    PQclear(res);
    return ok ? SEKALI_OK : SEKALI_RETRY;
}

static void bench_fini(void *state)
{
    free(state);
}

SEKALI_HANDLER_DEFINE(.name = "bench", .version = "1", .init = bench_init,
                      .handle = bench_handle, .fini = bench_fini)
