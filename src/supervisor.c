/* supervisor.c - spawns, reaps and restarts the worker processes.
 *
 * The supervisor never touches a broker or a database: a crashing handler
 * takes down one worker, never the parent. Signals stay blocked and arrive
 * through a signalfd, so they are handled at one point of the loop and never
 * interrupt it halfway.
 *
 * Restarts back off exponentially with jitter per slot, and the backoff only
 * resets after a worker stayed up for a while; a worker that keeps dying is
 * reported as a crash loop instead of being respawned at full speed. A worker
 * exiting with SK_EXIT_CONFIG or SK_EXIT_ABI would fail the same way again, so
 * the supervisor stops everything and exits with that code. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "scoreboard.h"
#include "supervisor.h"
#include "worker.h"

#define STABLE_AFTER_MS     10000  /* a worker up this long resets its backoff */
#define CRASH_LOOP_RESTARTS 5      /* this many quick restarts in a row ... */

struct slot {
    size_t            queue;       /* index into conf->queues */
    pid_t             pid;         /* 0 while not running */
    int64_t           started_ms;
    int64_t           restart_at_ms;
    struct sk_backoff backoff;
    uint32_t          quick_deaths;
};

struct supervisor {
    const struct sk_conf    *conf;
    const struct sk_plugin  *plugins;
    struct slot             *slots;
    size_t                   n_slots;
    int                      signal_fd;
    bool                     stopping;
    int64_t                  kill_at_ms;
    int                      exit_code;
    struct sk_scoreboard    *scoreboard;   /* slot i belongs to slots[i] */
    bool                     any_job_timeout;
    struct sk_metrics       *metrics;      /* shared with every worker */
    struct sk_metrics_http  *http;         /* NULL unless metrics.listen is set */
};

static void spawn(struct supervisor *s, struct slot *slot);
static void reap(struct supervisor *s);
static void on_exit_status(struct supervisor *s, struct slot *slot, int status);
static void begin_stop(struct supervisor *s, const char *why);
static size_t running(const struct supervisor *s);
static int next_timeout(const struct supervisor *s);
static void kill_overdue_jobs(struct supervisor *s);

