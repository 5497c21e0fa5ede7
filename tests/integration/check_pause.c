/* check_pause.c - sekalictl pause and resume, and priorities.
 *
 * A pause is a row in PostgreSQL that every worker of every host obeys
 * between jobs: it finishes the job in hand, cancels its consumer and
 * gives its prefetched deliveries back. So once `sekalictl pause` returns
 * (it waits until the queue has no consumer), no job of the queue starts,
 * which the effect rows prove: each carries its transaction's start time
 * (PostgreSQL's now()), and none may be later than the moment pause
 * returned. Nothing may be lost (every message not run is ready in the
 * queue again) or requeued in a loop (the broker's deliveries stand still
 * while paused; redeliveries stay within one prefetch window per worker).
 *
 * Priorities: with the queue paused, jobs of mixed priorities wait in the
 * broker; after resume one worker runs them highest first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* The workers' prefetch: the default 10, or two batches when the suite
 * runs in batch mode (config.c grows an unset prefetch so). */
static int prefetch(void)
{
    int two_batches = 2 * h_test_batch();
    return h_test_batch() > 1 && two_batches > 10 ? two_batches : 10;
}

struct run {
    struct h_run h;
    int          port;   /* sekalid's metrics */
    char         t_paused[64];  /* PostgreSQL's clock when pause returned */
};

static int ctl(struct run *r, char **out, const char *const *args)
{
    char *ignored = NULL;
    int rc = h_sekalictl(&r->h, out != NULL ? out : &ignored, args);
    free(ignored);
    return rc;
}

static void start(struct run *r, const char *name, int workers, const char *queue_yaml,
                  const char *top_extra, const struct sk_queue_shape *shape)
{
    h_run_open(&r->h, name);
    r->port = h_free_port();
    char top[512];
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\n%s", r->port,
             top_extra != NULL ? top_extra : "");
    h_run_start(&r->h, &(struct h_run_opts){ .workers = workers, .queue_yaml = queue_yaml,
                                             .top_yaml = top, .shape = shape });
}

static double queue_metric(struct run *r, const char *family)
{
    return h_metric(r->port, "%s{queue=\"%s\"}", family, r->h.queue);
}

/* 0 without metrics (port 0): the second host's test. */
static double deliveries(struct run *r)
{
    if (r->port == 0)
        return 0;
    double v = h_metric(r->port, "sekali_deliveries_total{queue=\"%s\",job_type=\"test\"}",
                        r->h.queue);
    return v < 0 ? 0 : v;
}

static double redeliveries(struct run *r)
{
    if (r->port == 0)
        return 0;
    double v = h_metric(r->port, "sekali_redeliveries_total{queue=\"%s\",job_type=\"test\"}",
                        r->h.queue);
    return v < 0 ? 0 : v;
}

/* `sekalictl pause`, which must say every consumer is gone; then notes
 * PostgreSQL's clock, against which the effect rows are compared. */
