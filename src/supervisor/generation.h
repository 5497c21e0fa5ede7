/* generation.h - private to src/supervisor/: a generation, one
 * configuration and the slots of the processes it runs (supervisor.c
 * explains their life), and building and freeing one.
 *
 * Building a generation takes what every process of it shares: the
 * scoreboard, sized for its largest batch, and a new metrics area.
 * Spawning, reaping and retiring its processes is supervisor.c's. */
#ifndef SK_GENERATION_H
#define SK_GENERATION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "backoff.h"
#include "config.h"
#include "deaths.h"
#include "metrics.h"
#include "plugin.h"
#include "roles.h"
#include "scoreboard.h"

struct slot {
    const struct sk_role_ops *ops;
    size_t            queue;       /* a worker's: index into conf->queues */
    char              title[300];  /* for ps, the same for the slot's life */
    pid_t             pid;         /* 0 while not running */
    int64_t           started_ms;
    int64_t           restart_at_ms;
    struct sk_backoff backoff;
    uint32_t          quick_deaths;  /* deaths without progress in a row */
    bool              timed_out;     /* the supervisor SIGKILLed it for job_timeout */
};

/* One configuration and the workers it runs. Slot i's shared state is
 * scoreboard slot i. */
struct generation {
    struct sk_conf       *conf;
    struct sk_plugin     *plugins;     /* plugins[q] serves conf->queues[q] */
    struct slot          *slots;
    size_t                n_slots;
    struct sk_scoreboard *scoreboard;
    struct sk_heir       *heirs;       /* slot i's scoreboard slot and queue, for deaths.c */
    struct sk_metrics    *metrics;     /* counted by this generation's workers */
    bool                  any_job_timeout;
    int64_t               kill_at_ms;  /* retiring: SIGKILL what is left after this */
    struct generation    *next;        /* in the list of retiring generations */
};

/* A generation of conf, with a slot for each process its roles ask for,
 * none running yet. Takes conf and plugins (sk_generation_free() frees
 * them); NULL with err filled on failure, and conf and plugins are then
 * still the caller's. */
struct generation *sk_generation_new(struct sk_conf *conf, struct sk_plugin *plugins,
                                     struct sk_err *err);
void sk_generation_free(struct generation *g);

/* What a slot's process is called in the log: "worker for queue invoices",
 * "the outbox relay". Writes into buf; returns it. */
const char *sk_generation_slot_name(const struct generation *g, const struct slot *slot,
                                    char *buf, size_t size);

#endif
