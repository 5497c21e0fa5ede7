/* config_schedules.c - the schema of schedules:, the periodic jobs the
 * scheduler enqueues: a cron expression in a time zone, or an interval,
 * and the queue and job type each tick becomes.
 *
 * A cron expression is parsed here, so that an error points at its
 * character and one that can never fire is refused at load. Whether each
 * schedule's queue is configured is checked by config.c, once the whole
 * file is read (queues: may come after schedules:). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_walk.h"

#include "cron.h"
#include "tz.h"

static int schedule_cron(struct loader *L, yaml_node_t *v, void *base);
static int schedule_zone(struct loader *L, yaml_node_t *v, void *base);
static int schedule_queue(struct loader *L, yaml_node_t *v, void *base);
static int check_schedule(struct loader *L, yaml_node_t *item, struct sk_schedule_conf *s);

static const char *const misseds[] = { "skip", "once", "all", NULL };  /* config.h's order */

/* A schedule's list is bounded so that one scheduler round stays short. */
#define MAX_SCHEDULES 1000

const struct key sk_conf_schedule_keys[] = {
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

/* Defaults of a schedule; every key but name, queue and cron/every has one. */
static const struct sk_schedule_conf schedule_defaults = {
    .missed = SK_MISSED_ONCE, .grace_ms = 60 * SEC,
};

/* schedules: a sequence of periodic jobs, each checked on its own here and
 * against the queues once the whole file is read. */
int sk_conf_schedules_load(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_conf *c = base;
    char label[32];
    int rc;

    if (sk_walk_is_null(v))
        return SK_OK;
    if (v->type != YAML_SEQUENCE_NODE)
        return sk_walk_fail(L, v, "schedules: expected a sequence, got %s", sk_walk_kind(v));
    size_t n = sk_walk_items(v);
    if (n > MAX_SCHEDULES)
        return sk_walk_fail(L, v, "schedules lists %zu schedules, more than %d", n, MAX_SCHEDULES);
    if (n > 0 && (c->schedules = calloc(n, sizeof(*c->schedules))) == NULL)
        return sk_walk_fail(L, v, "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = sk_walk_item(L, v, i);
        struct sk_schedule_conf *s = &c->schedules[i];
        *s = schedule_defaults;
        c->n_schedules = i + 1;
        snprintf(label, sizeof(label), "schedules[%zu]", i);
        if ((rc = sk_walk_map(L, item, label, sk_conf_schedule_keys, s)) != SK_OK ||
            (rc = check_schedule(L, item, s)) != SK_OK)
            return rc;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(c->schedules[j].name, s->name) != 0)
                continue;
            yaml_node_t *first = sk_walk_item(L, v, j);
            return sk_walk_fail(L, sk_walk_find(L, item, "name"),
                                "duplicate schedule name \"%s\" (first defined at line %zu)",
                                s->name, sk_walk_find(L, first, "name")->start_mark.line + 1);
        }
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
    int rc = sk_walk_scalar(L, v, "cron", "a scalar", &text);
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
    return sk_walk_store(L, v, &s->cron_text, text);
}

static int schedule_zone(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_schedule_conf *s = base;
    const char *zone;
    int rc = sk_walk_scalar(L, v, "timezone", "a scalar", &zone);
    if (rc != SK_OK)
        return rc;
    if (!sk_tz_known(zone))
        return sk_walk_fail(L, v, "unknown time zone \"%.64s\": expected an IANA name such as "
                            "Europe/Berlin, found in the tz database (/usr/share/zoneinfo)", zone);
    return sk_walk_store(L, v, &s->timezone, zone);
}

static int schedule_queue(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_schedule_conf *s = base;
    static const struct key name = NAME("queue", sk_schedule_conf, queue, true);
    s->queue_line = (uint32_t)v->start_mark.line + 1;
    s->queue_column = (uint32_t)v->start_mark.column + 1;
    return sk_walk_apply(L, &name, v, base);
}

/* Exactly one of cron and every; a zone only for cron (an interval ticks
 * in UTC); a cron expression that can never fire is refused here rather
 * than waited on for ever. */
static int check_schedule(struct loader *L, yaml_node_t *item, struct sk_schedule_conf *s)
{
    yaml_node_t *cron = sk_walk_lookup(L, item, "cron"), *every = sk_walk_lookup(L, item, "every");
    if (cron != NULL && every != NULL)
        return sk_walk_fail(L, every, "schedule \"%s\": give either cron or every, not both",
                            s->name);
    if (cron == NULL && every == NULL)
        return sk_walk_fail(L, item, "schedule \"%s\": missing \"cron\" or \"every\"", s->name);
    if (every != NULL) {
        if (s->every_ms % SEC != 0)
            return sk_walk_fail(L, every, "every must be a whole number of seconds, got %.64s",
                                (const char *)every->data.scalar.value);
        if (s->timezone != NULL)
            return sk_walk_fail(L, sk_walk_lookup(L, item, "timezone"),
                                "timezone applies to cron only: an every: schedule ticks at "
                                "multiples of its interval in UTC");
        sk_cron_every(&s->when, s->every_ms / SEC);
    } else {
        snprintf(s->when.zone, sizeof(s->when.zone), "%s", s->timezone ? s->timezone : "UTC");
        if (!sk_cron_possible(&s->when))
            return sk_walk_fail(L, cron, "cron expression \"%.64s\" never fires: no month "
                                "has that day", s->cron_text);
    }
    if (s->job_type == NULL && (s->job_type = strdup(s->name)) == NULL)
        return sk_walk_fail(L, item, "out of memory");
    if (s->body == NULL && (s->body = strdup("{}")) == NULL)
        return sk_walk_fail(L, item, "out of memory");
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
