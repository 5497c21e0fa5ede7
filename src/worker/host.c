/* host.c - the sekali_host vtable: the only way a handler reaches the daemon.
 *
 * Everything a handler hands us is copied before handle() returns, so its
 * buffers never need to outlive the call. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <yaml.h>

#include "config.h"
#include "headers_json.h"
#include "host.h"
#include "pg.h"
#include "text.h"
#include "trace_context.h"

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
static int host_enqueue_job(struct sekali_ctx *ctx, const struct sekali_enqueue *e,
                            char *job_id, size_t size);
static int host_conflict(struct sekali_ctx *ctx, const char *message);
static const char *host_headers_json(struct sekali_ctx *ctx);
static void host_retry_after(struct sekali_ctx *ctx, uint32_t delay_ms);
static int host_cancelled(struct sekali_ctx *ctx);
static int host_queue_sql(struct sekali_ctx *ctx, const char *sql, int n_params,
                          const char *const *values);

/* The size of the 1.3 enqueue struct: the first one, so the least a caller
 * may pass. */
#define ENQUEUE_V1_3_SIZE \
    (offsetof(struct sekali_enqueue, dedupe_ttl_ms) + sizeof(int64_t))

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
    .enqueue_job = host_enqueue_job,
    .config_get = sk_host_config_get,
    .conflict = host_conflict,
    .config_where = sk_conf_where,
    .headers_json = host_headers_json,
    .config_queue = sk_conf_queue_setting,
    .retry_after = host_retry_after,
    .cancelled = host_cancelled,
    .queue_sql = host_queue_sql,
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
    ctx->conflict = false;
    ctx->headers = NULL;
    ctx->headers_done = false;
    ctx->retry_after_ms = 0;
    sk_lease_checkpoints_clear(&ctx->checkpoints);
    sk_sqlq_clear(&ctx->queued);
}

const char *sk_host_ctx_body(struct sekali_ctx *ctx, const void *body, size_t len)
{
    if (len + 1 > ctx->body_cap) {
        /* Doubling keeps a worker whose bodies grow slowly from copying its
         * buffer at every job; max_body bounds it. */
        size_t cap = ctx->body_cap > 0 ? ctx->body_cap : 4096;
        while (cap < len + 1)
            cap *= 2;
        char *grown = realloc(ctx->body, cap);
        if (grown == NULL)
            return NULL;
        ctx->body = grown;
        ctx->body_cap = cap;
    }
    if (len > 0)
        memcpy(ctx->body, body, len);
    ctx->body[len] = '\0';
    return ctx->body;
}

void sk_host_ctx_free(struct sekali_ctx *ctx)
{
    sk_sqlq_clear(&ctx->queued);
    sk_lease_checkpoints_clear(&ctx->checkpoints);
    free(ctx->body);
    ctx->body = NULL;
    ctx->body_cap = 0;
    free(ctx->headers_buf);
    ctx->headers_buf = NULL;
    ctx->headers_cap = 0;
}

/* libyaml, not a line scanner: the text is libyaml's own re-emission of the
 * queue's `config:` node, so quoting and escapes come back exactly as the
 * operator wrote the value. */
int sk_host_config_get(const char *config, const char *key, char *buf, size_t size)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    int found = -1;

    if (buf != NULL && size > 0)
        buf[0] = '\0';
    if (config == NULL || key == NULL || !yaml_parser_initialize(&parser))
        return -1;
    yaml_parser_set_input_string(&parser, (const unsigned char *)config, strlen(config));
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_parser_delete(&parser);
        return -1;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root != NULL && root->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
             p < root->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(&doc, p->key);
            yaml_node_t *v = yaml_document_get_node(&doc, p->value);
            if (k == NULL || v == NULL || k->type != YAML_SCALAR_NODE ||
                strlen(key) != k->data.scalar.length ||
                memcmp(key, k->data.scalar.value, k->data.scalar.length) != 0)
                continue;
            if (v->type == YAML_SCALAR_NODE && v->data.scalar.length < INT32_MAX) {
                found = (int)v->data.scalar.length;
                if (buf != NULL && size > 0)
                    snprintf(buf, size, "%.*s", found, (const char *)v->data.scalar.value);
            }
            break;
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return found;
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

/* A handler's text may be cut anywhere (its own buffer) or hold any bytes
 * (a server's message quoting a hostile body): bounded here, on a
 * character, with invalid bytes replaced, since it will be stored and sent
 * as the job's error. */
