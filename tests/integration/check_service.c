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

#define EFFECT "tests/plugins/effect.so"

/* A datagram socket standing in for systemd's notification socket. */
static int notify_socket(const char *path)
{
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

START_TEST(test_systemd_hears_ready_status_watchdog_reloading_stopping_in_order)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "notify");
    char *dir = h_tmpdir("notify");
    char *config = h_write_config(dir, queue, EFFECT, 2, NULL);
    char sock[1024], sock_env[1100];
    snprintf(sock, sizeof(sock), "%s/notify.sock", dir);
    snprintf(sock_env, sizeof(sock_env), "NOTIFY_SOCKET=%s", sock);
    int fd = notify_socket(sock);
    const char *env[] = { sock_env, "WATCHDOG_USEC=1000000", NULL };
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, env);

    static char heard[65536];
    heard[0] = '\0';
    H_WAIT((drain_notifications(fd, heard, sizeof(heard)), strstr(heard, "READY=1") != NULL),
           20000, "sekalid never sent READY=1; heard:\n%s", heard);
    H_WAIT((drain_notifications(fd, heard, sizeof(heard)),
            strstr(strstr(heard, "READY=1"), "WATCHDOG=1") != NULL), 5000,
           "sekalid should ping the 1 s watchdog after READY; heard:\n%s", heard);
    ck_assert_msg(strstr(heard, "STATUS=") != NULL, "no STATUS= in:\n%s", heard);
    char expected[256];
    snprintf(expected, sizeof(expected), "STATUS=%s: 2/2 workers consuming", queue);
    ck_assert_msg(strstr(heard, expected) != NULL, "expected \"%s\" in:\n%s", expected, heard);

    /* A reload of the same file: RELOADING=1, then READY=1 again. */
    ck_assert_int_eq(kill(sekalid, SIGHUP), 0);
    H_WAIT((drain_notifications(fd, heard, sizeof(heard)),
            strstr(heard, "RELOADING=1") != NULL &&
            strstr(strstr(heard, "RELOADING=1"), "READY=1") != NULL), 20000,
           "expected RELOADING=1 then READY=1; heard:\n%s", heard);
    const char *reloading = strstr(heard, "RELOADING=1");
    ck_assert_msg(reloading > strstr(heard, "WATCHDOG=1"),
                  "RELOADING=1 should follow the first WATCHDOG=1; heard:\n%s", heard);

    ck_assert_int_eq(kill(sekalid, SIGTERM), 0);
    int status = h_wait_exit(sekalid, 30000, "sekalid after SIGTERM");
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    drain_notifications(fd, heard, sizeof(heard));
    const char *stopping = strstr(heard, "STOPPING=1");
    ck_assert_msg(stopping != NULL && stopping > strstr(heard, "RELOADING=1"),
                  "STOPPING=1 should come last; heard:\n%s", heard);
    close(fd);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_sigterm_drains_in_flight_jobs_without_loss_or_doubling)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "drain");
    char *dir = h_tmpdir("drain");
    char *config = h_write_config(dir, queue, EFFECT, 4, NULL);
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    H_WAIT(h_consumers(b, queue) == 4, 20000, "4 workers should consume %s", queue);
    for (int i = 0; i < 50; i++) {
        char id[32];
        snprintf(id, sizeof(id), "slow-%d", i);
        h_publish(b, queue, "test", id, NULL, NULL, "sleep:200");
    }
    const char *count = "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'";
    H_WAIT(h_pg_count(pg, count, queue) >= 4, 20000, "some jobs should complete first");

    /* Jobs are in flight and more are prefetched: stop now. */
    int64_t asked = h_now_ms();
    h_stop_sekalid(sekalid, dir);
    long long done_first = h_pg_count(pg, count, queue);
    ck_assert_msg(done_first < 50, "the stop should interrupt the run (all 50 were done)");
    ck_assert_int_le(h_now_ms() - asked, h_ms(20000));
    /* Nothing lost: what was not done is back in the queue. */
    ck_assert_int_eq(h_queue_depth(b, queue), (uint32_t)(50 - done_first));

    sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    H_WAIT(h_pg_count(pg, count, queue) == 50, 60000, "the rest should complete after restart");
    h_stop_sekalid(sekalid, dir);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(DISTINCT job_id) FROM sekali_test.effects "
                                    "WHERE queue = '%s'", queue), 50);
    ck_assert_int_eq(h_pg_count(pg, count, queue), 50);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);

    /* Credentials never reach the logs: the test config holds passwords in
     * both the AMQP URL and the PostgreSQL conninfo. */
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_int_eq(h_count_lines(log, "password="), 0);
    ck_assert_int_eq(h_count_lines(log, ":sekali@"), 0);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_sighup_with_a_broken_config_keeps_the_old_one)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "badreload");
    char *dir = h_tmpdir("badreload");
    char *config = h_write_config(dir, queue, EFFECT, 2, NULL);
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);
    char sock[1024], sock_env[1100];
    snprintf(sock, sizeof(sock), "%s/notify.sock", dir);
    snprintf(sock_env, sizeof(sock_env), "NOTIFY_SOCKET=%s", sock);
    int fd = notify_socket(sock);
    const char *env[] = { sock_env, NULL };
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, env);
    static char heard[65536];
    heard[0] = '\0';
    H_WAIT((drain_notifications(fd, heard, sizeof(heard)), strstr(heard, "READY=1") != NULL),
           20000, "sekalid never sent READY=1; heard:\n%s", heard);

    FILE *f = fopen(config, "a");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "    prefetch: lots\n");
    fclose(f);
    ck_assert_int_eq(kill(sekalid, SIGHUP), 0);
    H_WAIT((drain_notifications(fd, heard, sizeof(heard)),
            strstr(heard, "RELOADING=1") != NULL &&
            strstr(strstr(heard, "RELOADING=1"), "READY=1") != NULL), 10000,
           "expected RELOADING=1 then READY=1; heard:\n%s", heard);
    char expected[1200];
    snprintf(expected, sizeof(expected), "STATUS=reload failed, running the previous "
             "configuration: %s:21:", config);
    ck_assert_msg(strstr(heard, expected) != NULL, "expected \"%s\" in:\n%s", expected, heard);
    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    ck_assert_int_eq(h_count_lines(log, "reload failed, still running the previous "
                                        "configuration"), 1);

    /* Still running on the old configuration. */
    h_publish(b, queue, "test", "after-1", NULL, NULL, "ok");
    H_WAIT(h_pg_count(pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                      queue) == 1, 20000, "a job after the failed reload should still run");
    ck_assert_int_eq(h_consumers(b, queue), 2);
    h_stop_sekalid(sekalid, dir);
    close(fd);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_sighup_applies_new_workers_and_handler_under_load_exactly_once)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "reload");
    char *dir = h_tmpdir("reload");
    char *config = h_write_config(dir, queue, EFFECT, 2, NULL);
    PGconn *pg = h_pg();
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    H_WAIT(h_consumers(b, queue) == 2, 20000, "2 workers should consume %s", queue);
    for (int i = 0; i < 300; i++) {
        char id[32];
        snprintf(id, sizeof(id), "job-%d", i);
        h_publish(b, queue, "test", id, NULL, NULL, "sleep:5");
    }
    const char *count = "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'";
    H_WAIT(h_pg_count(pg, count, queue) >= 30, 20000, "jobs should be running");

    /* A rebuilt handler goes in under a new name (a loaded .so is never
     * replaced in place), with a new worker count. */
    char handler[1024], cmd[2300];
    snprintf(handler, sizeof(handler), "%s/effect-v2.so", dir);
    snprintf(cmd, sizeof(cmd), "cp %s/" EFFECT " %s && chmod 755 %s", h_build_dir(), handler,
             dir);
    ck_assert_int_eq(system(cmd), 0);
    char *tmp = h_write_config(dir, queue, EFFECT, 3, NULL);
    char *text = h_read_file(tmp);
    char old_handler[1024];
    snprintf(old_handler, sizeof(old_handler), "%s/" EFFECT, h_build_dir());
    char *at = strstr(text, old_handler);
    ck_assert_ptr_nonnull(at);
    FILE *f = fopen(config, "w");
    fprintf(f, "%.*s%s%s", (int)(at - text), text, handler, at + strlen(old_handler));
    fclose(f);
    free(text);
    free(tmp);
    ck_assert_int_eq(kill(sekalid, SIGHUP), 0);

    char log[1024];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    H_WAIT(h_count_lines(log, "reloaded: 3 workers for 1 queues") == 1, 20000,
           "the new configuration should be applied");
    H_WAIT(h_consumers(b, queue) == 3, 30000, "the new generation's 3 workers should consume "
           "and the old 2 drain away (consumers now %u)", h_consumers(b, queue));
    H_WAIT(h_pg_count(pg, count, queue) == 300, 60000, "all jobs should complete");
    h_stop_sekalid(sekalid, dir);
    char loaded[1200];
    snprintf(loaded, sizeof(loaded), "from %s)", handler);
    ck_assert_int_eq(h_count_lines(log, loaded), 3);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(DISTINCT job_id) FROM sekali_test.effects "
                                    "WHERE queue = '%s'", queue), 300);
    ck_assert_int_eq(h_pg_count(pg, count, queue), 300);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    sk_broker_close(b);
    PQfinish(pg);
    free(config);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("service");
    TCase *tc = tcase_create("service");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_systemd_hears_ready_status_watchdog_reloading_stopping_in_order);
    tcase_add_test(tc, test_sigterm_drains_in_flight_jobs_without_loss_or_doubling);
    tcase_add_test(tc, test_sighup_with_a_broken_config_keeps_the_old_one);
    tcase_add_test(tc, test_sighup_applies_new_workers_and_handler_under_load_exactly_once);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