static void pause_queue(struct run *r, const char *reason)
{
    char *out = NULL;
    int rc = ctl(r, &out, (const char *const[]){ "pause", r->h.queue, "--reason", reason,
                                                 "--by", "check_pause", NULL });
    ck_assert_msg(rc == 0, "sekalictl pause exited %d: %s", rc, out);
    ck_assert_msg(strstr(out, "no consumer left") != NULL, "pause said: %s", out);
    free(out);
    PGresult *res = PQexec(r->h.pg, "SELECT clock_timestamp()::text");
    ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
    snprintf(r->t_paused, sizeof(r->t_paused), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    ck_assert_uint_eq(h_consumers(r->h.b, r->h.queue), 0);
}

static void resume_queue(struct run *r)
{
    char *out = NULL;
    int rc = ctl(r, &out, (const char *const[]){ "resume", r->h.queue, NULL });
    ck_assert_msg(rc == 0 && strstr(out, "resumed") != NULL, "sekalictl resume exited %d: %s",
                  rc, out);
    free(out);
}

/* Effects whose transaction began after pause returned: jobs that started
 * while the queue was paused. */
static long long started_after_pause(struct run *r)
{
    return h_pg_count(r->h.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s' "
                      "AND created_at > '%s'::timestamptz", r->h.queue, r->t_paused);
}

/* While paused, for a while: no delivery taken, no job started, and every
 * message not run waiting ready in the queue (none unacked, none lost).
 * An observation over time, not a wait for an event: what it checks is
 * that nothing happens. */
static void expect_held(struct run *r, long long n, int for_ms, const char *why)
{
    H_WAIT(h_queue_depth(r->h.b, r->h.queue) + h_effects(&r->h, NULL) == n, 10000,
           "%s: the %lld jobs not run should be back in the queue: %u ready, %lld run", why,
           n - h_effects(&r->h, NULL), h_queue_depth(r->h.b, r->h.queue),
           h_effects(&r->h, NULL));
    long long ran = h_effects(&r->h, NULL);
    double taken = deliveries(r);
    int64_t until = h_now_ms() + for_ms;
    while (h_now_ms() < until) {
        ck_assert_msg(h_effects(&r->h, NULL) == ran, "%s: a job ran while paused", why);
        ck_assert_msg(deliveries(r) == taken, "%s: a delivery was taken while paused (%.0f, "
                      "was %.0f)", why, deliveries(r), taken);
        ck_assert_uint_eq(h_consumers(r->h.b, r->h.queue), 0);
        ck_assert_uint_eq(h_queue_depth(r->h.b, r->h.queue), (uint32_t)(n - ran));
        h_nap();
    }
    ck_assert_msg(started_after_pause(r) == 0, "%s: %lld jobs started after pause returned",
                  why, started_after_pause(r));
}

static void publish_jobs(struct run *r, int n, const char *body)
{
    for (int i = 0; i < n; i++) {
        char id[64];
        snprintf(id, sizeof(id), "k%d", i);
        h_publish(r->h.b, r->h.queue, "test", id, id, NULL, body);
    }
}

START_TEST(test_pause_under_load_stops_every_worker_and_nothing_is_lost_or_requeued)
{
    struct run r = { 0 };
    const int n = 400;
    start(&r, "pause_load", 4, NULL, NULL, NULL);
    publish_jobs(&r, n, "sleep:20");
    H_WAIT(h_effects(&r.h, NULL) >= 40, 30000, "40 jobs should run first, %lld did",
           h_effects(&r.h, NULL));

    pause_queue(&r, "load test");
    H_WAIT(queue_metric(&r, "sekali_workers_paused") == 4, 10000,
           "sekali_workers_paused should be 4, is %.0f", queue_metric(&r, "sekali_workers_paused"));
    ck_assert_int_lt(h_effects(&r.h, NULL), n);
    expect_held(&r, n, 2000, "under load");
    ck_assert_int_eq(h_count_events(r.h.log, "worker", SK_EVENT_PAUSED, NULL), 4);

    /* status and health say paused, and are not unhealthy for it. */
    char *out = NULL;
    int rc = ctl(&r, &out, (const char *const[]){ "status", NULL });
    ck_assert_msg(rc == 0, "status of a paused queue exited %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, ": paused\n") != NULL && strstr(out, "load test") != NULL &&
                  strstr(out, "by check_pause") != NULL, "status:\n%s", out);
    free(out);

    resume_queue(&r);
    H_WAIT(h_effects(&r.h, NULL) == n, 60000, "after resume all %d jobs should run, %lld did",
           n, h_effects(&r.h, NULL));
    H_WAIT(queue_metric(&r, "sekali_workers_paused") == 0, 10000, "still paused workers");
    ck_assert_int_eq(h_count_events(r.h.log, "worker", SK_EVENT_RESUMED, NULL), 4);
    /* The deliveries given back at the pause came again once each: at most
     * a prefetch window per worker, never a loop. */
    ck_assert_msg(redeliveries(&r) <= 4 * prefetch(), "%.0f redeliveries for one pause",
                  redeliveries(&r));
    ck_assert_msg(deliveries(&r) <= n + 4 * prefetch(), "%.0f deliveries of %d jobs",
                  deliveries(&r), n);
    h_run_stop(&r.h);
    h_expect_once(&r.h, n, 0);
    h_run_close(&r.h);
}
END_TEST

START_TEST(test_a_pause_outlives_a_restart_of_sekalid)
{
    struct run r = { 0 };
    start(&r, "pause_restart", 2, NULL, NULL, NULL);
    pause_queue(&r, "migration");
    h_stop_sekalid(r.h.sekalid, r.h.dir);
    publish_jobs(&r, 20, "ok");

    /* A new sekalid finds the row: its workers never take a job. */
    r.h.sekalid = h_start_sekalid("sekalid", r.h.config, r.h.dir, NULL);
    H_WAIT(queue_metric(&r, "sekali_workers_paused") == 2, 20000,
           "the restarted workers should report paused, %.0f do",
           queue_metric(&r, "sekali_workers_paused"));
    expect_held(&r, 20, 1500, "after the restart");
    ck_assert_int_eq(h_effects(&r.h, NULL), 0);

    int64_t t0 = h_now_ms();
    resume_queue(&r);
    H_WAIT(h_consumers(r.h.b, r.h.queue) == 2, 10000, "both workers should consume again");
    /* Reported, not asserted: speed belongs to benchmarks. */
    fprintf(stderr, "check_pause: resume to every worker subscribed: %lld ms\n",
            (long long)(h_now_ms() - t0));
    H_WAIT(h_effects(&r.h, NULL) == 20, 30000, "after resume 20 jobs should run, %lld did",
           h_effects(&r.h, NULL));
    h_run_stop(&r.h);
    h_expect_once(&r.h, 20, 0);
    h_run_close(&r.h);
}
END_TEST

/* A second sekalid on the same queue, as another host would run it: its
 * own config copy without the metrics listener (one port per host). */
START_TEST(test_two_hosts_both_honour_a_pause)
{
    struct run r = { 0 };
    const int n = 200;
    h_run_open(&r.h, "pause_hosts");
    h_run_start(&r.h, &(struct h_run_opts){ .workers = 2 });
    char *dir_b = h_tmpdir("pause_hosts_b");
    char *config_b = h_write_config(dir_b, r.h.queue, H_EFFECT, 2, NULL);
    pid_t host_b = h_start_sekalid("sekalid", config_b, dir_b, NULL);
    H_WAIT(h_consumers(r.h.b, r.h.queue) == 4, 20000, "both hosts should consume");
    publish_jobs(&r, n, "sleep:20");
    H_WAIT(h_effects(&r.h, NULL) >= 20, 30000, "20 jobs should run first");

    pause_queue(&r, "two hosts");
    char log_b[1200];
    snprintf(log_b, sizeof(log_b), "%s/sekalid.log", dir_b);
    H_WAIT(h_count_events(r.h.log, "worker", SK_EVENT_PAUSED, NULL) == 2 &&
           h_count_events(log_b, "worker", SK_EVENT_PAUSED, NULL) == 2, 10000,
           "each host's 2 workers should log paused: %d and %d",
           h_count_events(r.h.log, "worker", SK_EVENT_PAUSED, NULL),
           h_count_events(log_b, "worker", SK_EVENT_PAUSED, NULL));
    /* No metrics here (r.port 0): the effect rows and the broker's counts
     * carry the check. */
    expect_held(&r, n, 1500, "two hosts");

    resume_queue(&r);
    H_WAIT(h_effects(&r.h, NULL) == n, 60000, "after resume all %d jobs should run, %lld did",
           n, h_effects(&r.h, NULL));
    h_stop_sekalid(host_b, dir_b);
    h_run_stop(&r.h);
    h_expect_once(&r.h, n, 0);
    /* Both hosts' workers subscribed again (which of them ran the last
     * jobs is the broker's choice: one prefetch window may hold them all). */
    ck_assert_int_eq(h_count_events(r.h.log, "worker", SK_EVENT_RESUMED, NULL), 2);
    ck_assert_int_eq(h_count_events(log_b, "worker", SK_EVENT_RESUMED, NULL), 2);
    free(config_b);
    free(dir_b);
    h_run_close(&r.h);
}
END_TEST

/* A pause row written without its NOTIFY (as after a lost notification)
 * is found by the workers' poll, and so is its removal. */
START_TEST(test_a_pause_without_its_notify_is_found_by_the_poll)
{
    struct run r = { 0 };
    start(&r, "pause_poll", 2, NULL, NULL, NULL);
    char sql[512];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali.queue_pauses (queue, reason) VALUES "
             "('%s', 'no notify')", r.h.queue);
    h_pg_exec(r.h.pg, sql);
    H_WAIT(queue_metric(&r, "sekali_workers_paused") == 2 &&
           h_consumers(r.h.b, r.h.queue) == 0, 15000,
           "the poll should find the pause: %.0f workers paused, %u consumers",
           queue_metric(&r, "sekali_workers_paused"), h_consumers(r.h.b, r.h.queue));
    publish_jobs(&r, 10, "ok");
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.queue_pauses WHERE queue = '%s'", r.h.queue);
    h_pg_exec(r.h.pg, sql);
    H_WAIT(h_effects(&r.h, NULL) == 10, 15000, "the poll should find the resume: %lld of 10 "
           "jobs ran", h_effects(&r.h, NULL));
    h_run_stop(&r.h);
    h_expect_once(&r.h, 10, 0);
    h_run_close(&r.h);
}
END_TEST

