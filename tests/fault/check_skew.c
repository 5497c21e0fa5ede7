/* check_skew.c - workers whose clocks disagree by twenty minutes.
 *
 * Three sekalid instances consume one queue: one with the true time, one
 * ten minutes ahead and one ten minutes behind (libfaketime). sekali never
 * compares clocks across hosts: lock expiry is Redis's, fences and leases
 * are PostgreSQL's. So duplicates spread over the three must still give one
 * effect per key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define FAKETIME  "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
#define KEYS      200
#define COPIES    3

START_TEST(test_skewed_clocks_still_give_one_effect_per_key)
{
    h_init();
    ck_assert_msg(access(FAKETIME, R_OK) == 0, "%s is missing: install libfaketime", FAKETIME);
    char queue[128];
    h_unique_name(queue, sizeof(queue), "skew");
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);

    static const char *const offsets[] = { NULL, "+10m", "-10m" };
    pid_t sekalid[3];
    char *dirs[3];
    for (int i = 0; i < 3; i++) {
        dirs[i] = h_tmpdir("skew");
        char *config = h_write_config(dirs[i], queue, H_EFFECT, 2, NULL);
        char faketime[32];
        snprintf(faketime, sizeof(faketime), "FAKETIME=%s", offsets[i] != NULL ? offsets[i] : "");
        const char *skewed[] = { "LD_PRELOAD=" FAKETIME, faketime, NULL };
        sekalid[i] = h_start_sekalid("sekalid", config, dirs[i], offsets[i] != NULL ? skewed : NULL);
        free(config);
    }
    H_WAIT(h_consumers(b, queue) == 6, 20000, "six workers should consume %s", queue);

    /* Proof of the skew: each instance stamps its log lines with its clock. */
    for (int i = 1; i < 3; i++) {
        char log[1024];
        snprintf(log, sizeof(log), "%s/sekalid.log", dirs[i]);
        char *text = h_read_file(log);
        ck_assert_ptr_nonnull(text);
        struct tm tm = { 0 };
        ck_assert_ptr_nonnull(strptime(strstr(text, "\"ts\":\"") + 6, "%Y-%m-%dT%H:%M:%S", &tm));
        double skew = difftime(timegm(&tm), time(NULL));
        ck_assert_msg(skew > 500 || skew < -500, "instance %d should run %s, its log says %.0f s",
                      i, offsets[i], skew);
        free(text);
    }

    for (int copy = 0; copy < COPIES; copy++) {
        for (int k = 0; k < KEYS; k++) {
            char id[64], key[64];
            snprintf(id, sizeof(id), "msg-%d-%d", k, copy);
            snprintf(key, sizeof(key), "order-%d", k);
            h_publish(b, queue, "test", id, key, NULL, "sleep:2");
        }
    }
    H_WAIT(h_pg_count(pg, "SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys "
                          "WHERE queue = '%s'", queue) == KEYS * (COPIES - 1), 60000,
           "expected %d duplicates", KEYS * (COPIES - 1));
    for (int i = 0; i < 3; i++)
        h_stop_sekalid(sekalid[i], dirs[i]);

    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                                queue), KEYS);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(DISTINCT idempotency_key) FROM "
                                    "sekali_test.effects WHERE queue = '%s'", queue), KEYS);
    /* The skewed instances did run jobs. */
    ck_assert_int_ge(h_pg_count(pg, "SELECT count(DISTINCT pid) FROM sekali_test.effects WHERE "
                                    "queue = '%s'", queue), 3);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    for (int i = 0; i < 3; i++)
        free(dirs[i]);
    sk_broker_close(b);
    PQfinish(pg);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_skewed_clocks_still_give_one_effect_per_key,
        NULL,
    };
    return h_run_suite(h_suite("skew", 300, tests));
}
