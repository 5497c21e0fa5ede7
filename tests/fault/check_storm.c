/* check_storm.c - workers killed from outside, again and again: no job is
 * charged with deaths it did not cause, a dead worker's lock is freed at
 * once, and the supervisor keeps every slot running. Each test proves the
 * kills happened (the pids died, the supervisor logged the signal), then
 * that every job's effect exists exactly once. */
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "harness.h"

/* The longest "restarting in N ms" the supervisor logged; 0 if none. */
static long longest_restart_delay(const char *log)
{
    char *text = h_read_file(log);
    long longest = 0;
    const char *needle = "restarting in ";
    for (const char *p = text; p != NULL && (p = strstr(p, needle)) != NULL; p++) {
        long ms = atol(p + strlen(needle));
        if (ms > longest)
            longest = ms;
    }
    free(text);
    return longest;
}

/* No job's death was counted, and none was dead-lettered. */
static void expect_no_crash_recorded(struct h_run *r)
{
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT count(*) FROM sekali.job_crashes WHERE queue = "
                                       "'%s'", r->queue), 0);
    ck_assert_int_eq(h_queue_depth(r->b, r->dead), 0);
}

/* The chain of issue 9: a worker dies holding the lock on the job's
 * resource, and so do its next two replacements, each right after it took
 * the lock again (SIGKILL from the fault build's failpoint, as from
 * outside). None of those deaths happened in the handler, so none is
 * counted against the job (before, each was, and with max_crashes 3 the
 * job was dead-lettered without ever running). Each replacement frees the
 * dead worker's lock before consuming, so the job completes long before
 * the 30 s lock_ttl would have let it. */
START_TEST(test_deaths_holding_the_lock_cost_the_job_nothing_and_free_the_lock_at_once)
{
    struct h_run r;
    h_run_open(&r, "deadlock");
    int port = h_free_port();
    char top[256];
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 0s\n",
             port);
    const char *env[] = { "SEKALI_FAILPOINT=after_lock:order-chain",
                          "SEKALI_FAILPOINT_TIMES=3", NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 1,
                                          .queue_yaml = "    lock_ttl: 30s\n    max_crashes: 3\n",
                                          .top_yaml = top });
    int64_t published = h_now_ms();
    h_publish(r.b, r.queue, "test", "chain-1", "order-chain", NULL, "ok");

    h_wait_marked_deaths(&r, "after_lock", 3, 20000);

    H_WAIT(h_effects(&r, "order-chain") == 1, 15000,
           "the job should complete once, without waiting out the 30 s lock_ttl");
    int64_t took = h_now_ms() - published;
    ck_assert_msg(took < 20000, "the job took %lld ms: it waited for the lock's TTL",
                  (long long)took);
    /* The counters, not the log's wording: three deaths, each lock freed by
     * the supervisor and each slot restarted (the third restart ran the job). */
    ck_assert_int_eq(h_metric(port, "sekali_locks_released_for_dead_total{queue=\"%s\"}",
                              r.queue), 3);
    ck_assert_int_eq(h_metric(port, "sekali_worker_restarts_total{queue=\"%s\"}", r.queue), 3);
    h_run_stop(&r);

    ck_assert_int_eq(h_effects(&r, "order-chain"), 1);
    ck_assert_int_eq(h_count_deaths(r.log, "job_caused", "yes"), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT coalesce(sum(crashes), 0) FROM sekali.job_crashes "
                                      "WHERE queue = '%s'", r.queue), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'order-chain' AND status = "
                                      "'completed'", r.queue), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

/* The rest of issue 9's chain: two workers in turn die while they wait for
 * a lock another owner (here the test) holds on the job's resource, in
 * the state "received". Before, the slot's key made each death a crash of
 * the job, and with max_crashes 2 the job was dead-lettered unrun; now
 * neither counts, and the job runs once when the owner lets go. */
