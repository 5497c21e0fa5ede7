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

#define KEYS      200
#define COPIES    3

/* Effects recorded by the workers of the sekalid with pid `instance`. */
static long long effects_of_instance(struct h_run *r, pid_t instance)
{
    pid_t pids[16];
    size_t n = h_children(instance, pids, 16);
    ck_assert_msg(n >= 2, "sekalid %ld should have its 2 workers, has %zu children",
                  (long)instance, n);
    char list[256] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%ld", i > 0 ? "," : "",
                 (long)pids[i]);
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s' AND "
                             "pid IN (%s)", r->queue, list);
}

START_TEST(test_skewed_clocks_still_give_one_effect_per_key)
{
    struct h_run r;
    h_run_open(&r, "skew");
    char preload[1100];
    h_faketime_preload(preload, sizeof(preload));
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);

    static const char *const offsets[] = { NULL, "+10m", "-10m" };
    pid_t sekalid[3];
    char *dirs[3];
    for (int i = 0; i < 3; i++) {
        dirs[i] = h_tmpdir("skew");
        char *config = h_write_config(dirs[i], r.queue, H_EFFECT, 2, NULL);
        char faketime[32];
        snprintf(faketime, sizeof(faketime), "FAKETIME=%s", offsets[i] != NULL ? offsets[i] : "");
        const char *skewed[] = { preload, faketime, NULL };
        sekalid[i] = h_start_sekalid("sekalid", config, dirs[i], offsets[i] != NULL ? skewed : NULL);
        free(config);
    }
    H_WAIT(h_consumers(r.b, r.queue) == 6, 20000, "six workers should consume %s", r.queue);

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
            h_publish(r.b, r.queue, "test", id, key, NULL, "sleep:2");
        }
    }
    H_WAIT(h_duplicates(&r) == KEYS * (COPIES - 1), 60000, "expected %d duplicates, have %lld",
           KEYS * (COPIES - 1), h_duplicates(&r));
    /* Each instance, the two skewed ones included, ran jobs of its own: asked
     * of each one's workers while they still run. */
    for (int i = 0; i < 3; i++)
        ck_assert_msg(effects_of_instance(&r, sekalid[i]) > 0,
                      "instance %d (%s) should have run jobs", i,
                      offsets[i] != NULL ? offsets[i] : "true time");
    for (int i = 0; i < 3; i++)
        h_stop_sekalid(sekalid[i], dirs[i]);

    h_expect_once(&r, KEYS, KEYS * (COPIES - 1));
    for (int i = 0; i < 3; i++)
        free(dirs[i]);
    h_run_close(&r);
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
