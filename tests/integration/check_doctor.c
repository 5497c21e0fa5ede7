/* check_doctor.c - sekalictl doctor against the real test servers: they
 * pass as the harness runs them, and each check fails against the real
 * misconfiguration it is about (Redis evicting, a queue without sekali's
 * dead-letter arguments, a quorum queue without a delivery limit, a
 * consumer_timeout below job_timeout, a host clock a minute off under
 * libfaketime, an unmigrated database, a job waiting longer than the
 * retention, two hosts running one schedule with different specs).
 * sekalid refuses the unmigrated database too. Every server
 * setting a test changes is set back before it asserts. */
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "amqp_lib.h"

#include "harness.h"

#define JOB_TIMEOUT "    job_timeout: 10s\n"

/* sekalictl doctor --json on config with `extra` arguments and `prefix`
 * before the command (environment); its exit code, and its output in out
 * (a static buffer). */
static int doctor(const char *config, const char *prefix, const char *extra, char **out)
{
    static char text[65536];
    const char *ct = getenv("SEKALI_AMQP_CONSUMER_TIMEOUT");
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s %s/sekalictl -c '%s' doctor --json --consumer-timeout %sms %s "
             "2>/dev/null", prefix != NULL ? prefix : "", h_build_dir(), config,
             ct != NULL ? ct : "3600000", extra != NULL ? extra : "");
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(text, 1, sizeof(text) - 1, p);
    text[n] = '\0';
    int status = pclose(p);
    ck_assert_msg(WIFEXITED(status), "sekalictl doctor died: 0x%x", status);
    *out = text;
    return WEXITSTATUS(status);
}

/* Asserts that the JSON report has check (on object, "" for any) at level. */
static void has_verdict(const char *report, const char *check, const char *object,
                        const char *level)
{
    char want[600];
    if (object[0] != '\0')
        snprintf(want, sizeof(want), "{\"check\":\"%s\",\"object\":\"%s\",\"level\":\"%s\"",
                 check, object, level);
    else
        snprintf(want, sizeof(want), "{\"check\":\"%s\",\"object\":", check);
    const char *at = strstr(report, want);
    ck_assert_msg(at != NULL, "no %s of %s in: %s", check, object, report);
    if (object[0] == '\0') {
        char lv[64];
        snprintf(lv, sizeof(lv), "\"level\":\"%s\"", level);
        const char *l = strstr(at, "\"level\":");
        ck_assert_msg(l != NULL && strncmp(l, lv, strlen(lv)) == 0, "%s is not %s in: %s",
                      check, level, report);
    }
}

static void redis_cli(const char *args)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "redis-cli -h 127.0.0.1 -p %d %s >/dev/null", h_redis_port(),
             args);
    ck_assert_msg(system(cmd) == 0, "redis-cli %s failed", args);
}

/* The test broker's major version, as tests/servers.sh says it runs. */
static int broker_major(void)
{
    const char *v = getenv("SEKALI_RABBITMQ");
    return v != NULL && v[0] != '\0' ? atoi(v) : 3;
}

START_TEST(test_the_healthy_test_servers_pass_every_check)
{
    struct h_run r;
    h_run_open(&r, "doc-healthy");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = JOB_TIMEOUT });
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    /* One warning, earned by the broker's version alone: RabbitMQ 3.x is
     * past its end of life, and under RabbitMQ 4 the test's classic work
     * queue is not replicated. */
    ck_assert_msg(code == 6, "doctor exited %d: %s", code, report);
    const char *warn = strstr(report, "\"level\":\"warn\"");
    ck_assert_msg(warn != NULL && strstr(warn + 1, "\"level\":\"warn\"") == NULL &&
                  strstr(report, "\"level\":\"fail\"") == NULL, "%s", report);
    if (broker_major() >= 4)
        has_verdict(report, "queue.type", r.queue, "warn");
    else
        has_verdict(report, "broker.version", "", "warn");
    has_verdict(report, "schema", "", "pass");
    has_verdict(report, "queue.arguments", r.queue, "pass");
    has_verdict(report, "redis.maxmemory_policy", "", "pass");
    has_verdict(report, "clock.skew", "host-postgres", "pass");
    has_verdict(report, "retention.memory", "", "pass");
    /* The test server's shared buffers: the default 128 MB. */
    has_verdict(report, "postgres.huge_pages", "", "pass");
    /* sekalid's own start checks found nothing to log either. */
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_DOCTOR_PASSED, NULL) == 1, 20000,
           "sekalid should have run its start checks");
    ck_assert_int_eq(h_count_events(r.log, NULL, "doctor_failed", NULL), 0);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_redis_that_evicts_keys_fails)
{
    struct h_run r;
    h_run_open(&r, "doc-lru");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, JOB_TIMEOUT);
    redis_cli("CONFIG SET maxmemory-policy allkeys-lru");
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    redis_cli("CONFIG SET maxmemory-policy noeviction");
    ck_assert_int_eq(code, 7);
    has_verdict(report, "redis.maxmemory_policy", "", "fail");
    ck_assert_msg(strstr(report, "allkeys-lru") != NULL, "%s", report);
    h_run_close(&r);
}
END_TEST

