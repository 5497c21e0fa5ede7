/* supervisor.c - spawns, reaps and restarts the worker processes, and
 * reloads the configuration.
 *
 * The supervisor never touches a broker or a database: a crashing handler
 * takes down one worker, never the parent. Signals stay blocked and arrive
 * through a signalfd, so they are handled at one point of the loop and never
 * interrupt it halfway.
 *
 * A configuration and the workers it runs form a generation. SIGHUP loads
 * the file again; if it is invalid, the current generation runs on and the
 * error is reported; if it is valid, a new generation starts and the old one
 * drains (each old worker finishes its job, its unstarted deliveries go back
 * to the broker for the new workers) and is freed once its last worker left.
 * SIGTERM retires the current generation the same way, and the supervisor
 * exits when no generation is left. The generation a reload replaces goes on
 * serving until every worker of the new one consumes: should a new worker
 * exit 2 or 3 before that (its handler's init() refused the config, its
 * password was refused), the new generation is abandoned and the previous
 * one stays, as for an invalid file.
 *
 * Each slot of a generation has a role (roles.h: a queue's worker, an
 * outbox relay, the janitor) that names its process and runs it; every
 * child starts with the same sk_process_child_init().
 *
 * A worker that made progress before it died (it finished a delivery, or it
 * was consuming when something outside killed it) is restarted at once; only
 * deaths without progress (before becoming ready, or of its own doing) back
 * off exponentially with jitter per slot (restart: in the config), and five
 * of those in a row are reported as a crash loop. At reap time deaths.c
 * judges whether the death is the job's (the handler was running and the
 * worker faulted, exited, was OOM-killed or timed out), and moves a lock
 * the dead worker held to where its replacement frees it (a retiring
 * generation's, to a current worker of its queue); it also says when a job
 * is past its job_timeout, and the supervisor kills its worker. A worker
 * exiting with SK_EXIT_CONFIG or SK_EXIT_ABI would fail the same way again,
 * so (outside a pending reload) the supervisor stops everything and exits
 * with that code. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "deaths.h"
#include "failpoint.h"
#include "generation.h"
#include "host.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "notify.h"
#include "process.h"
#include "proctitle.h"
#include "roles.h"
#include "inflight.h"
#include "scoreboard.h"
#include "supervisor.h"

#define CRASH_LOOP_RESTARTS 5      /* this many deaths without progress in a row ... */

struct supervisor {
    struct generation *current;      /* NULL once stopping */
    struct generation *previous;     /* replaced by a reload, serving until current is ready */
    struct generation *retiring;     /* older generations still draining */
    int                signal_fd;
    bool               stopping;
    int                exit_code;
    bool               ready_sent;   /* READY=1 for the current generation */
    uint32_t           watchdog_ms;  /* systemd's WatchdogSec, or 0 */
    int64_t            next_watchdog_ms;
    char               status[1024]; /* the last STATUS= sent */
    struct sk_metrics_http *http;    /* serves the current generation; NULL if off */
    struct sk_deaths   deaths;       /* what judging a death remembers (the OOM counter) */
};

static int start(struct supervisor *s, struct sk_conf *conf, struct sk_plugin *plugins);
static char *inflight(void *arg, size_t *len);
static void turn(struct supervisor *s);
static void take_signals(struct supervisor *s);
static void retire(struct supervisor *s, struct generation *g, const char *reason,
                   const char *why);
static void spawn(struct supervisor *s, struct generation *g, struct slot *slot);
static void fresh(struct sk_slot *shared);
static void reap(struct supervisor *s);
static void on_exit_status(struct supervisor *s, struct generation *g, struct slot *slot,
                           const struct sk_slot *shared, int status, const struct sk_death *d);
static void cannot_run(struct supervisor *s, struct generation *g, const char *who, int code,
                       const struct sk_log_job *job);
static void log_death(const char *who, int status, int64_t lived, bool job_caused,
                      int64_t delay, const struct sk_log_job *job);
