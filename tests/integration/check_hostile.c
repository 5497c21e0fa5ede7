/* check_hostile.c - legal but hostile messages: headers as large as a frame
 * allows, replies aimed at sekali's own queues, a forged retry header, and
 * optional properties sekali does not use. Each must end in a clear outcome
 * (done, or dead-lettered with its reason) without holding up the job
 * behind it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* The message: headers so close to the frame size that a retry copy,
 * with sekali's headers added, cannot be sent. It used to go back to the
 * head of the queue at the same attempt for ever (92 runs in 51 s) while the
 * job behind it waited; then it was dead-lettered after its one run, by the
 * broker, as even the dead-letter copy did not fit. Now max_headers stops
 * at 80 KiB, so it is refused before it runs, and its dead letter, with
 * the padding left out, carries sekali's reason. */
START_TEST(test_message_too_large_to_reschedule_is_dead_lettered_and_the_next_job_runs)
{
    struct h_run r;
    h_run_open(&r, "bighdr");
    h_run_start(&r, &(struct h_run_opts){
        .workers = 1, .queue_yaml = "    max_headers: 80KiB\n" H_FAST_RETRIES });
    char *value = h_header_filling("big-1", "x-padding", H_FRAME_MAX - 100);
    struct sk_header pad = { .key = "x-padding", .text = value };
    h_publish_raw(r.b, r.queue, "big-1", "test", &pad, 1, "retry_always", 12);
    free(value);
    h_publish(r.b, r.queue, "test", "good-1", "k-good", NULL, "ok");

    H_WAIT(h_effects(&r, "k-good") == 1, 20000,
           "the good job behind the large-header message should complete");
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "the large-header message should be in %s",
           r.dead);
    h_run_stop(&r);
    ck_assert_int_eq(h_count_lines(r.log, "exceed max_headers 81920"), 1);
    ck_assert_int_eq(h_count_outcomes(r.log, "handed_back", "reschedule_failed"), 0);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_OUTCOME, "exit", "reject", NULL), 0);
    amqp_message_t msg;
    ck_assert(h_get(r.b, r.dead, &msg));
    char buf[600];
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", buf, sizeof(buf)), "malformed");
    ck_assert_msg(strstr(h_header_text(&msg, "x-sekali-headers-dropped", buf, sizeof(buf)),
                         "x-padding") != NULL, "x-sekali-headers-dropped: %s", buf);
    ck_assert_str_eq(h_header_text(&msg, "x-padding", buf, sizeof(buf)), "");
    amqp_destroy_message(&msg);
    h_run_close(&r);
}
END_TEST

/* With the default max_headers, the same kind of message is refused before
 * the handler runs, and its dead letter carries the reason. */
START_TEST(test_headers_over_max_headers_are_dead_lettered_as_malformed)
{
    struct h_run r;
    h_run_open(&r, "maxhdr");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    char *value = h_header_filling("big-2", "x-padding", 100000);
    struct sk_header pad = { .key = "x-padding", .text = value };
    h_publish_raw(r.b, r.queue, "big-2", "test", &pad, 1, "ok", 2);
    free(value);
    h_publish(r.b, r.queue, "test", "good-2", "k-good", NULL, "ok");
    H_WAIT(h_effects(&r, "k-good") == 1, 20000, "the good job should complete");
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "expected 1 dead letter in %s", r.dead);

    amqp_message_t msg;
    ck_assert(h_get(r.b, r.dead, &msg));
    char buf[600];
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", buf, sizeof(buf)), "malformed");
    ck_assert_msg(strstr(h_header_text(&msg, "x-sekali-error", buf, sizeof(buf)),
                         "exceed max_headers 65536") != NULL, "x-sekali-error: %s", buf);
    amqp_destroy_message(&msg);
    ck_assert_int_eq(h_effects(&r, "big-2"), 0);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

static void publish_props(struct sk_broker *b, const char *queue,
                          const amqp_basic_properties_t *props, const char *body)
{
    amqp_envelope_t env;
    memset(&env, 0, sizeof(env));
    env.message.properties = *props;
    env.message.body = amqp_cstring_bytes(body);
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_republish(b, queue, &env, NULL, 0, &err) == SK_OK,
                  "publish to %s: %s", queue, err.msg);
}

/* A reply to the work queue would run there as a job with this job's id and
 * key; to .dead it would pose as a dead letter. Such a job is refused as
 * malformed before it runs: its caller learns why from the dead letter,
 * rather than waiting for a reply that never comes after the effect. */
START_TEST(test_reply_to_a_sekali_queue_is_refused_before_the_job_runs)
{
    struct h_run r;
    h_run_open(&r, "replyto");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    const char *targets[] = { r.queue, r.dead, "amq.direct" };
    for (size_t i = 0; i < SK_ARRAY_LEN(targets); i++) {
        char id[32];
        snprintf(id, sizeof(id), "ask-%zu", i);
        struct sk_message m = { .message_id = id, .type = "test", .reply_to = targets[i],
                                .body = "ok", .body_len = 2 };
        struct sk_err err = { 0 };
        ck_assert_msg(sk_broker_publish(r.b, r.queue, &m, &err) == SK_OK, "%s", err.msg);
    }
    h_publish(r.b, r.queue, "test", "good-3", "k-good", NULL, "ok");
    H_WAIT(h_effects(&r, "k-good") == 1, 20000, "the good job should complete");
    H_WAIT(h_queue_depth(r.b, r.dead) == 3, 20000, "expected 3 dead letters, have %u",
           h_queue_depth(r.b, r.dead));
    h_run_stop(&r);

    for (size_t i = 0; i < SK_ARRAY_LEN(targets); i++) {
        amqp_message_t msg;
        ck_assert(h_get(r.b, r.dead, &msg));
        char buf[600];
        ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", buf, sizeof(buf)), "malformed");
        ck_assert_msg(strstr(h_header_text(&msg, "x-sekali-error", buf, sizeof(buf)),
                             targets[i]) != NULL, "x-sekali-error: %s", buf);
        amqp_destroy_message(&msg);
    }
    for (size_t i = 0; i < SK_ARRAY_LEN(targets); i++) {
        char id[32];
        snprintf(id, sizeof(id), "ask-%zu", i);
        ck_assert_int_eq(h_effects(&r, id), 0);
    }
    h_run_close(&r);
}
END_TEST