int sk_supervisor_run(const struct sk_conf *conf, const struct sk_plugin *plugins)
{
    struct supervisor s = { .conf = conf, .plugins = plugins, .signal_fd = -1 };
    for (size_t q = 0; q < conf->n_queues; q++)
        s.n_slots += (size_t)conf->queues[q].workers;
    s.slots = calloc(s.n_slots, sizeof(*s.slots));
    if (s.slots == NULL) {
        sk_log_error("calloc(slots) failed");
        return SK_EXIT_RUNTIME;
    }
    size_t i = 0;
    for (size_t q = 0; q < conf->n_queues; q++)
        for (int k = 0; k < conf->queues[q].workers; k++)
            s.slots[i++] = (struct slot){
                .queue = q, .backoff = { .base_ms = 200, .cap_ms = 30000 } };

    struct sk_err err = { 0 };
    if (sk_scoreboard_create(&s.scoreboard, s.n_slots, &err) != SK_OK ||
        sk_metrics_create(&s.metrics, conf->n_queues, &err) != SK_OK) {
        sk_log_error("%s", err.msg);
        sk_scoreboard_destroy(s.scoreboard);
        free(s.slots);
        return SK_EXIT_RUNTIME;
    }
    for (size_t q = 0; q < conf->n_queues; q++)
        s.any_job_timeout |= conf->queues[q].job_timeout_ms > 0;

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    s.signal_fd = signalfd(-1, &mask, SFD_CLOEXEC);
    if (s.signal_fd < 0) {
        sk_log_error("signalfd failed: %s", strerror(errno));
        sk_metrics_destroy(s.metrics);
        sk_scoreboard_destroy(s.scoreboard);
        free(s.slots);
        return SK_EXIT_RUNTIME;
    }
    /* Before any worker: a port that cannot be had stops sekalid at once,
     * as any other configuration mistake does. */
    int rc = sk_metrics_http_start(&s.http, conf, s.metrics, &err);
    if (rc != SK_OK) {
        sk_log_error("%s", err.msg);
        close(s.signal_fd);
        sk_metrics_destroy(s.metrics);
        sk_scoreboard_destroy(s.scoreboard);
        free(s.slots);
        return rc == SK_ERR ? SK_EXIT_CONFIG : SK_EXIT_RUNTIME;
    }

    for (i = 0; i < s.n_slots; i++)
        spawn(&s, &s.slots[i]);
    sk_log_info("supervisor started %zu workers for %zu queues", s.n_slots, conf->n_queues);

    while (!s.stopping || running(&s) > 0) {
        struct pollfd pfd = { .fd = s.signal_fd, .events = POLLIN };
        int ready = poll(&pfd, 1, next_timeout(&s));
        if (ready < 0 && errno != EINTR) {
            sk_log_error("poll failed: %s", strerror(errno));
            begin_stop(&s, "internal error");
        }
        if (ready > 0) {
            struct signalfd_siginfo info;
            while (read(s.signal_fd, &info, sizeof(info)) == (ssize_t)sizeof(info)) {
                switch (info.ssi_signo) {
                case SIGCHLD:
                    reap(&s);
                    break;
                case SIGTERM:
                case SIGINT:
                    begin_stop(&s, info.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
                    break;
                case SIGHUP:
                    sk_log_warn("SIGHUP: live reload is not supported yet; restart to apply "
                                "a new configuration");
                    break;
                }
                struct pollfd again = { .fd = s.signal_fd, .events = POLLIN };
                if (poll(&again, 1, 0) <= 0)
                    break;
            }
        }
        reap(&s);

        int64_t now = sk_now_ms();
        if (s.stopping) {
            if (now >= s.kill_at_ms && running(&s) > 0) {
                sk_log_warn("shutdown_timeout passed, killing %zu workers", running(&s));
                for (i = 0; i < s.n_slots; i++)
                    if (s.slots[i].pid > 0)
                        kill(s.slots[i].pid, SIGKILL);
                s.kill_at_ms = INT64_MAX;
            }
            continue;
        }
        kill_overdue_jobs(&s);
        for (i = 0; i < s.n_slots; i++)
            if (s.slots[i].pid == 0 && now >= s.slots[i].restart_at_ms)
                spawn(&s, &s.slots[i]);
    }

    close(s.signal_fd);
    sk_metrics_http_stop(s.http);  /* its thread reads the metrics */
    sk_metrics_destroy(s.metrics);
    sk_scoreboard_destroy(s.scoreboard);
    free(s.slots);
    sk_log_info("supervisor exiting with status %d", s.exit_code);
    return s.exit_code;
}

static void spawn(struct supervisor *s, struct slot *slot)
{
    const struct sk_queue_conf *queue = &s->conf->queues[slot->queue];
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        sk_log_error("fork failed: %s", strerror(errno));
        slot->restart_at_ms = sk_now_ms() + sk_backoff_next(&slot->backoff);
        return;
    }
    if (pid == 0) {
        /* The child starts clean: default dispositions, nothing blocked,
         * and it stops by itself if the supervisor dies. */
        close(s->signal_fd);
        sk_metrics_http_close_in_child(s->http);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(SK_EXIT_RUNTIME);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGHUP, SIG_IGN);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        sk_log_init(s->conf->log.level, s->conf->log.format, "worker");
        struct sk_slot *shared = sk_scoreboard_slot(s->scoreboard, (size_t)(slot - s->slots));
        atomic_store(&shared->job_started_ms, 0);
        exit(sk_worker_run(s->conf, queue, &s->plugins[slot->queue], shared,
                           sk_metrics_queue(s->metrics, slot->queue)));
    }
    sk_metrics_worker_started(s->metrics, slot->queue, slot->started_ms != 0);
    slot->pid = pid;
    slot->started_ms = sk_now_ms();
    sk_log_debug("started worker %ld for queue %s", (long)pid, queue->name);
}

static void reap(struct supervisor *s)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            return;
        for (size_t i = 0; i < s->n_slots; i++) {
            if (s->slots[i].pid == pid) {
                s->slots[i].pid = 0;
                sk_metrics_worker_exited(s->metrics, s->slots[i].queue);
                on_exit_status(s, &s->slots[i], status);
                break;
            }
        }
    }
}

