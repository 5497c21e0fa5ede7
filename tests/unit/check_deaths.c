/* check_deaths.c - the supervisor's verdict on a dead worker, fed wait
 * statuses and scoreboard slots directly: which deaths count against the
 * job, which show progress, which came from outside, how an OOM kill is
 * charged, and what the replacement inherits. The same rules run end to
 * end in check_crash and check_storm (tests/fault); here each case is
 * one line, without forking. */
/* links: core deaths oom scoreboard */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>

#include "deaths.h"
#include "suite.h"

/* Wait statuses as waitpid() reports them on Linux. */
static int exited(int code) { return (code & 0xff) << 8; }
static int killed(int sig) { return sig & 0x7f; }

static struct sk_slot *slot_in(enum sk_slot_phase phase, int ready, uint64_t finished)
{
    /* Room for two held locks and two orphans, as sk_scoreboard_create()
     * would lay a slot out for batch 2. */
    struct sk_slot *shared = calloc(1, sizeof(*shared) + 4 * sizeof(shared->locks[0]));
    ck_assert_ptr_nonnull(shared);
    shared->lock_cap = 2;
    atomic_store(&shared->phase, phase);
    atomic_store(&shared->ready, ready);
    atomic_store(&shared->finished, finished);
    return shared;
}

/* No OOM counter: every SIGKILL not of job_timeout is an outside kill. */
static struct sk_deaths no_counter(void)
{
    return (struct sk_deaths){ .oom_file = "", .oom_seen = -1 };
}

static void write_counter(const char *file, long long kills)
{
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "oom 0\noom_kill %lld\n", kills);
    fclose(f);
}

START_TEST(test_a_fault_or_an_exit_in_the_handler_is_the_jobs_doing)
{
    struct sk_deaths d = no_counter();
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 1, 0);
    int own[] = { killed(SIGSEGV), killed(SIGBUS), killed(SIGILL), killed(SIGFPE),
                  killed(SIGABRT), killed(SIGSYS), exited(0), exited(1) };
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++) {
        struct sk_death v = sk_deaths_judge(&d, shared, false, own[i]);
        ck_assert_msg(v.job_caused && !v.outside && !v.progress,
                      "status 0x%x in the handler: job_caused %d outside %d progress %d",
                      own[i], v.job_caused, v.outside, v.progress);
    }
    free(shared);
}
END_TEST

START_TEST(test_the_same_death_outside_the_handler_is_not_the_jobs)
{
    struct sk_deaths d = no_counter();
    struct sk_slot *shared = slot_in(SK_PHASE_JOB, 1, 0);
    struct sk_death v = sk_deaths_judge(&d, shared, false, killed(SIGSEGV));
    ck_assert(!v.job_caused && !v.outside && !v.progress);
    atomic_store(&shared->phase, SK_PHASE_IDLE);
    v = sk_deaths_judge(&d, shared, false, exited(1));
    ck_assert(!v.job_caused && !v.outside);
    free(shared);
}
END_TEST

START_TEST(test_a_kill_from_outside_is_nobodys_fault_and_progress_once_ready)
{
    struct sk_deaths d = no_counter();
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 1, 0);
    struct sk_death v = sk_deaths_judge(&d, shared, false, killed(SIGKILL));
    ck_assert(!v.job_caused && v.outside && v.progress);
    v = sk_deaths_judge(&d, shared, false, killed(SIGTERM));
    ck_assert(!v.job_caused && v.outside && v.progress);
    /* Before it was ready: outside still, but no progress to show. */
    atomic_store(&shared->ready, 0);
    v = sk_deaths_judge(&d, shared, false, killed(SIGKILL));
    ck_assert(!v.job_caused && v.outside && !v.progress);
    /* Consuming counts as ready. */
    atomic_store(&shared->consuming, 1);
    v = sk_deaths_judge(&d, shared, false, killed(SIGKILL));
    ck_assert(v.progress);
    free(shared);
}
END_TEST

START_TEST(test_a_finished_delivery_is_progress_whatever_killed_it)
{
    struct sk_deaths d = no_counter();
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 0, 1);
    struct sk_death v = sk_deaths_judge(&d, shared, false, killed(SIGSEGV));
    ck_assert(v.job_caused && v.progress && !v.outside);
    free(shared);
}
END_TEST

START_TEST(test_a_sigkill_for_job_timeout_is_the_jobs_doing)
{
    struct sk_deaths d = no_counter();
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 1, 0);
    struct sk_death v = sk_deaths_judge(&d, shared, true, killed(SIGKILL));
    ck_assert(v.job_caused && !v.outside && !v.progress);
    free(shared);
}
END_TEST

