/* check_archive.c - a completed key moved to sekali.finished_keys (sql/040)
 * is still finished for every function that meets it again.
 *
 * The move is one statement of the janitor's (sekali.archive_keys); the
 * way back is the probe each function makes when its INSERT made a new
 * row. The tests call those functions as the worker, the producer and
 * sekalictl do, on keys really moved (the move's count and both tables
 * are asserted), then race a claim against a move held open in another
 * session, and finally run sekalid with archive_after: 1s and publish
 * every key a second time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A completed key of r's queue, last touched two hours ago, with d
 * duplicates already counted. */
static void old_completed_key(const struct h_run *r, const char *key, int d)
{
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, attempts, "
             "duplicates, job_id, job_type, created_at, completed_at, updated_at) VALUES "
             "('%1$s', '%2$s', 'completed', 3, 2, %3$d, 'job-%2$s', 'test', "
             "now() - interval '3 hours', now() - interval '2 hours', "
             "now() - interval '2 hours')", r->queue, key, d);
    h_pg_exec(r->pg, sql);
}

static long long rows_of(const struct h_run *r, const char *key)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                             "AND key = '%s'", r->queue, key);
}

/* The janitor's move of r's keys older than an hour: returns how many. */
static long long archive(const struct h_run *r)
{
    return h_pg_count(r->pg, "SELECT sekali.archive_keys('%s', 3600000, 1000)", r->queue);
}

/* The one value sql returns, into buf. */
static const char *value(PGconn *pg, const char *sql, char *buf, size_t size)
{
    PGresult *res = PQexec(pg, sql);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1,
                  "%s: %s", sql, PQresultErrorMessage(res));
    snprintf(buf, size, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return buf;
}

/* Runs call (a statement with %1$s the queue and %2$s the key) on an
 * archived key and checks what it answered, that the key is back in
 * idempotency_keys, completed, out of finished_keys, and, when counted,
 * with one more duplicate. */
static void expect_finished(const struct h_run *r, const char *key, const char *call,
                            const char *answer, bool counted)
{
    char sql[1024], got[256], status[32];
    old_completed_key(r, key, 4);
    ck_assert_int_eq(archive(r), 1);
    ck_assert_int_eq(rows_of(r, key), 0);
    ck_assert_int_eq(h_archived(r), 1);

    snprintf(sql, sizeof(sql), call, r->queue, key);
    value(r->pg, sql, got, sizeof(got));
    ck_assert_msg(strcmp(got, answer) == 0, "%s answered '%s' for an archived key, not '%s'",
                  sql, got, answer);
    ck_assert_str_eq(h_key_status(r, key, status, sizeof(status)), "completed");
    ck_assert_int_eq(h_archived(r), counted ? 0 : 1);
    if (counted)
        ck_assert_int_eq(h_pg_count(r->pg, "SELECT duplicates FROM sekali.idempotency_keys "
                                           "WHERE queue = '%s' AND key = '%s'", r->queue, key),
                         5);
    /* The next test of the loop starts from an empty archive. */
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.idempotency_keys WHERE queue = '%s'; "
             "DELETE FROM sekali.finished_keys WHERE queue = '%s'", r->queue, r->queue);
    h_pg_exec(r->pg, sql);
}

