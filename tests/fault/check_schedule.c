/* check_schedule.c - one `every: 1s` schedule on three hosts whose clocks
 * are up to twenty minutes apart, while one host is SIGKILLed and comes
 * back and PostgreSQL restarts: every tick in the window has exactly one
 * job and one effect.
 *
 * The three sekalid instances run the same config: one with the true
 * time, one ten minutes ahead, one ten minutes behind (libfaketime, as
 * check_skew does). Each runs a scheduler, a relay and a worker. The
 * schedule uses missed: all, so the PostgreSQL outage may delay ticks but
 * must not lose one. The assertions count the rows the handler wrote
 * (sekali_test.effects) per tick key, and the outbox rows per key; the
 * faults are proven by the dead supervisor's wait status and by
 * PostgreSQL's new postmaster start time, and the schedulers' outage log
 * lines. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define RUN_MS 30000   /* the window */

#define TICK_TEXT 64  /* a timestamptz as text */

static char *config_for(struct h_run *r, const char *dir, const char *schedule)
{
    char top[1024];
    snprintf(top, sizeof(top),
             H_RELAY
             "schedules:\n"
             "  - name: %s\n"
             "    every: 1s\n"
             "    queue: %s\n"
             "    job_type: test\n"
             "    body: ok\n"
             "    missed: all\n",
             schedule, r->queue);
    return h_write_config_top(dir, r->queue, H_EFFECT, 1, NULL, top);
}

static pid_t start_host(const char *config, const char *dir, const char *offset,
                        const char *preload)
{
    char faketime[32];
    snprintf(faketime, sizeof(faketime), "FAKETIME=%s", offset != NULL ? offset : "");
    const char *skewed[] = { preload, faketime, NULL };
    return h_start_sekalid("sekalid", config, dir, offset != NULL ? skewed : NULL);
}

/* Ticks of the schedule whose key does not have exactly one effect row,
 * from its first effect's tick to `last` (an ISO time). */
static long long ticks_not_once(struct h_run *r, const char *schedule, const char *first,
                                const char *last)
{
    return h_pg_count(r->pg,
        "SELECT count(*) FROM generate_series('%s'::timestamptz, '%s'::timestamptz, "
        "interval '1 second') t WHERE (SELECT count(*) FROM sekali_test.effects e "
        "WHERE e.queue = '%s' AND e.idempotency_key = 'schedule:%s:' || "
        "to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')) <> 1",
        first, last, r->queue, schedule);
}

static void pg_text(PGconn *pg, const char *sql, char *out, size_t size)
{
    PGresult *res = PQexec(pg, sql);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
                  !PQgetisnull(res, 0, 0), "%s: %s", sql, PQerrorMessage(pg));
    snprintf(out, size, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
}

/* The schedule's last tick by PostgreSQL's clock, and its first effect on
 * r's queue (first and last: TICK_TEXT bytes each); waits until every tick between
 * them has exactly one effect. */
static void expect_each_tick_once(struct h_run *r, const char *schedule, char *first, char *last)
{
    char query[512];
    snprintf(query, sizeof(query), "SELECT last_tick::text FROM sekali.schedules WHERE name = '%s'",
             schedule);
    pg_text(r->pg, query, last, TICK_TEXT);
    snprintf(query, sizeof(query),
             "SELECT min(substr(idempotency_key, length('schedule:%s:') + 1))::timestamptz::text "
             "FROM sekali_test.effects WHERE queue = '%s'", schedule, r->queue);
    pg_text(r->pg, query, first, TICK_TEXT);
    H_WAIT(ticks_not_once(r, schedule, first, last) == 0, 30000,
           "every tick from %s to %s should have exactly one effect; %lld do not", first, last,
           ticks_not_once(r, schedule, first, last));
}