static void begin_stop(struct supervisor *s, const char *why);
static void reload(struct supervisor *s);
static void abandon(struct supervisor *s, const char *who, int code);
static void respawn_due(struct supervisor *s, struct generation *g, int64_t now);
static size_t running(const struct generation *g);
static size_t workers(const struct generation *g);
static int next_timeout(const struct supervisor *s);
static void kill_overdue_jobs(struct generation *g);
static void kill_stragglers(struct supervisor *s);
static void report(struct supervisor *s);
static bool slot_up(const struct generation *g, size_t i);
static bool slot_paused(const struct generation *g, size_t i);
static bool slot_blocked(const struct generation *g, size_t i);
static uint32_t slot_locks_held(const struct generation *g, size_t i);
static void describe(const struct generation *g, char *status, size_t size);

int sk_supervisor_run(struct sk_conf *conf, struct sk_plugin *plugins)
{
    struct supervisor s = { .signal_fd = -1 };
    sk_proctitle_set("sekalid: supervisor", "sk-supervisor");
    int rc = start(&s, conf, plugins);
    if (rc != SK_EXIT_OK)
        return rc;
    while (s.current != NULL || s.retiring != NULL)
        turn(&s);
    close(s.signal_fd);
    sk_metrics_http_stop(s.http);
    sk_log_info("supervisor exiting with status %d", s.exit_code);
    return s.exit_code;
}

/* Takes the signals, opens the endpoint, forks the first generation.
 * Returns SK_EXIT_OK, or the exit code of the failure (already logged). */
static int start(struct supervisor *s, struct sk_conf *conf, struct sk_plugin *plugins)
{
    struct sk_err err = { 0 };
    sk_process_parent_init();
    s->current = sk_generation_new(conf, plugins, &err);
    if (s->current == NULL) {
        sk_log_error("%s", err.msg);
        sk_conf_free(conf);
        free(plugins);
        return SK_EXIT_RUNTIME;
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    s->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC);
    if (s->signal_fd < 0) {
        sk_log_error("signalfd failed: %s", strerror(errno));
        sk_generation_free(s->current);
        return SK_EXIT_RUNTIME;
    }
    /* Before any worker: a port that cannot be had stops sekalid at once,
     * as any other configuration mistake does. */
    int rc = sk_metrics_http_start(&s->http, conf, s->current->metrics, &err);
    if (rc != SK_OK) {
        sk_log_error("%s", err.msg);
        close(s->signal_fd);
        sk_generation_free(s->current);
        return rc == SK_ERR ? SK_EXIT_CONFIG : SK_EXIT_RUNTIME;
    }
    sk_metrics_http_inflight(s->http, inflight, s);
    s->watchdog_ms = sk_notify_watchdog_ms();
    sk_deaths_warn_unwatched(conf, s->watchdog_ms);
    sk_deaths_init(&s->deaths);
    for (size_t i = 0; i < s->current->n_slots; i++)
        spawn(s, s->current, &s->current->slots[i]);
    sk_log_info("supervisor started %zu workers for %zu queues", workers(s->current),
                conf->n_queues);
    return SK_EXIT_OK;
}

/* One turn of the loop: wait for a signal, a scrape or the next deadline,
 * then handle what is due. The HTTP endpoint is answered last, so /readyz
 * tells what this turn found. */
static void turn(struct supervisor *s)
{
    int timeout = next_timeout(s);
    struct pollfd fds[2] = { { .fd = s->signal_fd, .events = POLLIN } };
    sk_metrics_http_poll(s->http, &fds[1], &timeout);
    int ready = poll(fds, 2, timeout);
    if (ready < 0) {
        if (errno != EINTR) {
            sk_log_error("poll failed: %s", strerror(errno));
            begin_stop(s, "internal error");
        }
        fds[1].revents = 0;
    }
    if (ready > 0 && fds[0].revents != 0)
        take_signals(s);
    reap(s);
    kill_stragglers(s);
    if (s->current == NULL)
        return;
    int64_t now = sk_now_ms();
    kill_overdue_jobs(s->current);
    if (s->previous != NULL)
        kill_overdue_jobs(s->previous);
    for (struct generation *g = s->retiring; g != NULL; g = g->next)
        kill_overdue_jobs(g);
    respawn_due(s, s->current, now);
    if (s->previous != NULL)
        respawn_due(s, s->previous, now);
    sk_fault_hold("hold_supervisor");
    report(s);
    sk_metrics_http_serve(s->http, &fds[1]);
}