/* The priority of key "p<N>-<i>". */
static int key_priority(const char *key)
{
    return atoi(key + 1);
}

START_TEST(test_a_resumed_queue_runs_its_jobs_highest_priority_first)
{
    struct run r = { 0 };
    const struct sk_queue_shape shape = { .max_priority = 9 };
    start(&r, "pause_priority", 1, "    max_priority: 9\n", H_RELAY, &shape);
    pause_queue(&r, "priorities");

    /* Through the outbox (sekali.enqueue(..., p_priority => n)), the
     * relay publishing each row's priority; one without a priority (0). */
    int n = 0;
    for (int i = 0; i < 30; i++, n++) {
        int prio = (i * 7) % 10;
        char sql[512], given[8];
        snprintf(given, sizeof(given), "%d", prio);
        snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'ok', 'p%d-%d', "
                 "p_priority => %s)", r.h.queue, prio, i, prio == 0 ? "NULL" : given);
        h_pg_exec(r.h.pg, sql);
    }
    /* And with sekalictl enqueue --priority, straight to the broker. */
    char *out = NULL;
    int rc = ctl(&r, &out, (const char *const[]){ "enqueue", r.h.queue, "test", "--key",
                                                  "p9-ctl", "--priority", "9", "--direct",
                                                  "ok", NULL });
    ck_assert_msg(rc == 0, "enqueue --priority exited %d", rc);
    free(out);
    n++;
    H_WAIT(h_queue_depth(r.h.b, r.h.queue) == (uint32_t)n, 20000,
           "the relay should publish all %d jobs to the paused queue, %u there", n,
           h_queue_depth(r.h.b, r.h.queue));

    resume_queue(&r);
    H_WAIT(h_effects(&r.h, NULL) == n, 30000, "%d jobs should run, %lld did", n,
           h_effects(&r.h, NULL));
    PGresult *res = PQexecParams(r.h.pg, "SELECT idempotency_key FROM sekali_test.effects "
                                 "WHERE queue = $1 ORDER BY id", 1, NULL,
                                 (const char *const[]){ r.h.queue }, NULL, NULL, 0);
    ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
    ck_assert_int_eq(PQntuples(res), n);
    /* Everything waited in the broker before the one worker subscribed:
     * it receives them highest first, whatever its prefetch. */
    for (int i = 1; i < n; i++)
        ck_assert_msg(key_priority(PQgetvalue(res, i - 1, 0)) >=
                          key_priority(PQgetvalue(res, i, 0)),
                      "job %d (%s) ran before job %d (%s), of higher priority", i - 1,
                      PQgetvalue(res, i - 1, 0), i, PQgetvalue(res, i, 0));
    /* The --direct job came last; equal priorities keep their order, so it
     * ran last of the four of priority 9, before every lower one. */
    ck_assert_str_eq(PQgetvalue(res, 3, 0), "p9-ctl");
    PQclear(res);
    h_run_stop(&r.h);
    h_expect_once(&r.h, n, 0);
    h_run_close(&r.h);
}
END_TEST

