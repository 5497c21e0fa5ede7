/* config.c - turns sekali.yaml into an immutable struct sk_conf.
 *
 * Owns the schema. Each section is a static table of keys (type, field,
 * bounds, required), as nginx's command tables are, so a new key is one line
 * and the walker below does not change. The file is loaded whole with
 * libyaml's node API and walked in document order; the first error stops the
 * load and carries the offending node's file:line:column, so `sekalid -t`
 * reads like `nginx -t`. Secrets are resolved here, at load time, so that a
 * reload picks up rotated ones and the rest of the daemon sees a password.
 *
 * Values that can be parsed without the walker (integers, booleans, durations
 * and sizes, password sources, the handler's section re-emitted as YAML) are
 * in config_value.c; this file hands them their node's text and adds the
 * node's position to their messages. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config_value.h"
#include "cron.h"
#include "pg_conninfo.h"
#include "tz.h"

#ifndef SK_HANDLER_DIR
#define SK_HANDLER_DIR "/usr/local/lib/sekali/handlers"
#endif

#define MAX_FILE      MIB         /* a config larger than this is a mistake */
#define MAX_NAME      200         /* AMQP allows 255: leave room for suffixes */
#define NAME_CHARS    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
#define MIN_LOCK_TTL  100         /* shorter leases cannot be renewed (every ttl/3) in time */
#define MAX_RETENTION (100 * 365 * DAY)  /* years; longer is "forever" */

enum type {
    T_STR,            /* char *, non-empty */
    T_NAME,           /* char *, 1 to MAX_NAME of NAME_CHARS: safe in AMQP, Redis and logs */
    T_PATH,           /* char *, resolved against the config file's directory */
    T_HANDLER,        /* T_PATH, or a bare NAME: SK_HANDLER_DIR/NAME.so */
    T_LIST,           /* char ** of non-empty scalars, followed by its size_t count */
    T_INT,            /* int in [min, max] */
    T_BOOL,           /* bool: true/false/yes/no/on/off */
    T_DURATION,       /* uint32_t milliseconds in [min, max] */
    T_SIZE,           /* size_t bytes in [min, max] */
    T_RETENTION,      /* uint64_t milliseconds in [min, max], or "forever" */
    T_ENUM,           /* an enum whose values index names[] */
    T_SECTION,        /* a nested mapping described by sub[] */
    T_PASSWORD_ENV,   /* char *password, read from the named variable */
    T_PASSWORD_FILE,  /* char *password, read from the named file */
    T_CUSTOM,         /* fn() parses it and may fill several fields */
};

struct loader;

struct key {
    const char        *name;
    enum type          type;
    size_t             offset;  /* of the field in the section's struct */
    uint64_t           min, max;
    bool               required;
    const struct key  *sub;
    const char *const *names;
    int              (*fn)(struct loader *L, yaml_node_t *value, void *base);
};

struct loader {
    const char      *path;
    char            *dir;          /* absolute directory of path */
    yaml_document_t *doc;
    struct sk_err   *err;
    const char      *secret_from;  /* where this section's password came from */
    const char      *text;         /* the file's text, for positions inside values */
    size_t           len;
};

static int parse(struct loader *L, yaml_parser_t *parser, const char *text, size_t len);
static int load_map(struct loader *L, yaml_node_t *map, const char *label,
                    const struct key *table, void *base);
static int apply(struct loader *L, const struct key *k, yaml_node_t *v, void *base);
static int apply_name(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                      void *field);
static int apply_int(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                     void *field);
static int apply_measure(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                         void *field);
static int apply_enum(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                      void *field);
static int amqp_section(struct loader *L, yaml_node_t *v, void *base);
static int amqp_url(struct loader *L, yaml_node_t *v, void *base);
static int amqp_node(struct loader *L, yaml_node_t *v, const char *label,
                     struct sk_amqp_conf *a);
static int tls_section(struct loader *L, yaml_node_t *v, const char *label,
                       struct sk_tls_conf *tls);
static int amqp_tls(struct loader *L, yaml_node_t *v, void *base);
static int pg_conninfo(struct loader *L, yaml_node_t *v, void *base);
static int load_queues(struct loader *L, yaml_node_t *v, void *base);
static int load_list(struct loader *L, const struct key *k, yaml_node_t *v, void *field);
static int queue_config(struct loader *L, yaml_node_t *v, void *base);
static int metrics_listen(struct loader *L, yaml_node_t *v, void *base);
static int metrics_token(struct loader *L, yaml_node_t *v, void *base);
static int console_listen(struct loader *L, yaml_node_t *v, void *base);
static int console_token(struct loader *L, yaml_node_t *v, void *base);
static int redis_tls(struct loader *L, yaml_node_t *v, void *base);
static int sentinel_password_env(struct loader *L, yaml_node_t *v, void *base);
static int sentinel_password_file(struct loader *L, yaml_node_t *v, void *base);
static int sentinel_password(struct loader *L, yaml_node_t *v, enum type t, char **dst);
static int redis_section(struct loader *L, yaml_node_t *v, void *base);
static int redis_sentinels(struct loader *L, yaml_node_t *v, void *base);
static int password(struct loader *L, const struct key *k, yaml_node_t *v, char **dst);
static int claim_secret(struct loader *L, yaml_node_t *v, const char *source);
static int scalar(struct loader *L, yaml_node_t *n, const char *label,
                  const char *expect, const char **out);
static int store(struct loader *L, yaml_node_t *n, char **dst, const char *s);
static int fail(struct loader *L, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static yaml_node_t *node(struct loader *L, int index);
static yaml_node_t *find_value(struct loader *L, yaml_node_t *map, const char *key);
static yaml_node_t *lookup(struct loader *L, yaml_node_t *map, const char *key);
static int check_batch(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q);
static int check_priority(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q);
static const char *kind(const yaml_node_t *n);
static bool is_null(const yaml_node_t *n);
static char *resolve(struct loader *L, const char *path);
static char *resolve_handler(struct loader *L, const char *name);
static int mark_config(struct loader *L, yaml_node_t *v, struct sk_queue_conf *q);
static int load_schedules(struct loader *L, yaml_node_t *v, void *base);
static int schedule_cron(struct loader *L, yaml_node_t *v, void *base);
static int schedule_zone(struct loader *L, yaml_node_t *v, void *base);
static int schedule_queue(struct loader *L, yaml_node_t *v, void *base);
static int check_schedule(struct loader *L, yaml_node_t *item, struct sk_schedule_conf *s);
static int check_schedule_queues(struct loader *L, struct sk_conf *c);

/* The schema. Adding a key: a line here, a field in config.h (or the
 * adapter's conf struct), its default below the tables, a documented line in
 * conf/sekali.yaml and an entry in man/sekali.yaml.5; tests/unit/check_docs.c
 * holds those three equal (docs/internals.md, "Adding a config key"). */
#define OF(s, f)                   offsetof(struct s, f)
#define STR(n, s, f)               { .name = n, .type = T_STR, .offset = OF(s, f) }
#define NAME(n, s, f, req)         { .name = n, .type = T_NAME, .offset = OF(s, f), .required = req }
#define PATH(n, s, f, req)         { .name = n, .type = T_PATH, .offset = OF(s, f), .required = req }
#define HANDLER(n, s, f, req)      { .name = n, .type = T_HANDLER, .offset = OF(s, f), .required = req }
#define LIST(n, s, f)              { .name = n, .type = T_LIST, .offset = OF(s, f) }
#define INT(n, s, f, lo, hi)       { .name = n, .type = T_INT, .offset = OF(s, f), .min = lo, .max = hi }
#define BOOL(n, s, f)              { .name = n, .type = T_BOOL, .offset = OF(s, f) }
#define DURATION(n, s, f, lo, hi)  { .name = n, .type = T_DURATION, .offset = OF(s, f), .min = lo, .max = hi }
#define SIZE(n, s, f, lo, hi)      { .name = n, .type = T_SIZE, .offset = OF(s, f), .min = lo, .max = hi }
#define RETENTION(n, s, f)         { .name = n, .type = T_RETENTION, .offset = OF(s, f), .min = SEC, .max = MAX_RETENTION }
#define ENUM(n, s, f, list)        { .name = n, .type = T_ENUM, .offset = OF(s, f), .names = list }
#define SUBSECTION(n, s, f, table)  { .name = n, .type = T_SECTION, .offset = OF(s, f), \
                                     .sub = table }
#define SECTION(n, f, table, req)  { .name = n, .type = T_SECTION, .offset = OF(sk_conf, f), \
                                     .sub = table, .required = req }
