/* flaky.c - a handler that fails until the test releases it, for the
 * dead-letter tests (tests/integration/check_dlq.c): a job dead-lettered
 * while it failed must, once replayed, run and record its effect once.
 *
 * Until MARKER_DIR/release exists, the body selects how the job fails:
 *   "fail"   return SEKALI_FAIL
 *   "retry"  return SEKALI_RETRY (on every attempt: retries run out)
 *   "crash"  abort(): the worker dies in the handler, a crash of the job
 * Anything else, and every body once released, inserts one row into
 * sekali_test.effects in the job's transaction and returns SEKALI_OK.
 * Config: `marker_dir: DIR`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sekali/handler.h>

struct state {
    const struct sekali_host *host;
    char                      release[600];
};

static int flaky_init(const struct sekali_host *host, const char *config, void **out)
{
    struct state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return SEKALI_RETRY;
    s->host = host;
    const char *p = config != NULL ? strstr(config, "marker_dir:") : NULL;
    if (p != NULL) {
        p += strlen("marker_dir:");
        while (*p == ' ' || *p == '"' || *p == '\'')
            p++;
        int n = (int)strcspn(p, "\"'\r\n");
        snprintf(s->release, sizeof(s->release), "%.*s/release", n, p);
    }
    *out = s;
    return SEKALI_OK;
}

static int body_is(const struct sekali_job *job, const char *word)
{
    return job->body_len == strlen(word) && memcmp(job->body, word, job->body_len) == 0;
}

static int flaky_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    struct state *s = state;
    if (s->release[0] != '\0' && access(s->release, F_OK) != 0) {
        if (body_is(job, "fail")) {
            s->host->set_error(ctx, "flaky: failing until released");
            return SEKALI_FAIL;
        }
        if (body_is(job, "retry")) {
            s->host->set_error(ctx, "flaky: retrying until released");
            return SEKALI_RETRY;
        }
        if (body_is(job, "crash"))
            abort();
    }
    char pid[16], fence[24], attempt[16];
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    snprintf(fence, sizeof(fence), "%lld", (long long)job->fence);
    snprintf(attempt, sizeof(attempt), "%u", job->delivery_attempt);
    const char *values[] = { job->queue, job->idempotency_key, job->job_id, pid, fence, attempt };
    PGresult *res = PQexecParams(s->host->pg(ctx),
                                 "INSERT INTO sekali_test.effects "
                                 "(queue, idempotency_key, job_id, pid, fence, attempt) "
                                 "VALUES ($1, $2, $3, $4, $5, $6)",
                                 6, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        s->host->set_error(ctx, PQresultErrorMessage(res));
    PQclear(res);
    return ok ? SEKALI_OK : SEKALI_RETRY;
}

static void flaky_fini(void *state)
{
    free(state);
}

SEKALI_HANDLER_DEFINE(.name = "flaky", .version = "test", .init = flaky_init,
                      .handle = flaky_handle, .fini = flaky_fini)
