/* check_cancel.c - cancellation (sql/018, sekalictl cancel): a cancelled
 * key's job never runs, or, when it is running, its outcome is refused.
 * One test per moment a cancel can meet a job: in the producer's own
 * transaction before delivery, in the outbox, delivered but waiting for its
 * resource lock, running (transactional and external mode), completed; and
 * the bad input a cancel can get. Each asserts the effects the test handler
 * committed (0 or 1) and sekali_cancelled_total. */
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static double cancelled_total(int port, const struct h_run *r)
{
    return h_metric(port, "sekali_cancelled_total{queue=\"%s\",job_type=\"test\"}", r->queue);
}

/* Whether a file DIR/PREFIX.* exists: the test handler's marks. */
static bool marked(const struct h_run *r, const char *prefix)
{
    char pattern[1200];
    snprintf(pattern, sizeof(pattern), "%s/%s.*", r->dir, prefix);
    glob_t g;
    bool found = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    return found;
}

static void release(const struct h_run *r)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/release", r->dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    close(fd);
}

static int cancel(struct h_run *r, char **out, const char *key, const char *reason)
{
    const char *args[] = { "cancel", r->queue, key, "--reason", reason, "--by", "tester",
                           NULL };
    return h_sekalictl(r, out, args);
}

/* The refund and the cancel commit together; a cancel rolled back with its
 * transaction cancels nothing. The messages wait in RabbitMQ (published
 * straight to it, so the keys are forced) until sekalid starts. */
START_TEST(test_cancel_in_the_producers_transaction_before_delivery)
{
    struct h_run r;
    h_run_open(&r, "cxtx");
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    h_publish(r.b, r.queue, "test", "m-refunded", "k-refunded", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-kept", "k-kept", NULL, "ok");

    char sql[1024];
    snprintf(sql, sizeof(sql),
             "BEGIN; CREATE TABLE IF NOT EXISTS sekali_test.refunds (key text); "
             "INSERT INTO sekali_test.refunds VALUES ('k-refunded'); "
             "SELECT sekali.cancel('%s', 'k-refunded', 'order refunded', 'shop', true); "
             "COMMIT", r.queue);
    h_pg_exec(r.pg, sql);
    snprintf(sql, sizeof(sql),
             "BEGIN; SELECT sekali.cancel('%s', 'k-kept', 'changed my mind', 'shop', true); "
             "ROLLBACK", r.queue);
    h_pg_exec(r.pg, sql);

    char top[128];
    int port = h_metrics_top(top, sizeof(top));
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top });
    H_WAIT(h_effects(&r, "k-kept") == 1, 20000, "the job whose cancel rolled back should run");
    H_WAIT(cancelled_total(port, &r) == 1, 20000,
           "the cancelled delivery should be counted once, is %g", cancelled_total(port, &r));
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-refunded"), 0);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-refunded", status, sizeof(status)), "cancelled");
    /* The claim counts the cancelled delivery in the key's duplicates
     * column, as for any finished key; the metric counts it as cancelled. */
    ck_assert_int_eq(h_duplicates(&r), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

/* ISO 8601 UTC, seconds from now. */
static void iso_in(char *out, size_t size, int seconds)
{
    time_t t = time(NULL) + seconds;
    strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
}

/* Cancelled while its outbox row waits for a relay: the row is removed and
 * never published. A second job, due after it, shows the relay ran. */
START_TEST(test_cancel_in_the_outbox_is_never_published)
{
    struct h_run r;
    h_run_open(&r, "cxoutbox");
    char top[256];
    int port = h_free_port();
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\n" H_RELAY, port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top });
    char due[32];
    iso_in(due, sizeof(due), 3);
    h_enqueue(r.pg, r.queue, "k-outboxed", NULL, due);
    char *out = NULL;
    ck_assert_int_eq(cancel(&r, &out, "k-outboxed", "duplicate order"), 0);
    ck_assert_msg(strstr(out, "cancelled: it will not run") != NULL, "cancel said: %s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND idempotency_key = 'k-outboxed'", r.queue), 0);

    iso_in(due, sizeof(due), 4);
    h_enqueue(r.pg, r.queue, "k-after", NULL, due);
    H_WAIT(h_effects(&r, "k-after") == 1, 20000, "the relay should publish the later job");
    /* Never delivered, so never counted by a worker. */
    ck_assert_int_eq(cancelled_total(port, &r), 0);
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-outboxed"), 0);

    const char *args[] = { "trace", "k-outboxed", "--queue", r.queue, NULL };
    ck_assert_int_eq(h_sekalictl(&r, &out, args), 0);
    ck_assert_msg(strstr(out, "by tester") && strstr(out, "reason duplicate order") &&
                  strstr(out, "1 unpublished outbox row(s) removed"),
                  "trace should show the cancellation: %s", out);
    free(out);
    h_run_close(&r);
}
END_TEST

