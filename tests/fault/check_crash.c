/* check_crash.c - workers killed at the two moments that matter most:
 * in the middle of the handler, and after COMMIT but before the ack.
 * Each test first proves the worker really died there, then that the job's
 * effect exists exactly once and nothing is left in the queue. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "harness.h"

static long long key_count(const struct h_run *r, const char *key, const char *column)
{
    return h_pg_count(r->pg, "SELECT coalesce(sum(%s), 0) FROM sekali.idempotency_keys "
                             "WHERE queue = '%s' AND key = '%s' AND status = 'completed'",
                      column, r->queue, key);
}

START_TEST(test_worker_killed_mid_handler_job_runs_again_once)
{
    struct h_run r;
    h_run_open(&r, "midkill");
    char top[64];
    int port = h_metrics_top(top, sizeof(top));
    /* A short lease: the dead worker's lock must expire before the job can
     * run again, and the test should not wait the default 30 s for it. */
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = "    lock_ttl: 2s\n",
                                          .markers = true, .top_yaml = top });
    h_publish(r.b, r.queue, "test", "stall-1", "order-stall", NULL, "stall");

    H_WAIT(h_stalled_pid(r.dir) != 0, 20000, "the handler never reached its stall point");
    pid_t victim = h_stalled_pid(r.dir);
    ck_assert_int_eq(h_effects(&r, "order-stall"), 0);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead after SIGKILL", (long)victim);

    H_WAIT(h_effects(&r, "order-stall") == 1, 30000,
           "the killed job should run again and commit once");
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND pid = %ld", r.queue, (long)victim), 0);
    /* The supervisor saw the death and replaced the worker: its counter,
     * not the wording of its log line. */
    H_WAIT(h_metric(port, "sekali_worker_restarts_total{queue=\"%s\"}", r.queue) == 1, 10000,
           "sekali_worker_restarts_total should count the killed worker once");
    h_run_stop(&r);

    ck_assert_int_eq(h_effects(&r, "order-stall"), 1);
    h_run_close(&r);
}
END_TEST

/* The pid that starts the failpoint's mark file, or 0 while it has none. */
static pid_t mark_pid(const char *path)
{
    char *text = h_read_file(path);
    pid_t pid = text != NULL ? (pid_t)atol(text) : 0;
    free(text);
    return pid;
}

START_TEST(test_worker_killed_after_commit_before_ack_is_a_counted_duplicate)
{
    struct h_run r;
    h_run_open(&r, "postcommit");
    const char *env[] = { "SEKALI_FAILPOINT=after_commit:order-42", NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 2,
                                          .queue_yaml = "    lock_ttl: 2s\n" });

    h_publish(r.b, r.queue, "test", "msg-42", "order-42", NULL, "ok");
    h_publish(r.b, r.queue, "test", "msg-43", "order-43", NULL, "ok");

    /* The failpoint creates the mark file, then writes its pid into it. */
    pid_t victim = 0;
    H_WAIT((victim = mark_pid(r.mark)) != 0, 20000, "the after_commit failpoint never fired");
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should have killed itself", (long)victim);

    /* The effect was committed before the death; the redelivery must find
     * the completed key and be acked as a duplicate. */
    H_WAIT(key_count(&r, "order-42", "duplicates") == 1, 30000,
           "the redelivery of order-42 should be counted as one duplicate");
    ck_assert_int_eq(h_effects(&r, "order-42"), 1);
    H_WAIT(h_effects(&r, "order-43") == 1, 20000, "order-43 should run once");
    h_run_stop(&r);

    ck_assert_int_eq(h_effects(&r, "order-42"), 1);
    h_run_close(&r);
}
END_TEST

/* A settled job's lock is released with the next acquire (span.c), so a
 * worker can die after the ack with its lock still in Redis. The
 * scoreboard still names it: the replacement frees it at its start, as it
 * frees a lock held mid-job, and the next job on the resource runs long
 * before the 60 s TTL would have let it. (The ack itself was still in
 * the worker, sent lazily: the job comes back and is a duplicate.) */
