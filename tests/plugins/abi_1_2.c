/* abi_1_2.c - a handler built against the ABI 1.2 header (handler_1_2.h, a
 * frozen copy), written the way 1.2 required: init() stashes the host,
 * the body is copied before being read as text, and follow-up jobs go
 * through the nine-argument enqueue(). Each run inserts one row into
 * sekali_test.effects; a body "chain:N" with N > 0 also enqueues
 * "chain:N-1" with idempotency key "<key>+". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "handler_1_2.h"

#if SEKALI_HANDLER_ABI_MINOR != 2
#error "abi_1_2.c must be built against the 1.2 header"
#endif

static int old_init(const struct sekali_host *host, const char *config, void **state)
{
    (void)config;
    *state = (void *)host;
    return SEKALI_OK;
}

static int old_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    const struct sekali_host *host = state;
    char body[64];
    size_t n = job->body_len < sizeof(body) - 1 ? job->body_len : sizeof(body) - 1;
    memcpy(body, job->body, n);
    body[n] = '\0';

    char pid[16], fence[24], attempt[16];
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    snprintf(fence, sizeof(fence), "%lld", (long long)job->fence);
    snprintf(attempt, sizeof(attempt), "%u", job->delivery_attempt);
    const char *values[] = { job->queue, job->idempotency_key, job->job_id, pid, fence, attempt };
    PGresult *res = PQexecParams(host->pg(ctx),
                                 "INSERT INTO sekali_test.effects "
                                 "(queue, idempotency_key, job_id, pid, fence, attempt) "
                                 "VALUES ($1, $2, $3, $4, $5, $6)",
                                 6, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        host->set_error(ctx, PQresultErrorMessage(res));
    PQclear(res);
    if (!ok)
        return SEKALI_RETRY;
    if (strncmp(body, "chain:", 6) == 0 && atoi(body + 6) > 0) {
        char next[32], key[600];
        int len = snprintf(next, sizeof(next), "chain:%d", atoi(body + 6) - 1);
        snprintf(key, sizeof(key), "%s+", job->idempotency_key);
        if (host->abi_minor < 2 ||
            host->enqueue(ctx, job->queue, job->job_type, next, (size_t)len, key, NULL,
                          NULL, 0) != 0)
            return SEKALI_RETRY;
    }
    host->set_result(ctx, "done", 4);
    return SEKALI_OK;
}

SEKALI_HANDLER_DEFINE(.name = "abi_1_2", .version = "1.2", .init = old_init,
                      .handle = old_handle)