START_TEST(test_deaths_while_waiting_for_the_lock_cost_the_job_nothing)
{
    struct h_run r;
    h_run_open(&r, "lockwait");
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    char lock_key[256];
    snprintf(lock_key, sizeof(lock_key), "sekali:lock:%s:order-wait", r.queue);
    redisReply *reply = redisCommand(redis, "SET %s test-owner PX 60000", lock_key);
    ck_assert_ptr_nonnull(reply);
    freeReplyObject(reply);

    const char *env[] = { "SEKALI_FAILPOINT=lock_busy:order-wait", "SEKALI_FAILPOINT_TIMES=2",
                          NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 1,
                                          .queue_yaml = "    max_crashes: 2\n" });
    h_publish(r.b, r.queue, "test", "wait-1", "order-wait", NULL, "ok");
    h_wait_marked_deaths(&r, "lock_busy", 2, 20000);
    reply = redisCommand(redis, "DEL %s", lock_key);
    ck_assert_ptr_nonnull(reply);
    freeReplyObject(reply);

    H_WAIT(h_effects(&r, "order-wait") == 1, 30000, "the job should run once");
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "order-wait"), 1);
    ck_assert_int_eq(h_count_deaths(r.log, "signal", "9"), 2);
    expect_no_crash_recorded(&r);
    redisFree(redis);
    h_run_close(&r);
}
END_TEST

/* The other side of the rule: a handler that faults (SIGSEGV) kills its
 * worker by its own doing, which counts, so with max_crashes 1 its next
 * delivery is dead-lettered "crashed" while a healthy job beside it runs
 * once. An outside-looking SIGKILL after the claim (the failpoint) of a
 * second key on the same run counts nothing. */
START_TEST(test_handler_that_segfaults_is_dead_lettered_but_a_kill_after_claim_is_not)
{
    struct h_run r;
    h_run_open(&r, "segv");
    const char *env[] = { "SEKALI_FAILPOINT=after_claim:order-killed", "SEKALI_FAILPOINT_ONCE=1",
                          NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 1,
                                          .queue_yaml = "    max_crashes: 1\n    lock: false\n" });
    h_publish(r.b, r.queue, "test", "killed-1", "order-killed", NULL, "ok");
    h_publish(r.b, r.queue, "test", "segv-1", "order-segv", NULL, "segv");
    h_publish(r.b, r.queue, "test", "fine-1", "order-fine", NULL, "ok");

    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 60000, "the segfaulting job should be dead-lettered");
    H_WAIT(h_effects(&r, "order-fine") == 1, 30000, "the healthy job should run once");
    H_WAIT(h_effects(&r, "order-killed") == 1, 30000,
           "the job whose worker was killed after its claim should run once");
    h_run_stop(&r);

    ck_assert_int_eq(h_count_lines(r.mark, "after_claim"), 1);
    /* SIGSEGV, or SIGABRT where ASan catches the fault and aborts. */
    ck_assert_int_eq(h_count_deaths(r.log, "signal", "11") +
                     h_count_deaths(r.log, "signal", "6"), 1);
    ck_assert_int_eq(h_count_deaths(r.log, "signal", "9"), 1);
    ck_assert_int_eq(h_count_deaths(r.log, "job_caused", "yes"), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.job_crashes WHERE queue = "
                                      "'%s' AND key = 'order-killed'", r.queue), 0);
    h_expect_dead_reason(&r, "crashed");
    ck_assert_int_eq(h_effects(&r, "order-segv"), 0);
    h_run_close(&r);
}
END_TEST

/* A job that killed its worker can come back as a copy from a delay queue
 * instead of a redelivery: the other worker met the dead worker's lock
 * still held and re-scheduled it. Such a copy carries no `redelivered`, and
 * must meet the crash count all the same, or a job that kills workers
 * would run for ever. Set up exactly: the crash is recorded as the dead
 * worker's replacement records it, and the copy really travels through the
 * queue's delay queue, which the broker dead-letters back to the queue. */
START_TEST(test_crashing_job_back_from_a_delay_queue_still_meets_max_crashes)
{
    struct h_run r;
    h_run_open(&r, "delaycopy");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    max_crashes: 1\n" });
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT sekali.record_crash('%s', 'order-copy')", r.queue),
                     1);
    char delay[300];
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_declare_delay(r.b, r.queue, false, 50, delay, sizeof(delay), &err) == SK_OK,
                  "%s", err.msg);
    /* Published only to the delay queue: the worker can get it only as
     * the broker's dead letter from there, as it gets every retry. */
    struct sk_header headers[] = { { .key = "x-idempotency-key", .text = "order-copy" },
                                   { .key = "x-sekali-attempt", .number = 1 } };
    h_publish_raw(r.b, delay, "copy-1", "test", headers, 2, "ok", 2);

    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 30000,
           "the copy of a job that crashed its worker should be dead-lettered");
    h_run_stop(&r);
    h_expect_dead_reason(&r, "crashed");
    ck_assert_int_eq(h_effects(&r, "order-copy"), 0);
    h_run_close(&r);
}
END_TEST

