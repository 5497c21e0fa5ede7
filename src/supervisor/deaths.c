/* deaths.c - the supervisor's judgement of a dead worker: whose doing the
 * death was, what it leaves behind and who inherits it, and when a job's
 * time is up so that its worker must die.
 *
 * Apart from the supervisor's loop because it is policy, not process
 * management: the verdict decides whether a job's key is charged with a
 * crash (and dead-lettered after max_crashes) and whether a restart backs
 * off, so it must be right on its own terms. It reads only a wait status,
 * a scoreboard slot and the OOM counter, which lets a unit test feed it
 * every kind of death without forking. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "deaths.h"
#include "log.h"
#include "oom.h"

static bool fault_signal(int sig);

/* Without a counter, OOM kills look like outside kills: logged once, here. */
void sk_deaths_init(struct sk_deaths *d)
{
    sk_oom_find(d->oom_file, sizeof(d->oom_file));
    d->oom_seen = sk_oom_kills(d->oom_file);
    d->oom_unclaimed = 0;
    if (d->oom_seen < 0)
        sk_log_warn("no memory cgroup OOM-kill counter readable: a worker the OOM killer "
                    "kills in a handler is taken for an outside kill, and its job is not "
                    "counted as crashed");
    else
        sk_log_debug("OOM kills counted from %s", d->oom_file);
}

/* Whose death this was. It counts against the job only if the handler was
 * running and the worker faulted (fault_signal()), exited by itself (the
 * worker's own code never exits inside the handler, so the handler did), was
 * SIGKILLed by the supervisor for job_timeout, or by the kernel's OOM killer
 * (the memory cgroup's counter rose since the last reap). Any other signal,
 * and every death outside the handler (parsing, waiting for or taking the
 * lock, claiming, committing, acking, idle), is no fault of the job.
 * Progress: the worker finished a delivery since it started, or it was ready
 * and something outside killed it. An outside kill before it was ready
 * (during a broker outage, say, when no worker can become ready) is no sign
 * that it cannot get going either: it neither backs off nor counts towards a
 * crash loop, and leaves the backoff of the slot's own failures as it was. */
struct sk_death sk_deaths_judge(struct sk_deaths *d, const struct sk_slot *shared,
                                bool timed_out, int status)
{
    bool oom = false;
    long long kills = sk_oom_kills(d->oom_file);
    if (kills > d->oom_seen)
        d->oom_unclaimed += kills - d->oom_seen;
    if (kills >= 0)
        d->oom_seen = kills;
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && !timed_out &&
        d->oom_unclaimed > 0) {
        oom = true;
        d->oom_unclaimed--;
    }
    bool fault = WIFSIGNALED(status) && fault_signal(WTERMSIG(status));
    bool own = fault || WIFEXITED(status) || timed_out || oom;
    bool in_handler = atomic_load(&shared->phase) == SK_PHASE_HANDLER;
    bool ready = atomic_load(&shared->ready) || atomic_load(&shared->consuming);
    return (struct sk_death){
        .job_caused = in_handler && own,
        .progress = atomic_load(&shared->finished) > 0 || (ready && !own),
        .outside = !own,
    };
}

/* Signals a process raises on itself by faulting or aborting: never sent
 * from outside in practice, so a handler that gets one did it itself. */
static bool fault_signal(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE ||
           sig == SIGABRT || sig == SIGSYS;
}

/* A dead worker consumes nothing and runs no job, whatever its slot says;
 * left as it was, a job start it never cleared would get its replacement
 * killed by the job timeout. */
void sk_deaths_bequeath(struct sk_slot *shared, const struct sk_death *death)
{
    atomic_store(&shared->consuming, 0);
    atomic_store(&shared->paused, 0);
    atomic_store(&shared->job_started_ms, 0);
    /* Its replacement records the crash against the job's key. */
    if (death->job_caused && shared->job_key[0] != '\0')
        atomic_store(&shared->died_in_job, 1);
    /* And deletes the locks it held, a whole batch's, before it consumes
     * anything. */
    sk_slot_orphan_locks(shared);
}

