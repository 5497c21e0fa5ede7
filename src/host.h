/* host.h - what the daemon offers handlers: the sekali_host vtable and the
 * per-job context behind the opaque struct sekali_ctx. */
#ifndef SK_HOST_H
#define SK_HOST_H

#include <stdatomic.h>
#include <stdbool.h>

#include <sekali/handler.h>

#include "lease.h"
#include "log.h"

#define SK_RESULT_MAX (64 * 1024)  /* a saved result is a receipt, not a payload */

/* Filled by the worker before handle() and read back after it. */
struct sekali_ctx {
    struct pg_conn          *pg;
    const struct sk_log_job *log;
    const atomic_bool       *lock_lost;   /* NULL when the job owns nothing to renew */
    bool                     external;    /* external mode: checkpoints are fenced */
    struct sk_checkpoints    checkpoints; /* loaded at an external claim */
    char                     result[SK_RESULT_MAX];
    size_t                   result_len;
    char                     error[512];
};

/* The vtable handed to every handler's init(). Valid for the process's life. */
const struct sekali_host *sk_host(void);

/* Clears what the previous job left in ctx, checkpoints included. */
void sk_host_ctx_reset(struct sekali_ctx *ctx);

#endif
