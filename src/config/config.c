/* config.c - turns sekali.yaml into an immutable struct sk_conf.
 *
 * Owns the schema's top: the table of sections, the small sections that
 * need no checks of their own (lock, log, outbox, janitor, restart), the
 * defaults, and the load itself, with what can only be checked once the
 * whole file is read. Each larger section is a table of keys in a file of
 * its own (config_servers.c, config_queues.c, config_schedules.c), as
 * nginx's modules each bring their directives, so a new key is one line
 * and the walker (config_walk.c) does not change; config_walk.h says how
 * they fit together. */
#include "config.h"

#include <arpa/inet.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_walk.h"

#define MAX_FILE      MIB         /* a config larger than this is a mistake */

static int check_schedule_queues(struct loader *L, struct sk_conf *c);

/* Indexed by enum value: keep them in config.h's order. */
static const char *const levels[]  = { "debug", "info", "warn", "error", NULL };
static const char *const formats[] = { "auto", "json", "text", NULL };

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

static const struct key outbox_keys[] = {
    INT("relays",               sk_outbox_conf, relays, 0, 64),
    INT("batch",                sk_outbox_conf, batch, 1, 10000),
    DURATION("poll_interval",   sk_outbox_conf, poll_interval_ms, 10, HOUR),
    END
};

static const struct key janitor_keys[] = {
    DURATION("interval",         sk_janitor_conf, interval_ms, 0, DAY),
    INT("batch",                 sk_janitor_conf, batch, 1, 100000),
    INT("busy_percent",          sk_janitor_conf, busy_percent, 1, 100),
    RETENTION("outbox_retention", sk_janitor_conf, outbox_retention_ms),
    RETENTION("history_retention", sk_janitor_conf, history_retention_ms),
    RETENTION("archive_after",   sk_janitor_conf, archive_after_ms),
    END
};

static const struct key restart_keys[] = {
    DURATION("initial", sk_restart_conf, initial_ms, 1, HOUR),
    DURATION("max",     sk_restart_conf, max_ms, 1, DAY),
    END
};

static const struct key top_keys[] = {
    CUSTOM_SECTION("amqp", sk_conf_amqp_section, sk_conf_amqp_keys, true),
    CUSTOM_SECTION("redis", sk_conf_redis_section, sk_conf_redis_keys, false),
    SECTION("postgres", postgres, sk_conf_postgres_keys, true),
    SECTION("lock",     lock,     lock_keys,     false),
    SECTION("log",      log,      log_keys,      false),
    SECTION("outbox",   outbox,   outbox_keys,   false),
    SECTION("janitor",  janitor,  janitor_keys,  false),
    SECTION("metrics",  metrics,  sk_conf_metrics_keys,  false),
    SECTION("console",  console,  sk_conf_console_keys,  false),
    SECTION("tracing",  tracing,  sk_conf_tracing_keys,  false),
    SECTION("restart",  restart,  restart_keys,  false),
    DURATION("shutdown_timeout", sk_conf, shutdown_timeout_ms, 0, DAY),
    CUSTOM_SECTION("queues", sk_conf_queues_load, sk_conf_queue_keys, true),
    CUSTOM_SECTION("schedules", sk_conf_schedules_load, sk_conf_schedule_keys, false),
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
    .janitor = { .interval_ms = 60 * SEC, .batch = 1000, .busy_percent = 100,
                 .outbox_retention_ms = 7 * DAY, .history_retention_ms = 7 * DAY,
                 .archive_after_ms = HOUR },
    .restart = { .initial_ms = 200, .max_ms = 30 * SEC },
    .console = { .session_ms = 15 * MIN, .pool = 4 },
    .tracing = { .otlp_timeout_ms = 2 * SEC },
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
_Static_assert(SK_RETENTION_FOREVER == UINT64_MAX, "the walker writes forever as UINT64_MAX");

int sk_conf_load(const char *path, struct sk_conf **out, struct sk_err *err)
{
    struct loader L = { .path = path, .err = err, .top = top_keys };
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
        c->tracing.service_name = strdup("sekali");
    }
    if (c == NULL || !c->path || !c->redis.host || !c->amqp.password || !c->tracing.service_name || !yaml_parser_initialize(&parser)) {
        sk_err_set(err, SK_ERR, "%s: out of memory", path);
        goto fail;
    }
    L.doc = &doc;
    L.text = text;
    L.len = len;
    if (sk_walk_parse(&L, &parser, text, len) == SK_OK) {
        rc = sk_walk_map(&L, yaml_document_get_root_node(&doc), "top level", top_keys, c);
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
    for (size_t i = 0; i < c->console.n_operators; i++) {
        free(c->console.operators[i].name);
        sk_conf_value_wipe(c->console.operators[i].token);
    }
    free(c->console.operators);
    free(c->console.tls_cert_file);
    free(c->console.tls_key_file);
    free(c->tracing.otlp_endpoint);
    free(c->tracing.service_name);
    sk_conf_tracing_free_headers(&c->tracing);
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

/* The host at the start of host, a URL's after its scheme, is loopback by
 * its name or address: localhost, an IPv4 literal in 127.0.0.0/8 (not a
 * name that starts with 127.), [::1]. */
static bool loopback_url_host(const char *host)
{
    if (host[0] == '[')
        return strncmp(host, "[::1]", 5) == 0;
    char name[64];
    size_t n = strcspn(host, ":/?#");
    if (n >= sizeof(name))
        return false;
    memcpy(name, host, n);
    name[n] = '\0';
    struct in_addr addr;
    return strcasecmp(name, "localhost") == 0 ||
           (inet_pton(AF_INET, name, &addr) == 1 && (ntohl(addr.s_addr) >> 24) == 127);
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
    /* An API key in a header crosses the network in clear: refused it
     * would break a collector beside sekali on a private network, so said. */
    const char *endpoint = conf->tracing.otlp_endpoint;
    if (endpoint != NULL && conf->tracing.n_otlp_headers > 0 &&
        strncasecmp(endpoint, "http://", 7) == 0 && !loopback_url_host(endpoint + 7)) {
        say("tracing.otlp_headers are sent in clear text: otlp_endpoint is http:// to a host "
            "that is not loopback; use https:// for a collector across a network", arg);
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
                                    .passive = q->declare == SK_DECLARE_PASSIVE,
                                    .lanes = (uint8_t)q->lanes };
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

static void each_key(const struct key *table, const char *prefix,
                     void (*each)(const char *path, void *arg), void *arg)
{
    for (const struct key *k = table; k->name != NULL; k++) {
        /* queues and schedules are the sequences of sections. */
        const char *sep = k->sub == NULL ? "" :
                          k->sub == sk_conf_queue_keys ||
                          k->sub == sk_conf_schedule_keys ? "[]." : ".";
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
