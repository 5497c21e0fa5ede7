/* check_frames.c - messages whose header frame is at, or past, frame_max.
 *
 * RabbitMQ checks frame_max only on the frames it receives, and grows a
 * message's headers (x-death, x-first-death-*) each time it dead-letters
 * it. librabbitmq 0.11 refuses a frame over frame_max and leaves its
 * reader aimed at an 8-byte buffer: the next call that reads on that
 * connection writes the frame's rest over the heap. Each test brings such
 * a message in one way and requires that it ends dead-lettered with a
 * reason, that no worker dies, that the jobs behind it run once, and that
 * sekalictl dlq list, show and purge still work on the queue's dead
 * letters. Run under build/asan too (docs/hostile-input.md). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define DLQ(r, out, ...) \
    h_sekalictl((r), (out), (const char *const[]){ "dlq", __VA_ARGS__, NULL })

/* Jobs published behind the hostile message, each to run exactly once. */
#define BEHIND 5

static void publish_behind(struct h_run *r)
{
    for (int i = 0; i < BEHIND; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "behind-%d", i);
        snprintf(key, sizeof(key), "k-behind-%d", i);
        h_publish(r->b, r->queue, "test", id, key, NULL, "ok");
    }
}

static void expect_behind_done_once(struct h_run *r)
{
    for (int i = 0; i < BEHIND; i++) {
        char key[32];
        snprintf(key, sizeof(key), "k-behind-%d", i);
        H_WAIT(h_effects(r, key) >= 1, 30000, "the job %s behind the hostile message should run",
               key);
    }
}

/* The end every test shares: one dead letter with sekali's reason, the
 * jobs behind done once, no worker killed, and dlq list, show and purge
 * working on it. */
static void expect_dead_lettered(struct h_run *r, const char *message_id, const char *reason)
{
    expect_behind_done_once(r);
    H_WAIT(h_queue_depth(r->b, r->dead) == 1, 30000, "the hostile message should be in %s",
           r->dead);
    h_run_stop(r);
    for (int i = 0; i < BEHIND; i++) {
        char key[32];
        snprintf(key, sizeof(key), "k-behind-%d", i);
        ck_assert_int_eq(h_effects(r, key), 1);
    }
    ck_assert_int_eq(h_count_events(r->log, NULL, SK_EVENT_WORKER_DIED, NULL), 0);
    ck_assert_int_eq(h_count_event_where(r->log, SK_EVENT_OUTCOME, "exit", "reject", NULL), 0);

    char *out = NULL;
    int rc = DLQ(r, &out, "list", r->queue);
    ck_assert_msg(rc == 0, "dlq list exited %d: %s", rc, out);
    ck_assert_msg(strstr(out, reason) != NULL, "dlq list should show reason %s: %s", reason, out);
    free(out);
    /* A malformed letter has no key: it is shown by its row's id. */
    char id[32];
    snprintf(id, sizeof(id), "%lld", h_pg_count(r->pg, "SELECT id FROM sekali.dead_letters "
                                                       "WHERE queue = '%s' AND job_id = '%s'",
                                                r->queue, message_id));
    rc = DLQ(r, &out, "show", r->queue, "--id", id);
    ck_assert_msg(rc == 0, "dlq show exited %d: %s", rc, out);
    /* The row keeps the headers the copy could carry, or says they were
     * left out. */
    ck_assert_msg(strstr(out, "x-sekali-headers-dropped") != NULL ||
                  strstr(out, "(omitted)") != NULL,
                  "dlq show should say which headers the letter left out: %s", out);
    free(out);
    rc = DLQ(r, &out, "purge", r->queue, "--all");
    ck_assert_msg(rc == 0, "dlq purge exited %d: %s", rc, out);
    free(out);
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT count(*) FROM sekali.dead_letters "
                                       "WHERE queue = '%s'", r->queue), 0);
}

/* Way in (a): a producer's forged x-death of about 130 KB. max_headers left
 * x-death out of its count, so the message ran; its retry went through a
 * delay queue, the broker's x-death records pushed it over frame_max, and
 * every worker that took it died of SIGSEGV while the queue behind it
 * stood still. */
START_TEST(test_forged_x_death_is_dead_lettered_and_the_queue_goes_on)
{
    struct h_run r;
    h_run_open(&r, "forged");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = H_FAST_RETRIES });

    /* 200 deaths of 640 bytes each: a header frame of about 129 KB. */
    enum { DEATHS = 200 };
    static char queue_name[600];
    memset(queue_name, 'd', sizeof(queue_name) - 1);
    static amqp_table_entry_t fields[DEATHS][3];
    static amqp_field_value_t deaths[DEATHS];
    for (int i = 0; i < DEATHS; i++) {
        fields[i][0] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("queue"),
            .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes(queue_name) } };
        fields[i][1] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("reason"),
            .value = { .kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("rejected") } };
        fields[i][2] = (amqp_table_entry_t){ .key = amqp_cstring_bytes("count"),
            .value = { .kind = AMQP_FIELD_KIND_I64, .value.i64 = 1 } };
        deaths[i] = (amqp_field_value_t){ .kind = AMQP_FIELD_KIND_TABLE,
                                          .value.table = { .num_entries = 3, .entries = fields[i] } };
    }
    amqp_table_entry_t headers[1] = { { .key = amqp_cstring_bytes("x-death"),
        .value = { .kind = AMQP_FIELD_KIND_ARRAY,
                   .value.array = { .num_entries = DEATHS, .entries = deaths } } } };
    amqp_envelope_t env;
    memset(&env, 0, sizeof(env));
    amqp_basic_properties_t *p = &env.message.properties;
    p->_flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_HEADERS_FLAG;
    p->message_id = amqp_cstring_bytes("forged-1");
    p->type = amqp_cstring_bytes("test");
    p->headers = (amqp_table_t){ .num_entries = 1, .entries = headers };
    env.message.body = amqp_cstring_bytes("retry_always");
    size_t frame = SK_BROKER_HEADER_FRAME_OVERHEAD + sk_broker_properties_size(p);
    ck_assert_msg(frame > 128000 && frame < H_FRAME_MAX, "forged frame of %zu bytes", frame);
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_republish(r.b, r.queue, &env, NULL, 0, &err) == SK_OK, "%s", err.msg);
    publish_behind(&r);

    expect_dead_lettered(&r, "forged-1", "malformed");
    ck_assert_int_eq(h_effects(&r, "forged-1"), 0);
    h_run_close(&r);
}
END_TEST