START_TEST(test_worker_killed_after_ack_leaves_no_lock_to_wait_for)
{
    struct h_run r;
    h_run_open(&r, "postack");
    const char *env[] = { "SEKALI_FAILPOINT=after_ack:order-a", "SEKALI_FAILPOINT_ONCE=1",
                          NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 1,
                                          .queue_yaml = "    lock_ttl: 60s\n" });
    h_publish(r.b, r.queue, "test", "msg-a", "order-a", "res-1", "ok");
    pid_t victim = 0;
    H_WAIT((victim = mark_pid(r.mark)) != 0, 20000, "the after_ack failpoint never fired");
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should have killed itself", (long)victim);
    int64_t died_at = h_now_ms();
    h_publish(r.b, r.queue, "test", "msg-b", "order-b", "res-1", "ok");
    H_WAIT(h_effects(&r, "order-b") == 1, 30000, "order-b should run once");
    int64_t waited = h_now_ms() - died_at;
    h_run_stop(&r);

    ck_assert_msg(waited < 30000, "order-b waited %lld ms: the dead worker's lock was left to "
                  "its TTL", (long long)waited);
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_LOCKS_FREED, NULL), 1);
    ck_assert_int_eq(h_effects(&r, "order-a"), 1);
    ck_assert_int_eq(h_effects(&r, "order-b"), 1);
    h_run_close(&r);
}
END_TEST

START_TEST(test_job_over_its_timeout_is_killed_and_runs_again_once)
{
    struct h_run r;
    h_run_open(&r, "timeout");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .markers = true,
                                          .queue_yaml = "    job_timeout: 1s\n    lock_ttl: 2s\n" });
    pid_t victim = h_publish_stalled(&r, "slow-1", "order-slow", "stall");

    /* Nobody but the supervisor kills it: the stall lasts two minutes. */
    H_WAIT(h_process_gone(victim), 10000, "the supervisor should kill the overdue worker %ld",
           (long)victim);
    H_WAIT(h_effects(&r, "order-slow") == 1, 30000,
           "the job should run again after the kill and commit once");
    h_run_stop(&r);

    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_JOB_TIMEOUT, "timeout_ms", "1000",
                                         NULL), 1);
    ck_assert_int_eq(h_effects(&r, "order-slow"), 1);
    /* A job_timeout kill in the handler is the job's doing: counted. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT crashes FROM sekali.job_crashes WHERE queue = "
                                      "'%s' AND key = 'order-slow'", r.queue), 1);
    h_run_close(&r);
}
END_TEST

/* A run whose worker dies on every delivery of the key order-poison (no
 * lock: a dead worker's lock would send each redelivery through a delay
 * queue first), with that job published; returns once it is in the run's
 * dead-letter queue. With a body, the handler kills its own worker
 * (tests/plugins/effect.c); without, the fault build's failpoint does,
 * after the claim, as a SIGKILL from outside would. */
static void publish_poison_until_dead(struct h_run *r, const char *name, const char *queue_yaml,
                                      const struct sk_queue_shape *shape, const char *body)
{
    static const char *const env[] = { "SEKALI_FAILPOINT=after_claim:order-poison", NULL };
    h_run_open(r, name);
    h_run_start(r, &(struct h_run_opts){ .binary = body == NULL ? "fault/sekalid" : NULL,
                                         .env = body == NULL ? env : NULL, .workers = 1,
                                         .queue_yaml = queue_yaml, .shape = shape });
    h_publish(r->b, r->queue, "test", "poison-1", "order-poison", NULL,
              body != NULL ? body : "ok");
    H_WAIT(h_queue_depth(r->b, r->dead) == 1, 60000,
           "the poison job should end in %s, which has %u", r->dead,
           h_queue_depth(r->b, r->dead));
}

