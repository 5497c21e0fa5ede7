/* handler_1_2.h - sekali/handler.h exactly as ABI 1.2 shipped it, frozen, so
 * that tests/plugins/abi_1_2.c is built against the 1.2 layout and proves
 * that handlers built before 1.3 still load and run. Never edit it.
 *
 * sekali/handler.h - the handler ABI: the one header a handler author includes.
 *
 * A handler is a shared object exporting one function, sekali_handler_v1(),
 * that returns a static descriptor. sekalid loads it with RTLD_NOW|RTLD_LOCAL,
 * checks the descriptor's ABI version and size, and refuses to start on a
 * mismatch. Plugins reach the daemon only through the sekali_host vtable and
 * never link against daemon symbols.
 *
 * Growing the ABI without breaking built plugins:
 *   - structs only grow at their end, and carry their own struct_size;
 *   - a plugin reads a host member only if host->abi_minor says it exists;
 *   - the host reads a descriptor member only if descriptor->struct_size covers it;
 *   - removing, reordering or retyping a member bumps SEKALI_HANDLER_ABI_MAJOR.
 *
 * Threading: every callback runs on the worker process's main thread, one job
 * at a time. Each worker is its own process, so handler state is per process. */
#ifndef SEKALI_HANDLER_H
#define SEKALI_HANDLER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEKALI_HANDLER_ABI_MAJOR 1  /* bump: every plugin must be rebuilt */
#define SEKALI_HANDLER_ABI_MINOR 2  /* bump: a member was appended below */

/* What handle() returns. */
enum sekali_status {
    SEKALI_OK    = 0,  /* commit the effect and the completion, then ack */
    SEKALI_RETRY = 1,  /* roll back; the job runs again later */
    SEKALI_FAIL  = 2,  /* roll back; record the key as failed; do not run again */
};

enum sekali_log_level {
    SEKALI_LOG_DEBUG = 0,
    SEKALI_LOG_INFO  = 1,
    SEKALI_LOG_WARN  = 2,
    SEKALI_LOG_ERROR = 3,
};

/* libpq's connection, declared here so that this header does not need
 * libpq-fe.h; it is the same type as PGconn. */
struct pg_conn;

/* One delivery, as the handler sees it. Borrowed: valid until handle()
 * returns. Strings are NUL-terminated; absent optional ones are "". */
struct sekali_job {
    uint32_t    struct_size;      /* sizeof as the host built it */
    const char *queue;
    const char *job_id;           /* AMQP message_id */
    const char *job_type;         /* AMQP type property */
    const char *idempotency_key;  /* x-idempotency-key, else job_id */
    const char *resource_key;     /* x-resource-key, else the idempotency key */
    const char *content_type;
    const void *body;
    size_t      body_len;
    uint32_t    delivery_attempt; /* 1 on the first delivery */
    int64_t     fence;            /* fencing token of this claim; grows with each claim */
    /* append here; never reorder, resize or remove */
};

/* Opaque per-job context, passed to handle() and back to the host functions. */
struct sekali_ctx;

/* What the daemon offers a handler. Borrowed: valid for the process's life. */
struct sekali_host {
    uint32_t abi_major, abi_minor, struct_size;   /* first, forever */