#define CUSTOM(n, func, req)       { .name = n, .type = T_CUSTOM, .fn = func, .required = req }
/* A section with checks of its own: fn() loads it by table, which names its
 * keys for sk_conf_each_key() (the loader itself goes through fn() only). */
#define CUSTOM_SECTION(n, func, table, req) \
    { .name = n, .type = T_CUSTOM, .fn = func, .sub = table, .required = req }
#define PASSWORD(s) \
    { .name = "password_env",  .type = T_PASSWORD_ENV,  .offset = OF(s, password) }, \
    { .name = "password_file", .type = T_PASSWORD_FILE, .offset = OF(s, password) }
#define END                        { .name = NULL }

/* Indexed by enum value: keep them in config.h's order. */
static const char *const modes[]   = { "transactional", "external", NULL };
static const char *const levels[]  = { "debug", "info", "warn", "error", NULL };
static const char *const formats[] = { "auto", "json", "text", NULL };
static const char *const redis_down[] = { "proceed", "wait", NULL };
static const char *const queue_types[] = { "classic", "quorum", NULL };
static const char *const declares[] = { "auto", "passive", NULL };
static const char *const amqp_auths[] = { "plain", "external", NULL };
static const char *const misseds[] = { "skip", "once", "all", NULL };

/* The same keys for every server's tls: section. */
static const struct key tls_keys[] = {
    PATH("ca_file",     sk_tls_conf, ca_file, false),
    PATH("cert_file",   sk_tls_conf, cert_file, false),
    PATH("key_file",    sk_tls_conf, key_file, false),
    STR("server_name",  sk_tls_conf, server_name),
    BOOL("verify",      sk_tls_conf, verify),
    END
};

static const struct key amqp_keys[] = {
    CUSTOM("url", amqp_url, true),
    PASSWORD(sk_amqp_conf),
    DURATION("heartbeat",       sk_amqp_conf, heartbeat_ms,       0, HOUR),
    DURATION("connect_timeout", sk_amqp_conf, connect_timeout_ms, 1, HOUR),
    DURATION("consumer_timeout", sk_amqp_conf, consumer_timeout_ms, 0, 7 * DAY),
    CUSTOM_SECTION("tls", amqp_tls, tls_keys, false),
    ENUM("auth_mechanism", sk_amqp_conf, auth, amqp_auths),
    END
};

static const struct key redis_keys[] = {
    STR("host",         sk_redis_conf, host),
    INT("port",         sk_redis_conf, port, 1, 65535),
    INT("db",           sk_redis_conf, db, 0, 15),
    PASSWORD(sk_redis_conf),
    DURATION("timeout", sk_redis_conf, timeout_ms, 1, HOUR),
    CUSTOM("sentinels", redis_sentinels, false),
    STR("master_name",  sk_redis_conf, master_name),
    STR("username",     sk_redis_conf, username),
    CUSTOM_SECTION("tls", redis_tls, tls_keys, false),
    STR("sentinel_username", sk_redis_conf, sentinel_username),
    CUSTOM("sentinel_password_env", sentinel_password_env, false),
    CUSTOM("sentinel_password_file", sentinel_password_file, false),
    END
};

static const struct key postgres_keys[] = {
    CUSTOM("conninfo", pg_conninfo, true),
    PASSWORD(sk_postgres_conf),
    DURATION("lock_timeout", sk_postgres_conf, lock_timeout_ms, 1, HOUR),
    DURATION("idle_in_transaction_timeout", sk_postgres_conf, idle_in_transaction_timeout_ms,
             0, DAY),
    END
};

static const struct key lock_keys[] = {
    DURATION("ttl",       sk_lock_conf, ttl_ms,       MIN_LOCK_TTL, DAY),
    DURATION("busy_wait", sk_lock_conf, busy_wait_ms, 0, HOUR),
    END
};

static const struct key log_keys[] = {
    ENUM("level",  sk_log_conf, level,  levels),
    ENUM("format", sk_log_conf, format, formats),
    END
};

static const struct key metrics_keys[] = {
    CUSTOM("listen", metrics_listen, false),
    CUSTOM("token_file", metrics_token, false),
    END
};

/* console.listen and token_file are parsed as metrics' are: the same
 * address rules, the same token characters, read at load. */
static const struct key console_keys[] = {
    CUSTOM("listen", console_listen, false),
    CUSTOM("token_file", console_token, false),
    PATH("tls_cert_file", sk_console_conf, tls_cert_file, false),
    PATH("tls_key_file",  sk_console_conf, tls_key_file, false),
    DURATION("session",   sk_console_conf, session_ms, MIN, DAY),
    END
};

static const struct key retry_keys[] = {
    INT("max_attempts",  sk_retry_conf, max_attempts, 1, 1000),
    DURATION("initial",  sk_retry_conf, initial_ms, 1, HOUR),
    DURATION("max",      sk_retry_conf, max_ms, 1, DAY),
    END
};

/* A batch's handlers run in savepoints of one transaction, each taking a
 * subtransaction id; past PostgreSQL's 64 cached per backend every snapshot
 * gets slower, so a much larger batch would buy nothing. */
#define MAX_BATCH 256

/* Batching is on unless a queue says batch: 1, and costs nothing at a
 * light load: a worker takes only what its prefetch window already holds
 * (batch_wait 0), so a lone job is a batch of one. Under load, 16 jobs a
 * COMMIT, a lock round trip and a multiple-ack is where the benchmark's
 * gain flattens (docs/benchmark.md: batch 64 adds little over 16). */
#define DEFAULT_BATCH 16
/* Past this much handler time (wall clock) a batch commits what ran: a
 * slower handler gains little from sharing a COMMIT (well under a
 * millisecond), and its batch-mates' row locks and latency should not wait
 * on it. Not lower: with more workers than cores a batch's wall time
 * includes waiting for a core, and at 20 ms 16 workers on 2 cores closed
 * their batches early all the time (make bench: 0.74x batch 1 and twice
 * PostgreSQL's CPU per job, against 2.1x and 0.23 ms at 100 ms). */
#define DEFAULT_BATCH_CLOSE_AFTER 100

/* A retry or dead-letter copy must fit, properties and all, in one header
 * frame: 131072 bytes, the frame_max sekalid asks for and RabbitMQ's
 * default. RabbitMQ checks frame_max only on what it receives, so a message
 * it grows past the limit by dead-lettering it reaches the next reader too
 * large for the frame (librabbitmq 0.11 then corrupts its own heap; see
 * broker_conn.h). max_headers counts every header a message arrives with,
 * x-death included, and must leave room for all the growth still to come:
 *   - the frame's own 20 bytes, the flags and ten short strings: 2.6 KB;
 *   - sekali's headers on a retry or dead-letter copy (the error text, the
 *     queue name, timestamps, the note of dropped headers): 2 KB;
 *   - the broker's x-death, one entry of at most 611 bytes (a 255-byte
 *     queue name twice) per delay queue crossed: the ladder from 10 ms to
 *     retry.max's one day has 62 buckets, and with the work queue's own
 *     `rejected` entry that is 38.5 KB;
 *   - x-first-death-* and x-last-death-*: 1.7 KB.
 * 131072 - 44.8 KB leaves 86 KB; 80 KiB keeps 4 KB of margin, and no
 * larger max_headers is accepted. 64 KiB, the default, keeps 20 KB. */
#define MAX_HEADERS_CAP (80 * 1024)

/* Whether name is one of queue's own: queue.dead, or queue.delay.<digits>. */
static bool owned_by(const char *name, const char *queue)
{
    size_t n = strlen(queue);
    if (strncmp(name, queue, n) != 0)
        return false;
    const char *rest = name + n;
    if (strcmp(rest, ".dead") == 0)
        return true;
    if (strncmp(rest, ".delay.", 7) != 0 || rest[7] == '\0')
        return false;
    for (rest += 7; *rest != '\0'; rest++)
        if (*rest < '0' || *rest > '9')
            return false;
    return true;
}