/* After the poison job, a healthy one runs, as its first attempt; then the
 * run stops cleanly and the poison job never had an effect. */
static void expect_healthy_job_after_poison(struct h_run *r)
{
    h_publish(r->b, r->queue, "test", "fine-1", "order-fine", NULL, "ok");
    H_WAIT(h_effects(r, "order-fine") == 1, 30000, "a healthy job should still run");
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT attempt FROM sekali_test.effects WHERE queue = "
                                       "'%s' AND idempotency_key = 'order-fine'", r->queue), 1);
    h_run_stop(r);
    ck_assert_int_eq(h_effects(r, "order-poison"), 0);
}

START_TEST(test_quorum_delivery_limit_dead_letters_a_job_that_kills_its_worker)
{
    struct h_run r;
    /* Without the lock's delay-queue hop, which would become the first
     * death reason; and without sekali's crash limit: the broker's
     * delivery_limit is under test. */
    publish_poison_until_dead(&r, "quorum",
                              "    queue_type: quorum\n    delivery_limit: 2\n    lock: false\n"
                              "    max_crashes: 0\n",
                              &(struct sk_queue_shape){ .quorum = true, .delivery_limit = 2 },
                              NULL);
    ck_assert_int_ge(h_count_lines(r.mark, "after_claim"), 2);
    expect_healthy_job_after_poison(&r);

    amqp_message_t msg;
    ck_assert(h_get(r.b, r.dead, &msg));
    char reason[64];
    ck_assert_str_eq(h_header_text(&msg, "x-first-death-reason", reason, sizeof(reason)),
                     "delivery_limit");
    amqp_destroy_message(&msg);
    h_run_close(&r);
}
END_TEST

/* A quorum queue with no delivery_limit: sekali's own crash accounting
 * (here none, max_crashes 0) decides, never the broker's default. RabbitMQ
 * 4 gives every quorum queue a limit of 20 deliveries unless declared
 * otherwise; a job whose worker is killed 21 times after the claim must
 * still run once on the 22nd, not be dead-lettered by the broker. */
