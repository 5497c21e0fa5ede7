/* scheduler.c - the scheduler process: each schedule's due ticks into the
 * outbox, exactly once across every host that runs the same schedules.
 *
 * Why a process of its own, started by the supervisor like the relay and
 * the janitor: the supervisor never touches a database, and the relay and
 * janitor have their own pace (a NOTIFY, a retention round) that a tick
 * must not wait on. It is single-threaded, which the time-zone search
 * needs (tz.h: TZ is process-global).
 *
 * Nothing here trusts this host's clock with a date. A round first peeks
 * at each schedule's row (sql/020) for its last tick and PostgreSQL's
 * now(); a schedule with a tick due then gets one transaction that locks
 * its row, reads now() again, works out the due ticks (ticks.c: the missed
 * policy) and enqueues them with sekali.schedule_fire(), which also moves
 * the last tick. Hosts racing for a tick queue on the row lock and the
 * second finds it taken. This host's clock only measures how long to
 * sleep until the next tick, at most a second, so a host whose clock is
 * ten minutes off enqueues on time all the same.
 *
 * A reload starts a new generation whose scheduler reads the same rows:
 * the current tick is enqueued by whichever of the two schedulers gets the
 * row first, and never twice (the row, and the tick's key).
 *
 * Once a minute it also reports which specs it runs (sql/022), so that
 * `sekalictl doctor` can find hosts that run one name with different
 * specs, whose ticks the rows above cannot tell apart. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "clock.h"
#include "log.h"
#include "outage.h"
#include "pg.h"
#include "process.h"
#include "scheduler.h"
#include "ticks.h"
#include "trace_context.h"

#define MAX_SLEEP_MS 1000     /* heartbeat, and a row another host moved, are seen this often */
#define MIN_SLEEP_MS 5
#define FAILED_WAIT_MS 5000   /* a schedule whose statement failed waits this long */
#define REPORT_EVERY_MS 60000 /* how often the runner row is refreshed: doctor reads
                               * rows younger than three of these */

static const char *const missed_names[] = { "skip", "once", "all" };

/* What the scheduler remembers of a schedule between rounds: the last
 * tick it saw in the row and the next one after it (a cron search is not
 * free, so it is made once per last tick). */
struct entry {
    const struct sk_schedule_conf *conf;
    char    spec[160];
    bool    known;           /* last and next are valid */
    int64_t last, next;      /* Unix seconds; next -1: never */
    int64_t retry_at_ms;     /* sk_now_ms() before which a failed schedule is left alone */
    struct sk_metrics_schedule *metrics;
};

struct scheduler {
    const struct sk_conf *conf;
    struct sk_slot       *slot;
    struct sk_metrics    *metrics;
    PGconn               *pg;
    struct entry         *entries;
    int64_t              *ticks;     /* SK_TICKS_CATCHUP_MAX of them, for one schedule's round */
    char                 *list;      /* the ticks as a PostgreSQL array literal */
    size_t                list_size;
    struct sk_outage      outage;
    char                  runner[HOST_NAME_MAX + PATH_MAX + 2];  /* host:config path */
    int64_t               report_at_ms;  /* sk_now_ms() when the runner rows are due */
};

static int round_once(struct scheduler *s, int64_t *sleep_ms);
static void name_runner(struct scheduler *s);
static void turn(struct scheduler *s);
static int report(struct scheduler *s);
static int peek(struct scheduler *s, struct entry *e, int64_t *now_ms, bool *exists);
static int open_row(struct scheduler *s, struct entry *e);
static int fire(struct scheduler *s, struct entry *e);
static void tick_list(struct scheduler *s, const struct sk_ticks *t);
static void log_fired(const struct sk_schedule_conf *c, const struct sk_ticks *t,
                      const char *trace_id);
static int rollback(struct scheduler *s, int rc);
static void remember(struct entry *e, int64_t last);
static void sleep_alive(struct scheduler *s, int64_t ms);

int sk_scheduler_run(const struct sk_conf *conf, struct sk_slot *slot,
                     struct sk_metrics *metrics)
{
    struct scheduler s = {
        .conf = conf, .slot = slot, .metrics = metrics, .outage = SK_OUTAGE_INIT(100, 2000),
        .entries = calloc(conf->n_schedules, sizeof(*s.entries)),
        .ticks = calloc(SK_TICKS_CATCHUP_MAX, sizeof(*s.ticks)),
        .list_size = SK_TICKS_CATCHUP_MAX * 22 + 3,
    };
    s.list = malloc(s.list_size);
    if (s.entries == NULL || s.ticks == NULL || s.list == NULL) {
        sk_log_error("scheduler: out of memory for %zu schedules", conf->n_schedules);
        free(s.entries);
        free(s.ticks);
        free(s.list);
        return SK_EXIT_RUNTIME;
    }
    for (size_t i = 0; i < conf->n_schedules; i++) {
        s.entries[i].conf = &conf->schedules[i];
        s.entries[i].metrics = sk_metrics_schedule(metrics, i);
        sk_conf_schedule_spec(&conf->schedules[i], s.entries[i].spec, sizeof(s.entries[i].spec));
    }
    name_runner(&s);
    sk_log_event(SK_LOG_INFO, SK_EVENT_STARTED, NULL, NULL, "scheduler started with %zu "
                 "schedule%s", conf->n_schedules, conf->n_schedules == 1 ? "" : "s");

