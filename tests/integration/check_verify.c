/* check_verify.c - sekalictl verify against inconsistencies made for real:
 * a job whose message was taken off its queue after the relay published it
 * (lost), an external-mode worker frozen with SIGSTOP past its lease
 * (stuck), a dead letter whose key was re-armed by hand (inconsistent);
 * a job waiting in a lane of its queue (not lost); and a clean run of a
 * few thousand jobs, which reports nothing. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define RELAY "outbox:\n  relays: 1\n  poll_interval: 200ms\n"

/* sekalictl verify --json --queue QUEUE; its exit code, its output in out
 * (a static buffer). */
static int verify(struct h_run *r, char **out)
{
    static char text[65536];
    char *got;
    int code = h_sekalictl(r, &got, (const char *const[]){ "verify", "--json", "--queue", r->queue,
                                                           "--since", "1h", NULL });
    snprintf(text, sizeof(text), "%s", got);
    free(got);
    *out = text;
    return code;
}

static void has(const char *report, const char *part)
{
    ck_assert_msg(strstr(report, part) != NULL, "expected %s in: %s", part, report);
}

START_TEST(test_a_clean_run_of_three_thousand_jobs_reports_nothing)
{
    struct h_run r;
    h_run_open(&r, "verify-clean");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .top_yaml = RELAY });
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(sekali.enqueue('%s', 'test', 'ok'::bytea, "
                                      "'k-' || i)) FROM generate_series(1, 3000) AS i", r.queue),
                     3000);
    H_WAIT(h_completed(&r) == 3000, 120000, "3000 jobs should complete, %lld did",
           h_completed(&r));
    char *report;
    int code = verify(&r, &report);
    ck_assert_msg(code == 0, "verify exited %d: %s", code, report);
    has(report, "\"enqueued\":3000,\"completed\":3000,\"failed\":0,\"processing\":0,"
                "\"waiting\":0");
    has(report, "\"lost\":0,");
    has(report, "\"stuck\":0,");
    has(report, "\"inconsistent\":0,");
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* The relay publishes the job; with no worker running, the message is taken
 * off the queue (acked) as a broker losing it would. */
START_TEST(test_a_message_gone_from_its_queue_after_publishing_is_lost)
{
    struct h_run r;
    h_run_open(&r, "verify-lost");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = RELAY });
    h_enqueue(r.pg, r.queue, "k-kept", NULL, NULL);
    H_WAIT(h_completed(&r) == 1, 20000, "the first job should complete");
    h_stop_sekalid(r.sekalid, r.dir);
    /* A relay alone: sekalid with no worker cannot be configured, so the
     * row is marked published by hand after the message went out. */
    char job_id[200];
    snprintf(job_id, sizeof(job_id), "%s-gone", r.queue);  /* job ids are unique for ever */
    h_publish(r.b, r.queue, "test", job_id, "k-gone", NULL, "ok");
    h_pg_exec(r.pg, "BEGIN");
    char sql[1024];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali.outbox (job_id, queue, job_type, body, "
             "idempotency_key, published_at) VALUES ('%s', '%s', 'test', 'ok', 'k-gone', "
             "now())", job_id, r.queue);
    h_pg_exec(r.pg, sql);
    h_pg_exec(r.pg, "COMMIT");
    H_WAIT(h_queue_depth(r.b, r.queue) == 1, 10000, "the message should be in the queue");
    char *report;
    int code = verify(&r, &report);
    ck_assert_msg(code == 0, "waiting in the queue is not lost: %d %s", code, report);
    has(report, "\"waiting\":1");
    has(report, "\"lost\":0,");

    amqp_message_t msg;
    ck_assert(h_get(r.b, r.queue, &msg));  /* acked: gone from the broker */
    amqp_destroy_message(&msg);
    code = verify(&r, &report);
    ck_assert_msg(code == 8, "verify exited %d: %s", code, report);
    has(report, "\"lost\":1,\"lost_keys\":[\"k-gone\"]");

    /* Another job's dead letter accounts for that job, not for this one;
     * its own letter (dead-lettered before it had a key) does. */
    const char *const letters[] = { "k-elsewhere", "k-gone" };
    for (int i = 0; i < 2; i++) {
        snprintf(sql, sizeof(sql), "INSERT INTO sekali.dead_letters (queue, key, reason, body, "
                 "body_size) VALUES ('%s', '%s', 'failed', '\\x00', 1)", r.queue, letters[i]);
        h_pg_exec(r.pg, sql);
        code = verify(&r, &report);
        ck_assert_msg(code == (i == 0 ? 8 : 0), "with a dead letter of %s, verify exited %d: %s",
                      letters[i], code, report);
        has(report, i == 0 ? "\"lost\":1,\"lost_keys\":[\"k-gone\"]" : "\"lost\":0,");
    }
    h_run_close(&r);
}
END_TEST

/* A queue with lanes holds its jobs in them (queues[].lanes): a job
 * waiting in a lane is the queue's, not lost. */
