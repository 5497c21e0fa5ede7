/* config_queues.c - the schema of queues:, the one section every config
 * has: a queue's name, handler, mode and limits, its retry ladder, batch
 * and priority, and the handler's own config: section.
 *
 * Beyond the table, what holds between keys and between queues: a batch
 * needs a transaction and a prefetch window to fill, priorities need a
 * classic queue, and no two queues may share a name or take each other's
 * dead-letter and delay queues. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_walk.h"

static bool owned_by(const char *name, const char *queue);
static int check_batch(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q);
static int check_priority(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q);
static int check_lanes(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q);
static int tenant_header(struct loader *L, yaml_node_t *v, void *base);
static int queue_config(struct loader *L, yaml_node_t *v, void *base);
static int mark_config(struct loader *L, yaml_node_t *v, struct sk_queue_conf *q);
static int rate_limit(struct loader *L, yaml_node_t *v, void *base);
static int rate_value(struct loader *L, yaml_node_t *v, void *base);

/* Indexed by enum value: keep them in config.h's order. */
static const char *const modes[]   = { "transactional", "external", NULL };
static const char *const redis_down[] = { "proceed", "wait", NULL };
static const char *const queue_types[] = { "classic", "quorum", NULL };
static const char *const declares[] = { "auto", "passive", NULL };
static const char *const rate_pers[] = { "queue", "resource", NULL };

static const struct key retry_keys[] = {
    INT("max_attempts",  sk_retry_conf, max_attempts, 1, 1000),
    DURATION("initial",  sk_retry_conf, initial_ms, 1, HOUR),
    DURATION("max",      sk_retry_conf, max_ms, 1, DAY),
    END
};

