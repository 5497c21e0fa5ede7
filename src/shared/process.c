/* process.c - the after-fork set-up and the stop flag every child process
 * of sekalid shares (see process.h): one copy, where the worker, the
 * relays and the janitor each had their own; and the supervisor's set-up
 * before its first fork, which the children inherit. */
#include "process.h"

#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "config_value.h"
#include "log.h"
#include "proctitle.h"
#include "tls.h"

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int signo)
{
    (void)signo;
    stop_requested = 1;
}

void sk_process_child_init(const struct sk_child_init *c)
{
    close(c->signal_fd);
    if (c->close_inherited != NULL)
        c->close_inherited(c->close_arg);
    sk_proctitle_set(c->title, c->comm);
    /* The passwords are in the child's config already: a handler, or a
     * program it runs, has no business with them. */
    sk_conf_value_forget_password_envs();
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    /* Asked after fork(): a supervisor that died before this would leave
     * the child orphaned with no signal coming, hence the check after. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != c->parent)
        _exit(SK_EXIT_RUNTIME);
    sk_log_init(c->log->level, c->log->format, c->log_role);
    /* Still blocked, as in the supervisor: nothing arrives until the
     * dispositions are the child's. */
    sk_process_install_stop();
    signal(SIGCHLD, SIG_DFL);
    signal(SIGHUP, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

void sk_process_install_stop(void)
{
    struct sigaction sa = { .sa_handler = on_stop_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

bool sk_process_stopping(void)
{
    return stop_requested != 0;
}

void sk_process_parent_init(void)
{
    sk_tls_init_before_fork();
}