START_TEST(test_every_function_finds_an_archived_key_finished)
{
    struct h_run r;
    h_run_open(&r, "archive");
    expect_finished(&r, "claim", "SELECT claimed_status FROM sekali.claim('%1$s', '%2$s', "
                    "'host:1', 'job-2', 'test')", "completed", true);
    expect_finished(&r, "completed", "SELECT claimed_status FROM sekali.claim_completed("
                    "'%1$s', '%2$s', 'host:1', 'job-2', 'test')", "completed", true);
    expect_finished(&r, "many", "SELECT claimed_status FROM sekali.claim_many('%1$s', "
                    "ARRAY['%2$s'], 'host:1', ARRAY['job-2'], ARRAY['test'])", "completed", true);
    expect_finished(&r, "lease", "SELECT claimed_status FROM sekali.claim_lease('%1$s', "
                    "'%2$s', 'host:1', 'job-2', 'test', 30000)", "completed", true);
    /* A job given up (crashes, a malformed copy) never downgrades it. */
    expect_finished(&r, "fail", "SELECT sekali.fail('%1$s', '%2$s', 'host:1', 'job-2', "
                    "'test', 'crashed')::text", "", true);
    expect_finished(&r, "cancel", "SELECT sekali.cancel('%1$s', '%2$s', 'too late')",
                    "already completed", true);
    /* Readers only read. */
    expect_finished(&r, "replay", "SELECT outcome FROM sekali.dlq_replay('%1$s', '%2$s', "
                    "'dead-1', 'test', 'ok', NULL, 'test', NULL, 'tester', 'root')",
                    "completed", false);
    expect_finished(&r, "state", "SELECT status FROM sekali.dlq_key_state('%1$s', '%2$s')",
                    "completed", false);
    expect_finished(&r, "trace", "SELECT string_agg(event, ',' ORDER BY seq) FROM "
                    "sekali.trace('%2$s', '%1$s')", "completed,duplicates", false);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 0);
    h_run_close(&r);
}
END_TEST

/* A batch's claim of four keys: archived, new, completed in the table,
 * and archived again: each answered as it is, the new one alone claimed. */
START_TEST(test_a_batch_claim_sorts_archived_keys_from_new_ones)
{
    struct h_run r;
    h_run_open(&r, "archive-batch");
    old_completed_key(&r, "old-1", 0);
    old_completed_key(&r, "old-2", 7);
    ck_assert_int_eq(archive(&r), 2);
    old_completed_key(&r, "kept", 0);
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "SELECT string_agg(claimed_status, ',' ORDER BY ord) FROM sekali.claim_completing("
             "'%s', ARRAY['old-1', 'new', 'kept', 'old-2'], 'host:1', "
             "ARRAY['j1', 'j2', 'j3', 'j4'], ARRAY['test', 'test', 'test', 'test'])", r.queue);
    char got[128];
    ck_assert_str_eq(value(r.pg, sql, got, sizeof(got)), "completed,processing,completed,completed");
    ck_assert_int_eq(h_archived(&r), 0);
    ck_assert_int_eq(h_duplicates(&r), 1 + 1 + 8);
    h_run_close(&r);
}
END_TEST

static long long lock_waits(PGconn *watch, int pid)
{
    return h_pg_count(watch, "SELECT count(*) FROM pg_locks WHERE pid = %d AND NOT granted", pid);
}

/* The race sql/040 is built around: a claim meets the key while the
 * janitor's move of it is not yet committed. It must wait for the move,
 * then find the key archived; a probe before its INSERT would have found
 * the key in neither table and claimed it anew. Each claim function. */
START_TEST(test_a_claim_that_meets_a_move_in_flight_finds_the_key_finished)
{
    static const char *const calls[] = {
        "SELECT claimed_status FROM sekali.claim_completed('%s', 'raced', 'host:1', 'j', 't')",
        "SELECT claimed_status FROM sekali.claim('%s', 'raced', 'host:1', 'j', 't')",
        "SELECT claimed_status FROM sekali.claim_lease('%s', 'raced', 'host:1', 'j', 't', 30000)",
        "SELECT claimed_status FROM sekali.claim_completing('%s', ARRAY['raced'], 'host:1', "
        "ARRAY['j'], ARRAY['t'])",
        NULL,
    };
    struct h_run r;
    h_run_open(&r, "archive-race");
    PGconn *janitor = h_pg(), *worker = h_pg();
    for (int i = 0; calls[i] != NULL; i++) {
        old_completed_key(&r, "raced", 0);
        h_pg_exec(janitor, "BEGIN");
        ck_assert_int_eq(h_pg_count(janitor, "SELECT sekali.archive_keys('%s', 3600000, 10)",
                                    r.queue), 1);
        char sql[512];
        snprintf(sql, sizeof(sql), calls[i], r.queue);
        ck_assert_msg(PQsendQuery(worker, sql) == 1, "PQsendQuery: %s",
                      PQerrorMessage(worker));
        H_WAIT(lock_waits(r.pg, PQbackendPID(worker)) > 0, 20000,
               "%s should wait for the janitor's uncommitted move", sql);
        h_pg_exec(janitor, "COMMIT");
        PGresult *res = PQgetResult(worker);
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s: %s", sql,
                      PQresultErrorMessage(res));
        ck_assert_msg(strcmp(PQgetvalue(res, 0, 0), "completed") == 0,
                      "%s answered %s after the move committed: the key would run again", sql,
                      PQgetvalue(res, 0, 0));
        PQclear(res);
        ck_assert_ptr_null(PQgetResult(worker));
        ck_assert_int_eq(h_archived(&r), 0);
        snprintf(sql, sizeof(sql), "DELETE FROM sekali.idempotency_keys WHERE queue = '%s'", r.queue);
        h_pg_exec(r.pg, sql);
    }
    PQfinish(janitor);
    PQfinish(worker);
    h_run_close(&r);
}
END_TEST