/* rate_limit: either the rate alone ("100/s") or this mapping. */
static const struct key rate_keys[] = {
    { .name = "rate", .type = T_CUSTOM, .fn = rate_value, .required = true },
    INT("burst",        sk_rate_conf, burst, 1, 1000000),
    ENUM("per",         sk_rate_conf, per, rate_pers),
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

/* Whether name is one of queue's own: queue.dead, queue.delay.<digits> or
 * queue.lane.<digits>. */
static bool owned_by(const char *name, const char *queue)
{
    size_t n = strlen(queue);
    if (strncmp(name, queue, n) != 0)
        return false;
    const char *rest = name + n;
    if (strcmp(rest, ".dead") == 0)
        return true;
    size_t skip = strncmp(rest, ".delay.", 7) == 0 ? 7 : strncmp(rest, ".lane.", 6) == 0 ? 6 : 0;
    if (skip == 0 || rest[skip] == '\0')
        return false;
    for (rest += skip; *rest != '\0'; rest++)
        if (*rest < '0' || *rest > '9')
            return false;
    return true;
}

const struct key sk_conf_queue_keys[] = {
    NAME("name",            sk_queue_conf, name, true),
    HANDLER("handler",      sk_queue_conf, handler, true),
    INT("workers",          sk_queue_conf, workers,  1, 256),
    INT("prefetch",         sk_queue_conf, prefetch, 1, 65535),
    ENUM("mode",            sk_queue_conf, mode, modes),
    BOOL("lock",            sk_queue_conf, lock),
    DURATION("lock_ttl",    sk_queue_conf, lock_ttl_ms, MIN_LOCK_TTL, DAY),
    INT("concurrency",      sk_queue_conf, concurrency, 1, 10000),
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
    INT("batch_max",        sk_queue_conf, batch_max, 1, MAX_BATCH),
    DURATION("batch_wait",  sk_queue_conf, batch_wait_ms, 0, SEC),
    DURATION("batch_close_after", sk_queue_conf, batch_close_after_ms, 1, HOUR),
    DURATION("lease",       sk_queue_conf, lease_ms, MIN_LOCK_TTL, DAY),
    RETENTION("retention",  sk_queue_conf, retention_ms),
    CUSTOM_SECTION("rate_limit", rate_limit, rate_keys, false),
    INT("lanes",            sk_queue_conf, lanes, 0, SK_LANES_MAX),
    CUSTOM("tenant_header", tenant_header, false),
    CUSTOM("config", queue_config, false),
    END
};

/* See MAX_HEADERS_CAP. */
#define MAX_HEADERS_DEFAULT (64 * 1024)

/* lock_ttl_ms 0 means "lock.ttl", filled in once the whole file is read. */
static const struct sk_queue_conf queue_defaults = {
    .workers = 1, .prefetch = 10, .mode = SK_MODE_TRANSACTIONAL, .lock = true, .concurrency = 1,
    .max_body = MIB,
    .max_headers = MAX_HEADERS_DEFAULT,
    .retry = { .max_attempts = 5, .initial_ms = SEC, .max_ms = 5 * 60 * SEC },
    .on_redis_down = SK_REDIS_DOWN_PROCEED,
    .lease_ms = 30 * SEC,
    .retention_ms = 30 * DAY,
    .max_crashes = 3,
    .batch = DEFAULT_BATCH, .batch_wait_ms = 0, .batch_close_after_ms = DEFAULT_BATCH_CLOSE_AFTER,
    .tenant_header = SK_TENANT_HEADER_DEFAULT,
};

int sk_conf_queues_load(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_conf *c = base;
    char label[32];
    int rc;

    if (v->type != YAML_SEQUENCE_NODE && !sk_walk_is_null(v))
        return sk_walk_fail(L, v, "queues: expected a sequence, got %s", sk_walk_kind(v));
    if (sk_walk_is_null(v) || sk_walk_items(v) == 0)
        return sk_walk_fail(L, v, "queues must list at least one queue");
    size_t n = sk_walk_items(v);
    if ((c->queues = calloc(n, sizeof(*c->queues))) == NULL)
        return sk_walk_fail(L, v, "out of memory");
    c->n_queues = n;

    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = sk_walk_item(L, v, i);

        c->queues[i] = queue_defaults;
        snprintf(label, sizeof(label), "queues[%zu]", i);
        if ((rc = sk_walk_map(L, item, label, sk_conf_queue_keys, &c->queues[i])) != SK_OK ||
            (rc = check_batch(L, item, &c->queues[i])) != SK_OK ||
            (rc = check_priority(L, item, &c->queues[i])) != SK_OK ||
            (rc = check_lanes(L, item, &c->queues[i])) != SK_OK)
            return rc;
        for (size_t j = 0; j < i; j++) {
            yaml_node_t *first = sk_walk_item(L, v, j);
            size_t line = sk_walk_find(L, first, "name")->start_mark.line + 1;
            if (strcmp(c->queues[j].name, c->queues[i].name) == 0)
                return sk_walk_fail(L, sk_walk_find(L, item, "name"),
                                    "duplicate queue name \"%s\" (first defined at line %zu)",
                                    c->queues[i].name, line);
            /* Each queue owns <name>.dead and <name>.delay.<ms>: a queue of
             * that name would take its dead letters or retry copies as jobs
             * (or hand its jobs to the other's dead letters). */
            const char *a = c->queues[i].name, *b = c->queues[j].name;
            const char *owned = owned_by(a, b) ? a : owned_by(b, a) ? b : NULL;
            if (owned != NULL)
                return sk_walk_fail(L, sk_walk_find(L, item, "name"),
                                    "queue name \"%s\" collides with \"%s\" (line %zu): "
                                    "\"%s\" is one of \"%s\"'s dead-letter or delay queues",
                                    a, b, line, owned, owned == a ? b : a);
        }
    }
    return SK_OK;
}

/* RabbitMQ 4.3 gives quorum queues strict priorities, levels 0-31; 3.x
 * and 4.0-4.2 refuse x-max-priority on them ("invalid arg"). Which broker
 * is behind amqp.url is only known at the declaration, which says so by
 * name (broker_queue.c), as `sekalictl doctor` does before a start; the
 * range is said here, at the line. */
