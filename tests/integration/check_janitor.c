/* check_janitor.c - retention removes exactly what it says, in batches,
 * and nothing that still protects a job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define EFFECT "tests/plugins/effect.so"

START_TEST(test_janitor_removes_exactly_what_retention_says)
{
    h_init();
    char queue[128], other[160];
    h_unique_name(queue, sizeof(queue), "janitor");
    snprintf(other, sizeof(other), "%s-unserved", queue);
    char *dir = h_tmpdir("janitor");
    PGconn *pg = h_pg();
    char sql[4096];
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
             "('%1$s-d3', '%1$s', 'x', now() + interval '1 day', NULL)", queue, other);
    h_pg_exec(pg, sql);
    /* o3 is unpublished: keep the relay away from it. */
    h_pg_exec(pg, "UPDATE sekali.outbox SET publish_error = 'test row' WHERE job_id LIKE "
                  "'janitor-%-o3'");

    char *config = h_write_config_top(dir, queue, EFFECT, 1, "    retention: 1h\n",
                                      "janitor:\n  interval: 200ms\n  batch: 2\n"
                                      "  outbox_retention: 1h\n");
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    H_WAIT(h_pg_count(pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s'",
                      queue) == 2, 20000, "the janitor should leave 2 keys of %s, has %lld",
           queue, h_pg_count(pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = "
                                 "'%s'", queue));
    H_WAIT(h_pg_count(pg, "SELECT count(*) FROM sekali.job_dedupe WHERE queue = '%s'", queue) ==
           1, 20000, "the janitor should leave the live dedupe key only");
    h_stop_sekalid(sekalid, dir);

    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue "
                                    "= '%s' AND key IN ('recent', 'stuck')", queue), 2);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue "
                                    "= '%s'", other), 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.checkpoints WHERE queue = "
                                    "'%s'", queue), 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.checkpoints WHERE queue = "
                                    "'%s' AND key = 'stuck'", queue), 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                queue), 2);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.outbox WHERE job_id = '%s-o1'",
                                queue), 0);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.job_dedupe WHERE dedupe_key = "
                                    "'%s-d3'", queue), 1);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("janitor");
    TCase *tc = tcase_create("janitor");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_janitor_removes_exactly_what_retention_says);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
