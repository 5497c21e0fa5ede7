/* check_process.c - every child of sekalid starts the same way
 * (sk_process_child_init(), src/shared/process.c): the supervisor's descriptors
 * closed, a real metrics endpoint's included; systemd's variables gone; its
 * name set; every signal unblocked with SIGTERM setting the stop flag and
 * SIGHUP ignored; SIGTERM asked for when the supervisor dies; and an exit at
 * once when it already has. Each test forks the "child" and reads what it
 * found from its exit status. */
/* links: core process proctitle metrics_http metrics metrics_text */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config_value.h"
#include "metrics_http.h"
#include "process.h"
#include "suite.h"

static const struct sk_log_conf log_conf = { .level = SK_LOG_ERROR };

/* As the supervisor keeps them: blocked, for its signalfd. */
static void block_like_the_supervisor(void)
{
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, NULL);
}

/* Runs check(arg) in a child after sk_process_child_init(init) and returns
 * the child's exit status: check's return value, or what init did. */
static int in_child(struct sk_child_init *init, int (*check)(void *), void *arg)
{
    block_like_the_supervisor();
    init->parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        sk_process_child_init(init);
        _exit(check(arg));
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "the child died of signal %d", WTERMSIG(status));
    return WEXITSTATUS(status);
}

static struct sk_child_init defaults(int signal_fd)
{
    return (struct sk_child_init){ .signal_fd = signal_fd, .title = "sekalid: worker q#1",
                                   .comm = "sk-test-child", .log_role = "worker",
                                   .log = &log_conf };
}

/* The socket descriptors of this process, but `except`. */
static int sockets(int except)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        struct stat st;
        if (e->d_name[0] != '.' && fd != dirfd(d) && fd != except && fstat(fd, &st) == 0 &&
            S_ISSOCK(st.st_mode))
            n++;
    }
    closedir(d);
    return n;
}

struct fds {
    int signal_fd;
    int client;  /* the test's own connection, which the child inherits too */
};

static int descriptors_closed(void *arg)
{
    const struct fds *f = arg;
    if (fcntl(f->signal_fd, F_GETFD) != -1 || errno != EBADF)
        return 10;  /* the supervisor's signalfd is still open */
    return sockets(f->client) == 0 ? 0 : 11;  /* a socket of the endpoint is left */
}

/* A free TCP port on 127.0.0.1 (closed again, so the endpoint may bind). */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    ck_assert(bind(s, (struct sockaddr *)&a, sizeof(a)) == 0);
    ck_assert(getsockname(s, (struct sockaddr *)&a, &len) == 0);
    close(s);
    return ntohs(a.sin_port);
}

static void close_endpoint(void *http)
{
    sk_metrics_http_close_in_child(http);
}