/* Each kill the counter shows is charged to one reaped SIGKILL, the first
 * after it rose, and never to a job_timeout kill. */
START_TEST(test_an_oom_kill_is_charged_once_to_the_next_sigkill)
{
    char file[] = "/tmp/check_deaths.XXXXXX";
    int fd = mkstemp(file);
    ck_assert_int_ge(fd, 0);
    close(fd);
    write_counter(file, 3);
    struct sk_deaths d = { .oom_seen = 3 };
    snprintf(d.oom_file, sizeof(d.oom_file), "%s", file);
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 1, 0);

    write_counter(file, 4);
    struct sk_death v = sk_deaths_judge(&d, shared, true, killed(SIGKILL));
    ck_assert(v.job_caused);                 /* the timeout's own kill */
    ck_assert_int_eq(d.oom_unclaimed, 1);    /* still waiting for its SIGKILL */
    v = sk_deaths_judge(&d, shared, false, killed(SIGSEGV));
    ck_assert_int_eq(d.oom_unclaimed, 1);
    v = sk_deaths_judge(&d, shared, false, killed(SIGKILL));
    ck_assert(v.job_caused && !v.outside);   /* the OOM killer's */
    ck_assert_int_eq(d.oom_unclaimed, 0);
    v = sk_deaths_judge(&d, shared, false, killed(SIGKILL));
    ck_assert(!v.job_caused && v.outside);   /* the counter did not rise again */
    ck_assert_int_eq(d.oom_seen, 4);
    unlink(file);
    free(shared);
}
END_TEST

START_TEST(test_the_replacement_inherits_the_crash_and_the_locks)
{
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 1, 0);
    atomic_store(&shared->consuming, 1);
    atomic_store(&shared->job_started_ms, 1234);
    snprintf(shared->job_key, sizeof(shared->job_key), "key-1");
    const char *keys[] = { "sekali:lock:q:key-1", "sekali:lock:q:key-2" };
    const char *tokens[] = { "token-1", "token-2" };
    sk_slot_record_locks(shared, 2, keys, tokens);

    sk_deaths_bequeath(shared, &(struct sk_death){ .job_caused = true });
    ck_assert_int_eq(atomic_load(&shared->consuming), 0);
    ck_assert_int_eq(atomic_load(&shared->job_started_ms), 0);
    ck_assert_int_eq(atomic_load(&shared->died_in_job), 1);
    ck_assert_int_eq(atomic_load(&shared->n_locks), 0);
    size_t n = 0;
    const struct sk_slot_lock *orphans = sk_slot_orphans(shared, &n);
    ck_assert_uint_eq(n, 2);   /* every lock it held, a batch's */
    ck_assert_str_eq(orphans[0].key, "sekali:lock:q:key-1");
    ck_assert_str_eq(orphans[1].token, "token-2");
    free(shared);
}
END_TEST

START_TEST(test_a_death_not_the_jobs_or_without_a_key_leaves_no_crash)
{
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 1, 0);
    snprintf(shared->job_key, sizeof(shared->job_key), "key-1");
    sk_deaths_bequeath(shared, &(struct sk_death){ .outside = true });
    ck_assert_int_eq(atomic_load(&shared->died_in_job), 0);
    ck_assert_int_eq(atomic_load(&shared->n_orphans), 0);   /* it held no lock */
    shared->job_key[0] = '\0';
    sk_deaths_bequeath(shared, &(struct sk_death){ .job_caused = true });
    ck_assert_int_eq(atomic_load(&shared->died_in_job), 0);
    free(shared);
}
END_TEST

/* A dead worker of a retiring generation hands its orphans to a live
 * worker's slot, but only one with none pending (its worker may be reading
 * those), and no more than that slot holds. */
