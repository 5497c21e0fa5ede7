/* process.c - the stop flag every child process of sekalid shares. */
#include "process.h"

#include <signal.h>
#include <stddef.h>

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int signo)
{
    (void)signo;
    stop_requested = 1;
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