#define STORM_KEYS 1500
#define STORM_KILLS 20

/* SIGKILLs a random child of sekalid and waits until it is gone; 0 when
 * there was none to kill (all restarting). */
static int kill_one(const struct h_run *r)
{
    pid_t pids[16];
    size_t n = h_children(r->sekalid, pids, 16);
    if (n == 0)
        return 0;
    pid_t victim = pids[(size_t)rand() % n];
    if (kill(victim, SIGKILL) != 0)
        return 0;
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead", (long)victim);
    return 1;
}

/* SIGKILLs sekalid's children, a random one every 100-200 ms, until wanted
 * died; returns how many did. Counted in kills, not in time: on a loaded
 * machine a restarted worker takes longer to show up as a child, and 4 s
 * once gave 6. */
static int kill_storm(const struct h_run *r, int wanted)
{
    int kills = 0;
    int64_t storm_end = h_now_ms() + h_ms(60000);
    while (kills < wanted && h_now_ms() < storm_end) {
        kills += kill_one(r);
        struct timespec t = { 0, (100 + rand() % 101) * 1000000L };
        nanosleep(&t, NULL);
    }
    ck_assert_msg(kills == wanted, "%d kills in 60 s, %d asked", kills, wanted);
    return kills;
}

/* Four workers, a SIGKILL to a random one every 100-200 ms, 20 of them, with
 * work in the queue throughout. Every kill is an outside kill, so every
 * slot comes back at once, whether or not its worker was ready yet: no
 * crash loop is reported, no restart waits, all four consume again within
 * seconds, and every key's effect exists exactly once, with no crash
 * counted. */
START_TEST(test_kill_storm_restarts_every_slot_promptly_and_loses_nothing)
{
    struct h_run r;
    h_run_open(&r, "storm");
    int port = h_free_port();
    char top[256];
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 0s\n"
             "restart:\n  initial: 200ms\n  max: 30s\n", port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 4, .queue_yaml = "    lock_ttl: 2s\n",
                                          .top_yaml = top });
    char key[64], id[64];
    for (int i = 0; i < STORM_KEYS; i++) {
        snprintf(key, sizeof(key), "storm-%d", i);
        snprintf(id, sizeof(id), "msg-%d", i);
        h_publish(r.b, r.queue, "test", id, key, key, "sleep:10");
    }

    int kills = kill_storm(&r, STORM_KILLS);

    /* Recovery is bounded: the slots were restarted, not left to back off. */
    H_WAIT(h_consumers(r.b, r.queue) == 4, 5000,
           "all 4 workers should consume again soon after the storm (%u do)",
           h_consumers(r.b, r.queue));
    ck_assert_int_eq(h_metric(port, "sekali_workers_up{queue=\"%s\"}", r.queue), 4);
    ck_assert_int_eq(h_metric(port, "sekali_worker_restarts_total{queue=\"%s\"}", r.queue),
                     kills);
    H_WAIT(h_effect_keys(&r) == STORM_KEYS, 120000, "every key should be done, %lld are",
           h_effect_keys(&r));
    /* A redelivered copy that met its dead predecessor's lock went to a
     * delay queue, and may come back after the last effect: the run ends
     * once the broker holds no copy, or the stop leaves it in the queue. */
    long long copies = h_in_flight(r.queue);
    H_WAIT(h_in_flight(r.queue) == 0, 60000, "every copy should be settled, %lld are not",
           h_in_flight(r.queue));
    fprintf(stderr, "storm: %d kills, %lld messages in flight after the last effect\n", kills,
            copies);
    h_run_stop(&r);

    ck_assert_int_eq(h_count_events(r.log, NULL, SK_EVENT_CRASH_LOOP, NULL), 0);
    ck_assert_int_eq(h_count_deaths(r.log, "restart_ms", "0"), kills);
    long longest = longest_restart_delay(r.log);
    ck_assert_msg(longest == 0, "a restart waited %ld ms: the storm pushed a slot into backoff",
                  longest);
    h_expect_once(&r, STORM_KEYS, H_ANY_DUPS);
    expect_no_crash_recorded(&r);
    h_run_close(&r);
}
END_TEST