START_TEST(test_a_retired_workers_locks_go_to_a_slot_with_none_pending)
{
    struct sk_slot *dead = slot_in(SK_PHASE_HANDLER, 1, 0);
    const char *keys[] = { "sekali:lock:q:key-1", "sekali:lock:q:key-2" };
    const char *tokens[] = { "token-1", "token-2" };
    sk_slot_record_locks(dead, 2, keys, tokens);
    sk_deaths_bequeath(dead, &(struct sk_death){ .outside = true });

    struct sk_slot *busy = slot_in(SK_PHASE_IDLE, 1, 0);
    sk_slot_record_locks(busy, 1, keys, tokens);
    sk_slot_orphan_locks(busy);   /* its own predecessor's, not freed yet */
    ck_assert_uint_eq(sk_slot_hand_orphans(dead, busy), 0);
    ck_assert_int_eq(atomic_load(&busy->n_orphans), 1);
    ck_assert_int_eq(atomic_load(&dead->n_orphans), 2);

    /* A slot laid out for batch 1 takes one; the other is left to expire. */
    struct sk_slot *small = calloc(1, sizeof(*small) + 2 * sizeof(small->locks[0]));
    ck_assert_ptr_nonnull(small);
    small->lock_cap = 1;
    ck_assert_uint_eq(sk_slot_hand_orphans(dead, small), 1);
    size_t n = 0;
    const struct sk_slot_lock *got = sk_slot_orphans(small, &n);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(got[0].key, "sekali:lock:q:key-1");
    ck_assert_str_eq(got[0].token, "token-1");
    ck_assert_int_eq(atomic_load(&dead->n_orphans), 0);
    ck_assert_uint_eq(sk_slot_hand_orphans(dead, busy), 0);   /* nothing left to hand */
    free(dead);
    free(busy);
    free(small);
}
END_TEST

START_TEST(test_a_retired_workers_crash_goes_to_a_slot_with_none_pending)
{
    struct sk_slot *dead = slot_in(SK_PHASE_HANDLER, 1, 0);
    snprintf(dead->job_key, sizeof(dead->job_key), "order-7");
    sk_deaths_bequeath(dead, &(struct sk_death){ .job_caused = true });
    ck_assert_int_eq(atomic_load(&dead->died_in_job), 1);

    struct sk_slot *heir = slot_in(SK_PHASE_JOB, 1, 0);
    snprintf(heir->job_key, sizeof(heir->job_key), "its-own-job");
    struct sk_slot *taken = slot_in(SK_PHASE_IDLE, 1, 0);
    atomic_store(&taken->crash_handed, 1);   /* one not yet counted */
    ck_assert(!sk_slot_hand_crash(dead, taken));
    ck_assert(sk_slot_hand_crash(dead, heir));
    ck_assert_int_eq(atomic_load(&heir->crash_handed), 1);
    ck_assert_str_eq(heir->handed_crash_key, "order-7");
    ck_assert_str_eq(heir->job_key, "its-own-job");   /* the heir's job is untouched */
    ck_assert_int_eq(atomic_load(&dead->died_in_job), 0);
    ck_assert(!sk_slot_hand_crash(dead, taken));      /* handed once only */
    free(dead);
    free(heir);
    free(taken);
}
END_TEST

/* The supervisor's choice of heir: a worker of the same queue, an idle one
 * before a busy one, and both the crash and the locks to that one. */
START_TEST(test_a_retired_worker_hands_down_to_an_idle_worker_of_its_queue)
{
    struct sk_slot *dead = slot_in(SK_PHASE_HANDLER, 1, 0);
    snprintf(dead->job_key, sizeof(dead->job_key), "order-7");
    const char *keys[] = { "sekali:lock:q:order-7" };
    const char *tokens[] = { "token-1" };
    sk_slot_record_locks(dead, 1, keys, tokens);
    sk_deaths_bequeath(dead, &(struct sk_death){ .job_caused = true });

    struct sk_slot *relay = slot_in(SK_PHASE_IDLE, 1, 0);
    struct sk_slot *other = slot_in(SK_PHASE_IDLE, 1, 0);
    struct sk_slot *busy = slot_in(SK_PHASE_JOB, 1, 0);
    atomic_store(&busy->job_started_ms, 1234);
    struct sk_slot *idle = slot_in(SK_PHASE_IDLE, 1, 0);
    const struct sk_heir heirs[] = {
        { relay, NULL }, { other, "r" }, { busy, "q" }, { idle, "q" },
    };
    sk_deaths_hand_down(dead, "q", heirs, 4);
    ck_assert_int_eq(atomic_load(&idle->crash_handed), 1);
    ck_assert_str_eq(idle->handed_crash_key, "order-7");
    ck_assert_int_eq(atomic_load(&idle->n_orphans), 1);
    for (size_t i = 0; i < 3; i++)
        ck_assert_msg(atomic_load(&heirs[i].shared->crash_handed) == 0 &&
                      atomic_load(&heirs[i].shared->n_orphans) == 0,
                      "heir %zu should have been passed over", i);
    ck_assert_int_eq(atomic_load(&dead->died_in_job), 0);
    ck_assert_int_eq(atomic_load(&dead->n_orphans), 0);

    /* With no idle worker of the queue, a busy one takes them. */
    struct sk_slot *again = slot_in(SK_PHASE_HANDLER, 1, 0);
    snprintf(again->job_key, sizeof(again->job_key), "order-8");
    sk_deaths_bequeath(again, &(struct sk_death){ .job_caused = true });
    sk_deaths_hand_down(again, "q", heirs, 3);
    ck_assert_int_eq(atomic_load(&busy->crash_handed), 1);
    ck_assert_str_eq(busy->handed_crash_key, "order-8");

    /* And with none of its queue, nothing is handed: the crash stays. */
    struct sk_slot *alone = slot_in(SK_PHASE_HANDLER, 1, 0);
    snprintf(alone->job_key, sizeof(alone->job_key), "order-9");
    sk_deaths_bequeath(alone, &(struct sk_death){ .job_caused = true });
    sk_deaths_hand_down(alone, "q", heirs, 2);
    ck_assert_int_eq(atomic_load(&alone->died_in_job), 1);
    ck_assert_int_eq(atomic_load(&other->crash_handed), 0);
    free(dead);
    free(again);
    free(alone);
    free(relay);
    free(other);
    free(busy);
    free(idle);
}
END_TEST

