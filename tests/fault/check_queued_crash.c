/* check_queued_crash.c - workers killed while a batch's queued statements
 * (host->queue_sql(), ABI 1.8) wait for their COMMIT, or ride it.
 *
 * A queued statement lives in the worker's memory until the COMMIT's
 * pipeline carries it (span_commit.c, queued_steps()): a worker killed before
 * then takes it to its grave, and one killed with the pipeline on the wire cannot
 * know whether PostgreSQL committed it. Either way the redeliveries must
 * leave each job's row once. The handler is tests/plugins/queued.c, whose
 * INSERT into sekali_test.queued_effects is queued; that table's primary
 * key turns a second INSERT of a key into a failed COMMIT, so a doubled
 * effect shows as a job that is not completed, or one that spent more than
 * one attempt. Each test first proves the worker died at its failpoint (a
 * line in the mark file), not after a sleep. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define JOBS     8
#define H_QUEUED "tests/plugins/queued.so"
#define BATCH    "    batch: 8\n    prefetch: 8\n    batch_wait: 500ms\n    lock_ttl: 2s\n"

/* The row "taken" (tests/data/effects.sql) that a body "dup" collides with. */
static void taken_row(struct h_run *r)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali_test.queued_effects VALUES ('%s', 'taken', 0)",
             r->queue);
    h_pg_exec(r->pg, sql);
}

/* JOBS jobs k-1 .. k-JOBS, waiting before the worker starts so that they
 * make one batch; the bad-th's body is "dup" (0: none). */
static void publish_jobs(struct h_run *r, int bad)
{
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    for (int i = 1; i <= JOBS; i++) {
        char id[16], key[16];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r->b, r->queue, "test", id, key, NULL, i == bad ? "dup" : "ok");
    }
}

static long long rows(const struct h_run *r)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali_test.queued_effects WHERE queue = '%s' "
                             "AND key LIKE 'k-%%'", r->queue);
}

/* Keys the worker `pid` completed: its COMMIT went through. */
static long long victims(const struct h_run *r, pid_t pid)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                             "AND status = 'completed' AND owner LIKE '%%:%ld'", r->queue,
                      (long)pid);
}

/* Of those, the ones whose copy has not been counted a duplicate yet. */
static long long victims_uncounted(const struct h_run *r, pid_t pid)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                             "AND status = 'completed' AND owner LIKE '%%:%ld' AND "
                             "duplicates = 0", r->queue, (long)pid);
}

/* Once sekalid has stopped: every job but the bad-th (0: none) completed
 * with its row once, on its first charged attempt, the bad one failed;
 * no key left processing and the queue empty. */
static void expect_each_once(struct h_run *r, int bad)
{
    int good = bad > 0 ? JOBS - 1 : JOBS;
    ck_assert_int_eq(rows(r), good);
    ck_assert_int_eq(h_completed(r), good);
    ck_assert_int_eq(h_failed(r), bad > 0 ? 1 : 0);
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                       "queue = '%s' AND status = 'processing'", r->queue), 0);
    /* A completed job whose row is not there, or is another job's. */
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys k WHERE "
                                       "k.queue = '%s' AND k.status = 'completed' AND NOT "
                                       "EXISTS (SELECT 1 FROM sekali_test.queued_effects e "
                                       "WHERE e.queue = k.queue AND e.key = k.key)", r->queue),
                     0);
    /* The claims the deaths rolled back charged nobody: one attempt each
     * (a kill is no job's doing, and the blame rule charges only the job
     * whose statement failed). */
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                       "queue = '%s' AND attempts <> 1", r->queue), 0);
    uint32_t depth = h_queue_depth(r->b, r->queue);
    ck_assert_msg(depth == 0, "%s should be empty, holds %u", r->queue, depth);
}

/* One worker, JOBS jobs in one batch of the queued handler, the failpoint
 * armed once: it must kill the worker, and the redeliveries must leave
 * each row once. Returns the duplicates the redeliveries found. */
static long long kill_once(const char *name, const char *failpoint, const char *point)
{
    struct h_run r;
    h_run_open(&r, name);
    taken_row(&r);
    publish_jobs(&r, 0);
    char armed[128];
    snprintf(armed, sizeof(armed), "SEKALI_FAILPOINT=%s", failpoint);
    const char *env[] = { armed, "SEKALI_FAILPOINT_ONCE=1", NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .handler = H_QUEUED,
                                          .workers = 1, .env = env, .queue_yaml = BATCH });
    pid_t victim = h_wait_marked_deaths(&r, point, 1, 30000);
    /* Done when every job completed and every job the victim's COMMIT
     * made true was redelivered and counted a duplicate (the key's owner
     * names the worker that completed it): the rest were acked by its
     * replacement. */
    H_WAIT(h_completed(&r) == JOBS && victims_uncounted(&r, victim) == 0, 60000,
           "the %d jobs should complete after the kill, have %lld completed, %lld failed, "
           "%lld of the dead worker's keys without their duplicate", JOBS, h_completed(&r),
           h_failed(&r), victims_uncounted(&r, victim));
    h_run_stop(&r);
    long long dups = h_duplicates(&r);
    long long theirs = victims(&r, victim);
    printf("check_queued_crash: worker %ld killed at %s; %lld rows, %lld completed, %lld by the "
           "dead worker, %lld duplicates\n", (long)victim, failpoint, rows(&r), h_completed(&r),
           theirs, dups);
    expect_each_once(&r, 0);
    /* Each copy the dead worker left unacked came back once. */
    ck_assert_int_eq(dups, theirs);
    h_run_close(&r);
    return dups;
}