/* Reads every pending signal off the signalfd and acts on it. */
static void take_signals(struct supervisor *s)
{
    struct signalfd_siginfo info;
    while (read(s->signal_fd, &info, sizeof(info)) == (ssize_t)sizeof(info)) {
        switch (info.ssi_signo) {
        case SIGCHLD:
            reap(s);
            break;
        case SIGTERM:
        case SIGINT:
            begin_stop(s, info.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
            break;
        case SIGHUP:
            reload(s);
            break;
        }
        struct pollfd again = { .fd = s->signal_fd, .events = POLLIN };
        if (poll(&again, 1, 0) <= 0)
            break;
    }
}

static void respawn_due(struct supervisor *s, struct generation *g, int64_t now)
{
    for (size_t i = 0; i < g->n_slots; i++) {
        struct slot *slot = &g->slots[i];
        if (slot->pid == 0 && now >= slot->restart_at_ms)
            spawn(s, g, slot);
    }
}

/* Asks every worker of g to finish its job and exit, and gives them the
 * generation's shutdown_timeout before SIGKILL. */
/* reason is the event's field (sekalid(8)): "reload", "superseded",
 * "abandoned" or "stop"; why is the prose. */
static void retire(struct supervisor *s, struct generation *g, const char *reason,
                   const char *why)
{
    g->kill_at_ms = sk_now_ms() + g->conf->shutdown_timeout_ms;
    sk_log_event_fields(SK_LOG_INFO, SK_EVENT_GENERATION_RETIRED, NULL, NULL,
                        (const struct sk_log_field[]){ { "reason", reason } }, 1,
                        "%s: waiting up to %u ms for %zu workers to finish their jobs", why,
                        g->conf->shutdown_timeout_ms, running(g));
    for (size_t i = 0; i < g->n_slots; i++)
        if (g->slots[i].pid > 0)
            kill(g->slots[i].pid, SIGTERM);
    g->next = s->retiring;
    s->retiring = g;
}

/* The child keeps none of the endpoint's sockets: a scrape must never be
 * answered, or held open, by a worker. */
static void close_endpoint(void *http)
{
    sk_metrics_http_close_in_child(http);
}

static void spawn(struct supervisor *s, struct generation *g, struct slot *slot)
{
    struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, (size_t)(slot - g->slots));
    fresh(shared);
    slot->timed_out = false;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        sk_log_error("fork failed: %s", strerror(errno));
        slot->restart_at_ms = sk_now_ms() + sk_backoff_next(&slot->backoff);
        return;
    }
    if (pid == 0) {
        sk_process_child_init(&(struct sk_child_init){
            .parent = parent, .signal_fd = s->signal_fd,
            .close_inherited = close_endpoint, .close_arg = s->http,
            .title = slot->title, .comm = slot->ops->comm, .log_role = slot->ops->log_role,
            .log = &g->conf->log });
        const struct sk_child child = {
            .conf = g->conf, .queue = slot->queue, .shared = shared, .metrics = g->metrics,
            .plugin = slot->ops->counts_as_worker ? &g->plugins[slot->queue] : NULL,
            .doctor = slot == &g->slots[0],
        };
        exit(slot->ops->run(&child));
    }
    if (slot->ops->counts_as_worker)
        sk_metrics_worker_started(g->metrics, slot->queue, slot->started_ms != 0);
    slot->pid = pid;
    slot->started_ms = sk_now_ms();
    char name[300];
    sk_log_debug("started process %ld: %s", (long)pid,
                 sk_generation_slot_name(g, slot, name, sizeof(name)));
}

/* The new process's progress starts from nothing; written before the fork,
 * so a child killed at once cannot be judged by its predecessor's. The dead
 * worker's job key and orphaned locks stay for it to handle. */
static void fresh(struct sk_slot *shared)
{
    atomic_store(&shared->job_started_ms, 0);
    atomic_store(&shared->phase, SK_PHASE_IDLE);
    atomic_store(&shared->ready, 0);
    atomic_store(&shared->finished, 0);
    atomic_store(&shared->blocked, 0);
    sk_slot_forget_locks(shared);
}

/* Finds pid's slot in generation g, or NULL. */
static struct slot *slot_of(struct generation *g, pid_t pid)
{
    for (size_t i = 0; g != NULL && i < g->n_slots; i++)
        if (g->slots[i].pid == pid)
            return &g->slots[i];
    return NULL;
}