    while (!sk_process_stopping())
        turn(&s);
    PQfinish(s.pg);
    free(s.entries);
    free(s.ticks);
    free(s.list);
    sk_log_event(SK_LOG_INFO, SK_EVENT_STOPPING, NULL, NULL, "scheduler stopping");
    return SK_EXIT_OK;
}

/* One turn of the scheduler's loop: a connection if it has none, a round,
 * then a sleep until the next tick or the next try. */
static void turn(struct scheduler *s)
{
    atomic_store(&s->slot->alive_ms, sk_now_ms());
    struct sk_err err = { 0 };
    if (s->pg == NULL &&
        (s->pg = sk_pg_dial(&s->conf->postgres, "sekali scheduler", &err)) == NULL) {
        atomic_store(&s->slot->consuming, 0);
        if (sk_outage_failed(&s->outage))
            sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, NULL,
                         "scheduler cannot reach PostgreSQL, retrying with backoff: %s",
                         err.msg);
        sleep_alive(s, sk_outage_wait_ms(&s->outage));
        return;
    }
    atomic_store(&s->slot->consuming, 1);
    int64_t sleep_ms = MAX_SLEEP_MS;
    int rc = round_once(s, &sleep_ms);
    /* SK_AGAIN is the connection: lost, or a standby after a failover
     * (read-only), where only a new dial finds the primary. */
    if (rc == SK_AGAIN) {
        if (sk_outage_failed(&s->outage))
            sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, NULL,
                         "scheduler lost PostgreSQL, retrying with backoff");
        PQfinish(s->pg);
        s->pg = NULL;
        sleep_alive(s, sk_outage_wait_ms(&s->outage));
        return;
    }
    if (sk_outage_ok(&s->outage))
        sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_POSTGRES, NULL,
                     "scheduler reached PostgreSQL again");
    sleep_alive(s, sleep_ms);
}

/* One look at every schedule; fires those with a tick due. *sleep_ms is
 * how long until the soonest next tick, by PostgreSQL's clock. Returns
 * SK_AGAIN when the connection is gone (the round stops there), else
 * SK_OK: a row locked past lock_timeout (SK_BUSY) is another host's turn,
 * and a schedule whose statement failed (logged) is left alone for
 * FAILED_WAIT_MS without holding up the others. */
static int round_once(struct scheduler *s, int64_t *sleep_ms)
{
    if (s->report_at_ms <= sk_now_ms()) {
        int rc = report(s);
        if (rc == SK_AGAIN)
            return rc;
        s->report_at_ms = sk_now_ms() + REPORT_EVERY_MS;
    }
    for (size_t i = 0; i < s->conf->n_schedules && !sk_process_stopping(); i++) {
        struct entry *e = &s->entries[i];
        if (e->retry_at_ms > sk_now_ms())
            continue;
        int64_t now_ms;
        bool exists;
        int rc = peek(s, e, &now_ms, &exists);
        if (rc == SK_OK && !exists && (rc = open_row(s, e)) == SK_OK)
            rc = peek(s, e, &now_ms, &exists);
        if (rc == SK_OK && exists && e->next >= 0 && e->next * 1000 <= now_ms) {
            rc = fire(s, e);
            if (rc == SK_OK)
                rc = peek(s, e, &now_ms, &exists);
        }
        if (rc == SK_AGAIN)
            return rc;
        if (rc == SK_BUSY)
            continue;
        if (rc != SK_OK) {
            sk_metrics_schedule_failed(e->metrics);
            e->retry_at_ms = sk_now_ms() + FAILED_WAIT_MS;
            continue;
        }
        if (exists && e->next >= 0 && e->next * 1000 - now_ms < *sleep_ms)
            *sleep_ms = e->next * 1000 - now_ms;
    }
    if (*sleep_ms < MIN_SLEEP_MS)
        *sleep_ms = MIN_SLEEP_MS;
    sk_metrics_scheduler_round(s->metrics);
    return SK_OK;
}

