/* ctl_schedules.c - sekalictl schedules [--json]: each schedule, its last
 * tick, its next tick, and the key and state of its last job.
 *
 * The schedules are those of the config file and those PostgreSQL holds a
 * row for (sql/020: another host's, or one removed from this config). The
 * last tick, the job's state and the clock come from PostgreSQL
 * (sekali.schedule_status()); the next tick is worked out here from the
 * configured spec, after the last tick (or after now, for a schedule no
 * scheduler has started yet). Values read from the database are printed
 * escaped: a row may have been written by anyone. Exit codes: 0 listed,
 * 1 PostgreSQL could not be read, 2 usage. */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cron.h"
#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_out.h"
#include "ctl_reports.h"
#include "pg.h"
#include "ticks.h"

/* Columns of sekali.schedule_status(). */
enum { COL_NAME, COL_SPEC, COL_QUEUE, COL_LAST, COL_KEY, COL_STATE, COL_ENQUEUED, COL_DROPPED,
       COL_NOW, COL_CLOCK /* now() again, for when there is no row */ };

struct line {
    const char *name, *spec, *queue, *key, *state;  /* borrowed; key, state may be NULL */
    char        conf_spec[160];
    bool        configured, stored;
    int64_t     last, next;                          /* -1: none */
    long long   enqueued, dropped;
};

static void put_time(FILE *out, int64_t t, bool json);
static void put_opt(FILE *out, const char *s, bool json);
static void print_text(FILE *out, const struct line *l, size_t n);
static void print_json(FILE *out, const struct line *l, size_t n, int64_t now);

int sk_ctl_schedules(const struct sk_conf *conf, int argc, char **argv)
{
    bool json;
    if (!sk_ctl_json_option(argc, argv, &json))
        return SK_CTL_SHOW_USAGE;
    if (optind != argc)
        return SK_CTL_SHOW_USAGE;
    return sk_ctl_schedules_report(conf, json, stdout);
}

/* A line for each configured schedule, then each stored one (a row of
 * res) joined to its configured line or added: returns how many. */
static size_t gather(const struct sk_conf *conf, PGresult *res, int rows, struct line *lines)
{
    size_t n = 0;
    for (size_t i = 0; i < conf->n_schedules; i++) {
        struct line *l = &lines[n++];
        const struct sk_schedule_conf *s = &conf->schedules[i];
        *l = (struct line){ .name = s->name, .spec = l->conf_spec, .queue = s->queue,
                            .configured = true, .last = -1, .next = -1 };
        sk_conf_schedule_spec(s, l->conf_spec, sizeof(l->conf_spec));
    }
    for (int r = 0; r < rows; r++) {
        if (PQgetisnull(res, r, COL_NAME))
            continue;
        const char *name = PQgetvalue(res, r, COL_NAME);
        struct line *l = NULL;
        for (size_t i = 0; i < n && l == NULL; i++)
            if (strcmp(lines[i].name, name) == 0)
                l = &lines[i];
        if (l == NULL) {
            l = &lines[n++];
            *l = (struct line){ .name = name, .spec = PQgetvalue(res, r, COL_SPEC),
                                .queue = PQgetvalue(res, r, COL_QUEUE), .next = -1 };
        }
        l->stored = true;
        l->last = strtoll(PQgetvalue(res, r, COL_LAST), NULL, 10);
        l->key = PQgetisnull(res, r, COL_KEY) ? NULL : PQgetvalue(res, r, COL_KEY);
        l->state = PQgetisnull(res, r, COL_STATE) ? NULL : PQgetvalue(res, r, COL_STATE);
        l->enqueued = strtoll(PQgetvalue(res, r, COL_ENQUEUED), NULL, 10);
        l->dropped = strtoll(PQgetvalue(res, r, COL_DROPPED), NULL, 10);
    }
    return n;
}