START_TEST(test_quorum_queue_without_delivery_limit_is_not_cut_short_by_the_broker)
{
    static const char *const env[] = { "SEKALI_FAILPOINT=after_claim:order-stubborn",
                                        "SEKALI_FAILPOINT_TIMES=21", NULL };
    struct h_run r;
    h_run_open(&r, "nolimit");
    h_run_start(&r, &(struct h_run_opts){
        .binary = "fault/sekalid", .env = env, .workers = 1,
        .queue_yaml = "    queue_type: quorum\n    lock: false\n    max_crashes: 0\n",
        .top_yaml = "restart:\n  initial: 20ms\n  max: 200ms\n",
        .shape = &(struct sk_queue_shape){ .quorum = true } });
    h_publish(r.b, r.queue, "test", "stubborn-1", "order-stubborn", NULL, "ok");
    H_WAIT(h_effects(&r, "order-stubborn") == 1 || h_queue_depth(r.b, r.dead) > 0, 120000,
           "the job should run or be dead-lettered; its worker died %d times",
           h_count_lines(r.mark, "after_claim"));
    ck_assert_int_eq(h_count_lines(r.mark, "after_claim"), 21);
    ck_assert_msg(h_queue_depth(r.b, r.dead) == 0,
                  "the broker dead-lettered the job after %d worker deaths",
                  h_count_lines(r.mark, "after_claim"));
    ck_assert_int_eq(h_effects(&r, "order-stubborn"), 1);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* A poison job on a classic queue, where the broker counts nothing: its
 * handler aborts (SIGABRT, the job's own doing), each replacement records
 * the crash, and with max_crashes 2 the next redelivery is dead-lettered
 * with reason "crashed" and the key failed, without a third run. Its
 * batch-mates, prefetched by the same dying workers, all complete once,
 * and a healthy job after it runs as attempt 1. */
START_TEST(test_classic_queue_dead_letters_a_job_that_keeps_killing_its_worker)
{
    struct h_run r;
    h_run_open(&r, "crashloop");
    /* The harness's prefetch of 4 puts the poison job in one batch with
     * its neighbours. */
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    max_crashes: 2\n"
                                          "    lock: false\n" });
    char key[32], id[32];
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof(key), "mate-%d", i);
        snprintf(id, sizeof(id), "mate-msg-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
        if (i == 2)
            h_publish(r.b, r.queue, "test", "poison-1", "order-poison", NULL, "abort");
    }
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 60000,
           "the poison job should end in %s, which has %u", r.dead, h_queue_depth(r.b, r.dead));
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof(key), "mate-%d", i);
        H_WAIT(h_effects(&r, key) == 1, 30000, "batch-mate %s should complete once", key);
    }
    /* The worker really died twice of the abort, and not a third time. */
    ck_assert_int_eq(h_count_deaths(r.log, "signal", "6"), 2);
    ck_assert_int_eq(h_count_events(r.log, NULL, SK_EVENT_WORKER_DIED, NULL), 2);
    ck_assert_int_eq(h_count_deaths(r.log, "job_caused", "yes"), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT crashes FROM sekali.job_crashes WHERE queue = "
                                      "'%s' AND key = 'order-poison'", r.queue), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'order-poison' AND status = "
                                      "'failed'", r.queue), 1);
    amqp_message_t msg;
    ck_assert(h_get(r.b, r.dead, &msg));
    char text[256];
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", text, sizeof(text)), "crashed");
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-error", text, sizeof(text)),
                     "its worker died 2 times while running it");
    amqp_destroy_message(&msg);
    expect_healthy_job_after_poison(&r);
    h_run_close(&r);
}
END_TEST

/* Two copies of one key on two workers, with a lease far shorter than the
 * job and renewal switched off: the first worker's lock really expires
 * while its handler runs, the second takes the lock (Redis shows a second
 * owner token), and PostgreSQL alone still makes the effect happen once. */
START_TEST(test_expired_lock_lets_a_second_worker_in_but_the_effect_happens_once)
{
    struct h_run r;
    h_run_open(&r, "expiry");
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");

    const char *env[] = { "SEKALI_FAULTS=no_renew", NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 2,
                                          .queue_yaml = "    lock_ttl: 300ms\n" });
    h_publish(r.b, r.queue, "test", "expiry-1", "order-expiry", NULL, "sleep:3000");
    h_publish(r.b, r.queue, "test", "expiry-2", "order-expiry", NULL, "sleep:3000");

    char lock_key[256], first[64] = "", second[64] = "";
    snprintf(lock_key, sizeof(lock_key), "sekali:lock:%s:order-expiry", r.queue);
    int64_t deadline = h_now_ms() + h_ms(20000);
    while (second[0] == '\0' && h_now_ms() < deadline) {
        redisReply *reply = redisCommand(redis, "GET %s", lock_key);
        if (reply != NULL && reply->type == REDIS_REPLY_STRING) {
            if (first[0] == '\0')
                snprintf(first, sizeof(first), "%s", reply->str);
            else if (strcmp(first, reply->str) != 0)
                snprintf(second, sizeof(second), "%s", reply->str);
        }
        freeReplyObject(reply);
        h_nap();
    }
    ck_assert_msg(first[0] != '\0' && second[0] != '\0',
                  "Redis should show two owners of %s in turn (saw \"%s\" and \"%s\")",
                  lock_key, first, second);
    /* The second owner took over while the first handler still ran. */
    ck_assert_int_eq(h_effects(&r, "order-expiry"), 0);

    H_WAIT(key_count(&r, "order-expiry", "duplicates") == 1, 30000,
           "the second copy should end as a counted duplicate");
    h_run_stop(&r);
    ck_assert_int_ge(h_count_lines(r.log, "lock had expired before release"), 1);
    ck_assert_int_eq(h_effects(&r, "order-expiry"), 1);
    redisFree(redis);
    h_run_close(&r);
}
END_TEST