    /* Logs with the job's fields (job_id, keys, fence, attempt) attached.
     * ctx may be NULL outside handle() (in init or fini). */
    void (*log)(struct sekali_ctx *ctx, int level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

    /* Transactional mode: the PostgreSQL connection inside the job's open
     * transaction. Do not COMMIT, ROLLBACK or close it: the host commits the
     * effect together with the job's completion. External mode: the
     * worker's connection, outside any transaction, for the handler's own
     * bookkeeping; pass job->idempotency_key to the outside service so that
     * it can deduplicate too. */
    struct pg_conn *(*pg)(struct sekali_ctx *ctx);

    /* 1 while this worker still holds the job's Redis lock (or the queue
     * takes no lock), 0 once renewal failed. The database, not the lock,
     * is what makes the effect happen once; this is for expensive work
     * a handler may prefer to abandon with SEKALI_RETRY. */
    int (*lock_held)(struct sekali_ctx *ctx);

    /* Saves the job's result with its completion (copied). Returns 0, or -1
     * if it is too large. */
    int (*set_result)(struct sekali_ctx *ctx, const void *data, size_t len);

    /* Records why the job failed or asked for a retry (copied). */
    void (*set_error)(struct sekali_ctx *ctx, const char *message);

    /* Since 1.1 (check host->abi_minor >= 1). External mode's recovery
     * points: a handler that finished a phase (charged the card) saves a
     * checkpoint, and an attempt that takes the job over later reads it and
     * skips that phase. Saving is fenced: it returns 0 when saved, -1 when
     * this worker no longer owns the job (stop: another one does) or in
     * transactional mode (where the transaction is the recovery). Values are
     * text; both strings are copied. */
    int (*checkpoint_save)(struct sekali_ctx *ctx, const char *name, const char *value);

    /* Since 1.1. The value saved under name by this or an earlier attempt,
     * or NULL. Borrowed: valid until handle() returns. */
    const char *(*checkpoint)(struct sekali_ctx *ctx, const char *name);

    /* Since 1.2. Enqueues a follow-up job through the outbox
     * (sekali.enqueue) on the job's connection: in transactional mode it
     * commits or rolls back with this job's effect, so a job and the jobs it
     * triggers happen together or not at all. idempotency_key and
     * dedupe_key may be NULL. Writes the new job's id to job_id (size
     * bytes) when job_id is not NULL. Returns 0, or -1 with the reason set
     * as the job's error (return SEKALI_RETRY then). */
    int (*enqueue)(struct sekali_ctx *ctx, const char *queue, const char *job_type,
                   const void *body, size_t body_len, const char *idempotency_key,
                   const char *dedupe_key, char *job_id, size_t size);

    /* append here; never reorder, resize or remove */
};

/* The descriptor a handler exports. Define it with SEKALI_HANDLER_DEFINE. */
struct sekali_handler {
    uint32_t    abi_major, abi_minor, struct_size;   /* first, forever */
    const char *name, *version;

    /* Optional. Called once per worker process before its first job.
     * config is the queue's `config:` section as YAML text, or NULL.
     * Returns SEKALI_OK, SEKALI_RETRY (transient: the worker restarts later)
     * or SEKALI_FAIL (bad configuration: sekalid stops the queue). */
    int (*init)(const struct sekali_host *host, const char *config, void **state);

    /* Mandatory. Performs the job's business effect. */
    int (*handle)(void *state, const struct sekali_job *job, struct sekali_ctx *ctx);

    /* Optional. Called when the worker exits cleanly. */
    void (*fini)(void *state);
    /* append here; never reorder, resize or remove */
};

#define SEKALI_HANDLER_SYMBOL "sekali_handler_v1"

/* Defines the exported descriptor. Members left out default to NULL, so a
 * plugin built against an older minor version stays valid:
 *     SEKALI_HANDLER_DEFINE(.name = "invoice", .version = "1.0",
 *                           .handle = invoice_handle)                     */
#define SEKALI_HANDLER_DEFINE(...)                                         \
    __attribute__((visibility("default")))                                 \
    const struct sekali_handler *sekali_handler_v1(void);                  \
    const struct sekali_handler *sekali_handler_v1(void)                   \
    {                                                                      \
        static const struct sekali_handler descriptor = {                  \
            .abi_major   = SEKALI_HANDLER_ABI_MAJOR,                       \
            .abi_minor   = SEKALI_HANDLER_ABI_MINOR,                       \
            .struct_size = sizeof(struct sekali_handler),                  \
            __VA_ARGS__                                                    \
        };                                                                 \
        return &descriptor;                                                \
    }

#ifdef __cplusplus
}
#endif

#endif