static const struct key queue_keys[] = {
    NAME("name",            sk_queue_conf, name, true),
    HANDLER("handler",      sk_queue_conf, handler, true),
    INT("workers",          sk_queue_conf, workers,  1, 256),
    INT("prefetch",         sk_queue_conf, prefetch, 1, 65535),
    ENUM("mode",            sk_queue_conf, mode, modes),
    BOOL("lock",            sk_queue_conf, lock),
    DURATION("lock_ttl",    sk_queue_conf, lock_ttl_ms, MIN_LOCK_TTL, DAY),
    SIZE("max_body",        sk_queue_conf, max_body, 1, 128 * MIB),
    SIZE("max_headers",     sk_queue_conf, max_headers, 1, MAX_HEADERS_CAP),
    LIST("job_types",       sk_queue_conf, job_types),
    DURATION("job_timeout", sk_queue_conf, job_timeout_ms, 0, DAY),
    SUBSECTION("retry",     sk_queue_conf, retry, retry_keys),
    ENUM("on_redis_down",   sk_queue_conf, on_redis_down, redis_down),
    ENUM("queue_type",      sk_queue_conf, queue_type, queue_types),
    ENUM("declare",         sk_queue_conf, declare, declares),
    INT("delivery_limit",   sk_queue_conf, delivery_limit, 0, 1000000),
    INT("max_priority",     sk_queue_conf, max_priority, 0, 255),
    INT("max_crashes",      sk_queue_conf, max_crashes, 0, 1000),
    BOOL("dead_letter_mirror", sk_queue_conf, dead_letter_mirror),
    INT("batch",            sk_queue_conf, batch, 1, MAX_BATCH),
    DURATION("batch_wait",  sk_queue_conf, batch_wait_ms, 0, SEC),
    DURATION("batch_close_after", sk_queue_conf, batch_close_after_ms, 1, HOUR),
    DURATION("lease",       sk_queue_conf, lease_ms, MIN_LOCK_TTL, DAY),
    RETENTION("retention",  sk_queue_conf, retention_ms),
    CUSTOM("config", queue_config, false),
    END
};

static const struct key outbox_keys[] = {
    INT("relays",               sk_outbox_conf, relays, 0, 64),
    INT("batch",                sk_outbox_conf, batch, 1, 10000),
    DURATION("poll_interval",   sk_outbox_conf, poll_interval_ms, 10, HOUR),
    END
};

static const struct key janitor_keys[] = {
    DURATION("interval",         sk_janitor_conf, interval_ms, 0, DAY),
    INT("batch",                 sk_janitor_conf, batch, 1, 100000),
    RETENTION("outbox_retention", sk_janitor_conf, outbox_retention_ms),
    END
};

static const struct key restart_keys[] = {
    DURATION("initial", sk_restart_conf, initial_ms, 1, HOUR),
    DURATION("max",     sk_restart_conf, max_ms, 1, DAY),
    END
};

/* A schedule's list is bounded so that one scheduler round stays short. */
#define MAX_SCHEDULES 1000

static const struct key schedule_keys[] = {
    NAME("name",           sk_schedule_conf, name, true),
    CUSTOM("cron",         schedule_cron, false),
    DURATION("every",      sk_schedule_conf, every_ms, SEC, DAY),
    CUSTOM("timezone",     schedule_zone, false),
    CUSTOM("queue",        schedule_queue, true),
    STR("job_type",        sk_schedule_conf, job_type),
    STR("body",            sk_schedule_conf, body),
    ENUM("missed",         sk_schedule_conf, missed, misseds),
    DURATION("grace",      sk_schedule_conf, grace_ms, 0, DAY),
    END
};

static const struct key top_keys[] = {
    CUSTOM_SECTION("amqp", amqp_section, amqp_keys, true),
    CUSTOM_SECTION("redis", redis_section, redis_keys, false),
    SECTION("postgres", postgres, postgres_keys, true),
    SECTION("lock",     lock,     lock_keys,     false),
    SECTION("log",      log,      log_keys,      false),
    SECTION("outbox",   outbox,   outbox_keys,   false),
    SECTION("janitor",  janitor,  janitor_keys,  false),
    SECTION("metrics",  metrics,  metrics_keys,  false),
    SECTION("console",  console,  console_keys,  false),
    SECTION("restart",  restart,  restart_keys,  false),
    DURATION("shutdown_timeout", sk_conf, shutdown_timeout_ms, 0, DAY),
    CUSTOM_SECTION("queues", load_queues, queue_keys, true),
    CUSTOM_SECTION("schedules", load_schedules, schedule_keys, false),
    END
};

/* Strings (redis.host, amqp.password) are set in sk_conf_load(). */
static const struct sk_conf conf_defaults = {
    .amqp  = { .heartbeat_ms = 30 * SEC, .connect_timeout_ms = 5 * SEC,
               .tls = { .verify = true } },
    .redis = { .port = 6379, .timeout_ms = 2 * SEC, .tls = { .verify = true } },
    .postgres = { .lock_timeout_ms = 5 * SEC, .idle_in_transaction_timeout_ms = 10 * 60 * SEC },
    .lock  = { .ttl_ms = 30 * SEC, .busy_wait_ms = 2 * SEC },
    .log   = { .level = SK_LOG_INFO, .format = SK_LOG_FORMAT_AUTO },
    .shutdown_timeout_ms = 30 * SEC,
    .outbox = { .relays = 0, .batch = 100, .poll_interval_ms = SEC },
    .janitor = { .interval_ms = 60 * SEC, .batch = 1000, .outbox_retention_ms = 7 * DAY },
    .restart = { .initial_ms = 200, .max_ms = 30 * SEC },
    .console = { .session_ms = 15 * MIN },
};

/* See MAX_HEADERS_CAP. */
#define MAX_HEADERS_DEFAULT (64 * 1024)

/* lock_ttl_ms 0 means "lock.ttl", filled in once the whole file is read. */
static const struct sk_queue_conf queue_defaults = {
    .workers = 1, .prefetch = 10, .mode = SK_MODE_TRANSACTIONAL, .lock = true, .max_body = MIB,
    .max_headers = MAX_HEADERS_DEFAULT,
    .retry = { .max_attempts = 5, .initial_ms = SEC, .max_ms = 5 * 60 * SEC },
    .on_redis_down = SK_REDIS_DOWN_PROCEED,
    .lease_ms = 30 * SEC,
    .retention_ms = 30 * DAY,
    .max_crashes = 3,
    .batch = DEFAULT_BATCH, .batch_wait_ms = 0, .batch_close_after_ms = DEFAULT_BATCH_CLOSE_AFTER,
};

/* T_ENUM writes through an int; T_LIST finds its count right after the array. */
_Static_assert(OF(sk_queue_conf, n_job_types) == OF(sk_queue_conf, job_types) + sizeof(char **),
               "n_job_types follows job_types");
_Static_assert(sizeof(enum sk_queue_mode) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sk_log_level) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sk_log_format) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sk_redis_down) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sk_queue_type) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sk_queue_declare) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sk_amqp_auth) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sk_missed) == sizeof(int), "enum size");

int sk_conf_load(const char *path, struct sk_conf **out, struct sk_err *err)
{
    struct loader L = { .path = path, .err = err };
    struct sk_conf *c = NULL;
    yaml_parser_t parser;
    yaml_document_t doc;
    char *text = NULL, *dircopy = NULL;
    const char *op;
    size_t len;
    int rc = SK_ERR;

    int e = sk_conf_value_read_file(path, MAX_FILE, &text, &len, &op);
    if (e != 0)
        return sk_err_set(err, SK_ERR, "%s: cannot %s: %s", path, op,
                          sk_conf_value_read_error(e));
    /* Relative handler and password paths follow the file, not the cwd:
     * the supervisor may have chdir()ed long before a reload. */
    if ((dircopy = strdup(path)) == NULL || (L.dir = realpath(dirname(dircopy), NULL)) == NULL) {
        sk_err_errno(err, SK_ERR, "%s: cannot resolve its directory", path);
        goto fail;
    }
    if ((c = malloc(sizeof(*c))) != NULL) {
        *c = conf_defaults;
        c->path = strdup(path);
        c->redis.host = strdup("127.0.0.1");
        c->amqp.password = strdup("guest");  /* the broker's default, as in amqp_parse_url() */
    }
    if (c == NULL || !c->path || !c->redis.host || !c->amqp.password || !yaml_parser_initialize(&parser)) {
        sk_err_set(err, SK_ERR, "%s: out of memory", path);
        goto fail;
    }
    L.doc = &doc;
    L.text = text;
    L.len = len;
    if (parse(&L, &parser, text, len) == SK_OK) {
        rc = load_map(&L, yaml_document_get_root_node(&doc), "top level", top_keys, c);
        if (rc == SK_OK)  /* queues: may come after schedules: */
            rc = check_schedule_queues(&L, c);
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&parser);
    if (rc != SK_OK)
        goto fail;

    /* Only now, because lock: may come after queues:. */
    for (size_t i = 0; i < c->n_queues; i++)
        if (c->queues[i].lock_ttl_ms == 0)
            c->queues[i].lock_ttl_ms = c->lock.ttl_ms;
    *out = c;
    c = NULL;
fail:
    sk_conf_free(c);
    free(L.dir);
    free(dircopy);
    free(text);
    return rc;
}