/* The storm over archived keys (sql/040): the janitor moves each completed
 * key to sekali.finished_keys a second after it finished, then every key
 * is published again and the second copies run into the storm, each claim
 * bringing an archived key back, some of them in transactions the kills
 * roll back. Every key still has one effect, every second copy is a
 * duplicate, and the keys really were moved and really came back. */
START_TEST(test_kill_storm_over_archived_keys_loses_and_doubles_nothing)
{
    struct h_run r;
    h_run_open(&r, "storm-archive");
    int port = h_free_port();
    char top[256];
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 200ms\n"
             "  archive_after: 1s\nrestart:\n  initial: 200ms\n  max: 30s\n", port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 4, .queue_yaml = "    lock_ttl: 2s\n",
                                          .top_yaml = top });
    char key[64], id[64];
    for (int i = 0; i < STORM_KEYS; i++) {
        snprintf(key, sizeof(key), "storm-%d", i);
        snprintf(id, sizeof(id), "first-%d", i);
        h_publish(r.b, r.queue, "test", id, key, key, "sleep:10");
    }
    H_WAIT(h_effect_keys(&r) == STORM_KEYS, 120000, "every key should be done, %lld are",
           h_effect_keys(&r));
    H_WAIT(h_archived(&r) == STORM_KEYS, 30000, "every key should be archived, %lld are",
           h_archived(&r));
    /* A kill every 100 copies, as they arrive, then the rest of the storm. */
    int kills = 0;
    for (int i = 0; i < STORM_KEYS; i++) {
        snprintf(key, sizeof(key), "storm-%d", i);
        snprintf(id, sizeof(id), "second-%d", i);
        h_publish(r.b, r.queue, "test", id, key, key, "sleep:10");
        if (i % 100 == 99)
            kills += kill_one(&r);
    }
    kills += kill_storm(&r, STORM_KILLS - kills < 5 ? 5 : STORM_KILLS - kills);
    H_WAIT(h_in_flight(r.queue) == 0, 120000, "every copy should be settled, %lld are not",
           h_in_flight(r.queue));
    long long back = h_unarchived(&r);
    fprintf(stderr, "storm over archived keys: %d kills, %lld keys brought back\n", kills, back);
    h_run_stop(&r);
    ck_assert_int_eq(h_count_deaths(r.log, "restart_ms", "0"), kills);
    /* Each second copy met its key archived (a claim rolled back by a kill
     * put it back, for the next copy to bring back again). */
    ck_assert_msg(back >= STORM_KEYS, "%lld archived keys brought back, %d expected", back,
                  STORM_KEYS);
    h_expect_once(&r, STORM_KEYS, H_ANY_DUPS);
    ck_assert_int_ge(h_duplicates(&r), STORM_KEYS);
    h_run_close(&r);
}
END_TEST

/* Workers killed from outside while RabbitMQ is down never become ready,
 * through no fault of theirs: each still comes back at once, no crash loop
 * is reported, and when RabbitMQ returns every slot consumes within
 * seconds (the chaos soak saw slots sleep up to 5 s in backoff, logged as
 * crash-looping, after its RabbitMQ restart). */
START_TEST(test_kills_during_a_broker_outage_never_back_off)
{
    struct h_run r;
    h_run_open(&r, "outagekill");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2,
                                          .top_yaml = "restart:\n  initial: 5s\n" });
    h_servers("stop-rabbitmq");
    int kills = 0;
    int64_t end = h_now_ms() + 3000;
    while (h_now_ms() < end) {
        pid_t pids[8];
        size_t n = h_children(r.sekalid, pids, 8);
        for (size_t i = 0; i < n; i++)
            if (kill(pids[i], SIGKILL) == 0) {
                H_WAIT(h_process_gone(pids[i]), 10000, "worker %ld should be dead",
                       (long)pids[i]);
                kills++;
            }
        struct timespec t = { 0, 150 * 1000000L };
        nanosleep(&t, NULL);
    }
    ck_assert_int_ge(kills, 12);  /* six or more deaths per slot, none of them ready */
    h_servers("start-rabbitmq");
    sk_broker_close(r.b);
    r.b = h_broker();
    H_WAIT(h_consumers(r.b, r.queue) == 2, 30000,
           "both workers should consume soon after RabbitMQ is back (%u do)",
           h_consumers(r.b, r.queue));
    h_publish(r.b, r.queue, "test", "after-1", "after-outage", NULL, "ok");
    H_WAIT(h_effects(&r, "after-outage") == 1, 30000, "a job after the outage should run");
    h_run_stop(&r);
    ck_assert_int_eq(h_count_deaths(r.log, "signal", "9"), kills);
    ck_assert_int_eq(h_count_events(r.log, NULL, SK_EVENT_CRASH_LOOP, NULL), 0);
    ck_assert_int_eq(longest_restart_delay(r.log), 0);
    h_run_close(&r);
}
END_TEST

