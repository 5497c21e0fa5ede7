/* config.h - the parsed, validated configuration: an immutable snapshot.
 *
 * sk_conf_load() reads one YAML file and either returns a complete snapshot
 * or fails with "file:line:column: message" in err. Nothing in a snapshot
 * changes after loading; a reload builds a new one and frees the old.
 * Durations are stored in milliseconds, sizes in bytes.
 *
 * The config depends on the adapters, never the reverse: each connection's
 * section is the struct its adapter declares (sk_amqp_conf in broker.h,
 * sk_redis_conf in lock.h, sk_postgres_conf in pg.h), and so are the log
 * enums (log.h). */
#ifndef SK_CONFIG_H
#define SK_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker.h"
#include "common.h"
#include "lane.h"
#include "lock.h"
#include "log.h"
#include "pg.h"
#include "ticks.h"

enum sk_queue_mode {
    SK_MODE_TRANSACTIONAL = 0,  /* handler writes inside the claim's transaction */
    SK_MODE_EXTERNAL,           /* handler acts outside the database, under a lease */
};

/* What a worker does while Redis is unreachable. */
enum sk_redis_down {
    SK_REDIS_DOWN_PROCEED = 0,  /* run without the lock: PostgreSQL's row lock still decides */
    SK_REDIS_DOWN_WAIT,         /* hand jobs back until Redis answers again */
};

enum sk_queue_type { SK_QUEUE_CLASSIC = 0, SK_QUEUE_QUORUM };

/* Who declares a work queue: sekali with its own arguments, or someone else
 * (a definitions file, an infrastructure tool), in which case sekali only
 * checks that it exists and consumes it as it is. */
enum sk_queue_declare { SK_DECLARE_AUTO = 0, SK_DECLARE_PASSIVE };

struct sk_lock_conf {
    uint32_t ttl_ms;               /* lease length; renewed every ttl/3 */
    uint32_t busy_wait_ms;         /* how long to wait for a busy lock before handing back */
};

struct sk_log_conf {
    enum sk_log_level  level;
    enum sk_log_format format;
};

struct sk_retry_conf {
    int      max_attempts;         /* deliveries a job gets before it is dead-lettered */
    uint32_t initial_ms;           /* first retry delay's ceiling; doubles per attempt */
    uint32_t max_ms;               /* the ceiling's cap */
};

/* Whose jobs one rate limit counts: the whole queue's, or each resource
 * key's apart. */
enum sk_rate_per { SK_RATE_PER_QUEUE = 0, SK_RATE_PER_RESOURCE };

/* A queue's rate limit (queues[].rate_limit): `count` jobs per `period_ms`
 * on average, up to `burst` at once after a quiet spell; count 0: none.
 * Counted in Redis, shared by every worker of every host. */
struct sk_rate_conf {
    uint32_t         count;
    uint32_t         period_ms;
    uint32_t         burst;
    enum sk_rate_per per;
};

/* The Prometheus endpoint of the supervisor. */
struct sk_metrics_conf {
    char *listen_host;             /* NULL: no endpoint (the section, or listen, is absent
                                    * or ""); an IPv6 literal without its brackets */
    int   listen_port;
    char *token;                   /* metrics.token_file's bearer token; NULL: none asked */
};

/* One operator of the console: a login with this token is this name in
 * the audit of everything the session does. */
struct sk_console_operator {
    char *name;                    /* 1 to 64 bytes of UTF-8, no control characters */
    char *token;                   /* token_file's token, at least 32 characters */
};

/* The operator's console, served by `sekalictl serve` (src/ctl/console.c). */
struct sk_console_conf {
    struct sk_metrics_conf http;   /* listen and token_file (one token shared by all,
                                    * each typing a name), read as metrics' are; no
                                    * listen: no console (the default) */
    struct sk_console_operator *operators;  /* console.operators: a token per name */
    size_t n_operators;
    char *tls_cert_file;           /* PEM; both set: HTTPS, NULL: plain HTTP */
    char *tls_key_file;
    uint32_t session_ms;           /* a login's lifetime */
    bool open_reads;               /* reads without a login (loopback listeners only) */
    int pool;                      /* PostgreSQL sessions, and AMQP connections, its reads share */
};

/* One header of every export POST (tracing.otlp_headers): a managed
 * collector's API key, a tenant. Both strings checked at load (a token
 * name; a value without CR, LF or NUL). */
