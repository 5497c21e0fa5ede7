/* check_nodes.c - amqp.url listing several RabbitMQ nodes: a node that is
 * down is passed over for the next one, and when none answers the error
 * names every node tried. The cluster itself (a node dying under a running
 * sekalid) is tests/cluster/test_rabbitmq_leader.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Starts sekalid for r with amqp.url replaced by the YAML list `urls`. */
static void start_with_urls(struct h_run *r, const char *urls, int workers)
{
    r->config = h_write_config_top(r->dir, r->queue, H_EFFECT, workers, NULL, NULL);
    char from[600], to[1400];
    snprintf(from, sizeof(from), "url: \"%s\"", h_amqp_url());
    snprintf(to, sizeof(to), "url: %s", urls);
    h_config_replace(r->config, from, to);
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    r->sekalid = h_start_sekalid("sekalid", r->config, r->dir, NULL);
}

START_TEST(test_a_dead_node_listed_first_is_passed_over)
{
    struct h_run r;
    h_run_open(&r, "nodes");
    char urls[1200];
    /* The live node's URL carries the same user, password and vhost. */
    snprintf(urls, sizeof(urls), "[\"amqp://sekali:sekali@127.0.0.1:%d/%%2f\", \"%s\"]",
             h_free_port(), h_amqp_url());
    start_with_urls(&r, urls, 2);
    H_WAIT(h_consumers(r.b, r.queue) == 2, 20000,
           "both workers should consume through the second node, have %u",
           h_consumers(r.b, r.queue));
    h_publish(r.b, r.queue, "test", "node-1", "order-node", NULL, "ok");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                      r.queue) == 1, 20000, "the job should run once");
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_no_node_answering_names_every_node_tried)
{
    struct h_run r;
    h_run_open(&r, "nodes-down");
    int a = h_free_port(), b = h_free_port();
    char urls[600], first[64], second[64];
    snprintf(urls, sizeof(urls), "[\"amqp://sekali:sekali@127.0.0.1:%d/%%2f\", "
             "\"amqp://127.0.0.1:%d\"]", a, b);
    start_with_urls(&r, urls, 1);
    snprintf(first, sizeof(first), "127.0.0.1:%d", a);
    snprintf(second, sizeof(second), "127.0.0.1:%d", b);
    H_WAIT(h_count_lines(r.log, "no RabbitMQ node took the connection") >= 1, 20000,
           "the worker should say that no node answered");
    ck_assert_int_ge(h_count_lines(r.log, first), 1);
    ck_assert_int_ge(h_count_lines(r.log, second), 1);
    ck_assert_int_eq(h_count_lines(r.log, "sekali:sekali"), 0);
    h_stop_sekalid(r.sekalid, r.dir);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_dead_node_listed_first_is_passed_over,
        test_no_node_answering_names_every_node_tried,
        NULL,
    };
    return h_run_suite(h_suite("nodes", 120, tests));
}