static void host_set_error(struct sekali_ctx *ctx, const char *message)
{
    sk_text_copy(ctx->error, sizeof(ctx->error), message);
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

/* The 1.2 call, frozen: the same as enqueue_job() with its first options. */
static int host_enqueue(struct sekali_ctx *ctx, const char *queue, const char *job_type,
                        const void *body, size_t body_len, const char *idempotency_key,
                        const char *dedupe_key, char *job_id, size_t size)
{
    struct sekali_enqueue e = {
        .struct_size = sizeof(e), .queue = queue, .job_type = job_type, .body = body,
        .body_len = body_len, .idempotency_key = idempotency_key, .dedupe_key = dedupe_key,
    };
    return host_enqueue_job(ctx, &e, job_id, size);
}

/* Members past e->struct_size were not there when the caller was built:
 * they read as 0 or NULL, which are the defaults. */
static int host_enqueue_job(struct sekali_ctx *ctx, const struct sekali_enqueue *in,
                            char *job_id, size_t size)
{
    struct sekali_enqueue e = { 0 };
    if (in == NULL || in->struct_size < ENQUEUE_V1_3_SIZE) {
        host_set_error(ctx, "enqueue: struct sekali_enqueue missing or smaller than ABI 1.3's "
                            "(set struct_size = sizeof(struct sekali_enqueue))");
        return -1;
    }
    memcpy(&e, in, in->struct_size < sizeof(e) ? in->struct_size : sizeof(e));
    if (ctx->pg == NULL || e.queue == NULL || e.job_type == NULL || e.body == NULL ||
        e.body_len > INT32_MAX) {
        host_set_error(ctx, "enqueue: no connection, queue, type or body");
        return -1;
    }
    char run_at[24], ttl[24], priority[16];
    snprintf(run_at, sizeof(run_at), "%lld", (long long)e.run_at_ms);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)e.dedupe_ttl_ms);
    snprintf(priority, sizeof(priority), "%d", (int)e.priority);
    /* A priority out of range is sekali.enqueue()'s to refuse, with its
     * own message: one rule, wherever a job is enqueued from. */
    /* The new job continues this one's trace, as a child of its span: the
     * settings sekali.enqueue() takes it from (sql/031) are made first, by
     * the materialised CTE, and last for the job's transaction. */
    const char *values[] = { e.queue, e.job_type, e.body, e.idempotency_key, e.dedupe_key,
                             e.resource_key, run_at, ttl, e.priority != 0 ? priority : NULL,
                             ctx->trace != NULL ? ctx->trace->traceparent : "",
                             ctx->trace != NULL ? ctx->trace->tracestate : "" };
    const int lengths[] = { 0, 0, (int)e.body_len, 0, 0, 0, 0, 0, 0, 0, 0 };
    const int formats[] = { 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0 };
    const struct sk_pg_stmt st = {
        .sql = "WITH t AS MATERIALIZED (SELECT set_config('sekali.traceparent', $10, true), "
               "set_config('sekali.tracestate', $11, true)) "
               "SELECT sekali.enqueue($1, $2, $3, $4, $5, $6, "
               "CASE WHEN $7::bigint = 0 THEN now() ELSE to_timestamp($7::bigint / 1000.0) END, "
               "CASE WHEN $8::bigint <= 0 THEN interval '1 day' "
               "ELSE $8::bigint * interval '1 millisecond' END, $9::integer) FROM t",
        .n_params = 11, .values = values, .lengths = lengths, .formats = formats,
        .one_row = true, .what = "sekali.enqueue",
    };
    struct sk_err err = { 0 };
    PGresult *res;
    if (sk_pg_exec(ctx->pg, &st, &res, &err) != SK_OK) {
        char why[512];
        snprintf(why, sizeof(why), "enqueue to %s: %s", e.queue, err.msg);
        host_set_error(ctx, why);
        return -1;
    }
    if (job_id != NULL && size > 0)
        snprintf(job_id, size, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return 0;
}

static int host_conflict(struct sekali_ctx *ctx, const char *message)
{
    ctx->conflict = true;
    char why[sizeof(ctx->error)];
    snprintf(why, sizeof(why), "conflict: %s",
             message != NULL && *message != '\0' ? message : "the row changed under the job");
    host_set_error(ctx, why);
    return SEKALI_RETRY;
}

/* Built on demand: most handlers never look at the headers. */
static const char *host_headers_json(struct sekali_ctx *ctx)
{
    if (!ctx->headers_done) {
        static const amqp_table_t none = { 0 };
        if (sk_headers_json(ctx->headers != NULL ? ctx->headers : &none, &ctx->headers_buf,
                            &ctx->headers_cap) < 0)
            return NULL;
        ctx->headers_done = true;
    }
    return ctx->headers_buf;
}

static void host_retry_after(struct sekali_ctx *ctx, uint32_t delay_ms)
{
    ctx->retry_after_ms = delay_ms;
}

/* Asked of PostgreSQL on the job's own connection: in transactional mode
 * the transaction sees every committed cancellation (read committed), and
 * the worker's connection is otherwise idle while an external handler runs.
 * A transaction the handler already spoiled is not queried: its COMMIT
 * fails anyway. */
static int host_cancelled(struct sekali_ctx *ctx)
{
    if (ctx->pg == NULL || ctx->log == NULL || PQtransactionStatus(ctx->pg) == PQTRANS_INERROR)
        return 0;
    struct sk_err err = { 0 };
    bool cancelled = false;
    if (sk_store_is_cancelled(ctx->pg, ctx->log->queue, ctx->log->idempotency_key, &cancelled,
                              &err) != SK_OK) {
        sk_log_job(SK_LOG_WARN, ctx->log, "host->cancelled(): not known: %s", err.msg);
        return 0;
    }
    return cancelled ? 1 : 0;
}

/* Queued on the job's context; handle() (span.c) hands them to the job,
 * whose COMMIT sends them. External mode has no transaction to send them
 * in. */
static int host_queue_sql(struct sekali_ctx *ctx, const char *sql, int n_params,
                          const char *const *values)
{
    if (ctx->external) {
        snprintf(ctx->error, sizeof(ctx->error),
                 "queue_sql(): external mode has no transaction to queue in");
        return -1;
    }
    return sk_sqlq_add(&ctx->queued, sql, n_params, values, ctx->error, sizeof(ctx->error));
}
