/* failpoint.h - named places where a fault build kills its own process.
 *
 * Fault tests need a worker to die at an exact step ("after_commit": the
 * effect is committed, the ack not yet sent). Only the fault build (make
 * builds build/fault/sekalid with -DSK_FAULTS) contains this code; in a
 * production build every failpoint compiles to nothing and cannot be reached.
 *
 * In a fault build, SEKALI_FAILPOINT=name[:key] arms the point `name`, for
 * one idempotency key if given. When it fires, the process writes its pid to
 * the file named by SEKALI_FAILPOINT_MARK (if set), so the test can prove the
 * fault happened, then kills itself with SIGKILL. With SEKALI_FAILPOINT_ONCE
 * set too, a point whose mark file exists no longer fires; with
 * SEKALI_FAILPOINT_TIMES=N, it fires for the first N processes only.
 * One point is keyed otherwise: "pipeline_sent" (pg.c) by the name of the
 * pipeline's last statement, e.g. pipeline_sent:COMMIT. */
#ifndef SK_FAILPOINT_H
#define SK_FAILPOINT_H

#include <stdbool.h>

#ifdef SK_FAULTS
void sk_failpoint(const char *name, const char *key);
/* True when SEKALI_FAULTS (a comma-separated list) names this fault, e.g.
 * "no_renew": the lock heartbeat stops renewing, so leases really expire. */
bool sk_fault_active(const char *name);
/* When SEKALI_FAULTS names this fault, blocks for as long as the file named
 * by SEKALI_HOLD_FILE exists: a test holds a process at a step, proves what
 * that looks like from outside, and lets it go by removing the file. */
void sk_fault_hold(const char *name);
#else
#define sk_failpoint(name, key) ((void)(name), (void)(key))
#define sk_fault_active(name)   ((void)(name), false)
#define sk_fault_hold(name)     ((void)(name))
#endif

#endif
