/* check_janitor.c - retention removes exactly what it says, in batches,
 * and nothing that still protects a job.
 *
 * "In batches" is seen from PostgreSQL's side: for the test a statement
 * trigger on sekali.idempotency_keys writes down how many of the run's
 * keys each DELETE took, and in which transaction. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Records, per DELETE statement on sekali.idempotency_keys, the rows of
 * queue it removed and its transaction, into sekali_test.janitor_deletes. */
static void count_key_deletes(PGconn *pg, const char *queue)
{
    char sql[2048];
    h_pg_exec(pg, "CREATE TABLE IF NOT EXISTS sekali_test.janitor_deletes (queue text NOT NULL, "
                  "tx bigint NOT NULL, n bigint NOT NULL)");
    h_pg_exec(pg, "CREATE OR REPLACE FUNCTION sekali_test.count_deletes() RETURNS trigger "
                  "LANGUAGE plpgsql AS $$ BEGIN "
                  "INSERT INTO sekali_test.janitor_deletes SELECT TG_ARGV[0], txid_current(), "
                  "count(*) FROM gone WHERE queue = TG_ARGV[0]; RETURN NULL; END $$");
    snprintf(sql, sizeof(sql), "CREATE TRIGGER \"count %s\" AFTER DELETE ON "
             "sekali.idempotency_keys REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
             "EXECUTE FUNCTION sekali_test.count_deletes('%s')", queue, queue);
    h_pg_exec(pg, sql);
}

static void stop_counting_key_deletes(PGconn *pg, const char *queue)
{
    char sql[512];
    snprintf(sql, sizeof(sql), "DROP TRIGGER IF EXISTS \"count %s\" ON sekali.idempotency_keys",
             queue);
    h_pg_exec(pg, sql);
}

