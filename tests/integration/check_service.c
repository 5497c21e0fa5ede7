/* check_service.c - sekalid as a service: what it tells systemd, how it
 * drains on SIGTERM, how it answers wrong credentials, and what its logs and
 * `sekalid -t` never contain. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "harness.h"

/* A datagram socket standing in for systemd's notification socket, at
 * dir/notify.sock; env gets the NOTIFY_SOCKET=... that names it. */
static int notify_socket(const char *dir, char *env, size_t size)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/notify.sock", dir);
    snprintf(env, size, "NOTIFY_SOCKET=%s", path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    ck_assert_uint_lt(strlen(path), sizeof(addr.sun_path));
    strcpy(addr.sun_path, path);
    ck_assert_msg(bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0, "bind(%s): %s", path,
                  strerror(errno));
    struct timeval timeout = { .tv_sec = 0, .tv_usec = 50 * 1000 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    return fd;
}

/* Appends every datagram waiting on fd to log (one per line). */
static void drain_notifications(int fd, char *log, size_t size)
{
    char buf[1024];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf) - 1, 0)) > 0) {
        buf[n] = '\0';
        size_t used = strlen(log);
        snprintf(log + used, size - used, "%s\n", buf);
    }
}

/* Collects notifications into heard until READY=1 is among them. */
static void wait_ready(int fd, char *heard, size_t size)
{
    H_WAIT((drain_notifications(fd, heard, size), strstr(heard, "READY=1") != NULL),
           20000, "sekalid never sent READY=1; heard:\n%s", heard);
}

/* Starts sekalid on r->config under a 1 s systemd watchdog and waits for
 * its READY=1; returns the notify socket, heard holding what came. */
static int start_watched(struct h_run *r, char *heard, size_t size)
{
    char sock_env[1100];
    int fd = notify_socket(r->dir, sock_env, sizeof(sock_env));
    const char *env[] = { sock_env, "WATCHDOG_USEC=1000000", NULL };
    r->sekalid = h_start_sekalid("sekalid", r->config, r->dir, env);
    heard[0] = '\0';
    wait_ready(fd, heard, size);
    return fd;
}

/* Collects notifications into heard until a READY=1 follows RELOADING=1. */
static void wait_reloaded(int fd, char *heard, size_t size, int timeout_ms)
{
    H_WAIT((drain_notifications(fd, heard, size),
            strstr(heard, "RELOADING=1") != NULL &&
            strstr(strstr(heard, "RELOADING=1"), "READY=1") != NULL), timeout_ms,
           "expected RELOADING=1 then READY=1; heard:\n%s", heard);
}

/* Starts sekalid for r with 2 workers and a systemd notify socket, and
 * waits for READY=1; returns the socket, notifications collect in heard. */
static int start_notified(struct h_run *r, char *heard, size_t size)
{
    r->config = h_write_config(r->dir, r->queue, H_EFFECT, 2, NULL);
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    char sock_env[1100];
    int fd = notify_socket(r->dir, sock_env, sizeof(sock_env));
    const char *env[] = { sock_env, NULL };
    r->sekalid = h_start_sekalid("sekalid", r->config, r->dir, env);
    heard[0] = '\0';
    wait_ready(fd, heard, size);
    return fd;
}

/* Appends lines to r's config (under its one queue), sends SIGHUP and
 * waits for the reload to be over, refused or not. */
static void reload_appending(struct h_run *r, const char *lines, int fd, char *heard,
                             size_t size, int timeout_ms)
{
    FILE *f = fopen(r->config, "a");
    ck_assert_ptr_nonnull(f);
    fputs(lines, f);
    fclose(f);
    ck_assert_int_eq(kill(r->sekalid, SIGHUP), 0);
    wait_reloaded(fd, heard, size, timeout_ms);
}