void sk_conf_free(struct sk_conf *c)
{
    if (c == NULL)
        return;
    free(c->path);
    for (size_t i = 0; i < c->amqp.n_nodes; i++)
        free(c->amqp.nodes[i].host);
    free(c->amqp.vhost);
    free(c->amqp.user);
    sk_conf_value_wipe(c->amqp.password);
    sk_tls_conf_free(&c->amqp.tls);
    free(c->redis.host);
    sk_conf_value_wipe(c->redis.password);
    free(c->redis.username);
    sk_tls_conf_free(&c->redis.tls);
    free(c->redis.sentinel_username);
    sk_conf_value_wipe(c->redis.sentinel_password);
    for (size_t i = 0; i < c->redis.n_sentinels; i++)
        free(c->redis.sentinels[i].host);
    free(c->redis.sentinels);
    free(c->redis.master_name);
    free(c->postgres.conninfo);
    sk_conf_value_wipe(c->postgres.password);
    free(c->metrics.listen_host);
    sk_conf_value_wipe(c->metrics.token);
    free(c->console.http.listen_host);
    sk_conf_value_wipe(c->console.http.token);
    free(c->console.tls_cert_file);
    free(c->console.tls_key_file);
    for (size_t i = 0; i < c->n_queues; i++) {
        struct sk_queue_conf *q = &c->queues[i];
        free(q->name);
        free(q->handler);
        sk_conf_value_wipe(q->handler_config);  /* handlers keep their own secrets there */
        for (size_t j = 0; j < q->n_config_marks; j++) {
            free(q->config_marks[j].key);
            sk_conf_value_wipe(q->config_marks[j].raw);
        }
        free(q->config_marks);
        for (size_t j = 0; j < q->n_job_types; j++)
            free(q->job_types[j]);
        free(q->job_types);
    }
    free(c->queues);
    for (size_t i = 0; i < c->n_schedules; i++) {
        struct sk_schedule_conf *s = &c->schedules[i];
        free(s->name);
        free(s->cron_text);
        free(s->timezone);
        free(s->queue);
        free(s->job_type);
        free(s->body);
    }
    free(c->schedules);
    free(c);
}

const struct sk_queue_conf *sk_conf_queue(const struct sk_conf *conf, const char *name)
{
    for (size_t i = 0; conf != NULL && name != NULL && i < conf->n_queues; i++)
        if (strcmp(conf->queues[i].name, name) == 0)
            return &conf->queues[i];
    return NULL;
}

int sk_conf_advise(const struct sk_conf *conf, void (*say)(const char *text, void *arg),
                   void *arg)
{
    int n = 0;
    for (size_t i = 0; i < conf->n_queues; i++) {
        const struct sk_queue_conf *q = &conf->queues[i];
        /* A lock is renewed every ttl/3 with the same Redis timeout as any
         * call: a renewal that hangs for all of it, then one more, spend
         * the whole lease before the worker learns that it is gone. */
        if (!q->lock || conf->redis.timeout_ms < q->lock_ttl_ms / 3)
            continue;
        char text[512], timeout[32], ttl[32];
        snprintf(text, sizeof(text), "queue %s: redis.timeout (%s) is not below a third of its "
                 "lock TTL (%s): a stuck lock renewal can use up the lease before the worker "
                 "learns it failed; lower redis.timeout below %u ms, or raise lock_ttl",
                 q->name, sk_conf_value_fmt_duration(conf->redis.timeout_ms, timeout,
                                                      sizeof(timeout)),
                 sk_conf_value_fmt_duration(q->lock_ttl_ms, ttl, sizeof(ttl)),
                 q->lock_ttl_ms / 3);
        say(text, arg);
        n++;
    }
    /* Ticks are outbox rows: without a relay somewhere they wait there. */
    if (conf->n_schedules > 0 && conf->outbox.relays == 0) {
        say("schedules are enqueued through the outbox, but outbox.relays is 0 here: their "
            "jobs are published only if a relay runs on another host; set outbox.relays: 1",
            arg);
        n++;
    }
    return n;
}

struct sk_queue_shape sk_conf_queue_shape(const struct sk_queue_conf *q)
{
    return (struct sk_queue_shape){ .quorum = q->queue_type == SK_QUEUE_QUORUM,
                                    .delivery_limit = (uint32_t)q->delivery_limit,
                                    .max_priority = (uint8_t)q->max_priority,
                                    .passive = q->declare == SK_DECLARE_PASSIVE };
}

/* Loads the one document of text into *L->doc, which the caller deletes
 * on success. A syntax error, an empty file or a second document fails. */
static int parse(struct loader *L, yaml_parser_t *parser, const char *text, size_t len)
{
    yaml_document_t extra;
    yaml_node_t *root;
    yaml_mark_t m;

    yaml_parser_set_input_string(parser, (const unsigned char *)text, len);
    if (yaml_parser_load(parser, L->doc)) {
        root = yaml_document_get_root_node(L->doc);
        if (root == NULL || is_null(root)) {
            yaml_document_delete(L->doc);
            return sk_err_set(L->err, SK_ERR, "%s:1:1: empty file: expected a mapping of "
                              "sections", L->path);
        }
        /* Whatever follows the first document would be silently ignored. */
        if (yaml_parser_load(parser, &extra)) {
            m = extra.start_mark;
            root = yaml_document_get_root_node(&extra);
            yaml_document_delete(&extra);
            if (root == NULL)
                return SK_OK;
            yaml_document_delete(L->doc);
            return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: found a second YAML document; a "
                              "config file holds one", L->path, m.line + 1, m.column + 1);
        }
        yaml_document_delete(L->doc);
    }
    m = parser->problem_mark;
    if (parser->error == YAML_READER_ERROR) {
        /* The reader (bad UTF-8, control characters) has a byte offset, not a mark. */
        m = (yaml_mark_t){ 0, 0, 0 };
        for (size_t i = 0; i < parser->problem_offset && i < len; i++) {
            m.column = text[i] == '\n' ? 0 : m.column + (((unsigned char)text[i] & 0xc0) != 0x80);
            m.line += text[i] == '\n';
        }
    }
    if (parser->context == NULL)
        return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: syntax error: %s", L->path, m.line + 1,
                          m.column + 1, parser->problem ? parser->problem : "out of memory");
    return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: syntax error: %s (%s that starts at %zu:%zu)",
                      L->path, m.line + 1, m.column + 1, parser->problem, parser->context,
                      parser->context_mark.line + 1, parser->context_mark.column + 1);
}

/* Applies each pair of map to base through table, in document order, then
 * checks the required keys. label names the mapping in messages. A null
 * value (a section whose lines are all commented out) counts as empty. */
static int load_map(struct loader *L, yaml_node_t *map, const char *label,
                    const struct key *table, void *base)
{
    const char *saved = L->secret_from, *name;
    yaml_node_pair_t *p = NULL, *end = NULL;
    char where[48];
    uint64_t seen = 0;
    int rc = SK_OK;

    if (map->type != YAML_MAPPING_NODE && !is_null(map))
        return fail(L, map, "%s: expected a mapping, got %s", label, kind(map));
    if (map->type == YAML_MAPPING_NODE) {
        p = map->data.mapping.pairs.start;
        end = map->data.mapping.pairs.top;
    }
    snprintf(where, sizeof(where), "%s %s", table == top_keys ? "at the" : "in", label);
    L->secret_from = NULL;
    for (; p < end && rc == SK_OK; p++) {
        yaml_node_t *kn = node(L, p->key);
        size_t i;

        if ((rc = scalar(L, kn, "key", "a scalar", &name)) != SK_OK)
            break;
        for (i = 0; table[i].name != NULL && strcmp(table[i].name, name) != 0; i++)
            ;
        sk_assert(i < 64);
        if (table[i].name == NULL)
            rc = fail(L, kn, "unknown key \"%.64s\" %s", name, where);
        else if (seen & (UINT64_C(1) << i))
            rc = fail(L, kn, "duplicate key \"%s\" %s", name, where);
        else
            rc = apply(L, &table[i], node(L, p->value), base);
        seen |= UINT64_C(1) << i;
    }
    for (size_t i = 0; rc == SK_OK && table[i].name != NULL; i++)
        if (table[i].required && !(seen & (UINT64_C(1) << i)))
            rc = fail(L, map, "missing required key \"%s\" %s", table[i].name, where);
    L->secret_from = saved;
    return rc;
}