/* A retiring generation's dead worker gets no replacement to record the
 * crash it died of or to free its locks (a reload's old worker killed at
 * shutdown_timeout, or by its job while it drained): both go to a worker of
 * the same queue in the current generation, an idle one if there is one,
 * which records the crash and then frees the locks before its next
 * delivery. Left alone, the locks would hold their jobs' redeliveries back
 * for lock_ttl, and a job that kills the workers of every reload would
 * never meet max_crashes. */
void sk_deaths_hand_down(struct sk_slot *dead, const char *queue, const struct sk_heir *heirs,
                         size_t n_heirs)
{
    size_t n;
    sk_slot_orphans(dead, &n);
    bool crash = atomic_load(&dead->died_in_job);
    if (n == 0 && !crash)
        return;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n_heirs; i++) {
            struct sk_slot *heir = heirs[i].shared;
            if (heirs[i].queue == NULL || strcmp(heirs[i].queue, queue) != 0 ||
                (pass == 0 && atomic_load(&heir->job_started_ms) != 0) ||
                (crash && atomic_load(&heir->crash_handed)) ||
                (n > 0 && atomic_load(&heir->n_orphans) != 0))
                continue;
            /* One heir for both, the crash first (scoreboard.h). */
            if (crash && sk_slot_hand_crash(dead, heir))
                sk_log_event(SK_LOG_INFO, SK_EVENT_CRASH_HANDED, NULL,
                             &(struct sk_log_job){ .queue = queue,
                                                   .idempotency_key = heir->handed_crash_key },
                             "queue %s: the crash of a retired worker (its job's key %s) "
                             "handed to a current worker to count", queue,
                             heir->handed_crash_key);
            size_t handed = n > 0 ? sk_slot_hand_orphans(dead, heir) : 0;
            char count[24];
            snprintf(count, sizeof(count), "%zu", handed);
            if (handed > 0)
                sk_log_event_fields(SK_LOG_INFO, SK_EVENT_LOCKS_HANDED, NULL,
                                    &(struct sk_log_job){ .queue = queue },
                                    (const struct sk_log_field[]){ { "count", count } }, 1,
                                    "queue %s: %zu lock%s of a retired worker handed to a "
                                    "current one to free", queue, handed,
                                    handed == 1 ? "" : "s");
            return;
        }
    }
    if (crash)
        sk_log_job(SK_LOG_WARN, &(struct sk_log_job){ .queue = queue,
                                                       .idempotency_key = dead->job_key },
                   "queue %s: a retired worker died running the job with key %s, and no "
                   "current worker of the queue could take the crash to count it", queue,
                   dead->job_key);
    if (n > 0)
        sk_log_warn("queue %s: %zu lock%s of a retired worker will expire after lock_ttl: no "
                    "current worker of the queue could take them", queue, n, n == 1 ? "" : "s");
}

/* Strictly past: a job that has run exactly its timeout is still on time. */
bool sk_deaths_overdue(const struct sk_slot *shared, uint32_t job_timeout_ms, int64_t now_ms)
{
    int64_t started = atomic_load(&shared->job_started_ms);
    return job_timeout_ms > 0 && started != 0 && now_ms - started > (int64_t)job_timeout_ms;
}

bool sk_deaths_earns_watchdog(const struct sk_slot *shared, bool runs_jobs,
                              uint32_t job_timeout_ms, int64_t now_ms, uint32_t grace_ms)
{
    if (now_ms - atomic_load(&shared->alive_ms) <= (int64_t)grace_ms)
        return true;
    int64_t started = atomic_load(&shared->job_started_ms);
    if (started == 0 || !runs_jobs)
        return false;
    return job_timeout_ms > 0 && now_ms - started <= (int64_t)job_timeout_ms + grace_ms;
}

void sk_deaths_warn_unwatched(const struct sk_conf *conf, uint32_t watchdog_ms)
{
    for (size_t q = 0; watchdog_ms > 0 && q < conf->n_queues; q++)
        if (conf->queues[q].job_timeout_ms == 0)
            sk_log_warn("queue %s has no job_timeout: under the systemd watchdog, a job "
                        "longer than %u ms withholds WATCHDOG=1 and systemd restarts sekalid; "
                        "set a job_timeout above its longest job", conf->queues[q].name,
                        watchdog_ms);
}