START_TEST(test_systemd_hears_ready_status_watchdog_reloading_stopping_in_order)
{
    /* sekalid is watched through what it tells systemd, so it is started
     * here rather than waited for on the broker. */
    struct h_run r;
    h_run_open(&r, "notify");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 2, NULL);
    static char heard[65536];
    int fd = start_watched(&r, heard, sizeof(heard));
    H_WAIT((drain_notifications(fd, heard, sizeof(heard)),
            strstr(strstr(heard, "READY=1"), "WATCHDOG=1") != NULL), 5000,
           "sekalid should ping the 1 s watchdog after READY; heard:\n%s", heard);
    ck_assert_msg(strstr(heard, "STATUS=") != NULL, "no STATUS= in:\n%s", heard);
    char expected[256];
    snprintf(expected, sizeof(expected), "STATUS=%s: 2/2 workers consuming", r.queue);
    ck_assert_msg(strstr(heard, expected) != NULL, "expected \"%s\" in:\n%s", expected, heard);

    /* A reload of the same file: RELOADING=1, then READY=1 again. */
    ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
    wait_reloaded(fd, heard, sizeof(heard), 20000);
    const char *reloading = strstr(heard, "RELOADING=1");
    ck_assert_msg(reloading > strstr(heard, "WATCHDOG=1"),
                  "RELOADING=1 should follow the first WATCHDOG=1; heard:\n%s", heard);

    ck_assert_int_eq(kill(r.sekalid, SIGTERM), 0);
    int status = h_wait_exit(r.sekalid, 30000, "sekalid after SIGTERM");
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    drain_notifications(fd, heard, sizeof(heard));
    const char *stopping = strstr(heard, "STOPPING=1");
    ck_assert_msg(stopping != NULL && stopping > strstr(heard, "RELOADING=1"),
                  "STOPPING=1 should come last; heard:\n%s", heard);
    close(fd);
    h_run_close(&r);
}
END_TEST

START_TEST(test_sigterm_drains_in_flight_jobs_without_loss_or_doubling)
{
    struct h_run r;
    h_run_open(&r, "drain");
    h_run_start(&r, &(struct h_run_opts){ .workers = 4 });
    for (int i = 0; i < 50; i++) {
        char id[32];
        snprintf(id, sizeof(id), "slow-%d", i);
        h_publish(r.b, r.queue, "test", id, NULL, NULL, "sleep:200");
    }
    H_WAIT(h_effects(&r, NULL) >= 4, 20000, "some jobs should complete first");

    /* Jobs are in flight and more are prefetched: stop now. */
    int64_t asked = h_now_ms();
    h_stop_sekalid(r.sekalid, r.dir);
    long long done_first = h_effects(&r, NULL);
    ck_assert_msg(done_first < 50, "the stop should interrupt the run (all 50 were done)");
    ck_assert_int_le(h_now_ms() - asked, h_ms(20000));
    /* Nothing lost: what was not done is back in the queue. */
    ck_assert_int_eq(h_queue_depth(r.b, r.queue), (uint32_t)(50 - done_first));

    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_effects(&r, NULL) == 50, 60000,
           "the rest should complete after restart");
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT job_id) FROM sekali_test.effects "
                                      "WHERE queue = '%s'", r.queue), 50);
    ck_assert_int_eq(h_effects(&r, NULL), 50);

    /* Credentials never reach the logs: the test config holds passwords in
     * both the AMQP URL and the PostgreSQL conninfo. */
    ck_assert_int_eq(h_count_lines(r.log, "password="), 0);
    ck_assert_int_eq(h_count_lines(r.log, ":sekali@"), 0);
    h_run_close(&r);
}
END_TEST