/* The handlers ran and queued their INSERTs; the worker dies before the
 * COMMIT's pipeline is sent (after the batch's last handler): the
 * statements were only in its memory, and the claims roll back. The
 * redeliveries run every job again: no duplicates. */
START_TEST(test_killed_before_the_commit_is_sent)
{
    ck_assert_int_eq(kill_once("queuedpre", "after_handler:k-8", "after_handler"), 0);
}
END_TEST

/* The COMMIT's pipeline (queued INSERTs, completions, COMMIT) is on the
 * wire, its answer unread: PostgreSQL may or may not commit it. If it
 * did, its jobs' redeliveries are duplicates; if not, they run again. */
START_TEST(test_killed_with_the_commit_on_the_wire)
{
    kill_once("queuedwire", "pipeline_sent:COMMIT", "pipeline_sent");
}
END_TEST

/* The COMMIT returned, none of its jobs acked: their redeliveries are
 * duplicates, k-8's at least. */
START_TEST(test_killed_just_after_the_commit)
{
    ck_assert_int_ge(kill_once("queuedpost", "after_commit:k-8", "after_commit"), 1);
}
END_TEST

/* The blame rule under a kill: k-4's queued INSERT breaks the unique key
 * at the batch's COMMIT, so the batch's jobs run again each alone, and the
 * failpoint kills the worker during those reruns (the reruns are counted
 * before it dies). After the redeliveries, k-4 alone is charged (failed at
 * max_attempts 1, dead-lettered) and every other job's row is there once;
 * the reruns the dead worker committed came back as duplicates. */
static void kill_in_reruns(const char *name, const char *failpoint, const char *point)
{
    struct h_run r;
    h_run_open(&r, name);
    taken_row(&r);
    publish_jobs(&r, 4);
    char top[64], armed[128];
    int port = h_metrics_top(top, sizeof(top));
    snprintf(armed, sizeof(armed), "SEKALI_FAILPOINT=%s", failpoint);
    const char *env[] = { armed, "SEKALI_FAILPOINT_ONCE=1", NULL };
    h_run_start(&r, &(struct h_run_opts){
        .binary = "fault/sekalid", .handler = H_QUEUED, .workers = 1, .env = env,
        .top_yaml = top, .queue_yaml = BATCH "    retry:\n      max_attempts: 1\n" });
    pid_t victim = h_wait_marked_deaths(&r, point, 1, 30000);
    char series[200];
    snprintf(series, sizeof(series), "sekali_batch_reruns_total{queue=\"%s\",job_type=\"test\"}",
             r.queue);
    double reruns = 0;
    H_WAIT((reruns = h_metric(port, "%s", series)) >= 0, 10000, "no %s in the metrics", series);
    ck_assert_msg(reruns >= 1, "the worker should have died in a rerun, after the batch's "
                  "COMMIT failed: %s is %.0f", series, reruns);
    H_WAIT(h_completed(&r) + h_failed(&r) == JOBS && victims_uncounted(&r, victim) == 0,
           60000, "the %d jobs should settle, have %lld completed, %lld failed, %lld of the dead "
           "worker's keys without their duplicate", JOBS, h_completed(&r), h_failed(&r),
           victims_uncounted(&r, victim));
    h_run_stop(&r);
    char status[32];
    long long dups = h_duplicates(&r), theirs = victims(&r, victim);
    printf("check_queued_crash: worker %ld killed in the reruns at %s (%.0f reruns counted); "
           "%lld rows, %lld completed, %lld by the dead worker, %lld duplicates, %lld failed "
           "(k-4: %s)\n", (long)victim, failpoint, reruns, rows(&r), h_completed(&r), theirs,
           dups, h_failed(&r), h_key_status(&r, "k-4", status, sizeof(status)));
    ck_assert_str_eq(h_key_status(&r, "k-4", status, sizeof(status)), "failed");
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 1);
    expect_each_once(&r, 4);
    ck_assert_int_eq(dups, theirs);
    h_run_close(&r);
}

/* With the first rerun's claim on the wire: a one-job claim (its statement
 * sk_claim_completed) comes only in a rerun on a batch queue of distinct
 * keys, and nothing of the reruns is committed yet. */
START_TEST(test_killed_in_the_first_rerun)
{
    kill_in_reruns("queuedrerun", "pipeline_sent:sk_claim_completed", "pipeline_sent");
}
END_TEST

/* Just after k-3's rerun committed (its batch COMMIT had failed, so this is
 * its first): k-1 .. k-3 committed and unacked, k-4 .. k-8 not yet run. */
START_TEST(test_killed_after_three_reruns_committed)
{
    kill_in_reruns("queuedrerun3", "after_commit:k-3", "after_commit");
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_killed_before_the_commit_is_sent,
        test_killed_with_the_commit_on_the_wire,
        test_killed_just_after_the_commit,
        test_killed_in_the_first_rerun,
        test_killed_after_three_reruns_committed,
        NULL,
    };
    return h_run_suite(h_suite("queued_crash", 180, tests));
}