static void reap(struct supervisor *s)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            break;
        struct generation *g = s->current;
        struct slot *slot = slot_of(g, pid);
        if (slot == NULL && (slot = slot_of(s->previous, pid)) != NULL)
            g = s->previous;
        for (g = slot != NULL ? g : s->retiring; slot == NULL && g != NULL; g = g->next)
            if ((slot = slot_of(g, pid)) != NULL)
                break;
        if (slot == NULL)
            continue;
        slot->pid = 0;
        if (slot->ops->counts_as_worker)
            sk_metrics_worker_exited(g->metrics, slot->queue);
        struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, (size_t)(slot - g->slots));
        struct sk_death d = sk_deaths_judge(&s->deaths, shared, slot->timed_out, status);
        sk_deaths_bequeath(shared, &d);
        if (g != s->current && g != s->previous && s->current != NULL &&
            slot->ops->counts_as_worker)
            sk_deaths_hand_down(shared, g->conf->queues[slot->queue].name, s->current->heirs,
                                s->current->n_slots);
        on_exit_status(s, g, slot, shared, status, &d);
    }
    /* Free the retired generations whose last worker is gone. */
    for (struct generation **link = &s->retiring; *link != NULL;) {
        struct generation *g = *link;
        if (running(g) > 0) {
            link = &g->next;
            continue;
        }
        *link = g->next;
        sk_log_debug("a retired generation has drained");
        sk_generation_free(g);
    }
}

/* shared: the dead worker's scoreboard slot, read for the key of the job
 * it died in, which its death line carries as a job field. */
static void on_exit_status(struct supervisor *s, struct generation *g, struct slot *slot,
                           const struct sk_slot *shared, int status, const struct sk_death *d)
{
    char name[300];
    const char *who = sk_generation_slot_name(g, slot, name, sizeof(name));
    int64_t lived = sk_now_ms() - slot->started_ms;
    bool retiring = g != s->current && g != s->previous;
    struct sk_log_job job = { 0 };
    if (slot->ops->counts_as_worker) {
        job.queue = g->conf->queues[slot->queue].name;
        if (atomic_load(&shared->phase) != SK_PHASE_IDLE && shared->job_key[0] != '\0')
            job.idempotency_key = shared->job_key;
    }

    if (WIFEXITED(status) && WEXITSTATUS(status) == SK_EXIT_OK && retiring) {
        sk_log_debug("%s stopped", who);
        return;
    }
    if (!retiring && WIFEXITED(status) &&
        (WEXITSTATUS(status) == SK_EXIT_CONFIG || WEXITSTATUS(status) == SK_EXIT_ABI))
        return cannot_run(s, g, who, WEXITSTATUS(status), &job);
    uint32_t delay = 0;
    if (!retiring && d->progress) {
        sk_backoff_reset(&slot->backoff);
        slot->quick_deaths = 0;
    } else if (!retiring && !d->outside) {
        delay = sk_backoff_next(&slot->backoff);
    }
    log_death(who, status, lived, d->job_caused, retiring ? -1 : (int64_t)delay, &job);
    if (retiring)
        return;
    if (!d->progress && !d->outside && ++slot->quick_deaths == CRASH_LOOP_RESTARTS) {
        char deaths[16], cap[16];
        snprintf(deaths, sizeof(deaths), "%u", slot->quick_deaths);
        snprintf(cap, sizeof(cap), "%u", slot->backoff.cap_ms);
        sk_log_event_fields(SK_LOG_ERROR, SK_EVENT_CRASH_LOOP, NULL, &job,
                            (const struct sk_log_field[]){ { "deaths", deaths },
                                                           { "cap_ms", cap } }, 2,
                            "%s is crash-looping (%u deaths in a row without "
                            "progress); restarts are backing off up to %u ms", who,
                            slot->quick_deaths, slot->backoff.cap_ms);
    }
    slot->restart_at_ms = sk_now_ms() + delay;
}

/* A process of g exited with code (SK_EXIT_CONFIG or SK_EXIT_ABI): it
 * would fail the same way again. A reload's new generation is abandoned;
 * otherwise everything stops, and sekalid exits with that code. */