struct sk_otlp_header {
    char *name;
    char *value;                   /* wiped when freed */
    bool  secret;                  /* from value_env/value_file: shown nowhere */
};

/* Spans exported to an OpenTelemetry collector (tracing:, span_export.c). */
struct sk_tracing_conf {
    char    *otlp_endpoint;        /* http(s) URL of an OTLP/HTTP traces endpoint; NULL: none */
    char    *service_name;         /* the resource's service.name */
    uint32_t otlp_timeout_ms;      /* one POST's limit, and the flush's at a worker's stop */
    struct sk_otlp_header *otlp_headers;
    size_t   n_otlp_headers;
};

struct sk_outbox_conf {
    int      relays;               /* relay processes; 0: none (the default) */
    int      batch;                /* rows claimed and published per transaction */
    uint32_t poll_interval_ms;     /* longest wait without a NOTIFY (scheduled jobs) */
};

/* retention: forever, in retention_ms and outbox_retention_ms. */
#define SK_RETENTION_FOREVER UINT64_MAX

struct sk_janitor_conf {
    uint32_t interval_ms;          /* between rounds; 0: no janitor */
    int      batch;                /* rows per DELETE, so no lock is held for long */
    int      busy_percent;         /* most of its time spent deleting; it rests the rest */
    uint64_t outbox_retention_ms;  /* published outbox rows older than this go */
    uint64_t history_retention_ms; /* sekali.history's minutes older than this go */
    uint64_t archive_after_ms;     /* completed keys untouched this long move (sql/040) */
};

/* The supervisor's restart delays for workers that die without progress. */
struct sk_restart_conf {
    uint32_t initial_ms;           /* first delay's ceiling; doubles per death */
    uint32_t max_ms;               /* the ceiling's cap */
};

struct sk_queue_conf {
    char              *name;
    char              *handler;        /* path of the handler .so */
    char              *handler_config; /* the `config:` section re-emitted as YAML; NULL if absent */
    int                workers;
    int                prefetch;
    enum sk_queue_mode mode;
    bool               lock;           /* take a Redis lock on the resource key */
    uint32_t           lock_ttl_ms;    /* this queue's lease (defaults to lock.ttl) */
    int                concurrency;    /* jobs a resource admits at once; 1: the plain lock */
    size_t             max_body;       /* larger messages are dead-lettered */
    size_t             max_headers;    /* so are messages whose headers table is larger */
    char             **job_types;      /* accepted AMQP `type` values; none means any */
    size_t             n_job_types;
    uint32_t           job_timeout_ms; /* 0: no limit */
    struct sk_retry_conf retry;
    enum sk_redis_down on_redis_down;
    enum sk_queue_type queue_type;
    enum sk_queue_declare declare;
    uint32_t           lease_ms;       /* external mode: the key's lease, renewed every lease/3 */
    uint64_t           retention_ms;   /* finished keys older than this are deleted;
                                          SK_RETENTION_FOREVER: never */
    int                delivery_limit; /* quorum: the broker dead-letters past it; 0: none */
    int                max_priority;   /* classic: x-max-priority; 0: no priorities */
    bool               dead_letter_mirror; /* also copy dead letters to <queue>.dead */
    int                max_crashes;    /* a job whose worker died this often is dead-lettered; 0: off */
    int                batch;          /* most deliveries per transaction; 1: one job per transaction */
    int                batch_max;      /* what batch may grow to with far servers (batch_size.c) */
    int                prefetch_max;   /* what prefetch may grow to with it: prefetch when set */
    uint32_t           batch_wait_ms;  /* longest a worker waits to fill a batch; 0: never */
    uint32_t           batch_close_after_ms; /* handlers' run time after which a batch commits */
    struct sk_rate_conf rate;          /* rate_limit: how fast jobs may start; count 0: no limit */
    int                lanes;          /* <name>.lane.0 .. lanes-1, a tenant's each; 0: none */
    char               tenant_header[SK_TENANT_HEADER_MAX + 1]; /* whose a job is (lane.h) */
    struct sk_conf_mark *config_marks; /* where config:'s top-level scalars were written */
    size_t             n_config_marks;
};

/* The position of one top-level scalar of a queue's `config:`, for
 * host->config_where(): the value's first character, and how to count
 * from there. */