/* A producer's x-sekali-attempt: 3 used to make a fresh job its third
 * attempt (with max_attempts 3, its last). It is ignored: the job retries
 * as any other and commits at attempt 2. */
START_TEST(test_producer_attempt_header_does_not_skip_retries)
{
    struct h_run r;
    h_run_open(&r, "forged");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = H_FAST_RETRIES });
    struct sk_header attempt = { .key = "x-sekali-attempt", .number = 3 };
    h_publish_raw(r.b, r.queue, "forged-1", "test", &attempt, 1, "retry", 5);
    H_WAIT(h_effects(&r, "forged-1") == 1, 20000, "the retried job should commit");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                      "'%s'", r.queue), 2);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* Neither property is used by a job without a reply: an empty correlation
 * id and a content type that is not UTF-8 used to dead-letter it. */
START_TEST(test_unused_odd_properties_do_not_dead_letter_a_job)
{
    struct h_run r;
    h_run_open(&r, "oddprops");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    amqp_basic_properties_t p = {
        ._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG |
                  AMQP_BASIC_CORRELATION_ID_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG,
        .message_id = amqp_cstring_bytes("odd-1"), .type = amqp_cstring_bytes("test"),
        .correlation_id = amqp_cstring_bytes(""), .content_type = amqp_cstring_bytes("x/\xff"),
    };
    publish_props(r.b, r.queue, &p, "ok");
    H_WAIT(h_effects(&r, "odd-1") == 1, 20000, "the job with odd properties should complete");
    h_run_stop(&r);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

/* The peak resident size (VmHWM) of sekalid's largest child, in KiB. */
static long worker_peak_kib(pid_t sekalid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)sekalid, (int)sekalid);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    long peak = 0;
    int child;
    while (fscanf(f, "%d", &child) == 1) {
        char status[64], line[256];
        snprintf(status, sizeof(status), "/proc/%d/status", child);
        FILE *s = fopen(status, "r");
        if (s == NULL)
            continue;
        long kib;
        while (fgets(line, sizeof(line), s) != NULL)
            if (sscanf(line, "VmHWM: %ld kB", &kib) == 1 && kib > peak)
                peak = kib;
        fclose(s);
    }
    fclose(f);
    return peak;
}

/* A body over max_body is refused from the size its header frame announces:
 * the worker never holds it (its peak memory stays far below the body), and
 * the broker dead-letters the whole message, body and all. */
START_TEST(test_body_over_max_body_is_refused_without_reading_it)
{
    /* Under RabbitMQ 4's largest message (16 MiB; 3.x took 128). */
    enum { BODY = 12 << 20 };
    struct h_run r;
    h_run_open(&r, "bigbody");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    max_body: 1MiB\n" });
    /* The worker's own peak after a first job is the baseline: sanitizers
     * and valgrind add tens of MiB of their own, a buffered body 12 more. */
    h_publish(r.b, r.queue, "test", "good-4", "k-first", NULL, "ok");
    H_WAIT(h_effects(&r, "k-first") == 1, 30000, "a first job should complete");
    long before = worker_peak_kib(r.sekalid);
    char *body = malloc(BODY);
    ck_assert_ptr_nonnull(body);
    memset(body, 'b', BODY);
    h_publish_raw(r.b, r.queue, "huge-1", "test", NULL, 0, body, BODY);
    free(body);
    h_publish(r.b, r.queue, "test", "good-5", "k-good", NULL, "ok");
    H_WAIT(h_effects(&r, "k-good") == 1, 30000,
           "the good job behind the huge body should complete");
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "the huge message should be in %s", r.dead);
    long peak = worker_peak_kib(r.sekalid);
    ck_assert_msg(before > 0 && peak > 0 && peak - before < (BODY >> 10) / 4,
                  "the worker's peak memory grew by %ld KiB (from %ld KiB): far less than "
                  "the body (%d KiB) was expected", peak - before, before, BODY >> 10);
    h_run_stop(&r);
    ck_assert_int_eq(h_count_lines(r.log, "body of 12582912 bytes exceeds max_body 1048576"), 2);

    amqp_message_t msg;
    ck_assert(h_get(r.b, r.dead, &msg));
    ck_assert_uint_eq(msg.body.len, BODY);
    amqp_destroy_message(&msg);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_message_too_large_to_reschedule_is_dead_lettered_and_the_next_job_runs,
        test_headers_over_max_headers_are_dead_lettered_as_malformed,
        test_reply_to_a_sekali_queue_is_refused_before_the_job_runs,
        test_producer_attempt_header_does_not_skip_retries,
        test_unused_odd_properties_do_not_dead_letter_a_job,
        test_body_over_max_body_is_refused_without_reading_it,
        NULL,
    };
    return h_run_suite(h_suite("hostile", 300, tests));
}