START_TEST(test_a_queue_without_the_dead_letter_arguments_fails)
{
    struct h_run r;
    h_run_open(&r, "doc-nodlx");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, JOB_TIMEOUT);
    h_declare_as_foreign(r.queue, amqp_empty_table);
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    ck_assert_int_eq(code, 7);
    has_verdict(report, "queue.arguments", r.queue, "fail");
    ck_assert_msg(strstr(report, "x-dead-letter") != NULL, "the broker's words: %s", report);
    h_run_close(&r);
}
END_TEST

/* Configured without one; and declared without one in the broker while
 * the configuration asks for 5. */
START_TEST(test_a_quorum_queue_without_a_delivery_limit_fails)
{
    struct h_run r;
    h_run_open(&r, "doc-quorum");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1,
                              JOB_TIMEOUT "    queue_type: quorum\n");
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_declare(r.b, r.queue, &(struct sk_queue_shape){ .quorum = true },
                                    &err) == SK_OK, "%s", err.msg);
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    ck_assert_int_eq(code, 7);
    has_verdict(report, "queue.delivery_limit", r.queue, "fail");
    has_verdict(report, "queue.arguments", r.queue, "pass");

    h_config_replace(r.config, "    queue_type: quorum\n", "    queue_type: quorum\n"
                                                          "    delivery_limit: 5\n");
    code = doctor(r.config, NULL, NULL, &report);
    ck_assert_int_eq(code, 7);
    has_verdict(report, "queue.delivery_limit", r.queue, "pass");
    has_verdict(report, "queue.arguments", r.queue, "fail");
    ck_assert_msg(strstr(report, "x-delivery-limit") != NULL, "the broker's words: %s", report);
    h_run_close(&r);
}
END_TEST

/* The test broker's consumer_timeout is SEKALI_AMQP_CONSUMER_TIMEOUT (1h
 * by default, tests/servers.sh): a job_timeout of 2h is past it. */
START_TEST(test_a_consumer_timeout_below_job_timeout_fails)
{
    struct h_run r;
    h_run_open(&r, "doc-ct");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, "    job_timeout: 23h\n");
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    ck_assert_int_eq(code, 7);
    has_verdict(report, "queue.consumer_timeout", r.queue, "fail");
    h_run_close(&r);
}
END_TEST

START_TEST(test_a_host_clock_a_minute_ahead_fails_the_skew_checks)
{
    glob_t g;
    ck_assert_msg(glob("/usr/lib/*/faketime/libfaketime.so.1", 0, NULL, &g) == 0,
                  "libfaketime not installed (Debian: faketime)");
    char prefix[1200];
    /* Under ASan the preloaded library comes before ASan's runtime, which
     * ASan refuses unless told that this order is meant. */
    snprintf(prefix, sizeof(prefix), "LD_PRELOAD=%s FAKETIME=+60s "
             "ASAN_OPTIONS=\"${ASAN_OPTIONS:-}:verify_asan_link_order=0\"", g.gl_pathv[0]);
    globfree(&g);
    struct h_run r;
    h_run_open(&r, "doc-skew");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, JOB_TIMEOUT);
    char *report;
    int code = doctor(r.config, prefix, NULL, &report);
    ck_assert_int_eq(code, 7);
    has_verdict(report, "clock.skew", "host-postgres", "fail");
    has_verdict(report, "clock.skew", "host-redis", "fail");
    h_run_close(&r);
}
END_TEST