static int apply(struct loader *L, const struct key *k, yaml_node_t *v, void *base)
{
    void *field = (char *)base + k->offset;
    const char *s;

    if (k->type == T_SECTION)
        return load_map(L, v, k->name, k->sub, field);
    if (k->type == T_CUSTOM)
        return k->fn(L, v, base);
    if (k->type == T_PASSWORD_ENV || k->type == T_PASSWORD_FILE)
        return password(L, k, v, field);
    if (k->type == T_LIST)
        return load_list(L, k, v, field);
    int rc = scalar(L, v, k->name, k->type == T_INT ? "an integer" : k->type == T_BOOL ?
                    "a boolean" : "a scalar", &s);
    if (rc != SK_OK)
        return rc;
    if ((*s == '\0' || is_null(v)) && (k->type == T_STR || k->type == T_PATH ||
                                          k->type == T_HANDLER))
        return fail(L, v, "%s must not be empty", k->name);

    switch (k->type) {
    case T_STR:
        return store(L, v, field, s);
    case T_NAME:
        return apply_name(L, k, v, s, field);
    case T_PATH:  /* existence is the plugin loader's business: it can say why */
    case T_HANDLER:
        free(*(char **)field);
        if ((*(char **)field = k->type == T_HANDLER ? resolve_handler(L, s) : resolve(L, s)) == NULL)
            return fail(L, v, "out of memory");
        return SK_OK;
    case T_INT:
        return apply_int(L, k, v, s, field);
    case T_BOOL:
        if (sk_conf_value_parse_bool(s, field) != SK_OK)
            return fail(L, v, "%s: expected a boolean (true/false/yes/no/on/off), got \"%.64s\"",
                        k->name, s);
        return SK_OK;
    case T_RETENTION:
        if (strcmp(s, "forever") == 0) {
            *(uint64_t *)field = SK_RETENTION_FOREVER;
            return SK_OK;
        }
        /* fall through */
    case T_DURATION:
    case T_SIZE:
        return apply_measure(L, k, v, s, field);
    case T_ENUM:
        return apply_enum(L, k, v, s, field);
    default:
        sk_assert(!"unhandled key type");
        return SK_ERR;
    }
}

static int apply_name(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                      void *field)
{
    if (strlen(s) > MAX_NAME || s[strspn(s, NAME_CHARS)] != '\0' || *s == '\0')
        return fail(L, v, "invalid %s \"%.64s\": use 1 to %d characters from "
                    "A-Z a-z 0-9 . _ -", k->name, s, MAX_NAME);
    /* RabbitMQ reserves the prefix: declaring such a queue is refused
     * with ACCESS_REFUSED, which workers would retry for ever. */
    if (strncmp(s, "amq.", 4) == 0)
        return fail(L, v, "invalid %s \"%.64s\": names starting with \"amq.\" are "
                    "reserved by RabbitMQ", k->name, s);
    return store(L, v, field, s);
}

static int apply_int(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                     void *field)
{
    int64_t i;
    if (sk_conf_value_parse_int(s, &i) != SK_OK)
        return fail(L, v, "%s: expected an integer, got \"%.64s\"", k->name, s);
    if (i < (int64_t)k->min || i > (int64_t)k->max)
        return fail(L, v, "%s must be between %" PRIu64 " and %" PRIu64 ", got %.64s",
                    k->name, k->min, k->max, s);
    *(int *)field = (int)i;
    return SK_OK;
}

/* A duration (stored in ms as uint32_t, a retention's as uint64_t) or a
 * size (bytes, size_t). */
static int apply_measure(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                         void *field)
{
    bool duration = k->type != T_SIZE;
    const char *(*fmt)(uint64_t, char *, size_t) = duration ?
        sk_conf_value_fmt_duration : sk_conf_value_fmt_size;
    char lo[32], hi[32];
    struct sk_err e;
    uint64_t u;
    int rc = duration ? sk_conf_value_parse_duration(s, &u, &e) : sk_conf_value_parse_size(s, &u, &e);
    if (rc != SK_OK)
        return fail(L, v, "%s%s", e.msg, k->type == T_RETENTION ? ", or forever" : "");
    if (u < k->min || u > k->max)
        return fail(L, v, "%s must be between %s and %s%s, got %.64s", k->name,
                    fmt(k->min, lo, sizeof(lo)), fmt(k->max, hi, sizeof(hi)),
                    k->type == T_RETENTION ? ", or forever" : "", s);
    if (k->type == T_DURATION)
        *(uint32_t *)field = (uint32_t)u;
    else if (k->type == T_RETENTION)
        *(uint64_t *)field = u;
    else
        *(size_t *)field = (size_t)u;
    return SK_OK;
}

static int apply_enum(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                      void *field)
{
    for (int j = 0; k->names[j] != NULL; j++) {
        if (strcmp(k->names[j], s) == 0) {
            *(int *)field = j;
            return SK_OK;
        }
    }
    char names[96] = "";
    for (int j = 0; k->names[j] != NULL; j++)
        snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                 j == 0 ? "" : k->names[j + 1] ? ", " : " or ", k->names[j]);
    return fail(L, v, "unknown %s \"%.64s\": expected %s", k->name, s, names);
}

/* amqp.url: amqp[s]://[user[:password]@]host[:port]/[vhost], or a sequence of
 * such URLs, one per node of a RabbitMQ cluster (a list rather than one
 * comma-separated string: each entry gets its own line:column in errors,
 * and a password may hold a comma). */
static int amqp_url(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_amqp_conf *a = base;
    char label[32];
    int rc;

    if (v->type == YAML_SCALAR_NODE)
        return amqp_node(L, v, "url", a);
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(L, v, "url: expected an amqp:// URL or a list of them, got %s", kind(v));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0)
        return fail(L, v, "url: the list of nodes is empty");
    if (n > SK_AMQP_MAX_NODES)
        return fail(L, v, "url: %zu nodes listed, at most %d", n, SK_AMQP_MAX_NODES);
    for (size_t i = 0; i < n; i++) {
        snprintf(label, sizeof(label), "url[%zu]", i);
        if ((rc = amqp_node(L, node(L, v->data.sequence.items.start[i]), label, a)) != SK_OK)
            return rc;
    }
    return SK_OK;
}

/* One node's URL: broker_url.c reads it; the password in url[0] must be
 * the only one given. Messages leave the URL out: it may hold a password. */
static int amqp_node(struct loader *L, yaml_node_t *v, const char *label,
                     struct sk_amqp_conf *a)
{
    bool first = a->n_nodes == 0, wrote_password;
    struct sk_err e;
    const char *s = NULL;
    int rc;

    if ((rc = scalar(L, v, label, "a scalar", &s)) != SK_OK)
        return rc;
    if (sk_broker_url_add(a, label, s, &wrote_password, &e) != SK_OK)
        return fail(L, v, "%s", e.msg);
    if (first && wrote_password)
        return claim_secret(L, v, "the password in url");
    return SK_OK;
}

/* The amqp section, plus what its table cannot say: tls: settings need an
 * amqps:// URL (they would otherwise be silently unused, and the link in
 * clear text), and EXTERNAL needs the certificate it logs in with. */
static int amqp_section(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_amqp_conf *a = &((struct sk_conf *)base)->amqp;
    yaml_node_t *at;
    int rc;

    if ((rc = load_map(L, v, "amqp", amqp_keys, a)) != SK_OK)
        return rc;
    if ((at = lookup(L, v, "tls")) != NULL && !a->tls.enabled)
        return fail(L, at, "amqp.tls needs amqps:// URLs: with amqp:// the link would be "
                    "clear text");
    if (a->auth == SK_AMQP_AUTH_EXTERNAL && a->tls.cert_file == NULL)
        return fail(L, lookup(L, v, "auth_mechanism"), "auth_mechanism external logs in with "
                    "a client certificate: give amqp.tls.cert_file and key_file");
    return SK_OK;
}

static int amqp_tls(struct loader *L, yaml_node_t *v, void *base)
{
    return tls_section(L, v, "amqp.tls", &((struct sk_amqp_conf *)base)->tls);
}

/* A tls: section (amqp.tls, redis.tls): its keys, then its files, read now
 * so that a missing or wrong-permission key fails `sekalid -t` and a
 * reload, at the section's position, instead of every connection. */
static int tls_section(struct loader *L, yaml_node_t *v, const char *label,
                       struct sk_tls_conf *tls)
{
    struct sk_err e;
    yaml_node_t *at;
    int rc;

