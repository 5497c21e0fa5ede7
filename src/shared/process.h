/* process.h - what every child process of sekalid shares: how it starts
 * after fork(), and how it learns that it should stop.
 *
 * The supervisor forks each worker, relay and janitor and calls
 * sk_process_child_init() first thing in the child, then the role's run
 * function. The supervisor stops a child with SIGTERM; the child finishes
 * the step it is in and returns from its run function. One flag per
 * process, set only by the signal handler installed here, read by every
 * loop and wait. */
#ifndef SK_PROCESS_H
#define SK_PROCESS_H

#include <stdbool.h>
#include <sys/types.h>

#include "config.h"

/* Borrowed from the supervisor for the call. */
struct sk_child_init {
    pid_t                     parent;     /* getpid() in the supervisor, before fork() */
    int                       signal_fd;  /* the supervisor's signalfd: closed */
    /* Closes what else of the supervisor's the child must not keep (the
     * HTTP endpoint's sockets); may be NULL. A callback, so that this file
     * needs nothing of the supervisor's modules. */
    void                    (*close_inherited)(void *arg);
    void                     *close_arg;
    const char               *title;      /* for ps: "sekalid: worker invoices#2" */
    const char               *comm;       /* for top, at most 15 bytes: "sk-worker" */
    const char               *log_role;   /* the process field of its log lines: "worker" */
    const struct sk_log_conf *log;
};

/* In the child, right after fork(): closes the supervisor's descriptors,
 * names the process, takes the supervisor's environment for systemd away
 * (only the supervisor talks to systemd), asks for SIGTERM when the
 * supervisor dies, starts the log, installs the stop flag and unblocks
 * every signal (the supervisor keeps its own blocked for its signalfd).
 * If the supervisor died before the child could ask, exits at once. */
void sk_process_child_init(const struct sk_child_init *c);

/* In the supervisor, once, before the first fork() and before any thread:
 * what every child would otherwise do at its first connection, done once
 * for all of them to inherit (OpenSSL's set-up: sk_tls_init_before_fork()).
 * Here, in the shared layer, because the supervisor itself never uses an
 * adapter (docs/internals.md, "The layers"; check_layers holds it). */
void sk_process_parent_init(void);

/* Installs the SIGTERM/SIGINT handler that sets the stop flag. Without
 * SA_RESTART, so a stop request interrupts sleeps and blocking waits.
 * sk_process_child_init() does; a test may call it alone. */
void sk_process_install_stop(void);

/* True once a stop has been requested. Async-signal-safe to read. */
bool sk_process_stopping(void);

#endif