static void on_exit_status(struct supervisor *s, struct slot *slot, int status)
{
    const char *queue = s->conf->queues[slot->queue].name;
    int64_t lived = sk_now_ms() - slot->started_ms;

    if (WIFEXITED(status) && WEXITSTATUS(status) == SK_EXIT_OK && s->stopping) {
        sk_log_debug("worker for queue %s stopped", queue);
        return;
    }
    if (WIFEXITED(status) &&
        (WEXITSTATUS(status) == SK_EXIT_CONFIG || WEXITSTATUS(status) == SK_EXIT_ABI)) {
        sk_log_error("worker for queue %s exited with status %d; not restarting it, since it "
                     "would fail the same way", queue, WEXITSTATUS(status));
        if (s->exit_code == SK_EXIT_OK)
            s->exit_code = WEXITSTATUS(status);
        begin_stop(s, "a worker cannot run with this configuration");
        return;
    }
    if (WIFSIGNALED(status))
        sk_log_warn("worker for queue %s killed by signal %d after %lld ms", queue,
                    WTERMSIG(status), (long long)lived);
    else
        sk_log_warn("worker for queue %s exited with status %d after %lld ms", queue,
                    WEXITSTATUS(status), (long long)lived);
    if (s->stopping)
        return;

    if (lived >= STABLE_AFTER_MS) {
        sk_backoff_reset(&slot->backoff);
        slot->quick_deaths = 0;
    } else if (++slot->quick_deaths == CRASH_LOOP_RESTARTS) {
        sk_log_error("worker for queue %s is crash-looping (%u quick deaths in a row); "
                     "restarts are backing off up to %u ms", queue, slot->quick_deaths,
                     slot->backoff.cap_ms);
    }
    slot->restart_at_ms = sk_now_ms() + sk_backoff_next(&slot->backoff);
}

static void begin_stop(struct supervisor *s, const char *why)
{
    if (s->stopping)
        return;
    s->stopping = true;
    s->kill_at_ms = sk_now_ms() + s->conf->shutdown_timeout_ms;
    sk_log_info("stopping (%s): waiting up to %u ms for %zu workers to finish their jobs", why,
                s->conf->shutdown_timeout_ms, running(s));
    for (size_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].pid > 0)
            kill(s->slots[i].pid, SIGTERM);
}

static size_t running(const struct supervisor *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_slots; i++)
        n += s->slots[i].pid > 0;
    return n;
}

/* A job past its queue's job_timeout is killed with its worker: SIGKILL,
 * because a handler stuck in a loop or a syscall would never see a gentler
 * signal. Its transaction rolls back and the broker redelivers the job. */
static void kill_overdue_jobs(struct supervisor *s)
{
    if (!s->any_job_timeout)
        return;
    int64_t now = sk_now_ms();
    for (size_t i = 0; i < s->n_slots; i++) {
        const struct sk_queue_conf *queue = &s->conf->queues[s->slots[i].queue];
        struct sk_slot *shared = sk_scoreboard_slot(s->scoreboard, i);
        int64_t started = atomic_load(&shared->job_started_ms);
        if (s->slots[i].pid <= 0 || queue->job_timeout_ms == 0 || started == 0 ||
            now - started <= (int64_t)queue->job_timeout_ms)
            continue;
        sk_log_warn("worker %ld of queue %s has run one job for %lld ms, over its job_timeout "
                    "of %u ms: killing it", (long)s->slots[i].pid, queue->name,
                    (long long)(now - started), queue->job_timeout_ms);
        kill(s->slots[i].pid, SIGKILL);
        atomic_store(&shared->job_started_ms, 0);
    }
}

/* Sleep until the next restart or kill deadline, or a signal; with job
 * timeouts, wake at least every 100 ms to check them. */
static int next_timeout(const struct supervisor *s)
{
    int64_t now = sk_now_ms();
    int64_t next = INT64_MAX;
    if (s->stopping) {
        next = s->kill_at_ms;
    } else {
        for (size_t i = 0; i < s->n_slots; i++)
            if (s->slots[i].pid == 0 && s->slots[i].restart_at_ms < next)
                next = s->slots[i].restart_at_ms;
    }
    int64_t longest = s->any_job_timeout && !s->stopping ? 100 : 60000;
    if (next <= now)
        return 0;
    return next == INT64_MAX || next - now > longest ? (int)longest : (int)(next - now);
}