static void cannot_run(struct supervisor *s, struct generation *g, const char *who, int code,
                       const struct sk_log_job *job)
{
    if (g == s->current && s->previous != NULL) {
        abandon(s, who, code);
        return;
    }
    sk_log_event(SK_LOG_ERROR, SK_EVENT_WORKER_CANNOT_RUN, NULL, job,
                 "%s exited with status %d; not restarting it, since it "
                 "would fail the same way", who, code);
    if (s->exit_code == SK_EXIT_OK)
        s->exit_code = code;
    begin_stop(s, "a worker cannot run with this configuration");
}

/* The death line: who, how, after how long, whose doing, what follows
 * (delay: the restart's, or -1 for a retired worker, which is not
 * restarted). How, whose and what are fields too (sekalid(8), LOGGING). */
static void log_death(const char *who, int status, int64_t lived, bool job_caused,
                      int64_t delay, const struct sk_log_job *job)
{
    bool signalled = WIFSIGNALED(status);
    char how[16], restart[24] = "", what[64] = "";
    snprintf(how, sizeof(how), "%d", signalled ? WTERMSIG(status) : WEXITSTATUS(status));
    if (delay >= 0) {
        snprintf(restart, sizeof(restart), "%lld", (long long)delay);
        snprintf(what, sizeof(what), delay == 0 ? "; restarting at once"
                                                : "; restarting in %lld ms", (long long)delay);
    }
    const struct sk_log_field fields[] = {
        { signalled ? "signal" : "status", how },
        { "job_caused", job_caused ? "yes" : NULL },
        { "restart_ms", restart },
    };
    sk_log_event_fields(SK_LOG_WARN, SK_EVENT_WORKER_DIED, NULL, job, fields, 3,
                        "%s %s %s after %lld ms%s%s", who,
                        signalled ? "killed by signal" : "exited with status", how,
                        (long long)lived, job_caused ? " (its job's doing)" : "", what);
}

static void begin_stop(struct supervisor *s, const char *why)
{
    if (s->stopping || s->current == NULL)
        return;
    s->stopping = true;
    sk_notify_stopping();
    sk_notify_status("stopping (%s): %zu workers finishing their jobs", why,
                     running(s->current));
    char what[128];
    snprintf(what, sizeof(what), "stopping (%s)", why);
    /* The last scrape is over before the generation it reads can go. */
    sk_metrics_http_stop(s->http);
    s->http = NULL;
    if (s->previous != NULL)
        retire(s, s->previous, "stop", what);
    s->previous = NULL;
    retire(s, s->current, "stop", what);
    s->current = NULL;
}

/* SIGHUP: the new configuration must load completely, handlers included,
 * before anything changes; otherwise the current generation runs on. */
static void reload(struct supervisor *s)
{
    if (s->current == NULL)
        return;
    sk_notify_reloading();
    sk_log_info("SIGHUP: reloading %s", s->current->conf->path);

    struct sk_err err = { 0 };
    struct sk_conf *conf = NULL;
    struct sk_plugin *plugins = NULL;
    struct generation *g = NULL;
    if (sk_conf_load(s->current->conf->path, &conf, &err) != SK_OK ||
        sk_plugin_load_queues(conf, sk_host(), &plugins, &err) != SK_OK ||
        (g = sk_generation_new(conf, plugins, &err)) == NULL) {
        sk_log_event(SK_LOG_ERROR, SK_EVENT_RELOAD_FAILED, NULL, NULL,
                     "reload failed, still running the previous configuration: %s", err.msg);
        sk_notify_status("reload failed, running the previous configuration: %s", err.msg);
        s->status[0] = '\0';
        sk_notify_ready();
        sk_conf_free(conf);
        free(plugins);
        return;
    }
    const struct sk_metrics_conf *was = &s->current->conf->metrics, *now = &conf->metrics;
    bool same_listen = was->listen_port == now->listen_port &&
        (was->listen_host == NULL) == (now->listen_host == NULL) &&
        (was->listen_host == NULL || strcmp(was->listen_host, now->listen_host) == 0);
    if (!same_listen)
        sk_log_warn("reload: metrics.listen changed; the new address takes a restart");
    sk_metrics_http_switch(s->http, g->conf, g->metrics);
    /* The running generation serves until the new one consumes (report()),
     * so that a new one that cannot start costs nothing. A generation that
     * a further reload replaces before it was ready is simply superseded. */
    if (s->previous != NULL)
        retire(s, s->current, "superseded",
               "reload: retiring the generation that never got ready");
    else
        s->previous = s->current;
    s->current = g;
    s->ready_sent = false;
    for (size_t i = 0; i < g->n_slots; i++)
        spawn(s, g, &g->slots[i]);
    char n_workers[24], n_queues[24];
    snprintf(n_workers, sizeof(n_workers), "%zu", workers(g));
    snprintf(n_queues, sizeof(n_queues), "%zu", conf->n_queues);
    sk_log_event_fields(SK_LOG_INFO, SK_EVENT_RELOADED, NULL, NULL,
                        (const struct sk_log_field[]){ { "workers", n_workers },
                                                       { "queues", n_queues } }, 2,
                        "reloaded: %s workers for %s queues", n_workers, n_queues);
}

