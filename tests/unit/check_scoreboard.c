/* check_scoreboard.c - a worker's job in its scoreboard slot, as the jobs
 * in flight read it (sk_slot_publish_job(), sk_slot_read_job()): a read
 * gets one job's fields whole or nothing, even while a worker in another
 * process rewrites them as fast as it can, and a worker killed mid-write
 * leaves nothing a reader takes for a job nor a count that breaks the next
 * write. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "scoreboard.h"
#include "suite.h"

#define READS 200000

START_TEST(test_a_job_is_read_whole_and_a_write_cut_short_reads_as_none)
{
    struct sk_scoreboard *sb;
    struct sk_err err;
    ck_assert_int_eq(sk_scoreboard_create(&sb, 1, 1, &err), SK_OK);
    struct sk_slot *s = sk_scoreboard_slot(sb, 0);
    struct sk_slot_job job;
    sk_slot_publish_job(s, "order-7", "invoice", 3, "0af7651916cd43dd8448eb211c80319c");
    ck_assert(sk_slot_read_job(s, &job));
    ck_assert_str_eq(job.key, "order-7");
    ck_assert_str_eq(job.type, "invoice");
    ck_assert_str_eq(job.trace_id, "0af7651916cd43dd8448eb211c80319c");
    ck_assert_uint_eq(job.attempt, 3);

    /* A worker killed between its two counts. */
    atomic_store(&s->job_seq, atomic_load(&s->job_seq) + 1);
    ck_assert(!sk_slot_read_job(s, &job));
    ck_assert_str_eq(job.key, "");
    /* Its replacement's first write is read again. */
    sk_slot_publish_job(s, "order-8", "refund", 1, "");
    ck_assert(sk_slot_read_job(s, &job));
    ck_assert_str_eq(job.key, "order-8");
    ck_assert_str_eq(job.type, "refund");

    /* A key longer than the slot holds is cut, and still ends. */
    char long_key[2 * SK_KEY_MAX];
    memset(long_key, 'k', sizeof(long_key) - 1);
    long_key[sizeof(long_key) - 1] = '\0';
    sk_slot_publish_job(s, long_key, "t", 1, "");
    ck_assert(sk_slot_read_job(s, &job));
    ck_assert_uint_eq(strlen(job.key), SK_KEY_MAX);
    sk_scoreboard_destroy(sb);
}
END_TEST

/* A child rewrites its slot with two jobs in turn, each of whose fields
 * names the job; every read the parent makes meanwhile must be of one, and
 * some must succeed. */
START_TEST(test_reads_racing_a_writer_in_another_process_see_one_job_or_none)
{
    struct sk_scoreboard *sb;
    struct sk_err err;
    ck_assert_int_eq(sk_scoreboard_create(&sb, 1, 1, &err), SK_OK);
    struct sk_slot *s = sk_scoreboard_slot(sb, 0);
    sk_slot_publish_job(s, "key-A", "type-A", 1, "");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        for (unsigned long i = 0;; i++) {
            bool a = (i & 1) == 0;
            sk_slot_publish_job(s, a ? "key-A" : "key-B-which-is-longer", a ? "type-A" : "type-B",
                                a ? 1 : 2, a ? "" : "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
            /* A worker writes once a job: bursts of writes with gaps,
             * so that some reads fall between them even on a busy host. */
            if (i % 16 == 15)
                usleep(20);
        }
    }
    unsigned long whole = 0, none = 0, a = 0, b = 0;
    struct sk_slot_job job;
    for (int i = 0; i < READS; i++) {
        if (!sk_slot_read_job(s, &job)) {
            none++;
            continue;
        }
        whole++;
        bool is_a = strcmp(job.key, "key-A") == 0 && strcmp(job.type, "type-A") == 0 &&
                    job.attempt == 1 && job.trace_id[0] == '\0';
        bool is_b = strcmp(job.key, "key-B-which-is-longer") == 0 &&
                    strcmp(job.type, "type-B") == 0 && job.attempt == 2 &&
                    strcmp(job.trace_id, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb") == 0;
        ck_assert_msg(is_a || is_b, "read %d mixes two jobs: key %s, type %s, attempt %u, "
                      "trace %s", i, job.key, job.type, job.attempt, job.trace_id);
        a += is_a;
        b += is_b;
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    printf("# %lu reads whole (%lu of A, %lu of B), %lu gave up on a write\n", whole, a, b, none);
    ck_assert_uint_gt(whole, 0);
    sk_scoreboard_destroy(sb);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_job_is_read_whole_and_a_write_cut_short_reads_as_none,
        test_reads_racing_a_writer_in_another_process_see_one_job_or_none,
        NULL,
    };
    return h_run_suite(h_suite("scoreboard", 60, tests));
}
