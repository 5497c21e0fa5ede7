/* roles.h - the kinds of child process the supervisor runs (a queue's
 * worker, an outbox relay, the janitor, the scheduler), and what each runs after fork().
 *
 * The supervisor knows a child only by its role: a slot names its process
 * from the role and calls its run function; which module does the work is
 * this table's business. Adding a kind of child is a row here and a count
 * of its slots in the supervisor's generation_new(). */
#ifndef SK_ROLES_H
#define SK_ROLES_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "metrics.h"
#include "plugin.h"
#include "scoreboard.h"

/* What a child process gets from its slot; borrowed for the process's
 * life (the supervisor's generation, inherited across fork()). */
struct sk_child {
    const struct sk_conf   *conf;
    size_t                  queue;    /* a worker's: index into conf->queues */
    const struct sk_plugin *plugin;   /* a worker's: its queue's handler; else NULL */
    struct sk_slot         *shared;   /* its scoreboard slot */
    struct sk_metrics      *metrics;
};

enum sk_role { SK_ROLE_WORKER, SK_ROLE_RELAY, SK_ROLE_JANITOR, SK_ROLE_SCHEDULER, SK_ROLE_COUNT };

struct sk_role_ops {
    const char *name;       /* in titles and the log: "outbox relay" */
    const char *comm;       /* for top, at most 15 bytes */
    const char *log_role;   /* the process field of its log lines */
    bool        counts_as_worker;  /* a queue's consumer: job_timeout, workers_up, STATUS */
    bool        numbered;   /* the role may have several slots: "#n" in the title */
    int       (*run)(const struct sk_child *c);  /* returns the process's exit status */
};

/* Indexed by enum sk_role. */
extern const struct sk_role_ops sk_roles[SK_ROLE_COUNT];

#endif