/* A worker of a reload's new generation exited 2 or 3 before that
 * generation was ready: it cannot run, and would stop sekalid were it the
 * only one. The previous generation, still serving, stays current. */
static void abandon(struct supervisor *s, const char *who, int code)
{
    struct generation *g = s->current;
    sk_log_event(SK_LOG_ERROR, SK_EVENT_RELOAD_FAILED, NULL, NULL,
                 "reload failed, still running the previous configuration: %s exited with "
                 "status %d at start", who, code);
    sk_notify_status("reload failed, running the previous configuration: %s exited with "
                     "status %d at start", who, code);
    s->status[0] = '\0';
    s->current = s->previous;
    s->previous = NULL;
    sk_metrics_http_switch(s->http, s->current->conf, s->current->metrics);
    retire(s, g, "abandoned", "reload: abandoning the new generation");
    s->ready_sent = true;
    sk_notify_ready();
}

/* Queue workers only: relays and the janitor are not counted. */
static size_t workers(const struct generation *g)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n_slots; i++)
        n += g->slots[i].ops->counts_as_worker;
    return n;
}

static size_t running(const struct generation *g)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n_slots; i++)
        n += g->slots[i].pid > 0;
    return n;
}

/* Slot i earns the watchdog's credit (sk_deaths_earns_watchdog()). */
static bool slot_alive(const struct generation *g, size_t i, int64_t now, uint32_t grace)
{
    const struct slot *slot = &g->slots[i];
    bool runs_jobs = slot->ops->counts_as_worker;
    uint32_t limit = runs_jobs ? g->conf->queues[slot->queue].job_timeout_ms : 0;
    return slot->pid > 0 && sk_deaths_earns_watchdog(sk_scoreboard_slot(g->scoreboard, i),
                                                     runs_jobs, limit, now, grace);
}

/* Tells systemd how things stand: READY=1 once every worker of the current
 * generation consumes (at start, and after a reload), STATUS= when the
 * picture changes, and WATCHDOG=1 only while every worker's loop is turning
 * or busy with a job that job_timeout watches: a supervisor that runs while
 * its workers are wedged must not keep the watchdog quiet. */
static void report(struct supervisor *s)
{
    const struct generation *g = s->current;
    int64_t now = sk_now_ms();
    uint32_t grace = s->watchdog_ms > 0 ? s->watchdog_ms : 60000;
    size_t consuming = 0;
    bool healthy = true;
    for (size_t i = 0; i < g->n_slots; i++) {
        consuming += slot_up(g, i);
        healthy &= slot_alive(g, i, now, grace);
    }
    for (size_t q = 0; q < g->conf->n_queues; q++) {
        uint64_t paused = 0, blocked = 0, held = 0;
        for (size_t i = 0; i < g->n_slots; i++) {
            bool mine = g->slots[i].ops->counts_as_worker && g->slots[i].queue == q;
            paused += mine && slot_paused(g, i);
            blocked += mine && slot_blocked(g, i);
            held += mine ? slot_locks_held(g, i) : 0;
        }
        sk_metrics_workers_paused(g->metrics, q, paused);
        sk_metrics_workers_blocked(g->metrics, q, blocked);
        sk_metrics_locks_held(g->metrics, q, held);
    }
    char status[1024];
    describe(g, status, sizeof(status));
    if (!s->ready_sent && consuming == g->n_slots) {
        s->ready_sent = true;
        sk_notify_ready();
        sk_log_event(SK_LOG_INFO, SK_EVENT_READY, NULL, NULL, "ready: every worker is consuming");
        if (s->previous != NULL) {
            retire(s, s->previous, "reload", "reload: retiring the previous generation");
            s->previous = NULL;
        }
    }
    if (strcmp(status, s->status) != 0) {
        memcpy(s->status, status, sizeof(status));
        sk_notify_status("%s", status);
    }
    sk_metrics_http_health(s->http, consuming == g->n_slots, status);
    if (s->watchdog_ms > 0 && healthy && now >= s->next_watchdog_ms) {
        sk_notify_watchdog();
        s->next_watchdog_ms = now + s->watchdog_ms / 2;
    }
}

