/* janitor.c - retention: deletes what no longer protects anything.
 *
 * Every janitor.interval it deletes, per queue, idempotency keys finished
 * (completed or failed) longer ago than the queue's retention, with their
 * checkpoints, and then the dead letters (sql/023) whose failed key is gone
 * and that are older than that retention too, so a dead letter lives as
 * long as its failed key (a letter without a key, as long as one would);
 * outbox rows published longer ago than outbox_retention;
 * dedupe keys released or expired more than an hour ago; and crash counts
 * (sql/006) a day old; and the minutes of sekali.history older than
 * history_retention, after adding this round's to it (history.c). A
 * finished key protects against late
 * duplicates, so retention must be longer than any redelivery can be late.
 * A row still `processing`, an unpublished outbox row or a live dedupe key
 * is never touched.
 *
 * Completed keys untouched for janitor.archive_after move on to a narrow
 * table (sql/040, sekali.archive_keys), where a key costs half the bytes,
 * after every other delete of the round, and each queue's for at most
 * janitor.interval of it (archive_queues()).
 *
 * The deletes are functions of sql/012, 023, 028, 034, 035 and 040 (sekali.purge_*), each
 * reading a time index so that a round costs what expired. Each call takes
 * at most janitor.batch rows and commits on its own, so it never holds many
 * row locks or a long transaction; a round repeats batches until one comes
 * back short, resting between them so that it deletes at most
 * janitor.busy_percent of its time (drain()). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "history.h"
#include "janitor.h"
#include "log.h"
#include "outage.h"
#include "pg.h"
#include "process.h"

/* Where a queue's moves and its archive's purge go on from (sql/041):
 * the newest updated_at the last batch took, as PostgreSQL prints a
 * timestamptz; "" from the start. */
struct janitor_marks {
    char purge[64];
    char move[64];
};

/* The marks are forgotten this often, so that a row that did land under
 * one (sql/041 says how) stays at most this much longer where it is; the
 * walk it costs is one batch's an hour. */
#define JANITOR_MARKS_MS (3600 * 1000)

/* One round's deletes: where they go and how they are paced. */
struct janitor_round {
    PGconn               *pg;
    const struct sk_conf *conf;
    struct sk_slot       *slot;
    struct janitor_marks *marks;  /* one a queue; NULL: every batch from the start */
};

/* Waits ms, in steps short enough that the supervisor, and through it
 * systemd's watchdog, sees the janitor alive. */
static void rest(struct sk_slot *slot, int64_t ms)
{
    int64_t until = sk_now_ms() + ms;
    for (;;) {
        atomic_store(&slot->alive_ms, sk_now_ms());
        int64_t left = until - sk_now_ms();
        if (left <= 0 || sk_process_stopping())
            return;
        sk_sleep_ms((uint32_t)(left < 200 ? left : 200));
    }
}

/* A call drain() repeats: a purge function that returns the rows it
 * deleted (its first column). */
struct drain_call {
    const char        *sql;
    const char *const *params;
    int                n_params;
    const char        *what;      /* for the log: "idempotency keys" */
    uint64_t           until_ns;  /* not 0: stop after the batch that ends past it */
    char              *mark;      /* not NULL: the last parameter, and the second
                                   * column written back (sql/041); "" is NULL */
    size_t             mark_size;
    bool               cut;       /* set: stopped at until_ns with more to do */
};

/* Calls c's function until a batch deletes fewer rows than asked, or past
 * c->until_ns. After each full batch it rests in proportion to the
 * batch's time, so that deleting takes at most janitor.busy_percent of the
 * janitor's time: the deletes compete with the workers for PostgreSQL,
 * and a backlog (a first round over a long history, a retention
 * shortened) is better spread over minutes than taken from the jobs in
 * one burst. Returns SK_OK, or the failure's code after logging it. */