/* The other order: a duplicate holds the key (its claim is uncommitted),
 * and the janitor's move passes it by instead of waiting or taking it. */
START_TEST(test_a_move_passes_by_a_key_a_claim_holds)
{
    struct h_run r;
    h_run_open(&r, "archive-held");
    old_completed_key(&r, "held", 0);
    old_completed_key(&r, "free", 0);
    PGconn *worker = h_pg();
    h_pg_exec(worker, "BEGIN");
    char sql[512];
    snprintf(sql, sizeof(sql), "SELECT claimed_status FROM sekali.claim_completed('%s', 'held', "
             "'host:1', 'j', 't')", r.queue);
    char got[32];
    ck_assert_str_eq(value(worker, sql, got, sizeof(got)), "completed");
    ck_assert_int_eq(archive(&r), 1);
    ck_assert_int_eq(rows_of(&r, "held"), 1);
    ck_assert_int_eq(rows_of(&r, "free"), 0);
    h_pg_exec(worker, "COMMIT");
    /* Its duplicate made it young again: not moved now either. */
    ck_assert_int_eq(archive(&r), 0);
    PQfinish(worker);
    h_run_close(&r);
}
END_TEST

/* The handler's result moves with a key no reply has carried yet (a
 * duplicate asking for one is replied it) and is dropped once one has. */
START_TEST(test_a_result_moves_until_a_reply_carried_it)
{
    struct h_run r;
    h_run_open(&r, "archive-reply");
    old_completed_key(&r, "owed", 0);
    old_completed_key(&r, "sent", 0);
    char sql[512];
    snprintf(sql, sizeof(sql), "UPDATE sekali.idempotency_keys SET result = 'r' WHERE "
             "queue = '%1$s'; UPDATE sekali.idempotency_keys SET replied_at = now() - "
             "interval '2 hours' WHERE queue = '%1$s' AND key = 'sent'", r.queue);
    h_pg_exec(r.pg, sql);
    ck_assert_int_eq(archive(&r), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(result) FROM sekali.finished_keys "
                                      "WHERE queue = '%s'", r.queue), 1);
    char got[32];
    for (int i = 0; i < 2; i++) {
        snprintf(sql, sizeof(sql), "SELECT claimed_status FROM sekali.claim_completed('%s', "
                 "'%s', 'host:1', 'j', 't')", r.queue, i == 0 ? "owed" : "sent");
        ck_assert_str_eq(value(r.pg, sql, got, sizeof(got)), "completed");
    }
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'owed' AND result = 'r' AND "
                                      "replied_at IS NULL", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'sent' AND result IS NULL AND "
                                      "replied_at IS NOT NULL", r.queue), 1);
    h_run_close(&r);
}
END_TEST

#define KEYS 40

/* sekalid with archive_after: 1s: every key completes, is moved by the
 * janitor, and its second copy is a duplicate: one effect a key. */
