/* process.h - what every child process of sekalid shares: how it learns
 * that it should stop.
 *
 * The supervisor stops a child with SIGTERM; the child finishes the step it
 * is in and returns from its run function. One flag per process, set only by
 * the signal handler installed here, read by every loop and wait. */
#ifndef SK_PROCESS_H
#define SK_PROCESS_H

#include <stdbool.h>

/* Installs the SIGTERM/SIGINT handler that sets the stop flag. Without
 * SA_RESTART, so a stop request interrupts sleeps and blocking waits. */
void sk_process_install_stop(void);

/* True once a stop has been requested. Async-signal-safe to read. */
bool sk_process_stopping(void);

#endif