static int drain_call(const struct janitor_round *r, struct drain_call *c)
{
    /* A copy, so that the mark can be the last parameter of each batch. */
    const char *params[4];
    if (c->n_params < 1 || (size_t)c->n_params > SK_ARRAY_LEN(params)) {
        sk_log_error("janitor: %s: %d parameters, at most %zu", c->what, c->n_params,
                     SK_ARRAY_LEN(params));
        return SK_ERR;
    }
    memcpy(params, c->params, sizeof(params[0]) * (size_t)c->n_params);
    const struct sk_pg_stmt st = { .sql = c->sql, .n_params = c->n_params, .values = params,
                                   .one_row = true };
    const uint64_t busy = (uint64_t)r->conf->janitor.busy_percent;
    uint64_t owed_ns = 0;  /* rest earned by batches too short to rest after alone */
    for (;;) {
        if (c->mark != NULL)
            params[c->n_params - 1] = c->mark[0] != '\0' ? c->mark : NULL;
        struct sk_err err = { 0 };
        PGresult *res;
        uint64_t started = sk_now_ns();
        int rc = sk_pg_exec(r->pg, &st, &res, &err);
        if (rc != SK_OK) {
            sk_log_warn("janitor: deleting %s failed: %s", c->what, err.msg);
            return rc;
        }
        long long n = atoll(PQgetvalue(res, 0, 0));
        if (c->mark != NULL && PQnfields(res) > 1)
            snprintf(c->mark, c->mark_size, "%s", PQgetvalue(res, 0, 1));
        PQclear(res);
        /* A batch is short, a round over a backlog is not: the supervisor,
         * and through it systemd's watchdog, must see every batch. */
        atomic_store(&r->slot->alive_ms, sk_now_ms());
        if (n < r->conf->janitor.batch || sk_process_stopping())
            return SK_OK;
        if (c->until_ns != 0 && sk_now_ns() >= c->until_ns) {
            c->cut = true;
            return SK_OK;
        }
        owed_ns += (sk_now_ns() - started) * (100 - busy) / busy;
        if (owed_ns >= 10 * 1000000ull) {
            rest(r->slot, (int64_t)(owed_ns / 1000000));
            owed_ns %= 1000000;
        }
    }
}

static int drain(const struct janitor_round *r, const char *sql, const char *const *params,
                 int n_params, const char *what)
{
    struct drain_call c = { .sql = sql, .params = params, .n_params = n_params, .what = what };
    return drain_call(r, &c);
}

/* One queue's expired keys go from both tables, with the dead letters
 * whose failed key went. The archive's purge goes on from its mark
 * (sql/041). */
static int purge_queue(const struct janitor_round *r, const struct sk_queue_conf *q,
                       const char *batch, struct janitor_marks *marks)
{
    if (q->retention_ms == SK_RETENTION_FOREVER)
        return SK_OK;
    char ms[24];
    snprintf(ms, sizeof(ms), "%" PRIu64, q->retention_ms);
    const char *params[] = { q->name, ms, batch, NULL };
    struct drain_call archived = {
        .sql = "SELECT * FROM sekali.purge_finished_keys_after($1, $2, $3, $4)",
        .params = params, .n_params = 4, .what = "archived keys",
        .mark = marks != NULL ? marks->purge : NULL, .mark_size = sizeof(marks->purge) };
    if (drain(r, "SELECT sekali.purge_keys($1, $2, $3)", params, 3, "idempotency keys") != SK_OK ||
        drain_call(r, &archived) != SK_OK ||
        drain(r, "SELECT sekali.purge_dead_letters($1, $2, $3)", params, 3,
              "dead letters") != SK_OK)
        return SK_AGAIN;
    return SK_OK;
}

/* The completed keys older than archive_after move to
 * sekali.finished_keys (sql/040), from where the last batch ended
 * (sql/041), after the round's purges so that no key
 * moves only to be deleted, and each queue's for at most janitor.interval
 * (at least a second) a round: an upgrade over a long history has hours
 * to move (about 30,000 keys a second), and the purges, the history's
 * minutes and the other queues' moves must not wait for them. In steady
 * state a round moves what completed since the last, well inside that. */
