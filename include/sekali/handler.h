/* sekali/handler.h - the handler ABI: the one header a handler author includes.
 *
 * A handler is a shared object exporting one function, sekali_handler_v1(),
 * that returns a static descriptor. That name is the permanent entry symbol:
 * it stays sekali_handler_v1 in every ABI version, even after a major bump,
 * so a plugin built for another major version is still found and refused
 * with its abi_major named, never with a bare "no symbol". sekalid loads
 * it with RTLD_NOW|RTLD_LOCAL, checks the descriptor's ABI version and size,
 * and refuses to start on a mismatch. Plugins reach the daemon only
 * through the sekali_host vtable and never link against daemon symbols.
 *
 * Growing the ABI without breaking built plugins:
 *   - structs only grow at their end, and carry their own struct_size;
 *   - a plugin reads a host member only if host->abi_minor says it exists;
 *   - the host reads a descriptor member only if descriptor->struct_size covers it;
 *   - removing, reordering or retyping a member bumps SEKALI_HANDLER_ABI_MAJOR.
 *
 * Return convention: handle() and init() return an enum sekali_status. Host
 * functions that can fail return 0 (or a length, where one is documented) on
 * success and -1 on failure; where the failure is the job's, the host has
 * already set it as the job's error, so the handler just returns
 * SEKALI_RETRY or SEKALI_FAIL.
 *
 * Which errors to retry: an error that another attempt can cure is
 * SEKALI_RETRY, one that will recur with the same body is SEKALI_FAIL. For
 * PostgreSQL (PQresultErrorField(res, PG_DIAG_SQLSTATE)): class 40
 * (serialization failure, deadlock), 55P03 (lock_timeout), class 57
 * (statement_timeout's 57014, admin shutdown) and class 08 (connection) are
 * transient: return SEKALI_RETRY; sekali_sqlstate_transient() below tells
 * them apart. Data errors (class 22, 23 on a unique key that is the job's own
 * business, 42 on a bad query) are SEKALI_FAIL.
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
#define SEKALI_HANDLER_ABI_MINOR 8  /* bump: a member was appended below */

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

struct sekali_host;

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
    const void *body;             /* since 1.3 body[body_len] == '\0' (the body
                                   * may hold NULs of its own: use body_len);
                                   * before 1.3 not terminated */
    size_t      body_len;
    uint32_t    delivery_attempt; /* 1 on the first delivery */
    int64_t     fence;            /* fencing token of this claim; grows with each claim */

    /* Since 1.3 (job->struct_size covers it when host->abi_minor >= 3): the
     * host, so that handle() needs no init() to reach it. */
    const struct sekali_host *host;

    /* Since 1.7 (job->struct_size covers them when host->abi_minor >= 7):
     * the job's W3C trace context. traceparent is this run's span, as
     * "00-<trace id>-<span id>-<flags>": send it on as the traceparent of
     * whatever the job calls, so the callee's spans are children of the
     * job's. The trace is the producer's (the message's traceparent
     * header, strictly checked), or a new one when the message had none
     * or a broken one; each run (a retry too) has a span of its own.
     * tracestate is the producer's, checked and at most 512 bytes, or "".
     * host->log() lines carry trace_id and span_id already. */
    const char *traceparent;
    const char *tracestate;
    /* append here; never reorder, resize or remove */
};

/* What host->enqueue_job() takes. Zero it, set struct_size, and fill what
 * you need: members a host does not know yet are never read, and members
 * left 0 or NULL take the defaults below. */
struct sekali_enqueue {
    uint32_t    struct_size;      /* sizeof(struct sekali_enqueue): first, forever */
    const char *queue;            /* mandatory */
    const char *job_type;         /* mandatory */
    const void *body;             /* mandatory; body_len bytes */
    size_t      body_len;
    const char *idempotency_key;  /* NULL: the new job's id */
    const char *dedupe_key;       /* NULL: no deduplication */
    const char *resource_key;     /* NULL: the idempotency key */
    int64_t     run_at_ms;        /* Unix time in ms to publish at; 0: now */
    int64_t     dedupe_ttl_ms;    /* how long dedupe_key holds; 0: one day */
    /* Since 1.6: the AMQP priority the job is published with, 1 to 255,
     * honoured by a queue with max_priority; 0: none, which such a queue
     * treats as 0. Outside 0..255, enqueue_job() fails. A 1.5 host does
     * not read it (check host->abi_minor >= 6). */
    int32_t     priority;
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