/* How many locks Redis holds for r's queue. */
static long long lock_count(redisContext *redis, const struct h_run *r)
{
    redisReply *reply = redisCommand(redis, "KEYS sekali:lock:%s:*", r->queue);
    ck_assert_msg(reply != NULL && reply->type == REDIS_REPLY_ARRAY, "redis KEYS failed");
    long long n = (long long)reply->elements;
    freeReplyObject(reply);
    return n;
}

/* The set-up of the tests that count locks: a Redis connection to count
 * them with, and top-level config (into top) serving metrics on a free
 * port (*port), with the janitor idle. */
static redisContext *lock_counting(char *top, size_t size, int *port)
{
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect failed");
    *port = h_free_port();
    snprintf(top, size, "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 0s\n", *port);
    return redis;
}

/* A worker of a batch-16 queue dies in one job's handler while it holds
 * the locks of all sixteen jobs, with a lock_ttl of 60 s. Before, the
 * scoreboard named only the running job's lock: its fifteen batch-mates
 * went round the delay queue as "lock busy" until their locks expired.
 * Now the replacement frees all sixteen in one round trip before it
 * consumes, and the batch completes in a few seconds, once each. */
START_TEST(test_death_mid_batch_frees_every_batch_mates_lock_at_once)
{
    enum { BATCH = 16, STALL_AT = 8 };
    struct h_run r;
    h_run_open(&r, "batchorphans");
    char top[256];
    int port;
    redisContext *redis = lock_counting(top, sizeof(top), &port);
    char extra[1400];
    snprintf(extra, sizeof(extra), "    batch: %d\n    prefetch: %d\n    batch_wait: 1s\n"
             "    lock_ttl: 60s\n    config:\n      marker_dir: %s\n", BATCH, 2 * BATCH, r.dir);
    /* Published before sekalid starts, so that the first batch is all of
     * them, with the stalling job in its middle. */
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    char key[32], id[32];
    for (int i = 0; i < BATCH; i++) {
        if (i == STALL_AT) {
            h_publish(r.b, r.queue, "test", "stall-1", "order-stall", NULL, "stall");
            continue;
        }
        snprintf(key, sizeof(key), "mate-%02d", i);
        snprintf(id, sizeof(id), "mate-msg-%02d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = extra, .top_yaml = top });

    H_WAIT(h_stalled_pid(r.dir) != 0, 20000, "the handler never reached its stall point");
    pid_t victim = h_stalled_pid(r.dir);
    /* The fault's setting: one worker holds all sixteen locks. */
    ck_assert_int_eq(lock_count(redis, &r), BATCH);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    int64_t killed = h_now_ms();
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead after SIGKILL", (long)victim);

    H_WAIT(h_effect_keys(&r) == BATCH, 15000,
           "all %d jobs should complete without waiting out the 60 s lock_ttl (%lld did, "
           "%lld locks still held)", BATCH, h_effect_keys(&r), lock_count(redis, &r));
    int64_t took = h_now_ms() - killed;
    fprintf(stderr, "batchorphans: the batch completed %lld ms after the kill\n",
            (long long)took);
    H_WAIT(h_metric(port, "sekali_worker_restarts_total{queue=\"%s\"}", r.queue) == 1, 10000,
           "sekali_worker_restarts_total should count the killed worker once");
    ck_assert_int_eq(h_metric(port, "sekali_locks_released_for_dead_total{queue=\"%s\"}",
                              r.queue), BATCH);
    ck_assert_int_eq(h_metric(port, "sekali_lock_busy_total{queue=\"%s\",job_type=\"test\"}",
                              r.queue), 0);
    /* Every effect is the replacement's: nothing of the dead batch committed. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND pid = %ld", r.queue, (long)victim), 0);
    h_run_stop(&r);

    ck_assert_int_eq(lock_count(redis, &r), 0);
    h_expect_once(&r, BATCH, 0);
    redisFree(redis);
    h_run_close(&r);
}
END_TEST

/* Issue 42: a batch defers a job whose lock another owner holds, commits
 * its batch-mates, and only then waits for that lock, holding nothing. A
 * worker killed right there (the failpoint lock_deferred, before it asks
 * again) leaves the batch-mates committed, the deferred job unacked and no
 * crash against it: its redelivery runs it once the lock is free, and the
 * batch-mates' redeliveries are duplicates. PostgreSQL decides, not the
 * lock. */
START_TEST(test_death_while_a_deferred_job_waits_leaves_its_batch_mates_committed)
{
    enum { MATES = 3 };
    struct h_run r;
    h_run_open(&r, "deferdeath");
    char top[256];
    int port;
    redisContext *redis = lock_counting(top, sizeof(top), &port);
    char lock_key[256];
    snprintf(lock_key, sizeof(lock_key), "sekali:lock:%s:order-deferred", r.queue);
    freeReplyObject(redisCommand(redis, "SET %s test-owner PX 60000", lock_key));
    /* Published before sekalid starts: one batch, the busy job second. */
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    char key[32], id[32];
    for (int i = 0; i <= MATES; i++) {
        if (i == 1) {
            h_publish(r.b, r.queue, "test", "deferred-1", "order-deferred", NULL, "ok");
            continue;
        }
        snprintf(key, sizeof(key), "dmate-%d", i);
        snprintf(id, sizeof(id), "dmate-msg-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    const char *env[] = { "SEKALI_FAILPOINT=lock_deferred:order-deferred",
                          "SEKALI_FAILPOINT_TIMES=1", NULL };
    h_run_start(&r, &(struct h_run_opts){ .binary = "fault/sekalid", .env = env, .workers = 1,
                                          .queue_yaml = "    batch: 16\n    prefetch: 32\n"
                                                        "    batch_wait: 1s\n",
                                          .top_yaml = top });
    pid_t victim = h_wait_marked_deaths(&r, "lock_deferred", 1, 20000);
    /* The fault's setting: the batch-mates committed before the death, the
     * deferred job did not run. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND pid = %ld", r.queue, (long)victim), MATES);
    ck_assert_int_eq(h_effects(&r, "order-deferred"), 0);
    freeReplyObject(redisCommand(redis, "DEL %s", lock_key));

    H_WAIT(h_effects(&r, "order-deferred") == 1, 30000, "the deferred job should run once");
    ck_assert_int_eq(h_metric(port, "sekali_worker_restarts_total{queue=\"%s\"}", r.queue), 1);
    h_run_stop(&r);
    ck_assert_int_eq(h_count_deaths(r.log, "signal", "9"), 1);
    expect_no_crash_recorded(&r);
    ck_assert_int_eq(lock_count(redis, &r), 0);
    h_expect_once(&r, MATES + 1, H_ANY_DUPS);
    redisFree(redis);
    h_run_close(&r);
}
END_TEST

/* A reload retires the old generation while one of its workers is stuck in
 * a job holding its lock (60 s lock_ttl); that worker is then killed, as
 * shutdown_timeout would kill it. Its generation starts no replacement, so
 * before, nobody freed the lock and the job's redelivery went round the
 * delay queue as "lock busy" until the lock expired. Now the supervisor
 * hands the lock to a worker of the new generation, which frees it, and the
 * job runs again within seconds, once. */
START_TEST(test_death_in_a_retired_generation_frees_its_lock_at_once)
{
    struct h_run r;
    h_run_open(&r, "retiredlock");
    char top[256];
    int port;
    redisContext *redis = lock_counting(top, sizeof(top), &port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = "    lock_ttl: 60s\n",
                                          .markers = true, .top_yaml = top });
    pid_t victim = h_publish_stalled(&r, "stall-1", "order-retired", "stall");
    ck_assert_int_eq(lock_count(redis, &r), 1);

    /* The same queue with two workers: a new generation, the old retired. */
    h_config_replace(r.config, "    workers: 1\n", "    workers: 2\n");
    ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
    H_WAIT(h_count_event_where(r.log, SK_EVENT_GENERATION_RETIRED, "reason", "reload",
                               NULL) == 1, 20000,
           "the new generation should get ready and the old one be retired");
    ck_assert(!h_process_gone(victim));
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    int64_t killed = h_now_ms();
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead after SIGKILL", (long)victim);

    H_WAIT(h_effect_keys(&r) == 1, 15000, "the job should run again without waiting out the "
           "60 s lock_ttl (%lld locks still held)", lock_count(redis, &r));
    fprintf(stderr, "retiredlock: the job committed %lld ms after the kill\n",
            (long long)(h_now_ms() - killed));
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_LOCKS_HANDED, "count", "1", NULL), 1);
    ck_assert_int_eq(h_metric(port, "sekali_locks_released_for_dead_total{queue=\"%s\"}",
                              r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = "
                                      "'%s' AND pid = %ld", r.queue, (long)victim), 0);
    h_run_stop(&r);
    ck_assert_int_eq(lock_count(redis, &r), 0);
    h_expect_once(&r, 1, 0);
    redisFree(redis);
    h_run_close(&r);
}
END_TEST

/* The same death, but by the job's own fault (a SIGSEGV in its handler):
 * the crash must be counted although no replacement comes to record it,
 * or a job that kills the draining workers of every reload would never
 * meet max_crashes. A current worker takes the crash with the lock, counts
 * it first, and the redelivery is dead-lettered (max_crashes 1). */
START_TEST(test_a_job_that_kills_a_retired_worker_still_meets_max_crashes)
{
    struct h_run r;
    h_run_open(&r, "retiredcrash");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .markers = true,
                                          .queue_yaml = "    lock_ttl: 60s\n    max_crashes: 1\n" });
    pid_t victim = h_publish_stalled(&r, "stall-1", "order-retiredcrash", "stall");

    h_config_replace(r.config, "    workers: 1\n", "    workers: 2\n");
    ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
    H_WAIT(h_count_event_where(r.log, SK_EVENT_GENERATION_RETIRED, "reason", "reload",
                               NULL) == 1, 20000,
           "the new generation should get ready and the old one be retired");
    ck_assert(!h_process_gone(victim));
    ck_assert_int_eq(kill(victim, SIGSEGV), 0);
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead after SIGSEGV", (long)victim);

    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "the job that killed a retired worker "
           "should be dead-lettered when it comes back (crashes counted: %lld)",
           h_pg_count(r.pg, "SELECT coalesce(sum(crashes), 0) FROM sekali.job_crashes "
                            "WHERE queue = '%s'", r.queue));
    h_run_stop(&r);
    ck_assert_int_eq(h_count_deaths(r.log, "job_caused", "yes"), 1);
    ck_assert_int_eq(h_count_events(r.log, NULL, SK_EVENT_CRASH_HANDED, NULL), 1);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_CRASH_RECORDED, "worker", "retired",
                                         "idempotency_key", "order-retiredcrash",
                                         "crashes", "1", NULL), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT crashes FROM sekali.job_crashes WHERE queue = "
                                      "'%s' AND key = 'order-retiredcrash'", r.queue), 1);
    h_expect_dead_reason(&r, "crashed");
    ck_assert_int_eq(h_effects(&r, "order-retiredcrash"), 0);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_deaths_holding_the_lock_cost_the_job_nothing_and_free_the_lock_at_once,
        test_deaths_while_waiting_for_the_lock_cost_the_job_nothing,
        test_handler_that_segfaults_is_dead_lettered_but_a_kill_after_claim_is_not,
        test_crashing_job_back_from_a_delay_queue_still_meets_max_crashes,
        test_kill_storm_restarts_every_slot_promptly_and_loses_nothing,
        test_kill_storm_over_archived_keys_loses_and_doubles_nothing,
        test_kills_during_a_broker_outage_never_back_off,
        test_death_mid_batch_frees_every_batch_mates_lock_at_once,
        test_death_while_a_deferred_job_waits_leaves_its_batch_mates_committed,
        test_death_in_a_retired_generation_frees_its_lock_at_once,
        test_a_job_that_kills_a_retired_worker_still_meets_max_crashes,
        NULL,
    };
    Suite *s = suite_create("storm");
    h_tcase(s, "kill", 600, tests);
    return h_run_suite(s);
}