START_TEST(test_sighup_with_a_broken_config_keeps_the_old_one)
{
    struct h_run r;
    h_run_open(&r, "badreload");
    static char heard[65536];
    int fd = start_notified(&r, heard, sizeof(heard));

    reload_appending(&r, "    prefetch: lots\n", fd, heard, sizeof(heard), 10000);
    /* The broken line is the file's last, wherever the harness's config
     * ends. */
    char *text = h_read_file(r.config);
    int last = 0;
    for (const char *c = text; *c != '\0'; c++)
        last += *c == '\n';
    free(text);
    char expected[1200];
    snprintf(expected, sizeof(expected), "STATUS=reload failed, running the previous "
             "configuration: %s:%d:", r.config, last);
    ck_assert_msg(strstr(heard, expected) != NULL, "expected \"%s\" in:\n%s", expected, heard);
    ck_assert_int_eq(h_count_events(r.log, "supervisor", SK_EVENT_RELOAD_FAILED, NULL), 1);

    /* Still running on the old configuration. */
    h_publish(r.b, r.queue, "test", "after-1", NULL, NULL, "ok");
    H_WAIT(h_effects(&r, NULL) == 1, 20000, "a job after the failed reload should still run");
    ck_assert_int_eq(h_consumers(r.b, r.queue), 2);
    h_stop_sekalid(r.sekalid, r.dir);
    close(fd);
    h_run_close(&r);
}
END_TEST

/* A reload whose handler config the handler's check() rejects is refused
 * before any new worker starts: the handler's message in the log and in
 * STATUS=, and the old generation goes on serving the queue. Before ABI 1.3
 * the new workers' init() found the mistake, and the daemon stopped. */
START_TEST(test_sighup_with_a_handler_config_its_check_rejects_keeps_the_old_generation)
{
    struct h_run r;
    h_run_open(&r, "checkreload");
    static char heard[65536];
    int fd = start_notified(&r, heard, sizeof(heard));
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_STARTED, NULL), 2);

    reload_appending(&r, "    config:\n      check_fail: table 1x is not a table\n", fd, heard,
                     sizeof(heard), 10000);
    ck_assert_msg(strstr(heard, "STATUS=reload failed, running the previous configuration: "
                                "queue ") != NULL &&
                  strstr(heard, "rejects its config: check_fail: table 1x is not a table") != NULL,
                  "the status should carry the handler's message; heard:\n%s", heard);
    ck_assert_int_eq(h_count_events(r.log, "supervisor", SK_EVENT_RELOAD_FAILED, NULL), 1);

    h_publish(r.b, r.queue, "test", "after-1", NULL, NULL, "ok");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                      r.queue) == 1, 20000, "a job after the refused reload should still run");
    ck_assert_int_eq(h_consumers(r.b, r.queue), 2);
    /* No new worker was started, and none stopped. */
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_STARTED, NULL), 2);
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_STOPPING, NULL), 0);
    ck_assert(!h_process_gone(r.sekalid));
    h_stop_sekalid(r.sekalid, r.dir);
    close(fd);
    h_run_close(&r);
}
END_TEST

/* A reload whose new workers exit 2 at start (here the handler's init()
 * refuses a config its check() lets through) is abandoned: the previous
 * generation, which serves until the new one consumes, stays. Before, the
 * supervisor took the exit for a configuration that cannot run and stopped
 * sekalid with exit 2. */
START_TEST(test_sighup_whose_new_workers_exit_2_at_start_keeps_the_old_generation)
{
    struct h_run r;
    h_run_open(&r, "initreload");
    static char heard[65536];
    int fd = start_notified(&r, heard, sizeof(heard));

    reload_appending(&r, "    config:\n      fail_init: yes\n", fd, heard, sizeof(heard), 20000);
    /* The fault happened: a new worker's init() failed and it exited 2. */
    ck_assert_int_ge(h_count_events(r.log, "worker", SK_EVENT_WORKER_CANNOT_START, NULL), 1);
    ck_assert_int_eq(h_count_events(r.log, "supervisor", SK_EVENT_RELOAD_FAILED, NULL), 1);
    ck_assert_msg(strstr(heard, "STATUS=reload failed, running the previous configuration: "
                                "worker for queue") != NULL,
                  "the status should say the reload failed; heard:\n%s", heard);

    h_publish(r.b, r.queue, "test", "after-1", NULL, NULL, "ok");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                      r.queue) == 1, 20000, "a job after the abandoned reload should still run");
    H_WAIT(h_consumers(r.b, r.queue) == 2, 20000, "the old generation's 2 workers should "
           "consume, and only they (consumers now %u)", h_consumers(r.b, r.queue));
    ck_assert_int_eq(h_count_events(r.log, NULL, SK_EVENT_WORKER_CANNOT_RUN, NULL), 0);
    ck_assert(!h_process_gone(r.sekalid));
    h_stop_sekalid(r.sekalid, r.dir);
    close(fd);
    h_run_close(&r);
}
END_TEST