/* The test broker's major version, as tests/servers.sh says it runs. */
static int broker_major(void)
{
    const char *v = getenv("SEKALI_RABBITMQ");
    return v != NULL && v[0] != '\0' ? atoi(v) : 3;
}

/* A quorum queue has no max_priority (RabbitMQ 4.0 refuses x-max-priority
 * on it as 3.x does), but RabbitMQ 4 gives every quorum queue two levels of
 * its own: priority 5 and above is high, below is normal, and a consumer is
 * given two high deliveries for each normal one while both wait, each level
 * in the order it was enqueued. So a job's priority still counts there,
 * weighted rather than strict; RabbitMQ 3.x's quorum queues ignore it. */
START_TEST(test_a_quorum_queue_on_rabbitmq_4_favours_high_priority_jobs)
{
    struct run r = { 0 };
    const struct sk_queue_shape shape = { .quorum = true };
    start(&r, "pause_qq_priority", 1, "    queue_type: quorum\n", H_RELAY, &shape);
    pause_queue(&r, "quorum priorities");
    int n = 30;
    for (int i = 0; i < n; i++) {
        int prio = (i * 7) % 10;
        char sql[512];
        snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'ok', 'p%d-%02d', "
                 "p_priority => %d)", r.h.queue, prio, i, prio);
        h_pg_exec(r.h.pg, sql);
    }
    H_WAIT(h_queue_depth(r.h.b, r.h.queue) == (uint32_t)n, 20000,
           "the relay should publish all %d jobs to the paused queue, %u there", n,
           h_queue_depth(r.h.b, r.h.queue));
    resume_queue(&r);
    H_WAIT(h_effects(&r.h, NULL) == n, 30000, "%d jobs should run, %lld did", n,
           h_effects(&r.h, NULL));
    PGresult *res = PQexecParams(r.h.pg, "SELECT idempotency_key FROM sekali_test.effects "
                                 "WHERE queue = $1 ORDER BY id", 1, NULL,
                                 (const char *const[]){ r.h.queue }, NULL, NULL, 0);
    ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
    ck_assert_int_eq(PQntuples(res), n);
    char order[30 * 8] = "";
    int high_in_first_half = 0, last_high = -1, last_normal = -1;
    for (int i = 0; i < n; i++) {
        const char *key = PQgetvalue(res, i, 0);
        int seq = atoi(strchr(key, '-') + 1);
        bool high = key_priority(key) >= 5;
        strncat(order, high ? "H" : "n", sizeof(order) - strlen(order) - 1);
        if (broker_major() < 4) {
            ck_assert_msg(seq == i, "RabbitMQ 3's quorum queue should keep the enqueue order, "
                          "job %d was %s", i, key);
            continue;
        }
        /* Each level keeps its own enqueue order. */
        int *last = high ? &last_high : &last_normal;
        ck_assert_msg(seq > *last, "job %s ran after a later one of its level", key);
        *last = seq;
        if (high && i < n / 2)
            high_in_first_half++;
    }
    PQclear(res);
    /* 2:1 while both wait: 10 of the first 15 (all 15 waited before the
     * one worker subscribed). */
    if (broker_major() >= 4)
        ck_assert_msg(high_in_first_half >= 10, "RabbitMQ 4 should give high priority first "
                      "two to one; ran %s", order);
    h_run_stop(&r.h);
    h_expect_once(&r.h, n, 0);
    h_run_close(&r.h);
}
END_TEST