START_TEST(test_janitor_removes_exactly_what_retention_says)
{
    struct h_run r;
    h_run_open(&r, "janitor");
    char other[160];
    snprintf(other, sizeof(other), "%s-unserved", r.queue);
    char sql[8192];
    /* The outbox, dedupe and crash purges are not per queue: at batch 2
     * a long-lived test database's expired rows of earlier runs (thousands
     * of outbox rows) took minutes of the round before the dedupe keys'
     * turn. Purged first, by the same functions, so the round watched has
     * this test's rows only. */
    h_pg_exec(r.pg, "SELECT sekali.purge_outbox(3600000, 2147483647), "
                    "sekali.purge_dedupe(2147483647), sekali.purge_crashes(2147483647)");
    /* Finished long ago (go, in batches of 2), recent or unfinished (stay). */
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) VALUES "
             "('%1$s', 'old-1', 'completed', 1, now() - interval '2 hours'),"
             "('%1$s', 'old-2', 'completed', 1, now() - interval '2 hours'),"
             "('%1$s', 'old-3', 'completed', 1, now() - interval '2 hours'),"
             "('%1$s', 'old-failed', 'failed', 1, now() - interval '2 hours'),"
             "('%1$s', 'recent', 'completed', 1, now()),"
             "('%1$s', 'stuck', 'processing', 1, now() - interval '2 hours'),"
             "('%2$s', 'old-elsewhere', 'completed', 1, now() - interval '2 hours');"
             "INSERT INTO sekali.checkpoints (queue, key, name, value, fence) VALUES "
             "('%1$s', 'old-1', 'charged', 'yes', 1), ('%1$s', 'stuck', 'charged', 'yes', 1);"
             "INSERT INTO sekali.outbox (job_id, queue, job_type, body, idempotency_key, "
             "published_at) VALUES "
             "('%1$s-o1', '%1$s', 't', '', 'o1', now() - interval '2 hours'),"
             "('%1$s-o2', '%1$s', 't', '', 'o2', now()),"
             "('%1$s-o3', '%1$s', 't', '', 'o3', NULL);"
             "INSERT INTO sekali.job_dedupe (dedupe_key, queue, job_id, expires_at, released_at) "
             "VALUES ('%1$s-d1', '%1$s', 'x', now() + interval '1 day', "
             "now() - interval '2 hours'),"
             "('%1$s-d2', '%1$s', 'x', now() - interval '2 hours', NULL),"
             "('%1$s-d3', '%1$s', 'x', now() + interval '1 day', NULL);"
             /* Crash counts: a day old is history (go), an hour old may be a loop (stay). */
             "INSERT INTO sekali.job_crashes (queue, key, crashes, last_crash) VALUES "
             "('%1$s', 'crashed-long-ago', 3, now() - interval '2 days'),"
             "('%1$s', 'crashed-lately', 2, now() - interval '1 hour');"
             /* Dead letters: of a failed key the janitor purges, and without a key
              * two hours old (go); without a key, recent (stays). */
             "INSERT INTO sekali.dead_letters (queue, key, reason, body, body_size, failed_at) "
             "VALUES ('%1$s', 'old-failed', 'failed', '', 0, now() - interval '2 hours'),"
             "('%1$s', NULL, 'malformed', '', 0, now() - interval '2 hours'),"
             "('%1$s', NULL, 'malformed', 'new', 3, now())", r.queue, other);
    h_pg_exec(r.pg, sql);
    count_key_deletes(r.pg, r.queue);
    /* o3 is unpublished: keep the relay away from it. */
    h_pg_exec(r.pg, "UPDATE sekali.outbox SET publish_error = 'test row' WHERE job_id LIKE "
                    "'janitor-%-o3'");

    /* Not h_run_start(): what to wait for is the janitor's work, not workers. */
    r.config = h_write_config_top(r.dir, r.queue, H_EFFECT, 1, "    retention: 1h\n",
                                  "janitor:\n  interval: 200ms\n  batch: 2\n"
                                  "  outbox_retention: 1h\n");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s'",
                      r.queue) == 2, 20000, "the janitor should leave 2 keys of %s, has %lld",
           r.queue, h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                     "queue = '%s'", r.queue));
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.job_dedupe WHERE queue = '%s'",
                      r.queue) == 1, 20000, "the janitor should leave the live dedupe key only");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.job_crashes WHERE queue = '%s'",
                      r.queue) == 1, 20000, "the janitor should forget the day-old crash count");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE queue = '%s'",
                      r.queue) == 1, 20000, "the janitor should keep the recent dead letter only");
    h_stop_sekalid(r.sekalid, r.dir);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE queue = "
                                      "'%s' AND body = 'new'", r.queue), 1);
    stop_counting_key_deletes(r.pg, r.queue);

    /* The 4 finished keys went 2 at a time (batch: 2), each batch in a
     * transaction of its own. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT sum(n) FROM sekali_test.janitor_deletes WHERE "
                                      "queue = '%s'", r.queue), 4);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT max(n) FROM sekali_test.janitor_deletes WHERE "
                                      "queue = '%s'", r.queue), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT tx) FROM sekali_test.janitor_deletes "
                                      "WHERE queue = '%s' AND n > 0", r.queue), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT crashes FROM sekali.job_crashes WHERE queue = '%s' "
                                      "AND key = 'crashed-lately'", r.queue), 2);

    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue "
                                      "= '%s' AND key IN ('recent', 'stuck')", r.queue), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue "
                                      "= '%s'", other), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.checkpoints WHERE queue = "
                                      "'%s'", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.checkpoints WHERE queue = "
                                      "'%s' AND key = 'stuck'", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE job_id = "
                                      "'%s-o1'", r.queue), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.job_dedupe WHERE dedupe_key "
                                      "= '%s-d3'", r.queue), 1);
    h_run_close(&r);
}
END_TEST

/* A round goes on while batches come back full: with an interval of an
 * hour, every old key must be gone after the first round alone, not just
 * the first batch of them. (A purge that counted the checkpoints it deleted
 * instead of the keys ended the round after one batch of keys that had
 * none.) */
START_TEST(test_one_janitor_round_drains_every_full_batch)
{
    struct h_run r;
    h_run_open(&r, "janitor");
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) "
             "SELECT '%s', 'old-' || i, 'completed', 1, now() - interval '2 hours' "
             "FROM generate_series(1, 7) AS i", r.queue);
    h_pg_exec(r.pg, sql);

    r.config = h_write_config_top(r.dir, r.queue, H_EFFECT, 1, "    retention: 1h\n",
                                  "janitor:\n  interval: 1h\n  batch: 2\n");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s'",
                      r.queue) == 0, 20000, "the first round should delete all 7 keys of %s, "
           "left %lld", r.queue,
           h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s'",
                      r.queue));
    h_stop_sekalid(r.sekalid, r.dir);
    h_run_close(&r);
}
END_TEST

/* A backlog (a first round over a long history, a retention shortened) is
 * deleted at most janitor.busy_percent of the time, leaving PostgreSQL to
 * the workers the rest of it: measured on the server, from when each
 * DELETE arrived to when it ended, against the whole round. */