START_TEST(test_sighup_applies_new_workers_and_handler_under_load_exactly_once)
{
    struct h_run r;
    h_run_open(&r, "reload");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2 });
    for (int i = 0; i < 300; i++) {
        char id[32];
        snprintf(id, sizeof(id), "job-%d", i);
        h_publish(r.b, r.queue, "test", id, NULL, NULL, "sleep:5");
    }
    H_WAIT(h_effects(&r, NULL) >= 30, 20000, "jobs should be running");

    /* A rebuilt handler goes in under a new name (a loaded .so is never
     * replaced in place), with a new worker count. */
    char handler[1024], cmd[2300];
    snprintf(handler, sizeof(handler), "%s/effect-v2.so", r.dir);
    snprintf(cmd, sizeof(cmd), "cp %s/" H_EFFECT " %s && chmod 755 %s", h_build_dir(), handler,
             r.dir);
    ck_assert_int_eq(system(cmd), 0);
    char *tmp = h_write_config(r.dir, r.queue, H_EFFECT, 3, NULL);
    char *text = h_read_file(tmp);
    char old_handler[1024];
    snprintf(old_handler, sizeof(old_handler), "%s/" H_EFFECT, h_build_dir());
    char *at = strstr(text, old_handler);
    ck_assert_ptr_nonnull(at);
    FILE *f = fopen(r.config, "w");
    fprintf(f, "%.*s%s%s", (int)(at - text), text, handler, at + strlen(old_handler));
    fclose(f);
    free(text);
    free(tmp);
    ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);

    H_WAIT(h_count_event_where(r.log, SK_EVENT_RELOADED, "workers", "3", "queues", "1",
                               NULL) == 1, 20000,
           "the new configuration should be applied");
    H_WAIT(h_consumers(r.b, r.queue) == 3, 30000, "the new generation's 3 workers should "
           "consume and the old 2 drain away (consumers now %u)", h_consumers(r.b, r.queue));
    H_WAIT(h_effects(&r, NULL) == 300, 60000, "all jobs should complete");
    h_run_stop(&r);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_STARTED, "role", "worker",
                                         "handler_path", handler, NULL), 3);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT job_id) FROM sekali_test.effects "
                                      "WHERE queue = '%s'", r.queue), 300);
    ck_assert_int_eq(h_effects(&r, NULL), 300);
    h_run_close(&r);
}
END_TEST

/* `sekalid -t` on a conninfo whose password is malformed: exit 2, the
 * position and the problem, never the password. */
START_TEST(test_check_mode_reports_a_bad_conninfo_without_its_password)
{
    h_init();
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s/sekalid -t -c tests/data/bad_secret_pg_uri_percent.yaml 2>&1",
             h_build_dir());
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    static char out[8192];
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2, "expected exit 2, got 0x%x: %s",
                  status, out);
    ck_assert_msg(strstr(out, "tests/data/bad_secret_pg_uri_percent.yaml:4:13: conninfo: the "
                              "password in the URI is malformed") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "Sup3r") == NULL, "the password is shown: %s", out);
}
END_TEST

/* Starts sekalid on config (with env), expects exit 2 with `expected` in its
 * log exactly once, and `secret` nowhere in it. */
