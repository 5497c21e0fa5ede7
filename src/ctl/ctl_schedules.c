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

static void put_time(int64_t t, bool json);
static void put_opt(const char *s, bool json);
static void print_text(const struct line *l, size_t n);
static void print_json(const struct line *l, size_t n, int64_t now);

int sk_ctl_schedules(const struct sk_conf *conf, int argc, char **argv)
{
    static const struct option options[] = {
        { "json", no_argument, NULL, 'j' },
        { NULL, 0, NULL, 0 },
    };
    bool json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (opt != 'j') {
            sk_ctl_usage_of("schedules");
            return SK_CTL_USAGE;
        }
        json = true;
    }
    if (optind != argc) {
        sk_ctl_usage_of("schedules");
        return SK_CTL_USAGE;
    }
    PGconn *pg = sk_ctl_pg_connect(conf);
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
        PQfinish(pg);
        return SK_CTL_FAILED;
    }
    int rows = PQntuples(res);
    /* One row with a NULL name stands for "no stored schedules" (the join). */
    int64_t now = strtoll(PQgetvalue(res, 0, COL_CLOCK), NULL, 10);
    struct line *lines = calloc(conf->n_schedules + (size_t)rows, sizeof(*lines));
    if (lines == NULL) {
        fprintf(stderr, "sekalictl: out of memory\n");
        PQclear(res);
        PQfinish(pg);
        return SK_CTL_FAILED;
    }
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
    for (size_t i = 0; i < conf->n_schedules; i++)
        lines[i].next = sk_cron_next(&conf->schedules[i].when,
                                     lines[i].stored ? lines[i].last : now);
    if (json)
        print_json(lines, n, now);
    else
        print_text(lines, n);
    free(lines);
    PQclear(res);
    PQfinish(pg);
    return SK_CTL_OK;
}

static void put_time(int64_t t, bool json)
{
    char iso[32];
    if (t < 0) {
        fputs(json ? "null" : "-", stdout);
        return;
    }
    sk_ticks_iso(t, iso, sizeof(iso));
    printf(json ? "\"%s\"" : "%s", iso);
}

static void put_opt(const char *s, bool json)
{
    if (s == NULL)
        fputs(json ? "null" : "-", stdout);
    else if (json)
        sk_ctl_put_jstr(stdout, s);
    else
        sk_ctl_put_text(stdout, s, strlen(s), 120);
}

static void print_text(const struct line *l, size_t n)
{
    if (n == 0) {
        printf("no schedules (none configured, none in PostgreSQL)\n");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        printf("%s", i > 0 ? "\n" : "");
        sk_ctl_put_tstr(stdout, l[i].name);
        printf("%s\n  spec      ", l[i].configured ? "" : "  (not in this config)");
        sk_ctl_put_tstr(stdout, l[i].spec);
        printf("\n  queue     ");
        sk_ctl_put_tstr(stdout, l[i].queue);
        printf("\n  last tick ");
        put_time(l[i].stored ? l[i].last : -1, false);
        printf(l[i].stored ? "" : " (no scheduler has started it yet)");
        printf("\n  next tick ");
        put_time(l[i].next, false);
        printf("\n  last job  ");
        put_opt(l[i].key, false);
        if (l[i].state != NULL)
            printf(" (%s)", l[i].state);
        printf("\n  enqueued  %lld, missed and not enqueued %lld\n", l[i].enqueued,
               l[i].dropped);
    }
}

static void print_json(const struct line *l, size_t n, int64_t now)
{
    printf("{\"now\": ");
    put_time(now, true);
    printf(", \"schedules\": [");
    for (size_t i = 0; i < n; i++) {
        printf("%s{\"name\": ", i > 0 ? ", " : "");
        sk_ctl_put_jstr(stdout, l[i].name);
        printf(", \"spec\": ");
        sk_ctl_put_jstr(stdout, l[i].spec);
        printf(", \"queue\": ");
        sk_ctl_put_jstr(stdout, l[i].queue);
        printf(", \"configured\": %s, \"last_tick\": ", l[i].configured ? "true" : "false");
        put_time(l[i].stored ? l[i].last : -1, true);
        printf(", \"next_tick\": ");
        put_time(l[i].next, true);
        printf(", \"last_key\": ");
        put_opt(l[i].key, true);
        printf(", \"last_state\": ");
        put_opt(l[i].state, true);
        printf(", \"enqueued\": %lld, \"dropped\": %lld}", l[i].enqueued, l[i].dropped);
    }
    printf("]}\n");
}
