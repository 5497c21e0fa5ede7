/* check_service.c - sekalid as a service: what it tells systemd, how it
 * drains on SIGTERM, and what its logs never contain. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Collects notifications into heard until a READY=1 follows RELOADING=1. */
static void wait_reloaded(int fd, char *heard, size_t size, int timeout_ms)
{
    H_WAIT((drain_notifications(fd, heard, size),
            strstr(heard, "RELOADING=1") != NULL &&
            strstr(strstr(heard, "RELOADING=1"), "READY=1") != NULL), timeout_ms,
           "expected RELOADING=1 then READY=1; heard:\n%s", heard);
}

START_TEST(test_systemd_hears_ready_status_watchdog_reloading_stopping_in_order)
{
    /* sekalid is watched through what it tells systemd, so it is started
     * here rather than waited for on the broker. */
    struct h_run r;
    h_run_open(&r, "notify");
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 2, NULL);
    char sock_env[1100];
    int fd = notify_socket(r.dir, sock_env, sizeof(sock_env));
    const char *env[] = { sock_env, "WATCHDOG_USEC=1000000", NULL };
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, env);

    static char heard[65536];
    heard[0] = '\0';
    wait_ready(fd, heard, sizeof(heard));
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
    const char *count = "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'";
    H_WAIT(h_pg_count(r.pg, count, r.queue) >= 4, 20000, "some jobs should complete first");

    /* Jobs are in flight and more are prefetched: stop now. */
    int64_t asked = h_now_ms();
    h_stop_sekalid(r.sekalid, r.dir);
    long long done_first = h_pg_count(r.pg, count, r.queue);
    ck_assert_msg(done_first < 50, "the stop should interrupt the run (all 50 were done)");
    ck_assert_int_le(h_now_ms() - asked, h_ms(20000));
    /* Nothing lost: what was not done is back in the queue. */
    ck_assert_int_eq(h_queue_depth(r.b, r.queue), (uint32_t)(50 - done_first));

    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_pg_count(r.pg, count, r.queue) == 50, 60000,
           "the rest should complete after restart");
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT job_id) FROM sekali_test.effects "
                                      "WHERE queue = '%s'", r.queue), 50);
    ck_assert_int_eq(h_pg_count(r.pg, count, r.queue), 50);

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
    r.config = h_write_config(r.dir, r.queue, H_EFFECT, 2, NULL);
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    char sock_env[1100];
    int fd = notify_socket(r.dir, sock_env, sizeof(sock_env));
    const char *env[] = { sock_env, NULL };
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, env);
    static char heard[65536];
    heard[0] = '\0';
    wait_ready(fd, heard, sizeof(heard));

    FILE *f = fopen(r.config, "a");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "    prefetch: lots\n");
    fclose(f);
    ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
    wait_reloaded(fd, heard, sizeof(heard), 10000);
    char expected[1200];
    snprintf(expected, sizeof(expected), "STATUS=reload failed, running the previous "
             "configuration: %s:21:", r.config);
    ck_assert_msg(strstr(heard, expected) != NULL, "expected \"%s\" in:\n%s", expected, heard);
    ck_assert_int_eq(h_count_lines(r.log, "reload failed, still running the previous "
                                          "configuration"), 1);

    /* Still running on the old configuration. */
    h_publish(r.b, r.queue, "test", "after-1", NULL, NULL, "ok");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                      r.queue) == 1, 20000, "a job after the failed reload should still run");
    ck_assert_int_eq(h_consumers(r.b, r.queue), 2);
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
    const char *count = "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'";
    H_WAIT(h_pg_count(r.pg, count, r.queue) >= 30, 20000, "jobs should be running");

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

    H_WAIT(h_count_lines(r.log, "reloaded: 3 workers for 1 queues") == 1, 20000,
           "the new configuration should be applied");
    H_WAIT(h_consumers(r.b, r.queue) == 3, 30000, "the new generation's 3 workers should "
           "consume and the old 2 drain away (consumers now %u)", h_consumers(r.b, r.queue));
    H_WAIT(h_pg_count(r.pg, count, r.queue) == 300, 60000, "all jobs should complete");
    h_run_stop(&r);
    char loaded[1200];
    snprintf(loaded, sizeof(loaded), "from %s)", handler);
    ck_assert_int_eq(h_count_lines(r.log, loaded), 3);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT job_id) FROM sekali_test.effects "
                                      "WHERE queue = '%s'", r.queue), 300);
    ck_assert_int_eq(h_pg_count(r.pg, count, r.queue), 300);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_systemd_hears_ready_status_watchdog_reloading_stopping_in_order,
        test_sigterm_drains_in_flight_jobs_without_loss_or_doubling,
        test_sighup_with_a_broken_config_keeps_the_old_one,
        test_sighup_applies_new_workers_and_handler_under_load_exactly_once,
        NULL,
    };
    return h_run_suite(h_suite("service", 300, tests));
}
