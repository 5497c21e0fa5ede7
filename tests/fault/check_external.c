/* check_external.c - external mode under a stalled worker (brief split brain).
 *
 * Worker A claims a key, saves a checkpoint, and is frozen with SIGSTOP in
 * its handler. Its lease runs out by PostgreSQL's clock; a second copy of
 * the job goes to worker B, which takes the key over with a higher fence,
 * finds A's checkpoint and completes. Then A is resumed and finishes too:
 * its completion must be fenced out, the outcome B recorded must stand, and
 * the outside service must have seen one request per key. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "harness.h"

/* The state letter of /proc/PID/stat: 'T' once SIGSTOP took effect. */
static char process_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return '?';
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')');
    return close_paren != NULL && close_paren[1] == ' ' ? close_paren[2] : '?';
}

static long long key_value(const struct h_run *r, const char *column)
{
    return h_pg_count(r->pg, "SELECT %s FROM sekali.idempotency_keys WHERE queue = '%s' "
                             "AND key = 'pay-1'", column, r->queue);
}

START_TEST(test_stalled_worker_is_fenced_out_after_a_takeover)
{
    struct h_run r;
    h_run_open(&r, "external");
    char top[64];
    int port = h_metrics_top(top, sizeof(top));
    /* No Redis lock: the lease alone must keep the outcome single. */
    h_run_start(&r, &(struct h_run_opts){
        .workers = 2, .markers = true, .top_yaml = top,
        .queue_yaml = "    mode: external\n    lease: 1s\n    lock: false\n" });

    pid_t a = h_publish_stalled(&r, "pay-1-a", "pay-1", "pay");
    ck_assert_int_eq(kill(a, SIGSTOP), 0);
    H_WAIT(process_state(a) == 'T', 5000, "worker %ld should be stopped", (long)a);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                            "AND key = 'pay-1' AND lease_until < now()", r.queue) == 1, 10000,
           "A's lease should run out while A is frozen");

    h_publish(r.b, r.queue, "test", "pay-1-b", "pay-1", NULL, "pay");
    H_WAIT(h_completed(&r) == 1, 20000, "worker B should take over and complete");
    ck_assert_int_eq(key_value(&r, "fence"), 2);

    char release[1024];
    snprintf(release, sizeof(release), "%s/release", r.dir);
    FILE *f = fopen(release, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(kill(a, SIGCONT), 0);
    H_WAIT(key_value(&r, "fenced_out") == 1, 20000,
           "A's late completion should be fenced out and counted");
    /* Counted where an operator sees it too, not only in the key's row. */
    H_WAIT(h_metric(port, "sekali_fenced_out_total{queue=\"%s\",job_type=\"test\"}",
                    r.queue) == 1, 10000, "sekali_fenced_out_total should count A's refusal");
    h_run_stop(&r);

    /* One outcome: B's, under fence 2, resumed from A's checkpoint. */
    ck_assert_int_eq(key_value(&r, "fence"), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.payments WHERE queue = "
                                      "'%s'", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT fence FROM sekali_test.payments WHERE queue = "
                                      "'%s'", r.queue), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.payments WHERE queue = "
                                      "'%s' AND note = 'charged by fence 1'", r.queue), 1);
    /* Both attempts really ran (the brief split brain happened). */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT pid) FROM sekali_test.effects "
                                      "WHERE queue = '%s'", r.queue), 2);
    h_run_close(&r);
}
END_TEST

START_TEST(test_external_duplicates_are_suppressed)
{
    struct h_run r;
    h_run_open(&r, "extdup");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = "    mode: external\n" });
    for (int copy = 0; copy < 3; copy++)
        for (int k = 0; k < 50; k++) {
            char id[64], key[64];
            snprintf(id, sizeof(id), "m-%d-%d", k, copy);
            snprintf(key, sizeof(key), "k-%d", k);
            h_publish(r.b, r.queue, "test", id, key, NULL, "pay");
        }
    H_WAIT(h_duplicates(&r) == 100, 30000, "expected 100 duplicates, have %lld",
           h_duplicates(&r));
    h_run_stop(&r);
    h_expect_once(&r, 50, 100);
    ck_assert_int_eq(h_completed(&r), 50);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_stalled_worker_is_fenced_out_after_a_takeover,
        test_external_duplicates_are_suppressed,
        NULL,
    };
    return h_run_suite(h_suite("external", 300, tests));
}