/* GET /inflight: every generation still running workers has jobs in
 * flight, a retiring one's draining ones included. Called from the loop's
 * own turn, so the list cannot change under it. */
static char *inflight(void *arg, size_t *len)
{
    const struct supervisor *s = arg;
    size_t n = 2;
    for (const struct generation *r = s->retiring; r != NULL; r = r->next)
        n++;
    const struct generation **gens = calloc(n, sizeof(*gens));
    if (gens == NULL)
        return NULL;
    gens[0] = s->current;
    gens[1] = s->previous;
    size_t i = 2;
    for (const struct generation *r = s->retiring; r != NULL; r = r->next)
        gens[i++] = r;
    char *text = sk_inflight_json(gens, n, len);
    free(gens);
    return text;
}

/* Slot i's process runs and says it consumes (a relay or the janitor: that
 * it is connected and working), or that its queue is paused: a worker that
 * obeys a pause is as ready as one consuming, or a paused queue would fail
 * the health check and hold back READY=1 and a reload. */
static bool slot_up(const struct generation *g, size_t i)
{
    const struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, i);
    return g->slots[i].pid > 0 &&
           (atomic_load(&shared->consuming) || atomic_load(&shared->paused));
}

static bool slot_paused(const struct generation *g, size_t i)
{
    const struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, i);
    return g->slots[i].pid > 0 && atomic_load(&shared->paused);
}

/* Slot i's worker runs but its handler cannot: it consumes nothing, so it
 * is not up, and the queue's line says why. */
static bool slot_blocked(const struct generation *g, size_t i)
{
    const struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, i);
    return g->slots[i].pid > 0 && atomic_load(&shared->blocked);
}

/* What slot i's running worker holds in Redis; a dead one's are orphans. */
static uint32_t slot_locks_held(const struct generation *g, size_t i)
{
    const struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, i);
    return g->slots[i].pid > 0 ? atomic_load(&shared->n_held) : 0;
}

/* A blocked worker's reason, fit for one segment of the STATUS= line: its
 * "; " separates queues, so a ';' in the handler's text becomes ','. */
static void blocked_why(const struct generation *g, size_t i, char *out, size_t size)
{
    const struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, i);
    size_t n = 0;
    for (; n + 1 < size && n < sizeof(shared->blocked_why) && shared->blocked_why[n] != '\0'; n++) {
        char c = shared->blocked_why[n];
        out[n] = c == ';' ? ',' : (unsigned char)c < 0x20 ? ' ' : c;
    }
    out[n] = '\0';
}

/* The STATUS= line: "invoices: 1/2 workers consuming; outbox: 1/1 relays up". */
static void describe(const struct generation *g, char *status, size_t size)
{
    size_t len = 0, relays = 0, relays_up = 0;
    status[0] = '\0';
    for (size_t q = 0; q < g->conf->n_queues; q++) {
        size_t up = 0, of = 0, paused = 0, blocked = 0;
        char why[SK_SLOT_WHY_MAX] = "";
        for (size_t i = 0; i < g->n_slots; i++) {
            if (g->slots[i].ops->counts_as_worker && g->slots[i].queue == q) {
                of++;
                paused += slot_paused(g, i);
                up += slot_up(g, i) && !slot_paused(g, i);
                if (slot_blocked(g, i) && blocked++ == 0)
                    blocked_why(g, i, why, sizeof(why));
            }
        }
        int n = blocked > 0
            ? snprintf(status + len, size - len, "%s%s: the handler cannot run (%zu/%zu "
                       "workers hold no job): %s", q > 0 ? "; " : "", g->conf->queues[q].name,
                       blocked, of, why)
            : paused > 0
            ? snprintf(status + len, size - len, "%s%s: paused (%zu/%zu workers paused)",
                       q > 0 ? "; " : "", g->conf->queues[q].name, paused, of)
            : snprintf(status + len, size - len, "%s%s: %zu/%zu workers consuming",
                       q > 0 ? "; " : "", g->conf->queues[q].name, up, of);
        if (n > 0 && (size_t)n < size - len)
            len += (size_t)n;
    }
    for (size_t i = 0; i < g->n_slots; i++) {
        if (g->slots[i].ops == &sk_roles[SK_ROLE_RELAY]) {
            relays++;
            relays_up += slot_up(g, i);
        }
    }
    if (relays > 0)
        snprintf(status + len, size - len, "; outbox: %zu/%zu relays up", relays_up, relays);
}