START_TEST(test_a_backlog_is_deleted_at_most_busy_percent_of_the_time)
{
    struct h_run r;
    h_run_open(&r, "janitor");
    h_pg_expired_backlog(&r, 40, 50);
    r.config = h_write_config_top(r.dir, r.queue, H_EFFECT, 1, "    retention: 1h\n",
                                  "janitor:\n  interval: 2s\n  batch: 2\n  busy_percent: 25\n");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s'",
                      r.queue) == 0, 60000, "the round should delete all 40 keys of %s", r.queue);
    /* At least 20 batches of 50 ms, each resting 150: longer than 2 s. */
    H_WAIT(h_count_lines(r.log, "longer than janitor.interval (2.0 s), deleting 25% of the "
                                "time (janitor.busy_percent)") > 0, 20000,
           "the janitor should say its round outlasted the interval");
    h_stop_sekalid(r.sekalid, r.dir);
    h_pg_expired_backlog_end(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.key_purges "
                                      "WHERE queue = '%s' AND n = 2", r.queue), 20);
    /* Each batch earns three times its own time of rest: a quarter busy,
     * a little more for the last batch's rest, which the round's span
     * leaves out. Deleting back to back it was over 90. */
    long long busy = h_pg_count(r.pg,
        "SELECT round(100 * extract(epoch FROM sum(ended - started)) / "
        "extract(epoch FROM max(ended) - min(started))) FROM sekali_test.key_purges "
        "WHERE queue = '%s'", r.queue);
    ck_assert_msg(busy <= 30, "deleting took %lld %% of the round, at busy_percent 25", busy);
    h_run_close(&r);
}
END_TEST

static long long keys_named(const struct h_run *r, const char *key)
{
    /* In either table: a key older than archive_after has moved (sql/040). */
    return h_pg_count(r->pg, "SELECT count(sekali.key_status('%s', '%s'))", r->queue, key);
}

/* A retention of a year, past the 45 days a 32-bit millisecond count held. */
START_TEST(test_retention_of_a_year_keeps_half_a_year_old_keys)
{
    struct h_run r;
    h_run_open(&r, "janitor");
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) VALUES "
             "('%1$s', 'two-years', 'completed', 1, now() - interval '2 years'),"
             "('%1$s', 'half-a-year', 'completed', 1, now() - interval '6 months')", r.queue);
    h_pg_exec(r.pg, sql);
    r.config = h_write_config_top(r.dir, r.queue, H_EFFECT, 1, "    retention: 8760h\n",
                                  "janitor:\n  interval: 200ms\n");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(keys_named(&r, "two-years") == 0, 20000,
           "the janitor should delete the key finished two years ago");
    h_stop_sekalid(r.sekalid, r.dir);
    ck_assert_int_eq(keys_named(&r, "half-a-year"), 1);
    h_run_close(&r);
}
END_TEST

START_TEST(test_retention_forever_keeps_every_key)
{
    struct h_run r;
    h_run_open(&r, "janitor");
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, updated_at) VALUES "
             "('%1$s', 'ten-years', 'failed', 1, now() - interval '10 years');"
             "INSERT INTO sekali.outbox (job_id, queue, job_type, body, idempotency_key, "
             "published_at) VALUES ('%1$s-o1', '%1$s', 't', '', 'o1', "
             "now() - interval '2 hours')", r.queue);
    h_pg_exec(r.pg, sql);
    r.config = h_write_config_top(r.dir, r.queue, H_EFFECT, 1, "    retention: forever\n",
                                  "janitor:\n  interval: 200ms\n  outbox_retention: 1h\n");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    /* A round purges the keys first, then the outbox: once the old outbox
     * row is gone, the keys' turn has passed. */
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE job_id = '%s-o1'",
                      r.queue) == 0, 20000, "the janitor should finish a round");
    h_stop_sekalid(r.sekalid, r.dir);
    ck_assert_int_eq(keys_named(&r, "ten-years"), 1);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_janitor_removes_exactly_what_retention_says,
        test_one_janitor_round_drains_every_full_batch,
        test_a_backlog_is_deleted_at_most_busy_percent_of_the_time,
        test_retention_of_a_year_keeps_half_a_year_old_keys,
        test_retention_forever_keeps_every_key,
        NULL,
    };
    return h_run_suite(h_suite("janitor", 120, tests));
}