START_TEST(test_second_copies_of_archived_keys_are_duplicates)
{
    struct h_run r;
    h_run_open(&r, "archive-run");
    h_run_start(&r, &(struct h_run_opts){
        .workers = 2, .top_yaml = "janitor:\n  interval: 200ms\n  archive_after: 1s\n" });
    char key[32], id[32];
    for (int i = 0; i < KEYS; i++) {
        snprintf(key, sizeof(key), "k-%d", i);
        snprintf(id, sizeof(id), "first-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    H_WAIT(h_effects(&r, NULL) == KEYS, 30000, "every first copy should run, %lld did",
           h_effects(&r, NULL));
    H_WAIT(h_archived(&r) == KEYS, 30000, "the janitor should move every key, %lld are moved",
           h_archived(&r));
    for (int i = 0; i < KEYS; i++) {
        snprintf(key, sizeof(key), "k-%d", i);
        snprintf(id, sizeof(id), "second-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    H_WAIT(h_duplicates(&r) == KEYS, 30000, "every second copy should be a duplicate, %lld are",
           h_duplicates(&r));
    h_run_stop(&r);
    ck_assert_int_eq(h_unarchived(&r), KEYS);
    h_expect_once(&r, KEYS, KEYS);
    ck_assert_int_eq(h_completed(&r), KEYS);
    h_run_close(&r);
}
END_TEST

#define BACKLOG 100000

/* An upgrade over a long history has hours of keys to move. A round moves
 * each queue's for at most janitor.interval (at least a second) and then
 * ends, so the next round's purges come while the backlog is still
 * moving: an expired key written once the moves began is gone before
 * the last old key moved. Before, the first round moved the whole
 * backlog, and every purge waited for it. */
START_TEST(test_a_long_move_leaves_the_purges_their_rounds)
{
    struct h_run r;
    h_run_open(&r, "archive-backlog");
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) "
             "SELECT '%s', 'old-' || i, 'completed', 1, now() - interval '10 minutes' "
             "FROM generate_series(1, %d) AS i", r.queue, BACKLOG);
    h_pg_exec(r.pg, sql);
    h_run_start(&r, &(struct h_run_opts){
        .workers = 1, .queue_yaml = "    retention: 1h\n",
        .top_yaml = "janitor:\n  interval: 200ms\n  batch: 100\n  archive_after: 1s\n" });
    H_WAIT(h_archived(&r) > 0, 30000, "the janitor should start moving the backlog");
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) "
             "VALUES ('%s', 'expired', 'completed', 1, now() - interval '2 hours')", r.queue);
    h_pg_exec(r.pg, sql);
    char status[32];
    H_WAIT(strcmp(h_key_status(&r, "expired", status, sizeof(status)), "absent") == 0, 60000,
           "a round's purge should delete the expired key");
    long long left = h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys "
                                      "WHERE queue = '%s'", r.queue);
    ck_assert_msg(left > 0, "the expired key went only once the whole backlog had moved");
    ck_assert_int_gt(h_count_lines(r.log, "than a round moves (1.0 s of it): the next rounds go on"),
                     0);
    H_WAIT(h_archived(&r) == BACKLOG, 90000, "the janitor should move the whole backlog, "
           "%lld of %d moved", h_archived(&r), BACKLOG);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* The archive has its retention: a key archived and untouched past it goes. */
START_TEST(test_archived_keys_expire_with_the_retention)
{
    struct h_run r;
    h_run_open(&r, "archive-expiry");
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.finished_keys (queue, key_id, duplicates, completed_at, "
             "updated_at) VALUES ('%1$s', sekali.key_id('gone'), 0, now() - interval '3 days', "
             "now() - interval '3 days'), ('%1$s', sekali.key_id('kept'), 0, "
             "now() - interval '1 day', now() - interval '1 day')", r.queue);
    h_pg_exec(r.pg, sql);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    retention: 48h\n",
                                          .top_yaml = "janitor:\n  interval: 200ms\n" });
    char status[32];
    H_WAIT(strcmp(h_key_status(&r, "gone", status, sizeof(status)), "absent") == 0, 20000,
           "the janitor should delete the key archived three days ago");
    h_run_stop(&r);
    ck_assert_str_eq(h_key_status(&r, "kept", status, sizeof(status)), "completed");
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_every_function_finds_an_archived_key_finished,
        test_a_batch_claim_sorts_archived_keys_from_new_ones,
        test_a_claim_that_meets_a_move_in_flight_finds_the_key_finished,
        test_a_move_passes_by_a_key_a_claim_holds,
        test_a_result_moves_until_a_reply_carried_it,
        test_second_copies_of_archived_keys_are_duplicates,
        test_archived_keys_expire_with_the_retention,
        test_a_long_move_leaves_the_purges_their_rounds,
        NULL,
    };
    return h_run_suite(h_suite("archive", 120, tests));
}