static int archive_queues(const struct janitor_round *r)
{
    const struct sk_conf *conf = r->conf;
    char batch[16];
    snprintf(batch, sizeof(batch), "%d", conf->janitor.batch);
    uint64_t after = conf->janitor.archive_after_ms;
    if (after == SK_RETENTION_FOREVER)
        return SK_OK;
    uint64_t budget_ms = conf->janitor.interval_ms > 1000 ? conf->janitor.interval_ms : 1000;
    char ms[24];
    snprintf(ms, sizeof(ms), "%" PRIu64, after);
    for (size_t i = 0; i < conf->n_queues && !sk_process_stopping(); i++) {
        const struct sk_queue_conf *q = &conf->queues[i];
        if (after >= q->retention_ms)
            continue;
        const char *params[] = { q->name, ms, batch, NULL };
        struct drain_call moves = {
            .sql = "SELECT * FROM sekali.archive_keys_after($1, $2, $3, $4)", .params = params,
            .n_params = 4, .what = "completed keys (moving them to sekali.finished_keys)",
            .until_ns = sk_now_ns() + budget_ms * 1000000ull,
            .mark = r->marks != NULL ? r->marks[i].move : NULL,
            .mark_size = sizeof(r->marks[i].move) };
        if (drain_call(r, &moves) != SK_OK)
            return SK_AGAIN;
        if (moves.cut)
            sk_log_info("janitor: queue %s has more completed keys to move to "
                        "sekali.finished_keys than a round moves (%.1f s of it): "
                        "the next rounds go on", q->name, (double)budget_ms / 1000);
    }
    return SK_OK;
}

static int round_once(const struct janitor_round *r, struct sk_history *history)
{
    const struct sk_conf *conf = r->conf;
    PGconn *pg = r->pg;
    char batch[16], ms[24];
    snprintf(batch, sizeof(batch), "%d", conf->janitor.batch);
    /* First, so that the counts land in the minute they happened in even
     * when the purges take long; a database not yet migrated to sql/037
     * (logged) still has its rows deleted. */
    if (history != NULL && sk_history_write(history, pg) != SK_OK &&
        PQstatus(pg) != CONNECTION_OK)
        return SK_AGAIN;
    for (size_t i = 0; i < conf->n_queues && !sk_process_stopping(); i++) {
        struct janitor_marks *marks = r->marks != NULL ? &r->marks[i] : NULL;
        if (purge_queue(r, &conf->queues[i], batch, marks) != SK_OK)
            return SK_AGAIN;
    }
    snprintf(ms, sizeof(ms), "%" PRIu64, conf->janitor.outbox_retention_ms);
    const char *outbox[] = { ms, batch };
    const char *only_batch[] = { batch };
    if ((conf->janitor.outbox_retention_ms != SK_RETENTION_FOREVER &&
         drain(r, "SELECT sekali.purge_outbox($1, $2)", outbox, 2, "outbox rows") != SK_OK) ||
        drain(r, "SELECT sekali.purge_dedupe($1)", only_batch, 1, "dedupe keys") != SK_OK ||
        drain(r, "SELECT sekali.purge_crashes($1)", only_batch, 1, "crash counts") != SK_OK)
        return SK_AGAIN;

    /* The dead letters' group counts (sql/029) gain a row per group and
     * writing session: folded each round, whatever the retention; last, so
     * that a database not yet migrated to 029 still loses its expired rows. */
    for (size_t i = 0; i < conf->n_queues && !sk_process_stopping(); i++) {
        const char *fold[] = { conf->queues[i].name, batch };
        if (drain(r, "SELECT sekali.fold_dead_letter_counts($1, $2)", fold, 2,
                  "the shards of dead letter counts") != SK_OK)
            return SK_AGAIN;
    }
    snprintf(ms, sizeof(ms), "%" PRIu64, conf->janitor.history_retention_ms);
    const char *history_args[] = { ms, batch };
    if (conf->janitor.history_retention_ms != SK_RETENTION_FOREVER &&
        drain(r, "SELECT sekali.purge_history($1, $2)", history_args, 2,
              "history minutes") != SK_OK)
        return SK_AGAIN;
    return SK_OK;
}