static void assert_refused_at_start(const char *dir, const char *config, const char *const *env,
                                    const char *expected, const char *secret)
{
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, env);
    int status = h_wait_exit(sekalid, 30000, "sekalid with wrong credentials");
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2,
                  "expected exit 2, got status 0x%x (see %s)", status, log);
    ck_assert_msg(h_count_lines(log, expected) == 1, "%s should say \"%s\" once", log, expected);
    ck_assert_int_ge(h_count_events(log, NULL, SK_EVENT_WORKER_CANNOT_RUN, NULL), 1);
    if (secret != NULL)
        ck_assert_msg(h_count_lines(log, secret) == 0, "%s shows the password", log);
}

START_TEST(test_wrong_amqp_password_stops_sekalid_with_exit_2)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "amqp-auth");
    char *dir = h_tmpdir("amqp-auth");
    char *config = h_write_config(dir, queue, H_EFFECT, 1, NULL);
    /* amqp://user:password@host:port/vhost: swap the password. */
    const char *url = h_amqp_url(), *colon = strchr(strstr(url, "://") + 3, ':');
    const char *at = strchr(url, '@');
    ck_assert_msg(colon != NULL && at != NULL && colon < at, "no password in %s", url);
    char from[256];
    snprintf(from, sizeof(from), "%.*s", (int)(at - colon + 1), colon);
    h_config_replace(config, from, ":wrong-Pa55word@");
    assert_refused_at_start(dir, config, NULL, "RabbitMQ refused sekali's credentials",
                            "wrong-Pa55word");
    free(config);
    free(dir);
}
END_TEST

/* The test servers authenticate TCP logins with scram-sha-256 (servers.sh). */
START_TEST(test_wrong_postgres_password_stops_sekalid_with_exit_2)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "pg-auth");
    char *dir = h_tmpdir("pg-auth");
    char *config = h_write_config(dir, queue, H_EFFECT, 1, NULL);
    ck_assert_msg(strstr(h_pg_conninfo(), "password=") != NULL, "no password in conninfo");
    h_config_replace(config, "password=", "password=wrong-Pa55word");
    assert_refused_at_start(dir, config, NULL, "PostgreSQL refused sekali's credentials",
                            "wrong-Pa55word");
    free(config);
    free(dir);
}
END_TEST

/* The test Redis has no password: these tests give it one for a while.
 * Every test of the tcase and its teardown (in the parent, so it runs even
 * when a test fails) take it away again. */
#define REDIS_PASSWORD "right-Pa55word"

static redisContext *redis_admin(void)
{
    redisContext *c = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(c != NULL && c->err == 0, "cannot connect to redis");
    redisReply *r = redisCommand(c, "AUTH %s", REDIS_PASSWORD);  /* refused if none is set */
    freeReplyObject(r);
    return c;
}

static void redis_require_password(const char *password)
{
    redisContext *c = redis_admin();
    redisReply *r = redisCommand(c, "CONFIG SET requirepass %s", password);
    ck_assert_msg(r != NULL && r->type == REDIS_REPLY_STATUS, "CONFIG SET requirepass failed");
    freeReplyObject(r);
    redisFree(c);
}

static void redis_open_again(void)
{
    h_init();
    redis_require_password("");
}

START_TEST(test_wrong_or_missing_redis_password_stops_sekalid_with_exit_2)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "redis-auth");
    char *dir = h_tmpdir("redis-auth");
    char *config = h_write_config(dir, queue, H_EFFECT, 1, NULL);
    redis_require_password(REDIS_PASSWORD);

    /* No password given: NOAUTH. */
    assert_refused_at_start(dir, config, NULL, "Redis refused sekali's credentials", NULL);

    /* The wrong one: WRONGPASS. */
    char *dir2 = h_tmpdir("redis-auth");
    char *config2 = h_write_config(dir2, queue, H_EFFECT, 1, NULL);
    h_config_replace(config2, "redis:\n", "redis:\n  password_env: SEKALI_TEST_REDIS_PW\n");
    const char *env[] = { "SEKALI_TEST_REDIS_PW=wrong-Pa55word", NULL };
    assert_refused_at_start(dir2, config2, env, "Redis refused sekali's credentials",
                            "wrong-Pa55word");
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir2);
    ck_assert_int_eq(h_count_lines(log, "WRONGPASS"), 1);
    redis_require_password("");
    free(config);
    free(config2);
    free(dir);
    free(dir2);
}
END_TEST