/* Delivered, then re-scheduled because another job holds its resource's
 * lock: cancelled meanwhile, it is acked unrun when it comes back. Both go
 * through the outbox, so PostgreSQL knows the waiting key before its claim. */
START_TEST(test_cancel_while_waiting_for_the_lock)
{
    struct h_run r;
    h_run_open(&r, "cxlock");
    char top[256];
    int port = h_free_port();
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\n" H_RELAY, port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = H_FAST_RETRIES,
                                          .top_yaml = top });
    char sql[512];
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'sleep:3000'::bytea, "
             "'k-holder', NULL, 'account-9')", r.queue);
    h_pg_exec(r.pg, sql);
    char lock[256];
    snprintf(lock, sizeof(lock), "sekali:lock:%s:account-9", r.queue);
    H_WAIT(h_redis_exists(lock), 20000, "the first job should hold %s", lock);
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'ok'::bytea, "
             "'k-waiter', NULL, 'account-9')", r.queue);
    h_pg_exec(r.pg, sql);
    H_WAIT(h_count_outcomes(r.log, "rescheduled", "lock_busy") >= 1, 20000,
           "the second job should have been delivered and found the lock busy");
    char *out = NULL;
    ck_assert_int_eq(cancel(&r, &out, "k-waiter", "not needed"), 0);
    free(out);
    H_WAIT(h_effects(&r, "k-holder") == 1, 20000, "the lock holder should complete");
    H_WAIT(cancelled_total(port, &r) == 1, 20000,
           "the waiting job should be acked as cancelled, counter %g", cancelled_total(port, &r));
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-waiter"), 0);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-waiter", status, sizeof(status)), "cancelled");
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

/* Once k-run's handler runs ("hold"): cancels it, then lets it finish. */
static void cancel_the_running_job(struct h_run *r)
{
    H_WAIT(marked(r, "hold"), 20000, "the handler should be running");
    char *out = NULL;
    ck_assert_int_eq(cancel(r, &out, "k-run", "stop it"), 0);
    ck_assert_msg(strstr(out, "cancelled while running") != NULL, "cancel said: %s", out);
    free(out);
    release(r);
}

/* Transactional mode: the handler has written its effect in the job's
 * transaction when the cancel comes; the COMMIT is refused and rolled back,
 * the delivery acked as cancelled, not retried nor dead-lettered. */
START_TEST(test_cancel_while_running_refuses_the_commit)
{
    struct h_run r;
    h_run_open(&r, "cxrun");
    char top[128], yaml[1400];
    int port = h_metrics_top(top, sizeof(top));
    snprintf(yaml, sizeof(yaml), "%s    config:\n      marker_dir: %s\n", H_FAST_RETRIES, r.dir);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = yaml, .top_yaml = top });
    h_publish(r.b, r.queue, "test", "m-run", "k-run", NULL, "hold");
    cancel_the_running_job(&r);
    H_WAIT(cancelled_total(port, &r) == 1, 20000,
           "the refused job should be counted as cancelled, is %g", cancelled_total(port, &r));
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-run"), 0);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-run", status, sizeof(status)), "cancelled");
    ck_assert_int_eq(h_count_events(r.log, NULL, "job_cancelled", NULL), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.cancellations WHERE "
                                      "queue = '%s' AND settled_at IS NOT NULL", r.queue), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