    if ((rc = load_map(L, v, label, tls_keys, tls)) != SK_OK)
        return rc;
    if (sk_tls_check_files(tls, label, &e) == SK_OK)
        return SK_OK;
    /* Blame the key the message names. */
    static const char *const keys[] = { "key_file", "cert_file", "ca_file" };
    for (size_t i = 0; i < SK_ARRAY_LEN(keys); i++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "%s.%s:", label, keys[i]);
        if (strncmp(e.msg, prefix, strlen(prefix)) == 0 && v->type == YAML_MAPPING_NODE &&
            (at = lookup(L, v, keys[i])) != NULL)
            return fail(L, at, "%s", e.msg);
    }
    return fail(L, v, "%s", e.msg);
}

/* libpq validates the string (pg_conninfo.c). A password inside it moves
 * to postgres.password, so that conninfo can be logged. */
static int pg_conninfo(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_postgres_conf *p = base;
    char why[400], *conninfo = NULL, *pw = NULL;
    const char *s;
    int rc;

    if ((rc = scalar(L, v, "conninfo", "a scalar", &s)) != SK_OK)
        return rc;
    if (sk_pg_conninfo_split(s, &conninfo, &pw, why, sizeof(why)) != SK_OK)
        return fail(L, v, "conninfo: %s", why);
    rc = SK_OK;
    if (pw != NULL && (rc = claim_secret(L, v, "the password in conninfo")) == SK_OK)
        rc = store(L, v, &p->password, pw);
    if (rc == SK_OK) {
        free(p->conninfo);
        p->conninfo = conninfo;
        conninfo = NULL;
    }
    if (pw != NULL)
        explicit_bzero(pw, strlen(pw));
    free(pw);
    free(conninfo);
    return rc;
}

static int load_queues(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_conf *c = base;
    char label[32];
    int rc;

    if (v->type != YAML_SEQUENCE_NODE && !is_null(v))
        return fail(L, v, "queues: expected a sequence, got %s", kind(v));
    if (is_null(v) || v->data.sequence.items.top == v->data.sequence.items.start)
        return fail(L, v, "queues must list at least one queue");
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if ((c->queues = calloc(n, sizeof(*c->queues))) == NULL)
        return fail(L, v, "out of memory");
    c->n_queues = n;

    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = node(L, v->data.sequence.items.start[i]);

        c->queues[i] = queue_defaults;
        snprintf(label, sizeof(label), "queues[%zu]", i);
        if ((rc = load_map(L, item, label, queue_keys, &c->queues[i])) != SK_OK ||
            (rc = check_batch(L, item, &c->queues[i])) != SK_OK ||
            (rc = check_priority(L, item, &c->queues[i])) != SK_OK)
            return rc;
        for (size_t j = 0; j < i; j++) {
            yaml_node_t *first = node(L, v->data.sequence.items.start[j]);
            size_t line = find_value(L, first, "name")->start_mark.line + 1;
            if (strcmp(c->queues[j].name, c->queues[i].name) == 0)
                return fail(L, find_value(L, item, "name"),
                            "duplicate queue name \"%s\" (first defined at line %zu)",
                            c->queues[i].name, line);
            /* Each queue owns <name>.dead and <name>.delay.<ms>: a queue of
             * that name would take its dead letters or retry copies as jobs
             * (or hand its jobs to the other's dead letters). */
            const char *a = c->queues[i].name, *b = c->queues[j].name;
            const char *owned = owned_by(a, b) ? a : owned_by(b, a) ? b : NULL;
            if (owned != NULL)
                return fail(L, find_value(L, item, "name"),
                            "queue name \"%s\" collides with \"%s\" (line %zu): \"%s\" is one "
                            "of \"%s\"'s dead-letter or delay queues", a, b, line, owned,
                            owned == a ? b : a);
        }
    }
    return SK_OK;
}

/* RabbitMQ 3.x (Debian 12 ships 3.10) refuses x-max-priority on a quorum
 * queue ("invalid arg"): said here, at the line, rather than by every
 * worker's declaration failing at start. */
static int check_priority(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q)
{
    if (q->max_priority > 0 && q->queue_type == SK_QUEUE_QUORUM)
        return fail(L, lookup(L, item, "max_priority"), "max_priority needs queue_type: classic "
                    "(RabbitMQ 3.x has no priorities on quorum queues and refuses "
                    "x-max-priority)");
    return SK_OK;
}

/* batch needs a transaction to share, and a prefetch window to fill from.
 * Unset, it is DEFAULT_BATCH in transactional mode, at most a set prefetch
 * (a window that small is the user's choice, priorities' for one), and 1
 * in external mode. An unset prefetch grows to two batches, so that the
 * next batch is already arriving while this one runs; one set too small
 * for a set batch is the user's to fix. */
static int check_batch(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q)
{
    yaml_node_t *batch = lookup(L, item, "batch");
    yaml_node_t *prefetch = lookup(L, item, "prefetch");
    if (batch == NULL)
        q->batch = q->mode == SK_MODE_EXTERNAL ? 1
                 : prefetch != NULL && q->prefetch < DEFAULT_BATCH ? q->prefetch : DEFAULT_BATCH;
    if (q->batch == 1)
        return SK_OK;
    if (q->mode == SK_MODE_EXTERNAL)
        return fail(L, batch, "batch %d needs mode: transactional "
                    "(an external job records its own outcome under its own lease)", q->batch);
    if (prefetch != NULL && q->prefetch < q->batch)
        return fail(L, prefetch, "prefetch %d is smaller than batch %d: a worker could never "
                    "fill its batch", q->prefetch, q->batch);
    if (prefetch == NULL && q->prefetch < 2 * q->batch)
        q->prefetch = 2 * q->batch;
    return SK_OK;
}

static int load_list(struct loader *L, const struct key *k, yaml_node_t *v, void *field)
{
    char ***items = field;
    size_t *count = (size_t *)(items + 1);
    char label[48];
    const char *s;
    int rc;

    if (is_null(v))
        return SK_OK;
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(L, v, "%s: expected a sequence, got %s", k->name, kind(v));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n > 0 && (*items = calloc(n, sizeof(**items))) == NULL)
        return fail(L, v, "out of memory");
    *count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = node(L, v->data.sequence.items.start[i]);
        snprintf(label, sizeof(label), "%s[%zu]", k->name, i);
        if ((rc = scalar(L, item, label, "a scalar", &s)) != SK_OK)
            return rc;
        if (*s == '\0')
            return fail(L, item, "%s must not be empty", label);
        if ((rc = store(L, item, &(*items)[i], s)) != SK_OK)
            return rc;
    }
    return SK_OK;
}

/* Handlers parse their own section, so each gets it back as YAML text. */
static int queue_config(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_queue_conf *q = base;
    const yaml_node_t *at;
    struct sk_err e;

    if (is_null(v))
        return SK_OK;
    if (sk_conf_value_emit(L->doc, v, "config", &q->handler_config, &at, &e) != SK_OK)
        return fail(L, at, "%s", e.msg);
    return mark_config(L, v, q);
}

/* Remembers where each top-level scalar of a handler's config starts, so
 * that check() can point into a value (host->config_where()). */
static int mark_config(struct loader *L, yaml_node_t *v, struct sk_queue_conf *q)
{
    if (v->type != YAML_MAPPING_NODE)
        return SK_OK;
    size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n == 0)
        return SK_OK;
    if ((q->config_marks = calloc(n, sizeof(*q->config_marks))) == NULL)
        return fail(L, v, "out of memory");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = node(L, p->key), *val = node(L, p->value);
        if (k == NULL || val == NULL || k->type != YAML_SCALAR_NODE ||
            val->type != YAML_SCALAR_NODE)
            continue;
        struct sk_conf_mark *m = &q->config_marks[q->n_config_marks];
        if ((m->key = strndup((const char *)k->data.scalar.value, k->data.scalar.length)) == NULL)
            return fail(L, v, "out of memory");
        q->n_config_marks++;
        m->line = (uint32_t)val->start_mark.line + 1;
        m->column = (uint32_t)val->start_mark.column + 1;
        m->style = (int)val->data.scalar.style;
        /* A block's text starts on the next line, at its indentation. */
        size_t i = val->start_mark.index;
        while (i < L->len && L->text[i] != '\n')
            i++;
        uint32_t indent = 0;
        for (i++; i < L->len && L->text[i] == ' '; i++)
            indent++;
        m->indent = indent + 1;
        size_t from = val->start_mark.index, to = val->end_mark.index;
        if (to > L->len || to < from)
            to = from;
        if ((m->raw = strndup(L->text + from, to - from)) == NULL)
            return fail(L, v, "out of memory");
    }
    return SK_OK;
}

/* host:port, checked now so that a typo fails `sekalid -t`; whether the
 * address can be bound is only known when the supervisor starts. An empty
 * or null value leaves the endpoint off. */