/* Way in (b): a plain, legal message whose header frame is 131,030 bytes
 * (the limit is 131,064 for this connection's 8-byte-framed properties).
 * sekali refused it, could not add its reasons to a copy, rejected it, and
 * the broker's x-death made the dead letter too large for sekalictl dlq,
 * which then died of SIGSEGV on that queue. */
START_TEST(test_frame_sized_headers_are_dead_lettered_with_a_reason_that_fits)
{
    struct h_run r;
    h_run_open(&r, "framesized");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    char *value = h_header_filling("big-1", "x-padding", 131030);
    struct sk_header pad = { .key = "x-padding", .text = value };
    h_publish_raw(r.b, r.queue, "big-1", "test", &pad, 1, "ok", 2);
    free(value);
    publish_behind(&r);

    expect_dead_lettered(&r, "big-1", "malformed");
    ck_assert_int_eq(h_effects(&r, "big-1"), 0);
    h_run_close(&r);
}
END_TEST

/* A message that arrives over the limit, as an older sekali or a broker
 * policy could leave it: published at 131,030 bytes into a queue whose
 * TTL dead-letters it into the work queue, gaining the broker's x-death on
 * the way. It must not stay at the head of the queue. */
START_TEST(test_message_arriving_over_frame_max_is_taken_off_the_head)
{
    struct h_run r;
    h_run_open(&r, "overmax");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    char feed[600];
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_declare_delay(r.b, r.queue, false, 1, feed, sizeof(feed), &err) == SK_OK,
                  "%s", err.msg);
    char *value = h_header_filling("over-1", "x-padding", 131030);
    struct sk_header pad = { .key = "x-padding", .text = value };
    h_publish_raw(r.b, feed, "over-1", "test", &pad, 1, "ok", 2);
    free(value);
    /* Behind it once it is in the work queue: the TTL is 1 ms. */
    H_WAIT(h_queue_depth(r.b, feed) == 0, 10000, "the feed queue should expire its message");
    publish_behind(&r);

    expect_dead_lettered(&r, "over-1", "malformed");
    ck_assert_int_eq(h_effects(&r, "over-1"), 0);
    h_run_close(&r);
}
END_TEST

/* A dead letter the broker grew past frame_max in <queue>.dead itself:
 * sekalictl dlq must list, show and purge it and what is behind it. */
START_TEST(test_dlq_reads_a_dead_letter_over_frame_max)
{
    struct h_run r;
    h_run_open(&r, "dlqover");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1 });
    char feed[600];
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_declare_delay(r.b, r.dead, false, 1, feed, sizeof(feed), &err) == SK_OK,
                  "%s", err.msg);
    char *value = h_header_filling("dead-over-1", "x-padding", 131030);
    struct sk_header pad = { .key = "x-padding", .text = value };
    h_publish_raw(r.b, feed, "dead-over-1", "test", &pad, 1, "ok", 2);
    free(value);
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 10000, "the grown letter should reach %s", r.dead);
    h_publish(r.b, r.dead, "test", "dead-small-1", "k-small", NULL, "ok");
    h_run_stop(&r);

    /* Letters put into <queue>.dead by hand are the broker's: the import
     * takes them into sekali.dead_letters, where every read is. */
    char *out = NULL;
    int rc = DLQ(&r, &out, "import", r.queue);
    ck_assert_msg(rc == 0, "dlq import exited %d: %s", rc, out);
    free(out);
    rc = DLQ(&r, &out, "list", r.queue);
    ck_assert_msg(rc == 0, "dlq list exited %d: %s", rc, out);
    ck_assert_msg(strstr(out, "dead-over-1") != NULL && strstr(out, "k-small") != NULL,
                  "dlq list should show both letters: %s", out);
    free(out);
    char id[32];
    snprintf(id, sizeof(id), "%lld", h_pg_count(r.pg, "SELECT id FROM sekali.dead_letters "
                                                      "WHERE queue = '%s' AND job_id = "
                                                      "'dead-over-1'", r.queue));
    rc = DLQ(&r, &out, "show", r.queue, "--id", id);
    ck_assert_msg(rc == 0, "dlq show exited %d: %s", rc, out);
    free(out);
    rc = DLQ(&r, &out, "purge", r.queue, "--all");
    ck_assert_msg(rc == 0, "dlq purge exited %d: %s", rc, out);
    free(out);
    ck_assert_uint_eq(h_queue_depth(r.b, r.dead), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters "
                                      "WHERE queue = '%s'", r.queue), 0);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_forged_x_death_is_dead_lettered_and_the_queue_goes_on,
        test_frame_sized_headers_are_dead_lettered_with_a_reason_that_fits,
        test_message_arriving_over_frame_max_is_taken_off_the_head,
        test_dlq_reads_a_dead_letter_over_frame_max,
        NULL,
    };
    return h_run_suite(h_suite("frames", 300, tests));
}