/* The supervisor's first child, read from /proc. */
static pid_t first_child(pid_t parent)
{
    char path[64], buf[256] = "";
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)parent, (int)parent);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
    fclose(f);
    return (pid_t)atoi(buf);
}

/* At run time (here: a worker replacing one that was killed, which is not
 * fatal as a start is) a refused Redis password is a configuration error,
 * not an outage: even under on_redis_down: proceed, jobs are held back (and
 * re-scheduled) rather than run without locks, it is logged once, and they
 * run once the password matches again. */
START_TEST(test_redis_refusing_the_password_at_run_time_holds_jobs_back_under_proceed)
{
    struct h_run r;
    h_run_open(&r, "redis-refused");
    struct h_run_opts o = { .workers = 1, .queue_yaml = "    on_redis_down: proceed\n" };
    h_run_start(&r, &o);
    const char *effects = "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s' "
                          "AND job_id = '%s'";
    h_publish(r.b, r.queue, "test", "warm-1", NULL, NULL, "ok");
    H_WAIT(h_pg_count(r.pg, effects, r.queue, "warm-1") == 1, 20000, "warm-1 should run");

    redis_require_password(REDIS_PASSWORD);
    pid_t worker = first_child(r.sekalid);
    ck_assert_int_gt(worker, 0);
    ck_assert_int_eq(kill(worker, SIGKILL), 0);
    H_WAIT(h_count_event_where(r.log, SK_EVENT_STARTED, "role", "worker", "queue", r.queue,
                               NULL) == 2, 20000, "the killed worker should be replaced");

    h_publish(r.b, r.queue, "test", "held-1", NULL, NULL, "ok");
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_LINK_REFUSED, SK_SERVER_REDIS) == 1, 20000,
           "the refusal should be logged (see %s)", r.log);
    ck_assert_int_eq(h_pg_count(r.pg, effects, r.queue, "held-1"), 0);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_OUTAGE_BEGIN, "on_redis_down", "proceed",
                                         NULL), 0);

    redis_require_password("");
    H_WAIT(h_pg_count(r.pg, effects, r.queue, "held-1") == 1, 30000,
           "held-1 should run once the password matches");
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, effects, r.queue, "held-1"), 1);
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_LINK_REFUSED, SK_SERVER_REDIS), 1);
    ck_assert_int_eq(h_count_event_where(r.log, SK_EVENT_OUTAGE_BEGIN, "on_redis_down", "proceed",
                                         NULL), 0);
    h_run_close(&r);
}
END_TEST

/* Drains fd into heard and notes in *last_ms when the latest WATCHDOG=1
 * arrived. */
static void note_watchdog(int fd, char *heard, size_t size, int64_t *last_ms)
{
    size_t before = strlen(heard);
    drain_notifications(fd, heard, size);
    if (strstr(heard + before, "WATCHDOG=1") != NULL)
        *last_ms = h_now_ms();
}

/* sekalid with a 1 s watchdog, one worker and queue_yaml (marker_dir
 * added), its handler stalled in a job; returns the notify socket and the
 * stalled worker. */