/* A database of its own, never migrated: doctor fails the schema, and
 * sekalid refuses it at start with exit 2. */
START_TEST(test_an_unmigrated_database_fails_and_sekalid_refuses_it)
{
    struct h_run r;
    h_run_open(&r, "doc-bare");
    h_pg_exec(r.pg, "DROP DATABASE IF EXISTS sekali_doctor_bare");
    h_pg_exec(r.pg, "CREATE DATABASE sekali_doctor_bare");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, JOB_TIMEOUT);
    h_config_replace(r.config, "dbname=sekali ", "dbname=sekali_doctor_bare ");
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    ck_assert_int_eq(code, 7);
    has_verdict(report, "schema", "", "fail");
    ck_assert_msg(strstr(report, "run sekalictl migrate") != NULL, "%s", report);

    pid_t sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    int status = h_wait_exit(sekalid, 20000, "sekalid on an unmigrated database");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2, "expected exit 2, got 0x%x",
                  status);
    char log[1200];
    snprintf(log, sizeof(log), "%s/sekalid.log", r.dir);
    ck_assert_int_eq(h_count_lines(log, "run sekalictl migrate"), 1);
    h_pg_exec(r.pg, "DROP DATABASE sekali_doctor_bare");
    h_run_close(&r);
}
END_TEST

/* Five attempts of up to 30 minutes each (job_timeout) spread over more
 * than the hour the queue keeps keys; ten-second ones do not. */
START_TEST(test_a_retention_shorter_than_the_redelivery_path_warns)
{
    struct h_run r;
    h_run_open(&r, "doc-path");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1,
                              "    job_timeout: 30m\n    retention: 1h\n");
    char *report;
    doctor(r.config, NULL, NULL, &report);
    has_verdict(report, "retention.redelivery", r.queue, "warn");
    ck_assert_msg(strstr(report, "a late redelivery is quarantined") != NULL, "%s", report);
    free(r.config);
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, JOB_TIMEOUT "    retention: 1h\n");
    doctor(r.config, NULL, NULL, &report);
    has_verdict(report, "retention.redelivery", r.queue, "pass");

    /* Five attempts of ten minutes fit in the hour, but a worker dying
     * under the job earns it up to max_crashes (3) more deliveries. */
    free(r.config);
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1,
                              "    job_timeout: 10m\n    retention: 1h\n");
    doctor(r.config, NULL, NULL, &report);
    has_verdict(report, "retention.redelivery", r.queue, "warn");
    ck_assert_msg(strstr(report, "8 deliveries") != NULL, "%s", report);
    free(r.config);
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1,
                              "    job_timeout: 10m\n    retention: 1h\n    max_crashes: 0\n");
    doctor(r.config, NULL, NULL, &report);
    has_verdict(report, "retention.redelivery", r.queue, "pass");
    h_run_close(&r);
}
END_TEST

/* The keys' primary key against the memory PostgreSQL was told it has
 * (effective_cache_size, set for doctor's session through PGOPTIONS): a
 * page of it is more than half of 8 kB. */
START_TEST(test_a_key_index_beyond_the_servers_memory_warns)
{
    struct h_run r;
    h_run_open(&r, "doc-memory");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, JOB_TIMEOUT);
    char *report;
    doctor(r.config, "PGOPTIONS='-c effective_cache_size=8kB'", NULL, &report);
    has_verdict(report, "retention.memory", "", "warn");
    ck_assert_msg(strstr(report, "more than half of effective_cache_size (8192 bytes)") != NULL,
                  "%s", report);
    doctor(r.config, NULL, NULL, &report);
    has_verdict(report, "retention.memory", "", "pass");
    h_run_close(&r);
}
END_TEST

/* An outbox job published two hours ago and never claimed, on a queue
 * that keeps keys one hour. */
