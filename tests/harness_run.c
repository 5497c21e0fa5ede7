/* harness_run.c - one test's sekalid on a queue of its own (struct h_run):
 * opening, starting, stopping and closing a run, and the verdicts most
 * tests end with (exactly once, a dead letter's reason, failpoint deaths). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_private.h"

void h_run_open(struct h_run *r, const char *name)
{
    h_init();
    memset(r, 0, sizeof(*r));
    h_unique_name(r->queue, sizeof(r->queue), name);
    snprintf(r->dead, sizeof(r->dead), "%s.dead", r->queue);
    r->dir = h_tmpdir(name);
    snprintf(r->log, sizeof(r->log), "%s/sekalid.log", r->dir);
    snprintf(r->mark, sizeof(r->mark), "%s/failpoint.mark", r->dir);
    r->pg = h_pg();
    r->b = h_broker();
}

void h_run_start(struct h_run *r, const struct h_run_opts *o)
{
    ck_assert_msg(o->workers >= 1, "h_run_start: %d workers", o->workers);
    const char *queue_yaml = o->queue_yaml;
    char marked[2400];
    if (o->markers) {
        int n = snprintf(marked, sizeof(marked), "%s    config:\n      marker_dir: %s\n",
                         queue_yaml != NULL ? queue_yaml : "", r->dir);
        ck_assert_msg(n > 0 && (size_t)n < sizeof(marked), "h_run_start: queue_yaml too long");
        queue_yaml = marked;
    }
    r->config = h_write_config_top(r->dir, r->queue, o->handler != NULL ? o->handler : H_EFFECT,
                                   o->workers, queue_yaml, o->top_yaml);
    if (o->heartbeat != NULL) {
        char line[64];
        snprintf(line, sizeof(line), "heartbeat: %s", o->heartbeat);
        h_config_replace(r->config, "heartbeat: 30s", line);
    }
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, o->shape, NULL), SK_OK);

    char mark_env[1100];
    snprintf(mark_env, sizeof(mark_env), "SEKALI_FAILPOINT_MARK=%s", r->mark);
    const char *env[16];
    size_t n = 0;
    for (const char *const *e = o->env; e != NULL && *e != NULL; e++) {
        ck_assert_uint_lt(n, SK_ARRAY_LEN(env) - 2);
        env[n++] = *e;
    }
    env[n++] = mark_env;
    env[n] = NULL;
    r->sekalid = h_start_sekalid(o->binary != NULL ? o->binary : "sekalid", r->config, r->dir,
                                 env);
    if (o->held)
        return;
    H_WAIT(h_consumers(r->b, r->queue) == (uint32_t)o->workers, 20000,
           "%d workers should consume %s, have %u", o->workers, r->queue,
           h_consumers(r->b, r->queue));
    bool locks = queue_yaml == NULL || strstr(queue_yaml, "lock: false") == NULL;
    h_expect_tls_links(r, o->workers, o->workers, locks ? o->workers : 0);
}

void h_run_stop(struct h_run *r)
{
    /* After an outage the reconnects were new handshakes: every consumer
     * RabbitMQ has for the queue must be one of sekalid's TLS connections. */
    h_expect_tls_links(r, h_test_tls() && r->b != NULL ? (int)h_consumers(r->b, r->queue) : 0,
                       0, 0);
    h_stop_sekalid(r->sekalid, r->dir);
    ck_assert_int_eq(h_queue_depth(r->b, r->queue), 0);
}

void h_run_close(struct h_run *r)
{
    sk_broker_close(r->b);
    PQfinish(r->pg);
    free(r->config);
    free(r->dir);
}

pid_t h_publish_stalled(struct h_run *r, const char *message_id, const char *key,
                        const char *body)
{
    h_publish(r->b, r->queue, "test", message_id, key, NULL, body);
    H_WAIT(h_stalled_pid(r->dir) != 0, 20000, "the handler never reached its stall point (%s)",
           message_id);
    return h_stalled_pid(r->dir);
}

pid_t h_wait_marked_deaths(const struct h_run *r, const char *point, int n, int timeout_ms)
{
    H_WAIT(h_count_lines(r->mark, point) == n, timeout_ms,
           "failpoint %s should have killed %d workers (mark has %d)", point, n,
           h_count_lines(r->mark, point));
    char *marks = h_read_file(r->mark);
    ck_assert_ptr_nonnull(marks);
    pid_t victim = 0;
    for (const char *p = marks; *p != '\0'; p = strchr(p, '\n') + 1) {
        victim = (pid_t)atol(p);
        H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead", (long)victim);
    }
    free(marks);
    return victim;
}

void h_expect_dead_reason(struct h_run *r, const char *reason)
{
    amqp_message_t msg;
    ck_assert_msg(h_get(r->b, r->dead, &msg), "%s should hold a dead letter", r->dead);
    char text[64];
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", text, sizeof(text)), reason);
    amqp_destroy_message(&msg);
}

void h_expect_once(struct h_run *r, long long keys, long long dups)
{
    long long effects = h_effects(r, NULL), distinct = h_effect_keys(r);
    ck_assert_msg(effects == keys, "expected %lld effects on %s, have %lld", keys, r->queue,
                  effects);
    ck_assert_msg(distinct == keys, "expected %lld keys with an effect, have %lld (%lld "
                  "effects: some key ran twice)", keys, distinct, effects);
    if (dups != H_ANY_DUPS) {
        long long d = h_duplicates(r);
        ck_assert_msg(d == dups, "expected %lld duplicates, have %lld", dups, d);
    }
    /* A test that closed its broker connection before an outage. */
    if (r->b == NULL)
        r->b = h_broker();
    uint32_t depth = h_queue_depth(r->b, r->queue);
    ck_assert_msg(depth == 0, "%s should be empty, holds %u", r->queue, depth);
}