/* The same in a batch: k-before ran in the transaction whose COMMIT the
 * cancelled k-run has refused. It did nothing wrong, so it runs again in
 * the next transaction at once, at the same attempt: no retry, no delay,
 * no dead letter; k-after, left to the next transaction when the batch
 * closed early behind the long handler, runs there. */
START_TEST(test_cancel_while_running_in_a_batch_reruns_its_batch_mates)
{
    struct h_run r;
    h_run_open(&r, "cxbatch");
    char top[128], yaml[1400];
    int port = h_metrics_top(top, sizeof(top));
    snprintf(yaml, sizeof(yaml), "%s    batch: 4\n    prefetch: 4\n    batch_wait: 500ms\n"
             "    lock: false\n    config:\n      marker_dir: %s\n", H_FAST_RETRIES, r.dir);
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    h_publish(r.b, r.queue, "test", "m-before", "k-before", NULL, "ok");
    h_publish(r.b, r.queue, "test", "m-run", "k-run", NULL, "hold");
    h_publish(r.b, r.queue, "test", "m-after", "k-after", NULL, "ok");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = yaml, .top_yaml = top });
    cancel_the_running_job(&r);
    H_WAIT(h_effects(&r, "k-before") == 1 && h_effects(&r, "k-after") == 1, 20000,
           "the batch-mates should commit");
    H_WAIT(cancelled_total(port, &r) == 1, 20000,
           "the refused job should be counted as cancelled, is %g", cancelled_total(port, &r));
    double retries = h_metric(port, "sekali_retries_total{queue=\"%s\",job_type=\"test\"}",
                              r.queue);
    h_run_stop(&r);
    ck_assert_msg(retries == 0, "no batch-mate should be retried, %g were", retries);
    ck_assert_int_eq(h_effects(&r, "k-run"), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND idempotency_key = 'k-before'", r.queue), 1);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-run", status, sizeof(status)), "cancelled");
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

/* External mode: one handler asks host->cancelled() and stops before its
 * effect; one does not ask, and its late completion is fenced out (its
 * outside effect happened; sekali records no outcome for it). */
START_TEST(test_cancel_while_running_in_external_mode)
{
    struct h_run r;
    h_run_open(&r, "cxext");
    char top[128], yaml[1400];
    int port = h_metrics_top(top, sizeof(top));
    snprintf(yaml, sizeof(yaml), "    mode: external\n    lease: 10s\n%s"
             "    config:\n      marker_dir: %s\n", H_FAST_RETRIES, r.dir);
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = yaml, .top_yaml = top });
    h_publish(r.b, r.queue, "test", "m-ask", "k-ask", NULL, "hold_ask");
    h_publish(r.b, r.queue, "test", "m-deaf", "k-deaf", NULL, "hold");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                            "AND status = 'processing'", r.queue) == 2, 20000,
           "both jobs should be running under a lease");
    char *out = NULL;
    ck_assert_int_eq(cancel(&r, &out, "k-ask", "stop"), 0);
    ck_assert_msg(strstr(out, "cancelled while running") != NULL, "cancel said: %s", out);
    free(out);
    ck_assert_int_eq(cancel(&r, &out, "k-deaf", "stop"), 0);
    free(out);
    release(&r);
    H_WAIT(cancelled_total(port, &r) == 2, 20000,
           "both jobs should be counted as cancelled, are %g", cancelled_total(port, &r));
    h_run_stop(&r);
    ck_assert_msg(marked(&r, "cancelled"), "the asking handler should have seen the cancel");
    ck_assert_int_eq(h_effects(&r, "k-ask"), 0);
    ck_assert_int_eq(h_effects(&r, "k-deaf"), 1);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-ask", status, sizeof(status)), "cancelled");
    ck_assert_str_eq(h_key_status(&r, "k-deaf", status, sizeof(status)), "cancelled");
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