/* The first worker dies after COMMIT, before it could reply: the redelivery
 * is a duplicate, and it sends the saved result, once. */
START_TEST(test_reply_lost_in_a_crash_is_sent_by_the_duplicate)
{
    struct h_run r;
    h_run_open(&r, "replycrash");
    char replies[160];
    snprintf(replies, sizeof(replies), "%s.replies", r.queue);
    ck_assert_int_eq(sk_broker_declare(r.b, replies, NULL, NULL), SK_OK);

    const char *env[] = { "SEKALI_FAILPOINT=after_commit:order-reply", NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 1,
                                          .queue_yaml = "    lock: false\n" });
    struct sk_message msg = { .message_id = "ask-1", .type = "test",
                              .idempotency_key = "order-reply", .reply_to = replies,
                              .correlation_id = "corr-9", .body = "ok", .body_len = 2 };
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_publish(r.b, r.queue, &msg, &err) == SK_OK, "%s", err.msg);

    H_WAIT(access(r.mark, F_OK) == 0, 20000, "the after_commit failpoint never fired");
    H_WAIT(key_count(&r, "order-reply", "duplicates") == 1, 30000,
           "the redelivery should be a duplicate");
    H_WAIT(h_queue_depth(r.b, replies) == 1, 20000, "the duplicate should send the saved result");
    h_stop_sekalid(r.sekalid, r.dir);
    ck_assert_int_eq(h_effects(&r, "order-reply"), 1);
    ck_assert_int_eq(h_queue_depth(r.b, replies), 1);
    h_run_close(&r);
}
END_TEST

START_TEST(test_a_finished_jobs_ack_is_not_held_back_by_a_full_prefetch_window)
{
    /* One worker, its prefetch window (10) full of 400 ms jobs: the
     * deliveries wait in its buffer, which used to hold back every ack until
     * the window was drained. Killing the worker after some jobs committed
     * shows what the broker still held unacked: each such job comes back as
     * a duplicate. With acks sent at least every 100 ms, only the job whose
     * commit the kill raced can. */
    struct h_run r;
    h_run_open(&r, "ackdelay");
    /* Published before the worker consumes, so that the window arrives in
     * one burst and stays in its buffer. */
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    char key[32];
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "ack-%d", i);
        h_publish(r.b, r.queue, "test", key, key, NULL, "sleep:400");
    }
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    prefetch: 10\n" });
    H_WAIT(h_effects(&r, NULL) >= 5, 30000, "five jobs should commit; %lld did",
           h_effects(&r, NULL));
    pid_t children[8];
    size_t n = h_children(r.sekalid, children, 8);
    ck_assert_uint_gt(n, 0);
    for (size_t i = 0; i < n; i++)
        kill(children[i], SIGKILL);
    for (size_t i = 0; i < n; i++)
        H_WAIT(h_process_gone(children[i]), 10000, "child %ld should be gone", (long)children[i]);
    long long done = h_effects(&r, NULL);
    H_WAIT(h_effects(&r, NULL) == 10, 30000, "every job should commit once; %lld did",
           h_effects(&r, NULL));
    h_run_stop(&r);
    h_expect_once(&r, 10, H_ANY_DUPS);
    long long dups = h_duplicates(&r);
    ck_assert_msg(dups <= 1, "%lld of the %lld jobs committed before the kill came back as "
                  "duplicates: their acks were held back", dups, done);
    h_run_close(&r);
}
END_TEST

/* A worker that dies by itself on every delivery (the handler aborts, and
 * max_crashes is off, so nothing dead-letters the job): its restarts back
 * off exponentially up to restart.max, and the fifth death in a row without
 * progress is reported once as a crash loop. */