struct sk_conf_mark {
    char     *key;
    uint32_t  line, column;  /* 1-based, of the value's first character */
    int       style;         /* yaml_scalar_style_t */
    uint32_t  indent;        /* block scalar: the column its lines start at, 1-based */
    char     *raw;           /* the value as written (quotes, escapes), to count in */
};

/* A periodic job (docs/schedules.md): each tick is enqueued through the
 * outbox with the key schedule:<name>:<tick in UTC, ISO 8601>. */
struct sk_schedule_conf {
    char          *name;
    char          *cron_text;      /* as written; NULL for an `every:` schedule */
    uint32_t       every_ms;       /* 0 for a cron schedule */
    char          *timezone;       /* IANA name, NULL: UTC (cron only) */
    char          *queue;          /* one of the configured queues */
    char          *job_type;
    char          *body;           /* the job's body, as written */
    enum sk_missed missed;
    uint32_t       grace_ms;       /* how late a tick may be seen and still be on time */
    struct sk_cron when;           /* cron_text or every_ms, in timezone, parsed */
    uint32_t       queue_line, queue_column;  /* of `queue:`, for errors found after loading */
};

struct sk_conf {
    char                   *path;
    struct sk_amqp_conf     amqp;
    struct sk_redis_conf    redis;
    struct sk_postgres_conf postgres;
    struct sk_lock_conf     lock;
    struct sk_log_conf      log;
    struct sk_metrics_conf  metrics;
    struct sk_console_conf  console;
    struct sk_tracing_conf  tracing;
    struct sk_outbox_conf   outbox;
    struct sk_janitor_conf  janitor;
    struct sk_restart_conf  restart;
    uint32_t                shutdown_timeout_ms;
    struct sk_queue_conf   *queues;
    size_t                  n_queues;
    struct sk_schedule_conf *schedules;
    size_t                  n_schedules;
};

/* Loads and validates path. On success *out is a new snapshot the caller
 * frees with sk_conf_free(). On failure returns SK_ERR, leaves *out untouched
 * and sets err->msg to "path:line:column: message" (the position of the
 * offending node), or "path: message" when there is no position (file
 * unreadable). */
int  sk_conf_load(const char *path, struct sk_conf **out, struct sk_err *err);
void sk_conf_free(struct sk_conf *conf);

/* host->config_where(): "FILE:LINE:COL" of byte offset of the scalar at
 * key in a queue's handler config text, looked up (by the text's address)
 * in the snapshot given to sk_conf_where_begin(), into buf like snprintf().
 * Returns its length, or -1 when unknown. Supervisor only: set while the
 * handlers' check() run (plugin.c), NULL otherwise. */
void sk_conf_where_begin(const struct sk_conf *conf);
int  sk_conf_where(const char *config, const char *key, size_t offset, char *buf, size_t size);
/* host->config_queue(): a setting ("name", "mode", "lease", "job_timeout", "batch")
 * of the queue whose handler config is config, like sk_conf_where(). */
int  sk_conf_queue_setting(const char *config, const char *key, char *buf, size_t size);

const struct sk_queue_conf *sk_conf_queue(const struct sk_conf *conf, const char *name);

/* A schedule's spec as one line ("cron 0 3 * * * Europe/Berlin", "every 15m"),
 * for the state table and sekalictl schedules. */
void sk_conf_schedule_spec(const struct sk_schedule_conf *s, char *buf, size_t size);

/* Calls each(path, arg) for every key of the schema, in table order, as a
 * dotted path: "amqp.url", "shutdown_timeout", "queues[].retry.max_attempts".
 * Sections are visited, not named themselves. For the docs test that holds
 * conf/sekali.yaml and sekali.yaml(5) equal to the schema. */
void sk_conf_each_key(void (*each)(const char *path, void *arg), void *arg);

/* Settings that load but cannot work as meant: calls say(text, arg) once
 * per finding, a sentence naming the keys and the fix, and returns how many.
 * For `sekalid -t` and the log at start. */
int sk_conf_advise(const struct sk_conf *conf, void (*say)(const char *text, void *arg),
                   void *arg);

/* The shape sekalid declares a configured queue with (sk_broker_declare()). */
struct sk_queue_shape sk_conf_queue_shape(const struct sk_queue_conf *q);

#endif
