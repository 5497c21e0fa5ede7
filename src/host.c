/* host.c - the sekali_host vtable: the only way a handler reaches the daemon.
 *
 * Everything a handler hands us is copied before handle() returns, so its
 * buffers never need to outlive the call. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "host.h"
#include "pg.h"

static void host_log(struct sekali_ctx *ctx, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static struct pg_conn *host_pg(struct sekali_ctx *ctx);
static int host_lock_held(struct sekali_ctx *ctx);
static int host_set_result(struct sekali_ctx *ctx, const void *data, size_t len);
static void host_set_error(struct sekali_ctx *ctx, const char *message);
static int host_checkpoint_save(struct sekali_ctx *ctx, const char *name, const char *value);
static const char *host_checkpoint(struct sekali_ctx *ctx, const char *name);
static int host_enqueue(struct sekali_ctx *ctx, const char *queue, const char *job_type,
                        const void *body, size_t body_len, const char *idempotency_key,
                        const char *dedupe_key, char *job_id, size_t size);

static const struct sekali_host host = {
    .abi_major = SEKALI_HANDLER_ABI_MAJOR,
    .abi_minor = SEKALI_HANDLER_ABI_MINOR,
    .struct_size = sizeof(struct sekali_host),
    .log = host_log,
    .pg = host_pg,
    .lock_held = host_lock_held,
    .set_result = host_set_result,
    .set_error = host_set_error,
    .checkpoint_save = host_checkpoint_save,
    .checkpoint = host_checkpoint,
    .enqueue = host_enqueue,
};

const struct sekali_host *sk_host(void)
{
    return &host;
}

void sk_host_ctx_reset(struct sekali_ctx *ctx)
{
    ctx->result_len = 0;
    ctx->error[0] = '\0';
    ctx->external = false;
    sk_lease_checkpoints_clear(&ctx->checkpoints);
}

static void host_log(struct sekali_ctx *ctx, int level, const char *fmt, ...)
{
    if (level < SEKALI_LOG_DEBUG)
        level = SEKALI_LOG_DEBUG;
    if (level > SEKALI_LOG_ERROR)
        level = SEKALI_LOG_ERROR;
    va_list ap;
    va_start(ap, fmt);
    sk_vlog_job((enum sk_log_level)level, ctx != NULL ? ctx->log : NULL, fmt, ap);
    va_end(ap);
}

static struct pg_conn *host_pg(struct sekali_ctx *ctx)
{
    return ctx->pg;
}

static int host_lock_held(struct sekali_ctx *ctx)
{
    return ctx->lock_lost == NULL || !atomic_load(ctx->lock_lost);
}

static int host_set_result(struct sekali_ctx *ctx, const void *data, size_t len)
{
    if (len > sizeof(ctx->result))
        return -1;
    memcpy(ctx->result, data, len);
    ctx->result_len = len;
    return 0;
}

static void host_set_error(struct sekali_ctx *ctx, const char *message)
{
    snprintf(ctx->error, sizeof(ctx->error), "%s", message != NULL ? message : "");
}

static int host_checkpoint_save(struct sekali_ctx *ctx, const char *name, const char *value)
{
    if (!ctx->external || name == NULL || value == NULL)
        return -1;
    struct sk_err err = { 0 };
    struct sk_keyref ref = { .queue = ctx->log->queue, .key = ctx->log->idempotency_key };
    sk_keyref_set_fence(&ref, ctx->log->fence);
    int rc = sk_lease_save_checkpoint(ctx->pg, &ref, name, value, &err);
    if (rc != SK_OK) {
        sk_log_job(SK_LOG_WARN, ctx->log, "checkpoint %s not saved: %s", name,
                   rc == SK_BUSY ? "fenced out, another worker owns the job" : err.msg);
        return -1;
    }
    /* Keep the in-memory view in step, so checkpoint() sees it at once. */
    for (size_t i = 0; i < ctx->checkpoints.n; i++) {
        if (strcmp(ctx->checkpoints.items[i].name, name) == 0) {
            char *copy = strdup(value);
            if (copy != NULL) {
                free(ctx->checkpoints.items[i].value);
                ctx->checkpoints.items[i].value = copy;
            }
            return 0;
        }
    }
    if (ctx->checkpoints.n < SK_CHECKPOINTS_MAX) {
        struct sk_checkpoint *c = &ctx->checkpoints.items[ctx->checkpoints.n];
        c->name = strdup(name);
        c->value = strdup(value);
        if (c->name != NULL && c->value != NULL) {
            ctx->checkpoints.n++;
        } else {
            free(c->name);
            free(c->value);
        }
    }
    return 0;
}

static const char *host_checkpoint(struct sekali_ctx *ctx, const char *name)
{
    for (size_t i = 0; name != NULL && i < ctx->checkpoints.n; i++)
        if (strcmp(ctx->checkpoints.items[i].name, name) == 0)
            return ctx->checkpoints.items[i].value;
    return NULL;
}

static int host_enqueue(struct sekali_ctx *ctx, const char *queue, const char *job_type,
                        const void *body, size_t body_len, const char *idempotency_key,
                        const char *dedupe_key, char *job_id, size_t size)
{
    if (ctx->pg == NULL || queue == NULL || job_type == NULL || body == NULL) {
        host_set_error(ctx, "enqueue: no connection, queue, type or body");
        return -1;
    }
    const char *values[] = { queue, job_type, body, idempotency_key, dedupe_key };
    const int lengths[] = { 0, 0, (int)body_len, 0, 0 };
    const int formats[] = { 0, 0, 1, 0, 0 };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.enqueue($1, $2, $3, $4, $5)", .n_params = 5, .values = values,
        .lengths = lengths, .formats = formats, .one_row = true, .what = "sekali.enqueue",
    };
    struct sk_err err = { 0 };
    PGresult *res;
    if (sk_pg_exec(ctx->pg, &st, &res, &err) != SK_OK) {
        char why[512];
        snprintf(why, sizeof(why), "enqueue to %s: %s", queue, err.msg);
        host_set_error(ctx, why);
        return -1;
    }
    if (job_id != NULL && size > 0)
        snprintf(job_id, size, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return 0;
}