    /* Since 1.2; frozen since 1.3: use enqueue_job(). Enqueues a follow-up
     * job through the outbox (sekali.enqueue) on the job's connection: in
     * transactional mode it commits or rolls back with this job's effect,
     * so a job and the jobs it triggers happen together or not at all.
     * idempotency_key and dedupe_key may be NULL. Writes the new job's id
     * to job_id (size bytes) when job_id is not NULL. Returns 0, or -1 with
     * the reason set as the job's error (return SEKALI_RETRY then). */
    int (*enqueue)(struct sekali_ctx *ctx, const char *queue, const char *job_type,
                   const void *body, size_t body_len, const char *idempotency_key,
                   const char *dedupe_key, char *job_id, size_t size);

    /* Since 1.3 (check host->abi_minor >= 3). enqueue() with every option
     * of sekali.enqueue(), taking a struct that can grow. Writes the new
     * job's id (or, when dedupe_key is held, the holder's) to job_id (size
     * bytes) when job_id is not NULL. Returns 0, or -1 with the reason set
     * as the job's error (return SEKALI_RETRY then). */
    int (*enqueue_job)(struct sekali_ctx *ctx, const struct sekali_enqueue *e,
                       char *job_id, size_t size);

    /* Since 1.3. Reads the top-level scalar `key` of a handler config (the
     * text init() and check() get; only flat `key: value` pairs are
     * supported). Copies it NUL-terminated into buf (size bytes, truncated
     * if needed) and returns its length, like snprintf(); returns -1 when
     * config is NULL or the key is absent, or holds a list or mapping.
     * Callable from check(), init() and handle(); it does not block. */
    int (*config_get)(const char *config, const char *key, char *buf, size_t size);

    /* Since 1.3. Optimistic concurrency: a handler whose guarded update
     * (UPDATE ... WHERE version = $n, or WHERE status = 'pending') touched
     * no row because another job changed it first calls this and returns
     * what it returns (SEKALI_RETRY): the job is re-scheduled with reason
     * "conflict", counted in sekali_occ_conflicts_total, and its next
     * attempt reads the row afresh. message (copied) becomes the job's
     * error. Like any retry, it counts towards retry.max_attempts. */
    int (*conflict)(struct sekali_ctx *ctx, const char *message);

    /* Since 1.4 (check host->abi_minor >= 4). Where in the configuration
     * file byte `offset` of the top-level scalar `key` of config was
     * written, as "FILE:LINE:COLUMN" (1-based, as sekalid's own config
     * errors): check() prefixes its message with it, so an error inside a
     * value (an unknown parameter in a statement) points at the spot.
     * Exact for plain and quoted one-line values and for literal (|) blocks;
     * the value's start for others. Copies it into buf like config_get() and
     * returns its length, or -1 when the position is not known (outside
     * check(), the key absent or not a scalar). */
    int (*config_where)(const char *config, const char *key, size_t offset, char *buf,
                        size_t size);

    /* Since 1.4. The job's AMQP headers as one JSON object ("{}" without
     * any), NUL-terminated: valid JSON whatever the producer sent (strings
     * escaped, invalid UTF-8 replaced by U+FFFD). Built on the first call
     * of a job; borrowed: valid until handle() returns. NULL when out of
     * memory. */
    const char *(*headers_json)(struct sekali_ctx *ctx);

    /* Since 1.4; from check(). A setting of the queue that config belongs
     * to, as text: "name", "mode" ("transactional" or "external"), "lease"
     * and "job_timeout" (milliseconds; 0 for none), and "batch" (the most
     * jobs sharing one transaction; older hosts return -1). So check()
     * can refuse a mode it cannot serve, a timeout the lease does not
     * cover, or a shared transaction it cannot live with ("set batch: 1").
     * Returns its length like config_get(), or -1 when unknown. */
    int (*config_queue)(const char *config, const char *key, char *buf, size_t size);

    /* Since 1.4. Before returning SEKALI_RETRY: the outside service said
     * when to come back (HTTP Retry-After). The next attempt waits at
     * least delay_ms, capped at the queue's retry.max; never less than the
     * retry policy's own delay. */
    void (*retry_after)(struct sekali_ctx *ctx, uint32_t delay_ms);

    /* Since 1.5 (check host->abi_minor >= 5). 1 when the job has been
     * cancelled (sekalictl cancel, sekali.cancel()) since it was claimed,
     * else 0, also when PostgreSQL cannot tell. Whatever the handler then
     * returns, its outcome is not recorded: in transactional mode the
     * COMMIT is refused and rolled back, in external mode the completion
     * is fenced out; the delivery is acked and counted as cancelled. So a
     * long handler asks between phases and stops early (return
     * SEKALI_FAIL), above all before an outside effect that cannot be
     * taken back. One PostgreSQL round trip per call, on the job's
     * connection: ask between phases, not per row. In transactional mode
     * a failing query leaves the job's transaction failed (its COMMIT
     * fails and the job is retried). */
    int (*cancelled)(struct sekali_ctx *ctx);