START_TEST(test_a_job_waiting_longer_than_the_retention_fails)
{
    struct h_run r;
    h_run_open(&r, "doc-old");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, JOB_TIMEOUT "    retention: 1h\n");
    char sql[1024];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali.outbox (job_id, queue, job_type, body, "
             "idempotency_key, run_at, created_at, published_at) VALUES ('%s-old', '%s', 'test', "
             "'x', '%s-old', now() - interval '2 hours', now() - interval '2 hours', "
             "now() - interval '2 hours')", r.queue, r.queue, r.queue);
    h_pg_exec(r.pg, sql);
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.outbox WHERE queue = '%s'", r.queue);
    h_pg_exec(r.pg, sql);
    ck_assert_int_eq(code, 7);
    has_verdict(report, "retention", r.queue, "fail");
    h_run_close(&r);
}
END_TEST

/* Polls the log until it holds at least n lines of event from role (server
 * NULL: any), or timeout_ms passed; the count seen. Does not fail the test,
 * so that a server setting can be set back before the assertions. */
static int wait_events(const char *log, const char *role, const char *event, const char *server,
                       int n, int timeout_ms)
{
    int64_t deadline = h_now_ms() + h_ms(timeout_ms);
    int seen;
    while ((seen = h_count_events(log, role, event, server)) < n && h_now_ms() < deadline)
        h_nap();
    return seen;
}

/* sekalid's own start checks, against three real misconfigurations at once:
 * Redis evicting, the queue declared without the dead-letter arguments, and
 * a job_timeout of 2h past the consumer_timeout of 1h that amqp.
 * consumer_timeout says. The generation's first worker logs each failure
 * once (event doctor_failed) and sekalid runs on; the worker restarted
 * after a kill does not check again; a reload does, and logs each once
 * more. */
START_TEST(test_sekalid_logs_each_failed_start_check_once)
{
    struct h_run r;
    h_run_open(&r, "doc-start");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1, "    job_timeout: 2h\n");
    h_config_replace(r.config, "  heartbeat: 30s\n", "  heartbeat: 30s\n"
                                                      "  consumer_timeout: 1h\n");
    h_declare_as_foreign(r.queue, amqp_empty_table);
    redis_cli("CONFIG SET maxmemory-policy allkeys-lru");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);

    /* The worker goes on after its checks: its declaration, which differs
     * from the queue's, is refused, and it retries as in an outage. */
    int at_start = wait_events(r.log, "worker", "doctor_failed", NULL, 3, 20000);
    int refused = wait_events(r.log, "worker", "outage_begin", "rabbitmq", 1, 20000);
    pid_t worker = h_worker_pid(r.sekalid, 0);
    int died = 0, refused_again = 0;
    if (worker > 0 && kill(worker, SIGKILL) == 0) {
        died = wait_events(r.log, "supervisor", "worker_died", NULL, 1, 20000);
        refused_again = wait_events(r.log, "worker", "outage_begin", "rabbitmq", 2, 30000);
    }
    int after_restart = h_count_events(r.log, "worker", "doctor_failed", NULL);
    kill(r.sekalid, SIGHUP);
    int reloaded = wait_events(r.log, "supervisor", "reloaded", NULL, 1, 20000);
    int after_reload = wait_events(r.log, "worker", "doctor_failed", NULL, 6, 20000);
    bool running = !h_process_gone(r.sekalid);
    redis_cli("CONFIG SET maxmemory-policy noeviction");
    h_stop_sekalid(r.sekalid, r.dir);

    ck_assert_msg(at_start == 3, "%d doctor_failed lines at start, expected 3", at_start);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_DOCTOR_FAILED, "check",
                                         "redis.maxmemory_policy", NULL), 2);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_DOCTOR_FAILED, "check",
                                         "queue.arguments", NULL), 2);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_DOCTOR_FAILED, "check",
                                         "queue.consumer_timeout", NULL), 2);
    ck_assert_int_ge(h_count_lines(r.log, "allkeys-lru"), 1);
    ck_assert_msg(refused >= 1, "the worker should have gone on to declare the queue");
    ck_assert_msg(worker > 0 && died == 1 && refused_again >= 2,
                  "the worker should have been killed (%ld) and restarted", (long)worker);
    ck_assert_msg(after_restart == 3, "a restart checked again: %d lines", after_restart);
    ck_assert_int_eq(reloaded, 1);
    ck_assert_msg(after_reload == 6, "%d doctor_failed lines after the reload, expected 6",
                  after_reload);
    ck_assert_msg(running, "sekalid should keep running with failed checks");
    h_run_close(&r);
}
END_TEST