START_TEST(test_a_job_is_overdue_only_strictly_past_its_timeout)
{
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 1, 0);
    ck_assert_msg(!sk_deaths_overdue(shared, 1000, 1000000), "an idle worker is never overdue");
    atomic_store(&shared->job_started_ms, 5000);
    ck_assert(!sk_deaths_overdue(shared, 1000, 5999));
    ck_assert(!sk_deaths_overdue(shared, 1000, 6000));
    ck_assert(sk_deaths_overdue(shared, 1000, 6001));
    ck_assert_msg(!sk_deaths_overdue(shared, 0, 1000000), "job_timeout 0 is no timeout");
    free(shared);
}
END_TEST

/* A turning loop earns the watchdog's credit; a job earns it only while a
 * job_timeout watches it and the kill is not overdue by more than grace. */
START_TEST(test_only_a_watched_job_earns_the_watchdog_past_the_grace)
{
    struct sk_slot *shared = slot_in(SK_PHASE_HANDLER, 1, 0);
    atomic_store(&shared->alive_ms, 10000);
    ck_assert(sk_deaths_earns_watchdog(shared, true, 0, 12000, 3000));
    ck_assert_msg(!sk_deaths_earns_watchdog(shared, true, 0, 14000, 3000),
                  "an idle worker whose loop stopped earns nothing");
    atomic_store(&shared->job_started_ms, 10000);
    ck_assert_msg(!sk_deaths_earns_watchdog(shared, true, 0, 100000, 3000),
                  "a job no job_timeout watches earns nothing past the grace");
    ck_assert(sk_deaths_earns_watchdog(shared, true, 60000, 73000, 3000));
    ck_assert_msg(!sk_deaths_earns_watchdog(shared, true, 60000, 73001, 3000),
                  "past job_timeout plus the grace, the kill should have landed");
    ck_assert_msg(!sk_deaths_earns_watchdog(shared, false, 60000, 20000, 3000),
                  "a relay or the janitor earns it only by its loop");
    free(shared);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_fault_or_an_exit_in_the_handler_is_the_jobs_doing,
        test_the_same_death_outside_the_handler_is_not_the_jobs,
        test_a_kill_from_outside_is_nobodys_fault_and_progress_once_ready,
        test_a_finished_delivery_is_progress_whatever_killed_it,
        test_a_sigkill_for_job_timeout_is_the_jobs_doing,
        test_an_oom_kill_is_charged_once_to_the_next_sigkill,
        test_the_replacement_inherits_the_crash_and_the_locks,
        test_a_death_not_the_jobs_or_without_a_key_leaves_no_crash,
        test_a_retired_workers_locks_go_to_a_slot_with_none_pending,
        test_a_retired_workers_crash_goes_to_a_slot_with_none_pending,
        test_a_retired_worker_hands_down_to_an_idle_worker_of_its_queue,
        test_a_job_is_overdue_only_strictly_past_its_timeout,
        test_only_a_watched_job_earns_the_watchdog_past_the_grace,
        NULL,
    };
    return h_run_suite(h_suite("deaths", 0, tests));
}