START_TEST(test_three_skewed_hosts_enqueue_each_tick_once_through_a_kill_and_a_restart)
{
    struct h_run r;
    h_run_open(&r, "sched");
    char preload[1100], schedule[160];
    h_faketime_preload(preload, sizeof(preload));
    snprintf(schedule, sizeof(schedule), "tick-%s", r.queue);
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);

    static const char *const offsets[] = { NULL, "+10m", "-10m" };
    pid_t host[3];
    char *dirs[3], *configs[3];
    for (int i = 0; i < 3; i++) {
        dirs[i] = h_tmpdir("sched");
        configs[i] = config_for(&r, dirs[i], schedule);
        host[i] = start_host(configs[i], dirs[i], offsets[i], preload);
    }
    H_WAIT(h_consumers(r.b, r.queue) == 3, 20000, "three workers should consume %s", r.queue);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                      r.queue) >= 3, 20000, "the schedule's first ticks should have run");
    int64_t began = h_now_ms();

    /* The host ten minutes ahead dies at once, with its children (a host
     * that loses power), and comes back three seconds later. */
    H_WAIT(h_now_ms() - began >= 6000, 10000, "six seconds into the window");
    pid_t kids[16];
    size_t n_kids = h_children(host[1], kids, 16);
    ck_assert_msg(n_kids >= 3, "host 1 should run a worker, a relay and a scheduler, has %zu "
                  "children", n_kids);
    ck_assert_int_eq(kill(host[1], SIGKILL), 0);
    for (size_t k = 0; k < n_kids; k++)
        kill(kids[k], SIGKILL);
    int status = h_wait_exit(host[1], 5000, "the SIGKILLed host");
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "host 1 should have died of SIGKILL, wait status %d", status);
    for (size_t k = 0; k < n_kids; k++)
        H_WAIT(h_process_gone(kids[k]), 5000, "host 1's child %ld should be gone",
               (long)kids[k]);
    H_WAIT(h_now_ms() - began >= 9000, 10000, "three seconds down");
    host[1] = start_host(configs[1], dirs[1], offsets[1], preload);

    /* PostgreSQL restarts once, under all three. */
    H_WAIT(h_now_ms() - began >= 15000, 20000, "fifteen seconds into the window");
    char started_before[64], started_after[64];
    pg_text(r.pg, "SELECT pg_postmaster_start_time()::text", started_before,
            sizeof(started_before));
    PQfinish(r.pg);
    h_servers("restart-postgres");
    r.pg = h_pg();
    pg_text(r.pg, "SELECT pg_postmaster_start_time()::text", started_after,
            sizeof(started_after));
    ck_assert_msg(strcmp(started_before, started_after) != 0,
                  "PostgreSQL should have restarted: started at %s both times", started_before);

    H_WAIT(h_now_ms() - began >= RUN_MS, RUN_MS + 30000, "the end of the window");
    /* The window's last tick, by PostgreSQL's clock; then wait for every
     * tick up to it to have run before anything is counted. */
    char first[TICK_TEXT], last[TICK_TEXT];
    expect_each_tick_once(&r, schedule, first, last);

    /* Both faults left their mark in the schedulers' own log lines. */
    int outages = 0;
    for (int i = 0; i < 3; i++) {
        char log[1024];
        snprintf(log, sizeof(log), "%s/sekalid.log", dirs[i]);
        outages += h_count_events(log, "scheduler", SK_EVENT_OUTAGE_END, SK_SERVER_POSTGRES);
    }
    ck_assert_msg(outages >= 1, "a scheduler should have lost PostgreSQL and found it again");
    for (int i = 0; i < 3; i++)
        h_stop_sekalid(host[i], dirs[i]);

    long long ticks = h_pg_count(r.pg, "SELECT extract(epoch FROM '%s'::timestamptz - "
                                       "'%s'::timestamptz)::int8 + 1", last, first);
    long long effects = h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE "
                                         "queue = '%s' AND substr(idempotency_key, "
                                         "length('schedule:%s:') + 1)::timestamptz <= '%s'",
                                   r.queue, schedule, last);
    long long doubled = h_pg_count(r.pg, "SELECT count(*) FROM (SELECT idempotency_key FROM "
                                         "sekali_test.effects WHERE queue = '%s' GROUP BY 1 "
                                         "HAVING count(*) > 1) d", r.queue);
    long long outbox_doubled = h_pg_count(r.pg, "SELECT count(*) FROM (SELECT idempotency_key "
                                                "FROM sekali.outbox WHERE queue = '%s' GROUP BY 1 "
                                                "HAVING count(*) > 1) d", r.queue);
    long long outbox = h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                  r.queue);
    long long duplicates = h_duplicates(&r);
    fprintf(stderr, "schedule: %lld ticks from %s to %s, %lld effects, %lld keys with more "
            "than one effect, %lld outbox rows (%lld keys with more than one), %lld duplicate "
            "deliveries absorbed, host 1 SIGKILLed with %zu children, PostgreSQL restarted "
            "(%s -> %s), %d scheduler outage end(s) logged\n", ticks, first, last, effects,
            doubled, outbox, outbox_doubled, duplicates, n_kids, started_before, started_after,
            outages);
    /* sekalictl schedules reads the same row: the last tick, and its job.
     * Read again now that every host is stopped: between `last` and the
     * stops the schedulers ran on, and on a loaded machine took a tick or
     * more past it. */
    r.config = strdup(configs[0]);
    char *out, want[512], query[512];
    const char *const args[] = { "schedules", "--json", NULL };
    ck_assert_int_eq(h_sekalictl(&r, &out, args), 0);
    snprintf(query, sizeof(query), "SELECT to_char(last_tick AT TIME ZONE 'UTC', "
             "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') FROM sekali.schedules WHERE name = '%s'",
             schedule);
    char last_iso[64];
    pg_text(r.pg, query, last_iso, sizeof(last_iso));
    snprintf(want, sizeof(want), "\"last_tick\": \"%s\"", last_iso);
    ck_assert_msg(strstr(out, want) != NULL, "schedules should show %s: %s", want, out);
    ck_assert_msg(strstr(out, "\"last_state\": \"completed\"") != NULL ||
                  strstr(out, "\"last_state\": \"enqueued\"") != NULL ||
                  strstr(out, "\"last_state\": \"published\"") != NULL,
                  "schedules should show the last job's state: %s", out);
    free(out);
    ck_assert_int_ge(ticks, RUN_MS / 1000 - 2);
    ck_assert_int_eq(effects, ticks);
    ck_assert_int_eq(doubled, 0);
    ck_assert_int_eq(outbox_doubled, 0);
    for (int i = 0; i < 3; i++) {
        free(dirs[i]);
        free(configs[i]);
    }
    h_run_close(&r);
}
END_TEST