static int metrics_listen(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_metrics_conf *m = base;
    struct sk_err e;
    const char *s;
    char *host;
    int rc, port;

    if (is_null(v))
        return SK_OK;
    if ((rc = scalar(L, v, "listen", "a scalar", &s)) != SK_OK)
        return rc;
    if (*s == '\0')
        return SK_OK;
    if (sk_conf_value_parse_listen("listen", s, &host, &port, &e) != SK_OK)
        return fail(L, v, "%s", e.msg);
    free(m->listen_host);
    m->listen_host = host;
    m->listen_port = port;
    return SK_OK;
}

/* metrics.token_file: a bearer token that /metrics, /livez and /readyz
 * then require (they show queue names and rates). Read at load, so a
 * reload rotates it. It goes into an HTTP header, so only RFC 6750's
 * token characters; the message never shows it. */
static int metrics_token(struct loader *L, yaml_node_t *v, void *base)
{
    static const struct key k = { .name = "token_file", .type = T_PASSWORD_FILE };
    static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=";
    struct sk_metrics_conf *m = base;
    int rc;

    if ((rc = password(L, &k, v, &m->token)) != SK_OK)
        return rc;
    if (strlen(m->token) > 512 || m->token[strspn(m->token, ok)] != '\0')
        return fail(L, v, "token_file: the token must be at most 512 characters of A-Z a-z 0-9 "
                    "- . _ ~ + / = (a bearer token, RFC 6750)");
    return SK_OK;
}

/* The console's section: its first member is read exactly as the metrics
 * section is. */
static int console_listen(struct loader *L, yaml_node_t *v, void *base)
{
    return metrics_listen(L, v, &((struct sk_console_conf *)base)->http);
}

static int console_token(struct loader *L, yaml_node_t *v, void *base)
{
    return metrics_token(L, v, &((struct sk_console_conf *)base)->http);
}

/* The redis section, plus the one rule its table cannot say: sentinels and
 * master_name come together (a sentinel watches masters by name, and a name
 * without sentinels to ask has no one to answer it). */
static int redis_section(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_redis_conf *r = &((struct sk_conf *)base)->redis;
    int rc;

    if ((rc = load_map(L, v, "redis", redis_keys, r)) != SK_OK)
        return rc;
    if (r->n_sentinels > 0 && r->master_name == NULL)
        return fail(L, find_value(L, v, "sentinels"), "redis.sentinels needs "
                    "redis.master_name: the name the sentinels monitor the master by");
    if (r->n_sentinels == 0 && r->master_name != NULL)
        return fail(L, find_value(L, v, "master_name"), "redis.master_name needs "
                    "redis.sentinels: a list of host:port to ask for the master");
    return SK_OK;
}

/* redis.tls: present means TLS to the master and the sentinels (Redis
 * has no URL scheme here to say so). */
static int redis_tls(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_redis_conf *r = base;
    r->tls.enabled = true;
    return tls_section(L, v, "redis.tls", &r->tls);
}

/* The sentinels' password is a second secret in the section: it has its
 * own one-source rule, apart from the master's password. */
static int sentinel_password_env(struct loader *L, yaml_node_t *v, void *base)
{
    return sentinel_password(L, v, T_PASSWORD_ENV, &((struct sk_redis_conf *)base)->sentinel_password);
}

static int sentinel_password_file(struct loader *L, yaml_node_t *v, void *base)
{
    return sentinel_password(L, v, T_PASSWORD_FILE, &((struct sk_redis_conf *)base)->sentinel_password);
}

static int sentinel_password(struct loader *L, yaml_node_t *v, enum type t, char **dst)
{
    const struct key k = { .name = t == T_PASSWORD_ENV ? "sentinel_password_env"
                                                       : "sentinel_password_file", .type = t };
    if (*dst != NULL)
        return fail(L, v, "%s conflicts with the other sentinel_password_* key: give the "
                    "sentinels' password one way only", k.name);
    const char *saved = L->secret_from;
    L->secret_from = NULL;  /* not the master's password's source */
    int rc = password(L, &k, v, dst);
    L->secret_from = saved;
    return rc;
}

/* A sequence of host:port, checked now so that a typo fails `sekalid -t`;
 * whether a sentinel answers is only known when a worker connects. */
static int redis_sentinels(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_redis_conf *r = base;
    char label[32];
    struct sk_err e;
    const char *s;
    int rc;

    if (is_null(v))
        return SK_OK;
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(L, v, "sentinels: expected a sequence of host:port, got %s", kind(v));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n > 0 && (r->sentinels = calloc(n, sizeof(*r->sentinels))) == NULL)
        return fail(L, v, "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = node(L, v->data.sequence.items.start[i]);
        snprintf(label, sizeof(label), "sentinels[%zu]", i);
        if ((rc = scalar(L, item, label, "host:port", &s)) != SK_OK)
            return rc;
        if (*s == ':')
            return fail(L, item, "%s: missing host in \"%.64s\"", label, s);
        if (sk_conf_value_parse_listen(label, s, &r->sentinels[i].host, &r->sentinels[i].port,
                                       &e) != SK_OK)
            return fail(L, item, "%s", e.msg);
        r->n_sentinels = i + 1;  /* what sk_conf_free() frees, even if a later item fails */
    }
    return SK_OK;
}

/* password_env: NAME or password_file: PATH, one source per section. */
static int password(struct loader *L, const struct key *k, yaml_node_t *v, char **dst)
{
    const char *name;
    char *path;
    struct sk_err e;
    int rc;

    if ((rc = scalar(L, v, k->name, "a scalar", &name)) != SK_OK ||
        (rc = claim_secret(L, v, k->name)) != SK_OK)
        return rc;
    if (k->type == T_PASSWORD_ENV) {
        rc = sk_conf_value_password_env(k->name, name, dst, &e);
    } else {
        if ((path = resolve(L, name)) == NULL)
            return fail(L, v, "out of memory");
        rc = sk_conf_value_password_file(k->name, path, dst, &e);
        free(path);
    }
    return rc == SK_OK ? SK_OK : fail(L, v, "%s", e.msg);
}

/* One source per password, so that no one has to wonder which one wins. */
static int claim_secret(struct loader *L, yaml_node_t *v, const char *source)
{
    if (L->secret_from != NULL)
        return fail(L, v, "%s conflicts with %s: give the password one way only",
                    source, L->secret_from);
    L->secret_from = source;
    return SK_OK;
}

/* Defaults of a schedule; every key but name, queue and cron/every has one. */
static const struct sk_schedule_conf schedule_defaults = {
    .missed = SK_MISSED_ONCE, .grace_ms = 60 * SEC,
};

/* schedules: a sequence of periodic jobs, each checked on its own here and
 * against the queues once the whole file is read. */
static int load_schedules(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_conf *c = base;
    char label[32];
    int rc;

    if (is_null(v))
        return SK_OK;
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(L, v, "schedules: expected a sequence, got %s", kind(v));
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n > MAX_SCHEDULES)
        return fail(L, v, "schedules lists %zu schedules, more than %d", n, MAX_SCHEDULES);
    if (n > 0 && (c->schedules = calloc(n, sizeof(*c->schedules))) == NULL)
        return fail(L, v, "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = node(L, v->data.sequence.items.start[i]);
        struct sk_schedule_conf *s = &c->schedules[i];
        *s = schedule_defaults;
        c->n_schedules = i + 1;
        snprintf(label, sizeof(label), "schedules[%zu]", i);
        if ((rc = load_map(L, item, label, schedule_keys, s)) != SK_OK ||
            (rc = check_schedule(L, item, s)) != SK_OK)
            return rc;
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->schedules[j].name, s->name) == 0)
                return fail(L, find_value(L, item, "name"),
                            "duplicate schedule name \"%s\" (first defined at line %zu)",
                            s->name, find_value(L, node(L, v->data.sequence.items.start[j]),
                                                "name")->start_mark.line + 1);
    }
    return SK_OK;
}

/* cron: parsed at once, so an error points at its character: the node's
 * column plus the offset, one more past an opening quote. */
static int schedule_cron(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_schedule_conf *s = base;
    const char *text;
    struct sk_err e = { 0 };
    size_t column = 0;
    int rc = scalar(L, v, "cron", "a scalar", &text);
    if (rc != SK_OK)
        return rc;
    if (sk_cron_parse(text, &s->when, &column, &e) != SK_OK) {
        bool quoted = v->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                      v->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE;
        size_t col = v->start_mark.column + 1 + column + (quoted ? 1 : 0);
        if (v->start_mark.line != v->end_mark.line)  /* a folded scalar: the node itself */
            col = v->start_mark.column + 1;
        return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: invalid cron expression \"%.64s\": %s",
                          L->path, v->start_mark.line + 1, col, text, e.msg);
    }
    return store(L, v, &s->cron_text, text);
}