/* A job past its queue's job_timeout is killed with its worker: SIGKILL,
 * because a handler stuck in a loop or a syscall would never see a gentler
 * signal. Its transaction rolls back and the broker redelivers the job. */
static void kill_overdue_jobs(struct generation *g)
{
    if (!g->any_job_timeout)
        return;
    int64_t now = sk_now_ms();
    for (size_t i = 0; i < g->n_slots; i++) {
        if (!g->slots[i].ops->counts_as_worker || g->slots[i].pid <= 0)
            continue;
        const struct sk_queue_conf *queue = &g->conf->queues[g->slots[i].queue];
        struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, i);
        if (!sk_deaths_overdue(shared, queue->job_timeout_ms, now))
            continue;
        char timeout[16];
        snprintf(timeout, sizeof(timeout), "%u", queue->job_timeout_ms);
        sk_log_event_fields(SK_LOG_WARN, SK_EVENT_JOB_TIMEOUT, NULL,
                            &(struct sk_log_job){ .queue = queue->name },
                            (const struct sk_log_field[]){ { "timeout_ms", timeout } }, 1,
                            "worker %ld of queue %s has run one job for %lld ms, over its "
                            "job_timeout of %s ms: killing it", (long)g->slots[i].pid,
                            queue->name,
                            (long long)(now - atomic_load(&shared->job_started_ms)), timeout);
        kill(g->slots[i].pid, SIGKILL);
        g->slots[i].timed_out = true;
        atomic_store(&shared->job_started_ms, 0);
    }
}

/* Workers of a retired generation still running after its shutdown_timeout
 * are killed; their jobs roll back and are redelivered, never doubled. */
static void kill_stragglers(struct supervisor *s)
{
    int64_t now = sk_now_ms();
    for (struct generation *g = s->retiring; g != NULL; g = g->next) {
        if (now < g->kill_at_ms || running(g) == 0)
            continue;
        sk_log_warn("shutdown_timeout passed, killing %zu workers", running(g));
        for (size_t i = 0; i < g->n_slots; i++)
            if (g->slots[i].pid > 0)
                kill(g->slots[i].pid, SIGKILL);
        g->kill_at_ms = INT64_MAX;
    }
}

/* Sleep until the next restart or kill deadline, or a signal; readiness,
 * liveness and job age live in shared memory, which no signal announces, so
 * look at them at least every 200 ms (100 ms with job timeouts). */
static int next_timeout(const struct supervisor *s)
{
    int64_t now = sk_now_ms();
    int64_t next = INT64_MAX;
    const struct generation *g = s->current;
    for (size_t i = 0; g != NULL && i < g->n_slots; i++)
        if (g->slots[i].pid == 0 && g->slots[i].restart_at_ms < next)
            next = g->slots[i].restart_at_ms;
    for (size_t i = 0; s->previous != NULL && i < s->previous->n_slots; i++)
        if (s->previous->slots[i].pid == 0 && s->previous->slots[i].restart_at_ms < next)
            next = s->previous->slots[i].restart_at_ms;
    for (const struct generation *r = s->retiring; r != NULL; r = r->next)
        if (r->kill_at_ms < next)
            next = r->kill_at_ms;
    int64_t longest = g != NULL && g->any_job_timeout ? 100 : 200;
    if (next <= now)
        return 0;
    return next - now > longest ? (int)longest : (int)(next - now);
}