/* A round longer than the interval, while keys keep expiring, means the
 * janitor falls behind: the expired rows, and the tables, grow. Said once
 * per such round; the first round over an old backlog says it too. */
static void warn_if_behind(const struct sk_conf *conf, int64_t took_ms)
{
    if (took_ms <= (int64_t)conf->janitor.interval_ms)
        return;
    bool paced = conf->janitor.busy_percent < 100;
    sk_log_warn("janitor: a round took %.1f s, longer than janitor.interval (%.1f s), "
                "deleting %d%% of the time (janitor.busy_percent): %s", (double)took_ms / 1000,
                (double)conf->janitor.interval_ms / 1000, conf->janitor.busy_percent,
                paced ? "if it stays behind, raise busy_percent"
                      : "PostgreSQL deletes expired rows slower than they come");
}

int sk_janitor_run(const struct sk_conf *conf, struct sk_slot *slot, struct sk_metrics *metrics)
{
    sk_log_event(SK_LOG_INFO, SK_EVENT_STARTED, NULL, NULL, "janitor started");

    struct sk_outage outage = SK_OUTAGE_INIT(500, 30000);
    PGconn *pg = NULL;
    /* Without it (out of memory) the retention still runs. */
    struct sk_history *history =
        sk_history_new(conf, metrics, sk_metrics_read_janitor_round(metrics) == 0);
    /* Without them (out of memory) each archive purge batch starts from
     * the oldest row. */
    size_t n_marks = conf->n_queues > 0 ? conf->n_queues : 1;
    struct janitor_marks *marks = calloc(n_marks, sizeof(*marks));
    int64_t marks_since = sk_now_ms();
    while (!sk_process_stopping()) {
        atomic_store(&slot->alive_ms, sk_now_ms());
        struct sk_err err = { 0 };
        if (pg == NULL && (pg = sk_pg_dial(&conf->postgres, "sekali janitor", &err)) == NULL) {
            atomic_store(&slot->consuming, 0);
            if (sk_outage_failed(&outage))
                sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, NULL,
                             "janitor cannot reach PostgreSQL, retrying with backoff: %s",
                             err.msg);
            sk_sleep_ms(sk_outage_wait_ms(&outage));
            continue;
        }
        atomic_store(&slot->consuming, 1);
        /* The failed delete was logged; a lost connection also begins an
         * outage, a statement that failed on a live server only backs off. */
        if (marks != NULL && sk_now_ms() - marks_since >= JANITOR_MARKS_MS) {
            memset(marks, 0, n_marks * sizeof(*marks));
            marks_since = sk_now_ms();
        }
        const struct janitor_round round = { .pg = pg, .conf = conf, .slot = slot,
                                             .marks = marks };
        int64_t round_started = sk_now_ms();
        int rc = round_once(&round, history);
        /* Moving keys is not falling behind the retention: timed apart. */
        int64_t purges_took = sk_now_ms() - round_started;
        if (rc == SK_OK)
            rc = archive_queues(&round);
        if (rc != SK_OK) {
            if (PQstatus(pg) == CONNECTION_OK)
                sk_outage_pause(&outage);
            else if (sk_outage_failed(&outage))
                sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, NULL,
                             "janitor lost PostgreSQL, retrying with backoff");
            PQfinish(pg);
            pg = NULL;
            sk_sleep_ms(sk_outage_wait_ms(&outage));
            continue;
        }
        if (sk_outage_ok(&outage))
            sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_POSTGRES, NULL,
                         "janitor reached PostgreSQL again");
        sk_metrics_janitor_round(metrics);
        warn_if_behind(conf, purges_took);
        rest(slot, conf->janitor.interval_ms);
    }
    PQfinish(pg);
    free(marks);
    sk_history_free(history);
    sk_log_event(SK_LOG_INFO, SK_EVENT_STOPPING, NULL, NULL, "janitor stopping");
    return SK_EXIT_OK;
}