int sk_ctl_schedules_report(const struct sk_conf *conf, bool json, FILE *out)
{
    PGconn *pg = sk_ctl_pg_take(conf);
    if (pg == NULL)
        return SK_CTL_FAILED;
    const struct sk_pg_stmt st = {
        .sql = "SELECT s.*, floor(extract(epoch FROM now()))::int8 FROM "
               "(SELECT 1) one LEFT JOIN sekali.schedule_status() s ON true",
        .what = "sekali.schedule_status()",
    };
    PGresult *res;
    if (!sk_ctl_pg_exec(pg, &st, &res)) {
        fprintf(stderr, "sekalictl: is the schema migrated (sekalictl migrate)?\n");
        sk_ctl_pg_give(pg);
        return SK_CTL_FAILED;
    }
    int rows = PQntuples(res);
    /* One row with a NULL name stands for "no stored schedules" (the join). */
    int64_t now = strtoll(PQgetvalue(res, 0, COL_CLOCK), NULL, 10);
    struct line *lines = calloc(conf->n_schedules + (size_t)rows, sizeof(*lines));
    if (lines == NULL) {
        fprintf(stderr, "sekalictl: out of memory\n");
        PQclear(res);
        sk_ctl_pg_give(pg);
        return SK_CTL_FAILED;
    }
    size_t n = gather(conf, res, rows, lines);
    for (size_t i = 0; i < conf->n_schedules; i++)
        lines[i].next = sk_cron_next(&conf->schedules[i].when,
                                     lines[i].stored ? lines[i].last : now);
    if (json)
        print_json(out, lines, n, now);
    else
        print_text(out, lines, n);
    free(lines);
    PQclear(res);
    sk_ctl_pg_give(pg);
    return SK_CTL_OK;
}

static void put_time(FILE *out, int64_t t, bool json)
{
    char iso[32];
    if (t < 0) {
        fputs(json ? "null" : "-", out);
        return;
    }
    sk_ticks_iso(t, iso, sizeof(iso));
    fprintf(out, json ? "\"%s\"" : "%s", iso);
}

static void put_opt(FILE *out, const char *s, bool json)
{
    if (s == NULL)
        fputs(json ? "null" : "-", out);
    else if (json)
        sk_ctl_put_jstr(out, s);
    else
        sk_ctl_put_text(out, s, strlen(s), 120);
}

static void print_text(FILE *out, const struct line *l, size_t n)
{
    if (n == 0) {
        fprintf(out, "no schedules (none configured, none in PostgreSQL)\n");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "%s", i > 0 ? "\n" : "");
        sk_ctl_put_tstr(out, l[i].name);
        fprintf(out, "%s\n  spec      ", l[i].configured ? "" : "  (not in this config)");
        sk_ctl_put_tstr(out, l[i].spec);
        fprintf(out, "\n  queue     ");
        sk_ctl_put_tstr(out, l[i].queue);
        fprintf(out, "\n  last tick ");
        put_time(out, l[i].stored ? l[i].last : -1, false);
        fprintf(out, l[i].stored ? "" : " (no scheduler has started it yet)");
        fprintf(out, "\n  next tick ");
        put_time(out, l[i].next, false);
        fprintf(out, "\n  last job  ");
        put_opt(out, l[i].key, false);
        if (l[i].state != NULL) {
            fputs(" (", out);
            sk_ctl_put_tstr(out, l[i].state);
            fputs(")", out);
        }
        fprintf(out, "\n  enqueued  %lld, missed and not enqueued %lld\n", l[i].enqueued,
               l[i].dropped);
    }
}

static void print_json(FILE *out, const struct line *l, size_t n, int64_t now)
{
    fprintf(out, "{\"now\": ");
    put_time(out, now, true);
    fprintf(out, ", \"schedules\": [");
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "%s{\"name\": ", i > 0 ? ", " : "");
        sk_ctl_put_jstr(out, l[i].name);
        fprintf(out, ", \"spec\": ");
        sk_ctl_put_jstr(out, l[i].spec);
        fprintf(out, ", \"queue\": ");
        sk_ctl_put_jstr(out, l[i].queue);
        fprintf(out, ", \"configured\": %s, \"last_tick\": ", l[i].configured ? "true" : "false");
        put_time(out, l[i].stored ? l[i].last : -1, true);
        fprintf(out, ", \"next_tick\": ");
        put_time(out, l[i].next, true);
        fprintf(out, ", \"last_key\": ");
        put_opt(out, l[i].key, true);
        fprintf(out, ", \"last_state\": ");
        put_opt(out, l[i].state, true);
        fprintf(out, ", \"enqueued\": %lld, \"dropped\": %lld}", l[i].enqueued, l[i].dropped);
    }
    fprintf(out, "]}\n");
}