/* A reload onto a database without the migrations keeps the running
 * generation: its workers go on consuming. */
START_TEST(test_a_reload_onto_an_unmigrated_database_keeps_the_old_config)
{
    struct h_run r;
    h_run_open(&r, "doc-reload");
    h_pg_exec(r.pg, "DROP DATABASE IF EXISTS sekali_doctor_bare2");
    h_pg_exec(r.pg, "CREATE DATABASE sekali_doctor_bare2");
    h_run_start(&r, &(struct h_run_opts){ .workers = 1, .queue_yaml = JOB_TIMEOUT });
    h_config_replace(r.config, "dbname=sekali ", "dbname=sekali_doctor_bare2 ");
    ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
    H_WAIT(h_count_events(r.log, "supervisor", SK_EVENT_RELOAD_FAILED, NULL) == 1, 20000,
           "the reload should fail");
    ck_assert_int_eq(h_count_lines(r.log, "run sekalictl migrate"), 1);
    h_publish(r.b, r.queue, "test", "after-reload", "k-after", NULL, "ok");
    H_WAIT(h_effects(&r, "k-after") == 1, 20000, "the old generation should still run jobs");
    h_run_stop(&r);
    h_pg_exec(r.pg, "DROP DATABASE sekali_doctor_bare2");
    h_run_close(&r);
}
END_TEST

/* Starts r with one schedule, name, running `every` into r's own queue. */
static void start_with_schedule(struct h_run *r, const char *label, const char *name,
                                const char *every)
{
    h_run_open(r, label);
    char top[512];
    snprintf(top, sizeof(top), "schedules:\n  - name: %s\n    every: %s\n    queue: %s\n",
             name, every, r->queue);
    h_run_start(r, &(struct h_run_opts){ .workers = 1, .top_yaml = top });
}

static long long runners_of(PGconn *pg, const char *name)
{
    return h_pg_count(pg, "SELECT count(*) FROM sekali.schedule_runners WHERE name = '%s'", name);
}

/* Two sekalids (two config files, so two runners, as two hosts would be)
 * run one schedule name with different specs: doctor warns and names
 * both; when the second stops running the name (a reload renames its
 * schedule), its row goes and doctor passes. */
START_TEST(test_a_schedule_run_with_two_specs_warns)
{
    struct h_run a, b;
    char name[128];
    h_unique_name(name, sizeof(name), "doc-sched");
    start_with_schedule(&a, "doc-spec-a", name, "1h");
    H_WAIT(runners_of(a.pg, name) == 1, 20000, "the first scheduler should report its spec");
    char *report;
    int code = doctor(a.config, NULL, NULL, &report);
    has_verdict(report, "schedule.spec", name, "pass");
    ck_assert_msg(strstr(report, "every 1h into") != NULL, "%s", report);

    start_with_schedule(&b, "doc-spec-b", name, "2h");
    H_WAIT(runners_of(a.pg, name) == 2, 20000, "the second scheduler should report its spec");
    code = doctor(a.config, NULL, NULL, &report);
    ck_assert_msg(code == 6, "doctor exited %d, not 6 (a warning): %s", code, report);
    has_verdict(report, "schedule.spec", name, "warn");
    ck_assert_msg(strstr(report, "every 2h into") != NULL && strstr(report, b.config) != NULL,
                  "the warning should name the other spec and its runner: %s", report);

    char renamed[160];
    snprintf(renamed, sizeof(renamed), "%s-renamed", name);
    h_config_replace(b.config, name, renamed);
    ck_assert_int_eq(kill(b.sekalid, SIGHUP), 0);
    H_WAIT(runners_of(a.pg, name) == 1 && runners_of(a.pg, renamed) == 1, 20000,
           "the reloaded scheduler should report its new name and drop the old one");
    code = doctor(a.config, NULL, NULL, &report);
    has_verdict(report, "schedule.spec", name, "pass");
    h_run_stop(&b);
    h_run_close(&b);
    h_run_stop(&a);
    h_run_close(&a);
}
END_TEST

/* Each server's version is reported; RabbitMQ 3.x warns as past its end of
 * life; a quorum queue's delivery limit not above sekali's own attempts
 * (max_crashes 3 by default) warns, as the broker would dead-letter first. */