static int check_priority(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q)
{
    if (q->max_priority > SK_QUORUM_MAX_PRIORITY && q->queue_type == SK_QUEUE_QUORUM)
        return sk_walk_fail(L, sk_walk_lookup(L, item, "max_priority"),
                            "max_priority on a quorum queue must be at most %d (RabbitMQ "
                            "4.3's 32 levels; queue_type: classic takes up to 255), got %d",
                            SK_QUORUM_MAX_PRIORITY, q->max_priority);
    return SK_OK;
}

/* One lane would be the queue again with a hop more: 0 (off) or 2 and up. */
static int check_lanes(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q)
{
    if (q->lanes == 1)
        return sk_walk_fail(L, sk_walk_lookup(L, item, "lanes"), "lanes must be 0 (no lanes) "
                            "or 2 to %d, got 1 (one lane is the queue itself)", SK_LANES_MAX);
    return SK_OK;
}

/* The header is looked up by name in every delivery's table: a name AMQP
 * can carry (a short string) of the characters names are made of. */
static int tenant_header(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_queue_conf *q = base;
    const char *text;
    if (sk_walk_scalar(L, v, "tenant_header", "a header name such as x-tenant", &text) != SK_OK)
        return SK_ERR;
    size_t n = strlen(text);
    if (n == 0 || n > SK_TENANT_HEADER_MAX || text[strspn(text, NAME_CHARS)] != '\0')
        return sk_walk_fail(L, v, "tenant_header: expected 1 to %d of A-Z a-z 0-9 . _ -, "
                            "got \"%.64s\"", SK_TENANT_HEADER_MAX, text);
    memcpy(q->tenant_header, text, n + 1);
    return SK_OK;
}

/* batch needs a transaction to share, and a prefetch window to fill from.
 * Unset, it is DEFAULT_BATCH in transactional mode, at most a set prefetch
 * (a window that small is the user's choice, priorities' for one), and 1
 * in external mode. An unset prefetch grows to two batches, so that the
 * next batch is already arriving while this one runs; one set too small
 * for a set batch is the user's to fix.
 *
 * A far PostgreSQL or Redis grows a worker's batch up to batch_max (batch_size.c),
 * and an unset prefetch with it, to two of those; a set prefetch stays as
 * set and caps the growth. A queue of batch 1 does not grow: its jobs are
 * one a transaction on purpose. */
static int check_batch(struct loader *L, yaml_node_t *item, struct sk_queue_conf *q)
{
    yaml_node_t *batch = sk_walk_lookup(L, item, "batch");
    yaml_node_t *batch_max = sk_walk_lookup(L, item, "batch_max");
    yaml_node_t *prefetch = sk_walk_lookup(L, item, "prefetch");
    if (batch == NULL)
        q->batch = q->mode == SK_MODE_EXTERNAL ? 1
                 : prefetch != NULL && q->prefetch < DEFAULT_BATCH ? q->prefetch : DEFAULT_BATCH;
    q->prefetch_max = q->prefetch;
    if (batch_max != NULL && q->batch_max < q->batch)
        return sk_walk_fail(L, batch_max, "batch_max %d is smaller than batch %d", q->batch_max,
                            q->batch);
    if (q->batch == 1) {
        if (batch_max != NULL && q->batch_max > 1)
            return sk_walk_fail(L, batch_max, "batch_max %d needs a batch above 1 (batch 1 "
                                "runs each job in a transaction of its own)", q->batch_max);
        q->batch_max = 1;
        return SK_OK;
    }
    if (q->mode == SK_MODE_EXTERNAL)
        return sk_walk_fail(L, batch, "batch %d needs mode: transactional (an external job "
                            "records its own outcome under its own lease)", q->batch);
    if (prefetch != NULL && q->prefetch < q->batch)
        return sk_walk_fail(L, prefetch, "prefetch %d is smaller than batch %d: a worker "
                            "could never fill its batch", q->prefetch, q->batch);
    if (prefetch != NULL && batch_max != NULL && q->prefetch < q->batch_max)
        return sk_walk_fail(L, prefetch, "prefetch %d is smaller than batch_max %d: a worker "
                            "could never fill its batch", q->prefetch, q->batch_max);
    if (batch_max == NULL)
        q->batch_max = prefetch != NULL && q->prefetch < MAX_BATCH ? q->prefetch : MAX_BATCH;
    if (q->batch_max < q->batch)
        q->batch_max = q->batch;
    if (prefetch == NULL && q->prefetch < 2 * q->batch)
        q->prefetch = 2 * q->batch;
    q->prefetch_max = prefetch != NULL ? q->prefetch : 2 * q->batch_max;
    return SK_OK;
}

