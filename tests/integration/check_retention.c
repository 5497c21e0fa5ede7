/* check_retention.c - a job first published longer ago than its queue
 * keeps keys is quarantined: dead-lettered with reason beyond_retention and
 * counted, its handler not run, because its key (or the key of the copy it
 * duplicates) may be purged already. A fresh job on the same queue runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

START_TEST(test_a_job_older_than_the_retention_is_dead_lettered_not_run)
{
    struct h_run r;
    h_run_open(&r, "beyond");
    char top[64];
    int port = h_metrics_top(top, sizeof(top));
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    retention: 1h\n",
                                          .top_yaml = top });
    /* As a producer (or a copy kept two hours somewhere) would send it. */
    amqp_envelope_t env;
    memset(&env, 0, sizeof(env));
    amqp_basic_properties_t *p = &env.message.properties;
    p->_flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
    p->message_id = amqp_cstring_bytes("old-1");
    p->type = amqp_cstring_bytes("test");
    p->timestamp = (uint64_t)time(NULL) - 2 * 3600;
    env.message.body = amqp_cstring_bytes("ok");
    struct sk_header key = { .key = "x-idempotency-key", .text = "k-old" };
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_republish(r.b, r.queue, &env, &key, 1, &err) == SK_OK, "%s",
                  err.msg);
    h_publish(r.b, r.queue, "test", "fresh-1", "k-fresh", NULL, "ok");

    H_WAIT(h_effects(&r, "k-fresh") == 1, 20000, "the fresh job should run");
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "the old job should be dead-lettered");
    amqp_message_t msg;
    ck_assert(h_get(r.b, r.dead, &msg));
    char buf[200];
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", buf, sizeof(buf)),
                     "beyond_retention");
    ck_assert_str_eq(h_header_text(&msg, "x-idempotency-key", buf, sizeof(buf)), "k-old");
    amqp_destroy_message(&msg);
    ck_assert_int_eq(h_effects(&r, "k-old"), 0);
    H_WAIT(h_metric(port, "sekali_dead_letters_total{queue=\"%s\",job_type=\"test\","
                          "reason=\"beyond_retention\"}", r.queue) == 1, 10000,
           "the quarantine should be counted");
    ck_assert_int_eq(h_count_outcomes(r.log, "dead", "beyond_retention"), 1);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_job_older_than_the_retention_is_dead_lettered_not_run,
        NULL,
    };
    return h_run_suite(h_suite("retention", 60, tests));
}