static int schedule_zone(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_schedule_conf *s = base;
    const char *zone;
    int rc = scalar(L, v, "timezone", "a scalar", &zone);
    if (rc != SK_OK)
        return rc;
    if (!sk_tz_known(zone))
        return fail(L, v, "unknown time zone \"%.64s\": expected an IANA name such as "
                    "Europe/Berlin, found in the tz database (/usr/share/zoneinfo)", zone);
    return store(L, v, &s->timezone, zone);
}

static int schedule_queue(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_schedule_conf *s = base;
    static const struct key name = NAME("queue", sk_schedule_conf, queue, true);
    s->queue_line = (uint32_t)v->start_mark.line + 1;
    s->queue_column = (uint32_t)v->start_mark.column + 1;
    return apply(L, &name, v, base);
}

/* Exactly one of cron and every; a zone only for cron (an interval ticks
 * in UTC); a cron expression that can never fire is refused here rather
 * than waited on for ever. */
static int check_schedule(struct loader *L, yaml_node_t *item, struct sk_schedule_conf *s)
{
    yaml_node_t *cron = lookup(L, item, "cron"), *every = lookup(L, item, "every");
    if (cron != NULL && every != NULL)
        return fail(L, every, "schedule \"%s\": give either cron or every, not both", s->name);
    if (cron == NULL && every == NULL)
        return fail(L, item, "schedule \"%s\": missing \"cron\" or \"every\"", s->name);
    if (every != NULL) {
        if (s->every_ms % SEC != 0)
            return fail(L, every, "every must be a whole number of seconds, got %.64s",
                        (const char *)every->data.scalar.value);
        if (s->timezone != NULL)
            return fail(L, lookup(L, item, "timezone"), "timezone applies to cron only: "
                        "an every: schedule ticks at multiples of its interval in UTC");
        sk_cron_every(&s->when, s->every_ms / SEC);
    } else {
        snprintf(s->when.zone, sizeof(s->when.zone), "%s", s->timezone ? s->timezone : "UTC");
        if (!sk_cron_possible(&s->when))
            return fail(L, cron, "cron expression \"%.64s\" never fires: no month has that day",
                        s->cron_text);
    }
    if (s->job_type == NULL && (s->job_type = strdup(s->name)) == NULL)
        return fail(L, item, "out of memory");
    if (s->body == NULL && (s->body = strdup("{}")) == NULL)
        return fail(L, item, "out of memory");
    return SK_OK;
}

/* A schedule's queue must be one of this file's, and its job type one the
 * queue accepts: a tick nobody consumes would pile up unseen. */
static int check_schedule_queues(struct loader *L, struct sk_conf *c)
{
    for (size_t i = 0; i < c->n_schedules; i++) {
        const struct sk_schedule_conf *s = &c->schedules[i];
        const struct sk_queue_conf *q = sk_conf_queue(c, s->queue);
        const char *why = NULL;
        if (q == NULL)
            why = "is not one of the queues configured here";
        for (size_t j = 0; q != NULL && q->n_job_types > 0; j++) {
            if (j == q->n_job_types) {
                why = "does not accept the schedule's job_type";
                break;
            }
            if (strcmp(q->job_types[j], s->job_type) == 0)
                break;
        }
        if (why != NULL)
            return sk_err_set(L->err, SK_ERR, "%s:%u:%u: schedule \"%s\": queue \"%s\" %s",
                              L->path, s->queue_line, s->queue_column, s->name, s->queue, why);
    }
    return SK_OK;
}

void sk_conf_schedule_spec(const struct sk_schedule_conf *s, char *buf, size_t size)
{
    char every[32];
    if (s->cron_text == NULL)
        snprintf(buf, size, "every %s", sk_conf_value_fmt_duration(s->every_ms, every,
                                                                    sizeof(every)));
    else
        snprintf(buf, size, "cron %s %s", s->cron_text, s->timezone ? s->timezone : "UTC");
}

/* Checks that n is a scalar without NUL bytes (a C string would cut it
 * short); expect completes "label: expected ..., got ..." otherwise. */
static int scalar(struct loader *L, yaml_node_t *n, const char *label,
                  const char *expect, const char **out)
{
    if (n->type != YAML_SCALAR_NODE)
        return fail(L, n, "%s: expected %s, got %s", label, expect, kind(n));
    *out = (const char *)n->data.scalar.value;
    if (strlen(*out) != n->data.scalar.length)
        return fail(L, n, "%s: contains a NUL character", label);
    return SK_OK;
}

static int store(struct loader *L, yaml_node_t *n, char **dst, const char *s)
{
    char *copy = strdup(s);

    if (copy == NULL)
        return fail(L, n, "out of memory");
    sk_conf_value_wipe(*dst);
    *dst = copy;
    return SK_OK;
}

static int fail(struct loader *L, const yaml_node_t *n, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: %s", L->path,
                      n->start_mark.line + 1, n->start_mark.column + 1, msg);
}

static yaml_node_t *node(struct loader *L, int index)
{
    yaml_node_t *n = yaml_document_get_node(L->doc, index);

    sk_assert(n != NULL);
    return n;
}

/* The value of the first pair named key; the caller knows there is one. */
static yaml_node_t *find_value(struct loader *L, yaml_node_t *map, const char *key)
{
    yaml_node_pair_t *p = map->data.mapping.pairs.start;

    while (strcmp((const char *)node(L, p->key)->data.scalar.value, key) != 0)
        p++;
    return node(L, p->value);
}

/* As find_value(), but the key may be absent: NULL then. */
static yaml_node_t *lookup(struct loader *L, yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++)
        if (strcmp((const char *)node(L, p->key)->data.scalar.value, key) == 0)
            return node(L, p->value);
    return NULL;
}

static const char *kind(const yaml_node_t *n)
{
    if (is_null(n))
        return "null";
    return n->type == YAML_MAPPING_NODE ? "a mapping"
         : n->type == YAML_SEQUENCE_NODE ? "a sequence" : "a scalar";
}

/* YAML's null: an empty, ~ or null plain scalar. A quoted "" is a string. */
static bool is_null(const yaml_node_t *n)
{
    static const char *const nulls[] = { "", "~", "null", "Null", "NULL" };

    for (size_t i = 0; n->type == YAML_SCALAR_NODE && i < SK_ARRAY_LEN(nulls); i++)
        if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
            strcmp((const char *)n->data.scalar.value, nulls[i]) == 0)
            return true;
    return false;
}

/* A stock handler is named, not pathed: `handler: sql` is sekali's own
 * SK_HANDLER_DIR/sql.so (SEKALI_HANDLER_DIR overrides the directory, for a
 * build tree). Anything with a '/' or ending in ".so" is a path, as always;
 * the name's characters are NAME_CHARS, so it cannot climb out. Returns a
 * new string. */
static char *resolve_handler(struct loader *L, const char *name)
{
    size_t n = strlen(name);
    if (strchr(name, '/') != NULL || (n >= 3 && strcmp(name + n - 3, ".so") == 0) ||
        strspn(name, NAME_CHARS) != n || strstr(name, "..") != NULL)
        return resolve(L, name);
    const char *dir = getenv("SEKALI_HANDLER_DIR");
    char *out;
    if (dir == NULL || dir[0] == '\0')
        dir = SK_HANDLER_DIR;
    return asprintf(&out, "%s/%s.so", dir, name) < 0 ? NULL : out;
}

/* Returns a new string: path if absolute, else path under the config's directory. */
static char *resolve(struct loader *L, const char *path)
{
    char *out;

    if (path[0] == '/')
        return strdup(path);
    return asprintf(&out, "%s/%s", L->dir, path) < 0 ? NULL : out;
}

static void each_key(const struct key *table, const char *prefix,
                     void (*each)(const char *path, void *arg), void *arg)
{
    for (const struct key *k = table; k->name != NULL; k++) {
        /* queues and schedules are the sequences of sections. */
        const char *sep = k->sub == NULL ? "" :
                          k->sub == queue_keys || k->sub == schedule_keys ? "[]." : ".";
        char path[128];
        snprintf(path, sizeof(path), "%s%s%s", prefix, k->name, sep);
        if (k->sub == NULL)
            each(path, arg);
        else
            each_key(k->sub, path, each, arg);
    }
}

void sk_conf_each_key(void (*each)(const char *path, void *arg), void *arg)
{
    each_key(top_keys, "", each, arg);
}