START_TEST(test_a_job_waiting_in_a_lane_is_not_lost)
{
    struct h_run r;
    h_run_open(&r, "verify-lane");
    struct sk_queue_shape shape = { .lanes = 2 };
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = RELAY,
                                          .queue_yaml = "    lanes: 2\n", .shape = &shape });
    h_stop_sekalid(r.sekalid, r.dir);
    char job_id[200], lane[256], sql[1024];
    snprintf(job_id, sizeof(job_id), "%s-laned", r.queue);
    snprintf(lane, sizeof(lane), "%s.lane.1", r.queue);
    h_publish(r.b, lane, "test", job_id, "k-laned", NULL, "ok");
    snprintf(sql, sizeof(sql), "INSERT INTO sekali.outbox (job_id, queue, job_type, body, "
             "idempotency_key, published_at) VALUES ('%s', '%s', 'test', 'ok', 'k-laned', "
             "now())", job_id, r.queue);
    h_pg_exec(r.pg, sql);
    H_WAIT(h_queue_depth(r.b, lane) == 1, 10000, "the message should be in %s", lane);
    char *report;
    int code = verify(&r, &report);
    ck_assert_msg(code == 0, "waiting in a lane is not lost: %d %s", code, report);
    has(report, "\"waiting\":1");
    has(report, "\"lost\":0,");
    amqp_message_t msg;
    ck_assert(h_get(r.b, lane, &msg));
    amqp_destroy_message(&msg);
    h_run_close(&r);
}
END_TEST

/* An external-mode worker frozen in its handler: its lease runs out with
 * nobody to renew it. */
START_TEST(test_a_worker_frozen_past_its_lease_leaves_its_key_stuck)
{
    struct h_run r;
    h_run_open(&r, "verify-stuck");
    h_run_start(&r, &(struct h_run_opts){
        .workers = 1, .markers = true,
        .queue_yaml = "    mode: external\n    lease: 1s\n    lock: false\n" });
    pid_t a = h_publish_stalled(&r, "pay-1-a", "pay-1", "pay");
    ck_assert_int_eq(kill(a, SIGSTOP), 0);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                            "AND key = 'pay-1' AND lease_until < now()", r.queue) == 1, 10000,
           "the lease should run out while the worker is frozen");
    char *report;
    int code = verify(&r, &report);
    ck_assert_int_eq(kill(a, SIGKILL), 0);
    ck_assert_msg(code == 8, "verify exited %d: %s", code, report);
    has(report, "\"stuck\":1,\"stuck_keys\":[\"pay-1\"]");
    h_stop_sekalid(r.sekalid, r.dir);
    h_run_close(&r);
}
END_TEST

/* A job that fails is dead-lettered with its key failed; re-arming the key
 * by hand (as dlq replay does, without the replay) leaves a dead letter
 * whose key is not failed. */
START_TEST(test_a_dead_letter_whose_key_was_rearmed_by_hand_is_inconsistent)
{
    struct h_run r;
    h_run_open(&r, "verify-rearm");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    h_publish(r.b, r.queue, "test", "fail-1", "k-fail", NULL, "fail");
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "the failed job should be dead-lettered");
    char *report;
    int code = verify(&r, &report);
    ck_assert_msg(code == 0, "verify exited %d: %s", code, report);
    has(report, "\"inconsistent\":0,");
    /* A hostile dead letter beside it: a key PostgreSQL cannot hold is
     * skipped, not an error. */
    struct sk_header bad = { .key = "x-idempotency-key", .text = "k-\xff\xfe" };
    h_publish_raw(r.b, r.dead, "bad-1", "test", &bad, 1, "x", 1);
    H_WAIT(h_queue_depth(r.b, r.dead) == 2, 10000, "the hostile letter should be in %s", r.dead);
    char sql[512];
    snprintf(sql, sizeof(sql), "UPDATE sekali.idempotency_keys SET status = 'processing', "
             "owner = NULL, lease_until = NULL WHERE queue = '%s' AND key = 'k-fail'", r.queue);
    h_pg_exec(r.pg, sql);
    code = verify(&r, &report);
    ck_assert_msg(code == 0, "inconsistent alone is not lost: %d %s", code, report);
    has(report, "\"inconsistent\":1,\"inconsistent_keys\":[\"k-fail\"]");
    ck_assert_uint_eq(h_queue_depth(r.b, r.dead), 2);  /* verify left them in place */
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_clean_run_of_three_thousand_jobs_reports_nothing,
        test_a_message_gone_from_its_queue_after_publishing_is_lost,
        test_a_job_waiting_in_a_lane_is_not_lost,
        test_a_worker_frozen_past_its_lease_leaves_its_key_stuck,
        test_a_dead_letter_whose_key_was_rearmed_by_hand_is_inconsistent,
        NULL,
    };
    return h_run_suite(h_suite("verify", 180, tests));
}