/* A completed job cannot be cancelled: exit 10, and nothing changes. */
START_TEST(test_cancel_after_completion_reports_it_already_ran)
{
    struct h_run r;
    h_run_open(&r, "cxdone");
    char top[128];
    int port = h_metrics_top(top, sizeof(top));
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .top_yaml = top });
    h_publish(r.b, r.queue, "test", "m-done", "k-done", NULL, "ok");
    H_WAIT(h_completed(&r) == 1, 20000, "the job should complete");
    char *out = NULL;
    ck_assert_int_eq(cancel(&r, &out, "k-done", "too late"), 10);
    free(out);
    h_publish(r.b, r.queue, "test", "m-done-again", "k-done", NULL, "ok");
    H_WAIT(h_duplicates(&r) == 1, 20000, "a copy should still be a plain duplicate");
    ck_assert_int_eq(cancelled_total(port, &r), 0);
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-done"), 1);
    char status[32];
    ck_assert_str_eq(h_key_status(&r, "k-done", status, sizeof(status)), "completed");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.cancellations WHERE "
                                      "queue = '%s'", r.queue), 0);
    h_run_close(&r);
}
END_TEST

/* Unknown queue and key (both 4) are refused with a message and record
 * nothing; a hostile reason is stored without its control characters; an
 * oversized one is refused. */
START_TEST(test_cancel_refuses_bad_input)
{
    struct h_run r;
    h_run_open(&r, "cxbad");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    char *out = NULL;
    const char *unknown_queue[] = { "cancel", "no-such-queue", "k", NULL };
    ck_assert_int_eq(h_sekalictl(&r, &out, unknown_queue), 4);
    free(out);
    ck_assert_int_eq(cancel(&r, &out, "k-never-heard-of", "why"), 4);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s'", r.queue), 0);
    const char *empty_key[] = { "cancel", r.queue, "", NULL };
    ck_assert_int_eq(h_sekalictl(&r, &out, empty_key), 2);
    free(out);
    char big[700];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ck_assert_int_eq(cancel(&r, &out, "k-big", big), 2);
    free(out);

    h_enqueue(r.pg, r.queue, "k-hostile", NULL, "2100-01-01");
    ck_assert_int_eq(cancel(&r, &out, "k-hostile", "line one\nline two\x1b[31m red"), 0);
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.cancellations WHERE "
                                      "queue = '%s' AND reason = 'line one line two [31m red'",
                                r.queue), 1);
    const char *trace[] = { "trace", "k-hostile", "--queue", r.queue, NULL };
    ck_assert_int_eq(h_sekalictl(&r, &out, trace), 0);
    ck_assert_msg(strchr(out, '\x1b') == NULL, "trace printed a raw escape: %s", out);
    free(out);
    /* Again: already cancelled, still exit 0, still one record. */
    ck_assert_int_eq(cancel(&r, &out, "k-hostile", "again"), 0);
    ck_assert_msg(strstr(out, "already cancelled") != NULL, "cancel said: %s", out);
    free(out);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_cancel_in_the_producers_transaction_before_delivery,
        test_cancel_in_the_outbox_is_never_published,
        test_cancel_while_waiting_for_the_lock,
        test_cancel_while_running_refuses_the_commit,
        test_cancel_while_running_in_a_batch_reruns_its_batch_mates,
        test_cancel_while_running_in_external_mode,
        test_cancel_after_completion_reports_it_already_ran,
        test_cancel_refuses_bad_input,
        NULL,
    };
    return h_run_suite(h_suite("cancel", 120, tests));
}
