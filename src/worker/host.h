/* host.h - what the daemon offers handlers: the sekali_host vtable and the
 * per-job context behind the opaque struct sekali_ctx. */
#ifndef SK_HOST_H
#define SK_HOST_H

#include <stdatomic.h>
#include <stdbool.h>

#include "amqp_lib.h"

#include <sekali/handler.h>

#include "lease.h"
#include "log.h"
#include "sqlq.h"

#define SK_RESULT_MAX (64 * 1024)  /* a saved result is a receipt, not a payload */

/* Filled by the worker before handle() and read back after it. */
struct sk_trace;

struct sekali_ctx {
    struct pg_conn          *pg;
    const struct sk_log_job *log;
    const atomic_bool       *lock_lost;   /* NULL when the job owns nothing to renew */
    bool                     external;    /* external mode: checkpoints are fenced */
    struct sk_checkpoints    checkpoints; /* loaded at an external claim */
    char                     result[SK_RESULT_MAX];
    size_t                   result_len;
    char                     error[512];
    bool                     conflict;    /* the handler called host->conflict() */
    char                    *body;        /* NUL-terminated copy of the job's body */
    size_t                   body_cap;    /* bytes allocated at body */
    const amqp_table_t      *headers;     /* the delivery's, or NULL: for headers_json() */
    char                    *headers_buf; /* headers_json()'s text, kept for the next job */
    size_t                   headers_cap;
    bool                     headers_done; /* headers_buf holds this job's */
    uint32_t                 retry_after_ms; /* host->retry_after(), 0 if not called */
    const struct sk_trace   *trace;       /* the job's run in its trace, or NULL */
    struct sk_sqlq           queued;      /* host->queue_sql()'s, taken by the job after */
};

/* The vtable handed to every handler's init(). Valid for the process's life. */
const struct sekali_host *sk_host(void);

/* Clears what the previous job left in ctx, checkpoints included. */
void sk_host_ctx_reset(struct sekali_ctx *ctx);

/* Copies body into ctx's buffer (grown as needed, kept for the next job)
 * with a NUL after its len bytes, which handler.h promises since 1.3.
 * Returns the copy, valid until the next call, or NULL when out of memory. */
const char *sk_host_ctx_body(struct sekali_ctx *ctx, const void *body, size_t len);

/* Releases what ctx holds (checkpoints, the body buffer); ctx stays usable. */
void sk_host_ctx_free(struct sekali_ctx *ctx);

/* host->config_get(), for the supervisor's own use too. */
int sk_host_config_get(const char *config, const char *key, char *buf, size_t size);

#endif
