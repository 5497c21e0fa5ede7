/* deaths.h - what a worker's death means, decided by the supervisor when it
 * reaps the worker: whose doing it was, whether the worker had made
 * progress, and what its replacement inherits through the scoreboard. */
#ifndef SK_DEATHS_H
#define SK_DEATHS_H

#include <stdbool.h>

#include "config.h"
#include "scoreboard.h"

/* The verdict on one death; the supervisor's restart policy acts on it. */
struct sk_death {
    bool job_caused;  /* counts against its job's key (sql/006) */
    bool progress;    /* restart at once, reset the backoff */
    bool outside;     /* killed from outside: restart at once, backoff as it was */
};

/* What judging needs to remember from one death to the next: the memory
 * cgroup's OOM-kill counter, and the kills it showed that no reaped
 * SIGKILL has been charged with yet. Owned by the supervisor. */
struct sk_deaths {
    char      oom_file[512];  /* the counter's file; "" if none */
    long long oom_seen;       /* its value at the last judgement */
    long long oom_unclaimed;
};

/* Finds the OOM-kill counter; logs, once, that there is none. Call at
 * start, before the first worker can die. */
void sk_deaths_init(struct sk_deaths *d);

/* Judges the death of a worker from its wait status, its scoreboard slot
 * (read before anything clears it) and whether the supervisor killed it
 * for job_timeout. Call once per reaped worker, in the order reaped: an OOM
 * kill is charged to the first SIGKILL reaped after the counter rose.
 * Supervisor only. */
struct sk_death sk_deaths_judge(struct sk_deaths *d, const struct sk_slot *shared,
                                bool timed_out, int status);

/* Leaves to the replacement what the dead worker could not finish, in its
 * scoreboard slot: a crash to record against the job's key when the death
 * was the job's, the lock it held to delete; and marks the slot as neither
 * consuming nor running a job. Call after sk_deaths_judge(), before the
 * slot's next fork. */
void sk_deaths_bequeath(struct sk_slot *shared, const struct sk_death *death);

/* A live worker that could inherit from a dead one: its scoreboard slot and
 * the name of the queue it works (NULL for a relay or the janitor). */
struct sk_heir {
    struct sk_slot *shared;
    const char     *queue;
};

/* For a worker of queue that died in a retiring generation (dead: its slot,
 * after sk_deaths_bequeath()), which gets no replacement: hands the crash
 * it died of and the locks it held to one of the n heirs (the current
 * generation's slots) of the same queue, an idle one if there is one, and
 * logs what it handed or could not. Supervisor only. */
void sk_deaths_hand_down(struct sk_slot *dead, const char *queue, const struct sk_heir *heirs,
                         size_t n);

/* Whether the job a worker runs (shared: its slot) is past job_timeout_ms
 * (0: no timeout) at now_ms, and the worker is to be killed for it. */
bool sk_deaths_overdue(const struct sk_slot *shared, uint32_t job_timeout_ms, int64_t now_ms);

/* Whether a live worker (shared: its slot) earns the systemd watchdog's
 * credit at now_ms: its loop turned within grace_ms, or it is busy with a
 * job that job_timeout_ms watches (0: none) and that is not past it by more
 * than grace_ms (by then the kill should have landed). A job that no
 * job_timeout watches earns none: nothing would ever end a wedged handler
 * there, and a hung worker must not keep WATCHDOG=1 coming. runs_jobs is
 * false for the relays and the janitor. */
bool sk_deaths_earns_watchdog(const struct sk_slot *shared, bool runs_jobs,
                              uint32_t job_timeout_ms, int64_t now_ms, uint32_t grace_ms);

/* Under a systemd watchdog (watchdog_ms > 0), warns once for each queue
 * without job_timeout: one of its jobs longer than the watchdog interval
 * withholds WATCHDOG=1 and systemd restarts sekalid. Said at start, so that
 * no one learns it from systemd. */
void sk_deaths_warn_unwatched(const struct sk_conf *conf, uint32_t watchdog_ms);

#endif