START_TEST(test_child_init_closes_the_supervisor_descriptors_and_every_endpoint_socket)
{
    struct sk_conf conf = { .metrics = { .listen_host = "127.0.0.1", .listen_port = free_port() } };
    struct sk_metrics *m = NULL;
    struct sk_err err = { 0 };
    ck_assert_int_eq(sk_metrics_create(&m, 0, 0, &err), SK_OK);
    struct sk_metrics_http *h = NULL;
    ck_assert_msg(sk_metrics_http_start(&h, &conf, m, &err) == SK_OK, "%s", err.msg);

    /* An open connection, accepted by the endpoint as the supervisor's
     * loop would: it is a descriptor the child must not keep either. */
    struct fds f = { .signal_fd = eventfd(0, EFD_CLOEXEC), .client = socket(AF_INET, SOCK_STREAM, 0) };
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(conf.metrics.listen_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert(connect(f.client, (struct sockaddr *)&a, sizeof(a)) == 0);
    for (int turn = 0; turn < 50 && sockets(f.client) < 2; turn++) {
        struct pollfd pfd;
        int timeout = 100;
        sk_metrics_http_poll(h, &pfd, &timeout);
        poll(&pfd, 1, timeout);
        sk_metrics_http_serve(h, &pfd);
    }
    ck_assert_msg(sockets(f.client) == 2, "the endpoint should hold its listening socket and "
                  "the accepted connection, holds %d sockets", sockets(f.client));

    struct sk_child_init init = defaults(f.signal_fd);
    init.close_inherited = close_endpoint;
    init.close_arg = h;
    ck_assert_int_eq(in_child(&init, descriptors_closed, &f), 0);
    close(f.client);
    close(f.signal_fd);
    sk_metrics_http_stop(h);
    sk_metrics_destroy(m);
}
END_TEST

static int systemd_gone_and_named(void *arg)
{
    (void)arg;
    if (getenv("NOTIFY_SOCKET") || getenv("WATCHDOG_USEC") || getenv("WATCHDOG_PID"))
        return 20;
    char comm[32] = "";
    FILE *f = fopen("/proc/self/comm", "r");
    if (f == NULL || fgets(comm, sizeof(comm), f) == NULL)
        return 21;
    fclose(f);
    return strcmp(comm, "sk-test-child\n") == 0 ? 0 : 22;
}

START_TEST(test_child_init_hands_the_child_no_systemd_socket_and_names_it)
{
    setenv("NOTIFY_SOCKET", "/run/systemd/notify", 1);
    setenv("WATCHDOG_USEC", "30000000", 1);
    setenv("WATCHDOG_PID", "1", 1);
    struct sk_child_init init = defaults(eventfd(0, EFD_CLOEXEC));
    ck_assert_int_eq(in_child(&init, systemd_gone_and_named, NULL), 0);
    close(init.signal_fd);
}
END_TEST

static int password_env_gone(void *arg)
{
    (void)arg;
    return getenv("SK_TEST_AMQP_PASSWORD") == NULL ? 0 : 40;
}

/* A handler runs in the child: the password its config read from the
 * environment is no business of it, or of a program it starts. The
 * supervisor keeps the variable, which a reload reads again. */
START_TEST(test_child_init_clears_the_password_env_variables_read)
{
    setenv("SK_TEST_AMQP_PASSWORD", "s3cr3t", 1);
    char *pw = NULL;
    ck_assert_int_eq(sk_conf_value_password_env("amqp", "SK_TEST_AMQP_PASSWORD", &pw, NULL),
                     SK_OK);
    struct sk_child_init init = defaults(eventfd(0, EFD_CLOEXEC));
    ck_assert_int_eq(in_child(&init, password_env_gone, NULL), 0);
    ck_assert_str_eq(getenv("SK_TEST_AMQP_PASSWORD"), "s3cr3t");
    sk_conf_value_wipe(pw);
    close(init.signal_fd);
}
END_TEST

static int signals_are_the_childs(void *arg)
{
    (void)arg;
    sigset_t now;
    sigprocmask(SIG_SETMASK, NULL, &now);
    if (sigismember(&now, SIGTERM) || sigismember(&now, SIGCHLD) || sigismember(&now, SIGHUP))
        return 30;  /* still blocked as in the supervisor */
    if (sk_process_stopping())
        return 31;
    raise(SIGHUP);  /* ignored: the default would end the process */
    raise(SIGTERM);  /* handled: the default would end the process */
    if (!sk_process_stopping())
        return 32;
    int pdeath = 0;
    if (prctl(PR_GET_PDEATHSIG, &pdeath) != 0 || pdeath != SIGTERM)
        return 33;
    return 0;
}

START_TEST(test_child_init_unblocks_signals_and_sigterm_sets_the_stop_flag)
{
    struct sk_child_init init = defaults(eventfd(0, EFD_CLOEXEC));
    ck_assert_int_eq(in_child(&init, signals_are_the_childs, NULL), 0);
    close(init.signal_fd);
}
END_TEST

static int never_reached(void *arg)
{
    (void)arg;
    return 40;
}

/* PR_SET_PDEATHSIG only covers a supervisor dying after it was asked: one
 * that is already gone is seen as a parent that is not the one forking. */
START_TEST(test_child_init_exits_at_once_when_the_supervisor_is_already_gone)
{
    block_like_the_supervisor();
    struct sk_child_init init = defaults(eventfd(0, EFD_CLOEXEC));
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        init.parent = getpid();  /* not this child's parent */
        sk_process_child_init(&init);
        _exit(never_reached(NULL));
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == SK_EXIT_RUNTIME,
                  "expected exit %d, got status 0x%x", SK_EXIT_RUNTIME, status);
    close(init.signal_fd);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_child_init_closes_the_supervisor_descriptors_and_every_endpoint_socket,
        test_child_init_hands_the_child_no_systemd_socket_and_names_it,
        test_child_init_clears_the_password_env_variables_read,
        test_child_init_unblocks_signals_and_sigterm_sets_the_stop_flag,
        test_child_init_exits_at_once_when_the_supervisor_is_already_gone,
        NULL,
    };
    return h_run_suite(h_suite("process", 30, tests));
}