/* This scheduler's name among the runners of sql/022: the host and the
 * config file, which a restart or a reload keeps. */
static void name_runner(struct scheduler *s)
{
    char host[HOST_NAME_MAX + 1] = "unknown-host";
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "unknown-host");
    host[sizeof(host) - 1] = '\0';
    char *path = realpath(s->conf->path, NULL);
    snprintf(s->runner, sizeof(s->runner), "%s:%s", host,
             path != NULL ? path : s->conf->path);
    free(path);
}

static const char *schedule_name(const void *entries, size_t i)
{
    return ((const struct entry *)entries)[i].conf->name;
}
static const char *schedule_spec(const void *entries, size_t i)
{
    return ((const struct entry *)entries)[i].spec;
}
static const char *schedule_queue(const void *entries, size_t i)
{
    return ((const struct entry *)entries)[i].conf->queue;
}

/* Tells sql/022 which specs this runner runs. A failure other than a lost
 * connection costs doctor's view only: it is logged, and tried again at
 * the next report. */
static int report(struct scheduler *s)
{
    size_t n = s->conf->n_schedules;
    char *names = sk_pg_text_array(n, schedule_name, s->entries);
    char *specs = sk_pg_text_array(n, schedule_spec, s->entries);
    char *queues = sk_pg_text_array(n, schedule_queue, s->entries);
    int rc = SK_ERR;
    struct sk_err err = { 0 };
    if (names != NULL && specs != NULL && queues != NULL) {
        const char *args[] = { s->runner, names, specs, queues };
        const struct sk_pg_stmt st = {
            .sql = "SELECT sekali.schedule_runner_seen($1, $2::text[], $3::text[], $4::text[])",
            .n_params = 4, .values = args, .what = "sekali.schedule_runner_seen",
        };
        rc = sk_pg_exec(s->pg, &st, NULL, &err);
    } else {
        sk_err_set(&err, SK_ERR, "out of memory");
    }
    if (rc != SK_OK && rc != SK_AGAIN)
        sk_log_warn("scheduler: cannot report its schedules for sekalictl doctor: %s", err.msg);
    free(names);
    free(specs);
    free(queues);
    return rc;
}

/* The row's last tick and PostgreSQL's now() in ms, without a lock. */
static int peek(struct scheduler *s, struct entry *e, int64_t *now_ms, bool *exists)
{
    const char *params[] = { e->conf->name };
    const struct sk_pg_stmt st = {
        .sql = "SELECT (SELECT extract(epoch FROM last_tick)::int8 FROM sekali.schedules "
               "WHERE name = $1), (extract(epoch FROM now()) * 1000)::int8",
        .n_params = 1, .values = params, .one_row = true, .what = "reading a schedule's row",
    };
    PGresult *res;
    struct sk_err err = { 0 };
    int rc = sk_pg_exec(s->pg, &st, &res, &err);
    if (rc != SK_OK) {
        sk_log_warn("scheduler: schedule %s: %s", e->conf->name, err.msg);
        return rc;
    }
    *exists = !PQgetisnull(res, 0, 0);
    *now_ms = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
    if (*exists)
        remember(e, strtoll(PQgetvalue(res, 0, 0), NULL, 10));
    PQclear(res);
    return SK_OK;
}

static void remember(struct entry *e, int64_t last)
{
    sk_metrics_schedule_last_tick(e->metrics, last);
    if (e->known && e->last == last)
        return;
    e->known = true;
    e->last = last;
    e->next = sk_cron_next(&e->conf->when, last);
}

/* A schedule seen for the first time starts now (its own statement: the
 * row must exist whether or not a tick follows). */
static int open_row(struct scheduler *s, struct entry *e)
{
    const char *open[] = { e->conf->name, e->spec, e->conf->queue };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.schedule_open($1, $2, $3)", .n_params = 3, .values = open,
        .what = "sekali.schedule_open",
    };
    struct sk_err err = { 0 };
    int rc = sk_pg_exec(s->pg, &st, NULL, &err);
    if (rc != SK_OK)
        sk_log_warn("scheduler: schedule %s: %s", e->conf->name, err.msg);
    else
        sk_log_info("scheduler: schedule %s (%s) starts now", e->conf->name, e->spec);
    return rc;
}

/* The locked transaction: the due ticks by PostgreSQL's clock, enqueued,
 * and the last tick moved, at one COMMIT. */
