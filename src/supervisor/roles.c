/* roles.c - the role table of roles.h: each kind of child process and the
 * module that runs it. */
#include "roles.h"

#include "janitor.h"
#include "relay.h"
#include "scheduler.h"
#include "worker.h"

static int run_worker(const struct sk_child *c)
{
    return sk_worker_run(c->conf, &c->conf->queues[c->queue], c->plugin, c->shared,
                         sk_metrics_queue(c->metrics, c->queue), c->doctor);
}

static int run_relay(const struct sk_child *c)
{
    return sk_relay_run(c->conf, c->shared, c->metrics);
}

static int run_janitor(const struct sk_child *c)
{
    return sk_janitor_run(c->conf, c->shared, c->metrics);
}

static int run_scheduler(const struct sk_child *c)
{
    return sk_scheduler_run(c->conf, c->shared, c->metrics);
}

const struct sk_role_ops sk_roles[SK_ROLE_COUNT] = {
    [SK_ROLE_WORKER] = { "worker", "sk-worker", "worker", true, true, run_worker },
    [SK_ROLE_RELAY] = { "outbox relay", "sk-relay", "relay", false, true, run_relay },
    [SK_ROLE_JANITOR] = { "janitor", "sk-janitor", "janitor", false, false, run_janitor },
    [SK_ROLE_SCHEDULER] = { "scheduler", "sk-scheduler", "scheduler", false, false,
                            run_scheduler },
};
