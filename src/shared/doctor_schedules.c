/* doctor_schedules.c - doctor's check that every host runs a schedule with
 * the same spec (doctor.h).
 *
 * A schedule's name is its identity across hosts: hosts that run one name
 * with different specs each enqueue their own ticks, every one of them
 * once, but on two timetables. Each scheduler reports the specs it runs
 * about once a minute (sql/022, scheduler.c); the rows younger than
 * RECENT_S are compared with this configuration's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doctor.h"
#include "pg.h"

#define RECENT_S 180  /* three of the schedulers' report periods */
#define RECENT_SQL "interval '180 seconds'"

struct runner_row {
    const char *name, *runner, *spec, *queue;
};

static void check_one(struct sk_doctor *d, const struct sk_schedule_conf *c,
                      const struct runner_row *rows, int n);
static void append_runner(char *out, size_t size, const char *runner);

void sk_doctor_schedules(struct sk_doctor *d)
{
    if (d->conf->n_schedules == 0 || d->cheap)
        return;
    struct sk_err err = { 0 };
    PGconn *pg = sk_pg_dial(&d->conf->postgres, "sekali doctor", &err);
    if (pg == NULL)
        return;  /* postgres.reachable has said why */
    const struct sk_pg_stmt st = {
        .sql = "SELECT name, runner, spec, queue FROM sekali.schedule_runners "
               "WHERE seen_at > now() - " RECENT_SQL " "
               "ORDER BY name, spec, queue, runner",
        .what = "reading sekali.schedule_runners",
    };
    PGresult *res;
    if (sk_pg_exec(pg, &st, &res, &err) != SK_OK) {
        for (size_t i = 0; i < d->conf->n_schedules; i++)
            sk_doctor_add(d, "schedule.spec", d->conf->schedules[i].name, SK_DOCTOR_SKIP,
                          "run sekalictl migrate", "cannot read which specs the hosts run: %s",
                          err.msg);
        PQfinish(pg);
        return;
    }
    int n = PQntuples(res);
    struct runner_row *rows = calloc((size_t)n + 1, sizeof(*rows));
    if (rows == NULL)
        sk_doctor_add(d, "schedule.spec", "", SK_DOCTOR_FAIL, NULL,
                      "out of memory for %d rows of sekali.schedule_runners", n);
    for (int i = 0; rows != NULL && i < n; i++)
        rows[i] = (struct runner_row){ PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
                                       PQgetvalue(res, i, 2), PQgetvalue(res, i, 3) };
    for (size_t i = 0; rows != NULL && i < d->conf->n_schedules; i++)
        check_one(d, &d->conf->schedules[i], rows, n);
    free(rows);
    PQclear(res);
    PQfinish(pg);
}

/* The runners of c's name, grouped by what they run (rows are sorted), and
 * this configuration's spec and queue against them. */
static void check_one(struct sk_doctor *d, const struct sk_schedule_conf *c,
                      const struct runner_row *rows, int n)
{
    char mine[160];
    sk_conf_schedule_spec(c, mine, sizeof(mine));
    char groups[400] = "";
    int runners = 0, kinds = 0;
    bool differs = false;
    const struct runner_row *prev = NULL;
    for (int i = 0; i < n; i++) {
        const struct runner_row *r = &rows[i];
        if (strcmp(r->name, c->name) != 0)
            continue;
        runners++;
        bool same_kind = prev != NULL && strcmp(prev->spec, r->spec) == 0 &&
                         strcmp(prev->queue, r->queue) == 0;
        if (!same_kind) {
            kinds++;
            differs |= strcmp(r->spec, mine) != 0 || strcmp(r->queue, c->queue) != 0;
            size_t used = strlen(groups);
            snprintf(groups + used, sizeof(groups) - used, "%s%s into %s on ",
                     used > 0 ? "; " : "", r->spec, r->queue);
        } else {
            size_t used = strlen(groups);
            snprintf(groups + used, sizeof(groups) - used, ", ");
        }
        append_runner(groups, sizeof(groups), r->runner);
        prev = r;
    }
    if (runners == 0)
        sk_doctor_add(d, "schedule.spec", c->name, SK_DOCTOR_SKIP, NULL,
                      "no scheduler has reported it in the last %d s: no sekalid runs it now",
                      RECENT_S);
    else if (!differs)
        sk_doctor_add(d, "schedule.spec", c->name, SK_DOCTOR_PASS, NULL,
                      "%d scheduler%s run%s it as configured here: %s", runners,
                      runners == 1 ? "" : "s", runners == 1 ? "s" : "", groups);
    else
        sk_doctor_add(d, "schedule.spec", c->name, SK_DOCTOR_WARN,
                      "give every host the same schedules: entry and reload it (a rolling "
                      "change clears once every host has reloaded)",
                      "here %s into %s, but %d spec%s run: %s; each host enqueues its own "
                      "ticks", mine, c->queue, kinds, kinds == 1 ? "" : "s", groups);
}

/* A runner is another host's name and file path: printed with its control
 * characters made '?', so that it cannot drive the reader's terminal. */
static void append_runner(char *out, size_t size, const char *runner)
{
    size_t used = strlen(out);
    for (const char *p = runner; *p != '\0' && used + 1 < size; p++)
        out[used++] = (unsigned char)*p < 0x20 || *p == 0x7f ? '?' : *p;
    out[used] = '\0';
}