static int fire(struct scheduler *s, struct entry *e)
{
    const struct sk_schedule_conf *c = e->conf;
    struct sk_err err = { 0 };
    PGresult *res;
    int rc = sk_pg_run(s->pg, "BEGIN", &err);
    if (rc != SK_OK) {
        sk_log_warn("scheduler: BEGIN failed: %s", err.msg);
        return rc;
    }
    const char *name[] = { c->name };
    const struct sk_pg_stmt lock = {
        .sql = "SELECT extract(epoch FROM last_tick)::int8, floor(extract(epoch FROM now()))::int8 "
               "FROM sekali.schedules WHERE name = $1 FOR UPDATE",
        .n_params = 1, .values = name, .one_row = true, .what = "locking a schedule's row",
    };
    if ((rc = sk_pg_exec(s->pg, &lock, &res, &err)) != SK_OK) {
        if (rc != SK_BUSY)
            sk_log_warn("scheduler: schedule %s: %s", c->name, err.msg);
        return rollback(s, rc);
    }
    int64_t last = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    int64_t now = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
    PQclear(res);

    struct sk_ticks t = { .at = s->ticks, .cap = SK_TICKS_CATCHUP_MAX };
    sk_ticks_due(&c->when, last, now, c->grace_ms / 1000, c->missed, &t);
    if (t.latest == last)  /* someone else was first */
        return rollback(s, SK_OK);
    tick_list(s, &t);
    char latest[24], dropped[24];
    snprintf(latest, sizeof(latest), "%" PRId64, t.latest);
    snprintf(dropped, sizeof(dropped), "%zu", t.dropped);
    /* Each firing begins a trace, which its jobs carry (sql/031): the
     * setting is made first (the materialised CTE), for this transaction. */
    struct sk_trace trace;
    sk_trace_begin(&trace, NULL, 0, NULL, 0);
    const char *args[] = { c->name, e->spec, c->queue, c->job_type, c->body, s->list, latest,
                           dropped, trace.traceparent };
    const struct sk_pg_stmt fire_st = {
        .sql = "WITH t AS MATERIALIZED (SELECT set_config('sekali.traceparent', $9, true)) "
               "SELECT sekali.schedule_fire($1, $2, $3, $4, convert_to($5, 'UTF8'), $6, $7, $8) "
               "FROM t",
        .n_params = 9, .values = args, .one_row = true, .what = "sekali.schedule_fire",
    };
    if ((rc = sk_pg_exec(s->pg, &fire_st, NULL, &err)) != SK_OK) {
        sk_log_warn("scheduler: schedule %s: %s", c->name, err.msg);
        return rollback(s, rc);
    }
    if ((rc = sk_pg_run(s->pg, "COMMIT", &err)) != SK_OK) {
        sk_log_warn("scheduler: schedule %s: COMMIT failed: %s", c->name, err.msg);
        return rc;
    }
    sk_metrics_schedule_fired(e->metrics, t.n, t.dropped);
    log_fired(c, &t, trace.trace_id);
    return SK_OK;
}

/* The ticks of t as a PostgreSQL array literal, into s->list. */
static void tick_list(struct scheduler *s, const struct sk_ticks *t)
{
    size_t used = (size_t)snprintf(s->list, s->list_size, "{");
    for (size_t i = 0; i < t->n; i++)
        used += (size_t)snprintf(s->list + used, s->list_size - used, "%s%" PRId64,
                                 i > 0 ? "," : "", t->at[i]);
    snprintf(s->list + used, s->list_size - used, "}");
}

static void log_fired(const struct sk_schedule_conf *c, const struct sk_ticks *t,
                      const char *trace_id)
{
    char iso[32];
    sk_ticks_iso(t->latest, iso, sizeof(iso));
    if (t->dropped > 0)
        sk_log_warn("scheduler: schedule %s: %zu due tick%s not enqueued (missed: %s), "
                    "%zu enqueued, up to %s, in trace %s", c->name, t->dropped,
                    t->dropped == 1 ? "" : "s", missed_names[c->missed], t->n, iso, trace_id);
    else
        sk_log_debug("scheduler: schedule %s: %zu tick%s enqueued, up to %s, in trace %s",
                     c->name, t->n, t->n == 1 ? "" : "s", iso, trace_id);
}

/* Ends the open transaction without its changes; returns rc. */
static int rollback(struct scheduler *s, int rc)
{
    if (PQstatus(s->pg) == CONNECTION_OK)
        sk_pg_run(s->pg, "ROLLBACK", NULL);
    return rc;
}

/* Sleeps in short steps, so that the supervisor sees us alive. */
static void sleep_alive(struct scheduler *s, int64_t ms)
{
    while (ms > 0 && !sk_process_stopping()) {
        uint32_t step = ms > 200 ? 200 : (uint32_t)ms;
        atomic_store(&s->slot->alive_ms, sk_now_ms());
        sk_sleep_ms(step);
        ms -= step;
    }
}