START_TEST(test_versions_are_reported_and_a_low_delivery_limit_warns)
{
    struct h_run r;
    h_run_open(&r, "doc-versions");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1,
                              JOB_TIMEOUT "    queue_type: quorum\n    delivery_limit: 3\n");
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_declare(r.b, r.queue, &(struct sk_queue_shape){
                                        .quorum = true, .delivery_limit = 3 }, &err) == SK_OK,
                  "%s", err.msg);
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    ck_assert_msg(code == 6, "doctor exited %d: %s", code, report);
    has_verdict(report, "broker.version", "", broker_major() >= 4 ? "pass" : "warn");
    char want[64];
    snprintf(want, sizeof(want), "RabbitMQ %d.", broker_major());
    ck_assert_msg(strstr(report, want) != NULL, "no %s in: %s", want, report);
    has_verdict(report, "postgres.version", "", "pass");
    ck_assert_msg(strstr(report, "PostgreSQL 1") != NULL, "%s", report);
    has_verdict(report, "redis.version", "", "pass");
    ck_assert_msg(strstr(report, "Redis 7") != NULL || strstr(report, "Valkey 8") != NULL,
                  "%s", report);
    has_verdict(report, "queue.delivery_limit_low", r.queue, "warn");
    ck_assert_msg(strstr(report, "delivery_limit 3 is not above") != NULL, "%s", report);
    h_run_close(&r);
}
END_TEST

/* RabbitMQ 4.3 gives quorum queues strict priorities (x-max-priority up
 * to 31); 3.x and 4.0-4.2 refuse the argument. On the test brokers (3.10,
 * and 4.0 under SEKALI_RABBITMQ=4) doctor fails it before a start, and a
 * worker names the broker's version instead of passing on "invalid arg".
 * 4.3 itself is not run here: Debian 13 ships 4.0. */
START_TEST(test_priorities_on_a_quorum_queue_need_rabbitmq_4_3)
{
    struct h_run r;
    h_run_open(&r, "doc-qq-prio");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 1,
                              JOB_TIMEOUT "    queue_type: quorum\n    delivery_limit: 30\n"
                              "    max_priority: 9\n");
    char *report;
    int code = doctor(r.config, NULL, NULL, &report);
    ck_assert_msg(code == 7, "doctor exited %d: %s", code, report);
    has_verdict(report, "queue.priorities", r.queue, "fail");
    ck_assert_msg(strstr(report, "needs RabbitMQ 4.3 or later") != NULL, "%s", report);

    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_count_lines(r.log, "needs RabbitMQ 4.3 or later, and this broker is") > 0, 20000,
           "the worker should say why it cannot declare %s", r.queue);
    bool exists = true;
    uint32_t messages, consumers;
    struct sk_err err = { 0 };
    ck_assert_int_eq(sk_broker_queue_probe(r.b, r.queue, &exists, &messages, &consumers, &err),
                     SK_OK);
    ck_assert_msg(!exists, "%s should not have been declared without its priorities", r.queue);
    h_stop_sekalid(r.sekalid, r.dir);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_the_healthy_test_servers_pass_every_check,
        test_redis_that_evicts_keys_fails,
        test_a_queue_without_the_dead_letter_arguments_fails,
        test_a_quorum_queue_without_a_delivery_limit_fails,
        test_a_consumer_timeout_below_job_timeout_fails,
        test_a_host_clock_a_minute_ahead_fails_the_skew_checks,
        test_an_unmigrated_database_fails_and_sekalid_refuses_it,
        test_a_job_waiting_longer_than_the_retention_fails,
        test_a_retention_shorter_than_the_redelivery_path_warns,
        test_a_key_index_beyond_the_servers_memory_warns,
        test_a_reload_onto_an_unmigrated_database_keeps_the_old_config,
        test_sekalid_logs_each_failed_start_check_once,
        test_a_schedule_run_with_two_specs_warns,
        test_versions_are_reported_and_a_low_delivery_limit_warns,
        test_priorities_on_a_quorum_queue_need_rabbitmq_4_3,
        NULL,
    };
    return h_run_suite(h_suite("doctor", 60, tests));
}