START_TEST(test_a_worker_that_keeps_crashing_backs_off_and_is_reported_crash_looping)
{
    struct h_run r;
    h_run_open(&r, "crashloop");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1,
                                          .queue_yaml = "    max_crashes: 0\n    lock: false\n",
                                          .top_yaml = "restart:\n  initial: 100ms\n"
                                                      "  max: 800ms\n" });
    h_publish(r.b, r.queue, "test", "loop-1", "order-loop", NULL, "abort");
    H_WAIT(h_count_deaths(r.log, "signal", "6") >= 8, 60000,
           "the worker should die again and again; it died %d times",
           h_count_deaths(r.log, "signal", "6"));
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_CRASH_LOOP, "deaths", "5", "cap_ms",
                                         "800", NULL), 1);
    /* Each death's line says when the restart comes: full jitter under a
     * ceiling that doubles from 100 ms to 800 ms. All within the cap, and
     * some past the first ceiling, or nothing backed off. */
    char *log = h_read_file(r.log);
    ck_assert_ptr_nonnull(log);
    int deaths = 0;
    unsigned longest = 0;
    for (const char *at = log; (at = strstr(at, ",\"signal\":\"6\"")) != NULL; at++) {
        const char *end = strchr(at, '\n');
        const char *in = strstr(at, ",\"restart_ms\":\"");
        unsigned ms = 0;
        if (in != NULL && (end == NULL || in < end))
            ck_assert_int_eq(sscanf(in, ",\"restart_ms\":\"%u\"", &ms), 1);
        ck_assert_msg(ms <= 800, "a restart delay of %u ms is past restart.max", ms);
        longest = ms > longest ? ms : longest;
        deaths++;
    }
    free(log);
    ck_assert_int_ge(deaths, 8);
    ck_assert_msg(longest > 100, "after %d deaths no restart waited past the first 100 ms "
                  "ceiling (longest %u ms): no backoff", deaths, longest);
    ck_assert_int_eq(h_effects(&r, "order-loop"), 0);
    ck_assert_int_eq(kill(r.sekalid, SIGTERM), 0);
    h_wait_exit(r.sekalid, 30000, "sekalid after SIGTERM");
    h_run_close(&r);
}
END_TEST

START_TEST(test_production_binary_has_no_failpoints)
{
    h_init();
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "grep -q SEKALI_FAILPOINT %s/sekalid", h_build_dir());
    ck_assert_msg(system(cmd) != 0, "build/sekalid must not contain failpoints");
    snprintf(cmd, sizeof(cmd), "grep -q SEKALI_FAILPOINT %s/fault/sekalid", h_build_dir());
    ck_assert_msg(system(cmd) == 0, "the fault build should contain the failpoints");
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_worker_killed_mid_handler_job_runs_again_once,
        test_worker_killed_after_commit_before_ack_is_a_counted_duplicate,
        test_worker_killed_after_ack_leaves_no_lock_to_wait_for,
        test_job_over_its_timeout_is_killed_and_runs_again_once,
        test_quorum_delivery_limit_dead_letters_a_job_that_kills_its_worker,
        test_quorum_queue_without_delivery_limit_is_not_cut_short_by_the_broker,
        test_classic_queue_dead_letters_a_job_that_keeps_killing_its_worker,
        test_expired_lock_lets_a_second_worker_in_but_the_effect_happens_once,
        test_reply_lost_in_a_crash_is_sent_by_the_duplicate,
        test_a_finished_jobs_ack_is_not_held_back_by_a_full_prefetch_window,
        test_a_worker_that_keeps_crashing_backs_off_and_is_reported_crash_looping,
        test_production_binary_has_no_failpoints,
        NULL,
    };
    Suite *s = suite_create("crash");
    h_tcase(s, "kill", 600, tests);
    return h_run_suite(s);
}