/* A queue that exists without x-max-priority cannot get it: the workers
 * say what to do instead of retrying in silence. */
START_TEST(test_max_priority_on_an_existing_queue_without_it_says_what_to_do)
{
    struct h_run r = { 0 };
    h_run_open(&r, "pause_mismatch");
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, "    max_priority: 5\n");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_count_lines(r.log, "priorities are fixed when it is created") > 0, 20000,
           "the worker should say why it cannot consume %s", r.queue);
    ck_assert_int_gt(h_count_lines(r.log, "x-max-priority"), 0);
    ck_assert_uint_eq(h_consumers(r.b, r.queue), 0);
    h_stop_sekalid(r.sekalid, r.dir);
    h_run_close(&r);
}
END_TEST

START_TEST(test_bad_pause_and_priority_input_is_refused_clearly)
{
    struct h_run r = { 0 };
    h_run_open(&r, "pause_bad");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, NULL);
    char *out = NULL;
    ck_assert_int_eq(h_sekalictl(&r, &out, (const char *const[]){ "pause", "no.such.queue",
                                                                   NULL }), 4);
    free(out);
    out = NULL;
    ck_assert_int_eq(h_sekalictl(&r, &out, (const char *const[]){ "enqueue", r.queue, "test",
                                                                   "--priority", "256", "ok",
                                                                   NULL }), 2);
    free(out);
    out = NULL;
    /* Resuming a queue that is not paused changes nothing. */
    ck_assert_int_eq(h_sekalictl(&r, &out, (const char *const[]){ "resume", r.queue, NULL }),
                     0);
    ck_assert_ptr_nonnull(strstr(out, "was not paused"));
    free(out);

    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'ok', p_priority => 300)",
             r.queue);
    PGresult *res = PQexec(r.pg, sql);
    ck_assert_int_eq(PQresultStatus(res), PGRES_FATAL_ERROR);
    ck_assert_str_eq(PQresultErrorField(res, PG_DIAG_SQLSTATE), "22003");
    PQclear(res);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 0);
    /* The old positional call, as every caller before 019 writes it. */
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'ok'::bytea, 'k', NULL, "
             "NULL, now(), interval '1 hour')", r.queue);
    h_pg_exec(r.pg, sql);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                "AND priority IS NULL", r.queue), 1);
    /* No relay of a later suite should try to publish it. */
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.outbox WHERE queue = '%s'", r.queue);
    h_pg_exec(r.pg, sql);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_pause_under_load_stops_every_worker_and_nothing_is_lost_or_requeued,
        test_a_pause_outlives_a_restart_of_sekalid,
        test_two_hosts_both_honour_a_pause,
        test_a_pause_without_its_notify_is_found_by_the_poll,
        test_a_resumed_queue_runs_its_jobs_highest_priority_first,
        test_a_quorum_queue_on_rabbitmq_4_favours_high_priority_jobs,
        test_max_priority_on_an_existing_queue_without_it_says_what_to_do,
        test_bad_pause_and_priority_input_is_refused_clearly,
        NULL,
    };
    return h_run_suite(h_suite("pause", 240, tests));
}