static int start_stalled(struct h_run *r, const char *queue_yaml, char *heard, size_t size,
                         pid_t *victim)
{
    char yaml[1200];
    snprintf(yaml, sizeof(yaml), "%s    config:\n      marker_dir: %s\n", queue_yaml, r->dir);
    r->config = h_write_config(r->dir, r->queue, H_EFFECT, 1, yaml);
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    int fd = start_watched(r, heard, size);
    h_publish(r->b, r->queue, "test", "wedged-1", "order-wedged", NULL, "stall");
    H_WAIT(h_stalled_pid(r->dir) != 0, 20000, "the handler never reached its stall point");
    *victim = h_stalled_pid(r->dir);
    return fd;
}

START_TEST(test_a_wedged_handler_without_job_timeout_withholds_the_watchdog)
{
    struct h_run r;
    h_run_open(&r, "wedged");
    static char heard[65536];
    pid_t victim;
    int fd = start_stalled(&r, "", heard, sizeof(heard), &victim);

    /* job_timeout: 0s, so nothing will end this job: once the worker's loop
     * has not turned for the watchdog's 1 s, WATCHDOG=1 stops (it is sent
     * every 500 ms while earned). */
    int64_t last = h_now_ms();
    H_WAIT((note_watchdog(fd, heard, sizeof(heard), &last), h_now_ms() - last > 2500), 15000,
           "WATCHDOG=1 should stop while the handler is wedged; the last came %lld ms ago",
           (long long)(h_now_ms() - last));

    /* Said at start, once. */
    ck_assert_int_eq(h_count_lines(r.log, "has no job_timeout: under the systemd watchdog"), 1);
    /* Its worker killed and replaced, the watchdog is fed again. */
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    int64_t killed = h_now_ms();
    H_WAIT((note_watchdog(fd, heard, sizeof(heard), &last), last > killed), 20000,
           "WATCHDOG=1 should resume once the wedged worker is replaced");
    H_WAIT(h_effects(&r, "order-wedged") == 1, 30000, "the job should run again once");
    close(fd);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_a_long_job_that_job_timeout_watches_keeps_the_watchdog_fed)
{
    struct h_run r;
    h_run_open(&r, "watched");
    static char heard[65536];
    pid_t victim;
    int fd = start_stalled(&r, "    job_timeout: 5s\n    lock_ttl: 2s\n", heard, sizeof(heard),
                           &victim);
    int64_t stalled = h_now_ms();

    /* The supervisor will kill this job at 5 s, so until then it counts as
     * progress: WATCHDOG=1 still comes well past the watchdog's 1 s. */
    int64_t last = 0;
    H_WAIT((note_watchdog(fd, heard, sizeof(heard), &last), last > stalled + 2500), 10000,
           "WATCHDOG=1 should keep coming during a job that job_timeout watches");
    ck_assert_msg(!h_process_gone(victim), "the worker should still be in its job");
    ck_assert_int_eq(h_count_lines(r.log, "has no job_timeout"), 0);
    H_WAIT(h_process_gone(victim), 20000, "job_timeout should kill the worker");
    H_WAIT(h_effects(&r, "order-wedged") == 1, 30000, "the job should run again once");
    close(fd);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* A janitor round over a backlog outlasts the watchdog many times over: it
 * must show itself alive between its batches and in its rests, or systemd
 * restarts sekalid (and its workers' jobs) for as long as the backlog
 * lasts. Its first round here takes at least 60 batches of 100 ms. */
START_TEST(test_a_long_janitor_round_keeps_the_watchdog_fed)
{
    struct h_run r;
    h_run_open(&r, "janitor-watchdog");
    h_pg_expired_backlog(&r, 60, 100);
    r.config = h_write_config_top(r.dir, r.queue, H_EFFECT, 1, "    retention: 1h\n",
                                  "janitor:\n  interval: 1h\n  batch: 1\n");
    static char heard[65536];
    int fd = start_watched(&r, heard, sizeof(heard));
    const char *purged = "SELECT count(*) FROM sekali_test.key_purges WHERE queue = '%s'";
    H_WAIT(h_pg_count(r.pg, purged, r.queue) > 0, 20000, "the janitor's round never began");
    int64_t begun = h_now_ms(), last = 0;
    H_WAIT((note_watchdog(fd, heard, sizeof(heard), &last), last > begun + 2500), 15000,
           "WATCHDOG=1 should keep coming during the janitor's round");
    long long left = h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys "
                                      "WHERE queue = '%s'", r.queue);
    ck_assert_msg(left > 0, "the round should still be running when WATCHDOG=1 came");
    close(fd);
    h_run_stop(&r);
    h_pg_expired_backlog_end(&r);
    h_run_close(&r);
}
END_TEST

/* `sekalid -t` on r's config with redis.timeout `timeout`: its output. */
static const char *check_with_redis_timeout(struct h_run *r, const char *timeout, int *code)
{
    r->config = h_write_config(r->dir, r->queue, H_EFFECT, 1, "    lock_ttl: 3s\n");
    char with[64];
    snprintf(with, sizeof(with), "redis:\n  timeout: %s\n", timeout);
    h_config_replace(r->config, "redis:\n", with);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s/sekalid -t -c %s 2>&1", h_build_dir(), r->config);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    static char out[8192];
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    free(r->config);
    r->config = NULL;
    return out;
}

START_TEST(test_check_mode_warns_when_the_redis_timeout_cannot_fit_a_lock_renewal)
{
    struct h_run r;
    h_run_open(&r, "renewfit");
    int code;
    /* 2 s (the default) against a 3 s lease renewed every second. */
    const char *out = check_with_redis_timeout(&r, "2s", &code);
    ck_assert_msg(code == 0, "a warning is no failure: exit %d, %s", code, out);
    char expected[512];
    snprintf(expected, sizeof(expected), "sekalid: warning: queue %s: redis.timeout (2s) is not "
             "below a third of its lock TTL (3s)", r.queue);
    ck_assert_msg(strstr(out, expected) != NULL, "expected \"%s\" in:\n%s", expected, out);
    ck_assert_msg(strstr(out, "lower redis.timeout below 1000 ms") != NULL, "%s", out);
    out = check_with_redis_timeout(&r, "300ms", &code);
    ck_assert_msg(code == 0 && strstr(out, "warning") == NULL, "exit %d: %s", code, out);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_systemd_hears_ready_status_watchdog_reloading_stopping_in_order,
        test_sigterm_drains_in_flight_jobs_without_loss_or_doubling,
        test_sighup_with_a_broken_config_keeps_the_old_one,
        test_sighup_with_a_handler_config_its_check_rejects_keeps_the_old_generation,
        test_sighup_whose_new_workers_exit_2_at_start_keeps_the_old_generation,
        test_sighup_applies_new_workers_and_handler_under_load_exactly_once,
        test_check_mode_reports_a_bad_conninfo_without_its_password,
        test_check_mode_warns_when_the_redis_timeout_cannot_fit_a_lock_renewal,
        test_wrong_amqp_password_stops_sekalid_with_exit_2,
        test_wrong_postgres_password_stops_sekalid_with_exit_2,
        NULL,
    };
    Suite *s = h_suite("service", 300, tests);
    const TTest *watchdog[] = {
        test_a_wedged_handler_without_job_timeout_withholds_the_watchdog,
        test_a_long_job_that_job_timeout_watches_keeps_the_watchdog_fed,
        test_a_long_janitor_round_keeps_the_watchdog_fed,
        NULL,
    };
    h_tcase(s, "watchdog", 120, watchdog);
    TCase *tc = tcase_create("redis-auth");
    tcase_set_timeout(tc, 300);
    tcase_add_unchecked_fixture(tc, NULL, redis_open_again);
    tcase_add_test(tc, test_wrong_or_missing_redis_password_stops_sekalid_with_exit_2);
    tcase_add_test(tc, test_redis_refusing_the_password_at_run_time_holds_jobs_back_under_proceed);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