/* Takes the schedule out of r's config (body ok-5) by a sixth reload and
 * waits until no scheduler is left to enqueue and every tick enqueued has
 * run and been acked: a tick published as sekalid stopped stayed in the
 * queue, which h_run_stop() refuses. */
static void stop_ticking(struct h_run *r, const char *schedule)
{
    char block[512];
    snprintf(block, sizeof(block), "schedules:\n  - name: %s\n    every: 1s\n    queue: %s\n"
             "    job_type: test\n    body: ok-5\n", schedule, r->queue);
    h_config_replace(r->config, block, "");
    ck_assert_int_eq(kill(r->sekalid, SIGHUP), 0);
    /* The first generation's scheduler and one per reload before this. */
    H_WAIT(h_count_events(r->log, "scheduler", SK_EVENT_STOPPING, NULL) == 6, 30000,
           "every generation's scheduler should stop, %d did",
           h_count_events(r->log, "scheduler", SK_EVENT_STOPPING, NULL));
    H_WAIT(h_pg_count(r->pg, "SELECT count(*) FROM sekali.outbox o WHERE queue = '%s' AND NOT "
                             "EXISTS (SELECT 1 FROM sekali_test.effects e WHERE e.queue = o.queue "
                             "AND e.idempotency_key = o.idempotency_key)", r->queue) == 0, 30000,
           "every tick enqueued should have run");
    H_WAIT(h_in_flight(r->queue) == 0, 30000, "every tick should be acked, %lld are not",
           h_in_flight(r->queue));
}

/* Five reloads, each changing the schedule's body, while it ticks every
 * second: the old and the new generation's schedulers overlap at each, and
 * still every tick has one job and one effect. */
START_TEST(test_reloads_neither_double_nor_skip_a_tick)
{
    struct h_run r;
    h_run_open(&r, "sched-reload");
    char schedule[160], top[1024];
    snprintf(schedule, sizeof(schedule), "tick-%s", r.queue);
    snprintf(top, sizeof(top),
             H_RELAY
             "schedules:\n"
             "  - name: %s\n"
             "    every: 1s\n"
             "    queue: %s\n"
             "    job_type: test\n"
             "    body: ok-0\n", schedule, r.queue);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top });
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                      r.queue) >= 2, 20000, "the schedule's first ticks should have run");
    for (int i = 1; i <= 5; i++) {
        char from[32], to[32];  /* any int fits: -O1 checks the bound */
        snprintf(from, sizeof(from), "body: ok-%d", i - 1);
        snprintf(to, sizeof(to), "body: ok-%d", i);
        h_config_replace(r.config, from, to);
        ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
        H_WAIT(h_count_events(r.log, "supervisor", SK_EVENT_RELOADED, NULL) == i, 20000,
               "reload %d should be done", i);
        /* The new generation's own ticks, not a time: on a loaded machine
         * its scheduler's first tick can come seconds after the reload. */
        H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' AND "
                                "body = 'ok-%d'", r.queue, i) >= 2, 30000,
               "two ticks should carry reload %d's body", i);
    }
    char first[TICK_TEXT], last[TICK_TEXT];
    expect_each_tick_once(&r, schedule, first, last);
    stop_ticking(&r, schedule);
    h_run_stop(&r);
    long long doubled = h_pg_count(r.pg, "SELECT count(*) FROM (SELECT idempotency_key FROM "
                                         "sekali.outbox WHERE queue = '%s' GROUP BY 1 "
                                         "HAVING count(*) > 1) d", r.queue);
    long long ticks = h_pg_count(r.pg, "SELECT extract(epoch FROM '%s'::timestamptz - "
                                       "'%s'::timestamptz)::int8 + 1", last, first);
    /* The last body is the one the newest generation enqueues. */
    long long newest = h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                        "AND body = 'ok-5'", r.queue);
    fprintf(stderr, "reload: %lld ticks from %s to %s over 5 reloads, %lld keys with more than "
            "one outbox row, %lld jobs with the last body\n", ticks, first, last, doubled,
            newest);
    ck_assert_int_eq(doubled, 0);
    ck_assert_int_ge(newest, 1);
    ck_assert_int_ge(ticks, 8);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_three_skewed_hosts_enqueue_each_tick_once_through_a_kill_and_a_restart,
        test_reloads_neither_double_nor_skip_a_tick,
        NULL,
    };
    return h_run_suite(h_suite("schedule", 300, tests));
}