    /* Since 1.8 (check host->abi_minor >= 8). Transactional mode: queues
     * one SQL statement that needs no answer (an INSERT, an UPDATE) to be
     * sent in the transaction's COMMIT pipeline, not now: a batch of N
     * jobs then costs one round trip to PostgreSQL for all their writes
     * instead of one per statement, which matters when the server is far.
     * sql (one statement, $1..$n placeholders) and the n_params text
     * values (NULL: SQL NULL) are copied. The statements run in the order
     * queued, after every handler of the batch has returned, so a handler
     * cannot read what it queued. They commit or roll back with the job's
     * completion. When one fails, the transaction is rolled back and each
     * of its jobs runs again alone in a transaction of its own, spending
     * no attempt; the job whose own statement then fails is retried or
     * dead-lettered like any failed COMMIT. At most 64 statements and
     * 256 KiB per job, 64 parameters per statement. Returns 0, or -1 with
     * the reason set as the job's error (external mode, a bound passed,
     * no memory): return SEKALI_RETRY then, or run the statement now. */
    int (*queue_sql)(struct sekali_ctx *ctx, const char *sql, int n_params,
                     const char *const *values);

    /* append here; never reorder, resize or remove */
};

/* The descriptor a handler exports. Define it with SEKALI_HANDLER_DEFINE. */
struct sekali_handler {
    uint32_t    abi_major, abi_minor, struct_size;   /* first, forever */
    const char *name, *version;

    /* Optional. Called once per worker process before its first job.
     * config is the queue's `config:` section as YAML text, or NULL.
     * Returns SEKALI_OK, SEKALI_RETRY (transient: the worker restarts later)
     * or SEKALI_FAIL (bad configuration: at start sekalid stops with exit
     * 2; in a reload the new configuration is abandoned). Validate the
     * config in check() instead: `sekalid -t` runs it, and it fails a
     * reload before any new worker starts. */
    int (*init)(const struct sekali_host *host, const char *config, void **state);

    /* Mandatory. Performs the job's business effect. */
    int (*handle)(void *state, const struct sekali_job *job, struct sekali_ctx *ctx);

    /* Optional. Called when the worker exits cleanly. */
    void (*fini)(void *state);

    /* Since 1.3, optional. Validates the queue's handler config (as init()
     * gets it, or NULL) in the supervisor, by `sekalid -t`, at start and
     * before a reload starts new workers: a config it rejects stops the
     * start, fails `sekalid -t`, and leaves a reload's old generation
     * running. Returns SEKALI_OK, or SEKALI_FAIL with a message written to
     * err (err_size bytes). It must not block, open connections or keep
     * state: it runs in the supervisor, and on every reload. host offers
     * config_get() and log(). */
    int (*check)(const struct sekali_host *host, const char *config, char *err,
                 size_t err_size);

    /* Since 1.4, optional. Called by the worker, outside any transaction,
     * on the PostgreSQL connection its jobs run on, before it takes each
     * delivery: a handler that depends on the database (a function its
     * statement calls) checks it here once per connection and returns at
     * once afterwards. SEKALI_OK: the worker takes jobs. Anything else: it
     * takes none, logs err (err_size bytes) naming the queue, and calls
     * again after a backoff (1 s doubling to 30 s) on a live connection:
     * a deploy-order mistake (the function not created yet) holds the
     * queue's jobs in the broker instead of dead-lettering them, and
     * never restarts the worker. */
    int (*ready)(void *state, struct pg_conn *pg, char *err, size_t err_size);
    /* append here; never reorder, resize or remove */
};

/* The permanent entry symbol: never renamed, whatever the ABI version. */
#define SEKALI_HANDLER_SYMBOL "sekali_handler_v1"

/* 1 when a PostgreSQL SQLSTATE (PG_DIAG_SQLSTATE, may be NULL) names an
 * error another attempt can cure: class 40 (serialization failure,
 * deadlock), 55P03 (lock not available), class 57 (operator intervention:
 * query canceled by statement_timeout, shutdown) and class 08 (connection
 * exception); a NULL SQLSTATE means no server answer, so also 1. Return
 * SEKALI_RETRY for these and SEKALI_FAIL for the rest. Compiled into the
 * handler, so it needs no host. */
static inline int sekali_sqlstate_transient(const char *sqlstate)
{
    if (sqlstate == NULL || sqlstate[0] == '\0')
        return 1;
    if ((sqlstate[0] == '4' && sqlstate[1] == '0') || (sqlstate[0] == '5' && sqlstate[1] == '7') ||
        (sqlstate[0] == '0' && sqlstate[1] == '8'))
        return 1;
    return sqlstate[0] == '5' && sqlstate[1] == '5' && sqlstate[2] == 'P' && sqlstate[3] == '0' &&
           sqlstate[4] == '3';
}

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