/* rate_limit: "100/s", or {rate: 100/s, burst: 20, per: resource}. The
 * burst defaults to the rate's count (100/s: up to 100 at once after a
 * quiet second), so that a rate written alone admits a period's worth
 * together, as a bucket of that size would. A burst whose tolerance passes
 * 30 days would outgrow the limiter's arithmetic and mean nothing. */
static int rate_limit(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_queue_conf *q = base;
    struct sk_rate_conf *r = &q->rate;
    int rc;

    *r = (struct sk_rate_conf){ 0 };
    if (sk_walk_is_null(v))
        return SK_OK;
    if (v->type == YAML_SCALAR_NODE)
        rc = rate_value(L, v, r);
    else if (v->type == YAML_MAPPING_NODE)
        rc = sk_walk_map(L, v, "rate_limit", rate_keys, r);
    else
        return sk_walk_fail(L, v, "rate_limit: expected a rate (e.g. 100/s) or a mapping "
                            "with rate, burst and per, got %s", sk_walk_kind(v));
    if (rc != SK_OK)
        return rc;
    if (r->burst == 0)
        r->burst = r->count;
    if ((uint64_t)r->burst * r->period_ms / r->count > 30 * DAY)
        return sk_walk_fail(L, v->type == YAML_MAPPING_NODE ? sk_walk_find(L, v, "burst") : v,
                            "rate_limit: a burst of %u at this rate is more than 30 days' "
                            "worth of jobs", r->burst);
    return SK_OK;
}

static int rate_value(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_rate_conf *r = base;
    const char *text;
    struct sk_err e;

    if (sk_walk_scalar(L, v, "rate_limit", "a rate such as 100/s", &text) != SK_OK)
        return SK_ERR;
    if (sk_conf_value_parse_rate(text, &r->count, &r->period_ms, &e) != SK_OK)
        return sk_walk_fail(L, v, "rate_limit: %s", e.msg);
    return SK_OK;
}

/* Handlers parse their own section, so each gets it back as YAML text. */
static int queue_config(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_queue_conf *q = base;
    const yaml_node_t *at;
    struct sk_err e;

    if (sk_walk_is_null(v))
        return SK_OK;
    if (sk_conf_value_emit(L->doc, v, "config", &q->handler_config, &at, &e) != SK_OK)
        return sk_walk_fail(L, at, "%s", e.msg);
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
        return sk_walk_fail(L, v, "out of memory");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = sk_walk_node(L, p->key), *val = sk_walk_node(L, p->value);
        if (k == NULL || val == NULL || k->type != YAML_SCALAR_NODE ||
            val->type != YAML_SCALAR_NODE)
            continue;
        struct sk_conf_mark *m = &q->config_marks[q->n_config_marks];
        if ((m->key = strndup((const char *)k->data.scalar.value, k->data.scalar.length)) == NULL)
            return sk_walk_fail(L, v, "out of memory");
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
            return sk_walk_fail(L, v, "out of memory");
    }
    return SK_OK;
}
