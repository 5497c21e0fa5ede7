/* host.c - the sekali_host vtable: the only way a handler reaches the daemon.
 *
 * Everything a handler hands us is copied before handle() returns, so its
 * buffers never need to outlive the call. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "host.h"

static void host_log(struct sekali_ctx *ctx, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static struct pg_conn *host_pg(struct sekali_ctx *ctx);
static int host_lock_held(struct sekali_ctx *ctx);
static int host_set_result(struct sekali_ctx *ctx, const void *data, size_t len);
static void host_set_error(struct sekali_ctx *ctx, const char *message);

static const struct sekali_host host = {
    .abi_major = SEKALI_HANDLER_ABI_MAJOR,
    .abi_minor = SEKALI_HANDLER_ABI_MINOR,
    .struct_size = sizeof(struct sekali_host),
    .log = host_log,
    .pg = host_pg,
    .lock_held = host_lock_held,
    .set_result = host_set_result,
    .set_error = host_set_error,
};

const struct sekali_host *sk_host(void)
{
    return &host;
}

void sk_host_ctx_reset(struct sekali_ctx *ctx)
{
    ctx->result_len = 0;
    ctx->error[0] = '\0';
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
