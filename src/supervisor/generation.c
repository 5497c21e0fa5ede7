/* generation.c - building and freeing a generation (generation.h): its
 * slots, one per process each role asks for, and what its processes share,
 * the scoreboard and the metrics area. */
#include "generation.h"

#include <stdio.h>
#include <stdlib.h>

static int lay_out(struct generation *g, size_t *lock_cap, struct sk_err *err);
static void slot_init(const struct generation *g, struct slot *slot, enum sk_role role,
                      size_t queue, unsigned number);

struct generation *sk_generation_new(struct sk_conf *conf, struct sk_plugin *plugins,
                                     struct sk_err *err)
{
    struct generation *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        sk_err_errno(err, SK_ERR, "calloc(generation)");
        return NULL;
    }
    g->conf = conf;
    g->plugins = plugins;
    size_t lock_cap;
    if (lay_out(g, &lock_cap, err) != SK_OK)
        goto fail;
    if (sk_scoreboard_create(&g->scoreboard, g->n_slots, lock_cap, err) != SK_OK)
        goto fail;
    g->heirs = calloc(g->n_slots, sizeof(*g->heirs));
    if (g->heirs == NULL) {
        sk_err_errno(err, SK_ERR, "calloc(heirs)");
        goto fail;
    }
    for (size_t i = 0; i < g->n_slots; i++)
        g->heirs[i] = (struct sk_heir){
            .shared = sk_scoreboard_slot(g->scoreboard, i),
            .queue = g->slots[i].ops->counts_as_worker ? conf->queues[g->slots[i].queue].name
                                                       : NULL,
        };
    /* Counters start from zero with each generation, as after a restart;
     * Prometheus's rate() and increase() take such resets in their stride. */
    if (sk_metrics_create(&g->metrics, conf->n_queues, conf->n_schedules, err) != SK_OK)
        goto fail;
    return g;

fail:
    free(g->heirs);
    sk_scoreboard_destroy(g->scoreboard);
    free(g->slots);
    free(g);
    return NULL;
}

/* Frees the generation with its configuration. Its plugins stay loaded:
 * unloading code that may still be referenced is never worth the risk. */
void sk_generation_free(struct generation *g)
{
    if (g == NULL)
        return;
    sk_scoreboard_destroy(g->scoreboard);
    sk_metrics_destroy(g->metrics);
    free(g->heirs);
    free(g->slots);
    sk_conf_free(g->conf);
    free(g->plugins);
    free(g);
}

/* Slots of one role are numbered from 1 in slot order (per queue for
 * workers), which restarts keep, so a title names the same slot for life. */
static void slot_init(const struct generation *g, struct slot *slot, enum sk_role role,
                      size_t queue, unsigned number)
{
    const struct sk_conf *conf = g->conf;
    *slot = (struct slot){ .ops = &sk_roles[role], .queue = queue,
                           .backoff = { .base_ms = conf->restart.initial_ms,
                                        .cap_ms = conf->restart.max_ms } };
    if (slot->ops->counts_as_worker)
        snprintf(slot->title, sizeof(slot->title), "sekalid: %s %s#%u", slot->ops->name,
                 conf->queues[queue].name, number);
    else if (slot->ops->numbered)
        snprintf(slot->title, sizeof(slot->title), "sekalid: %s #%u", slot->ops->name, number);
    else
        snprintf(slot->title, sizeof(slot->title), "sekalid: %s", slot->ops->name);
}

/* What a slot's process is called in the log: "worker for queue invoices",
 * "the outbox relay". */
const char *sk_generation_slot_name(const struct generation *g, const struct slot *slot,
                                    char *buf, size_t size)
{
    if (slot->ops->counts_as_worker)
        snprintf(buf, size, "%s for queue %s", slot->ops->name,
                 g->conf->queues[slot->queue].name);
    else
        snprintf(buf, size, "the %s", slot->ops->name);
    return buf;
}

/* g's slots, one per process of each role, and *lock_cap, the most locks
 * a worker of g may hold: at most one per job of its batch, and those of
 * the batch before whose release waits for this batch's acquire (span.c):
 * twice the batch. */
static int lay_out(struct generation *g, size_t *lock_cap, struct sk_err *err)
{
    const struct sk_conf *conf = g->conf;
    *lock_cap = 1;
    for (size_t q = 0; q < conf->n_queues; q++) {
        g->n_slots += (size_t)conf->queues[q].workers;
        g->any_job_timeout |= conf->queues[q].job_timeout_ms > 0;
        if ((size_t)conf->queues[q].batch_max > *lock_cap)
            *lock_cap = (size_t)conf->queues[q].batch_max;
    }
    *lock_cap *= 2;
    g->n_slots += (size_t)conf->outbox.relays + (conf->janitor.interval_ms > 0) +
                  (conf->n_schedules > 0);
    g->slots = calloc(g->n_slots, sizeof(*g->slots));
    if (g->slots == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(slots)");
    size_t i = 0;
    for (size_t q = 0; q < conf->n_queues; q++)
        for (int k = 0; k < conf->queues[q].workers; k++)
            slot_init(g, &g->slots[i++], SK_ROLE_WORKER, q, (unsigned)k + 1);
    for (int k = 0; k < conf->outbox.relays; k++)
        slot_init(g, &g->slots[i++], SK_ROLE_RELAY, 0, (unsigned)k + 1);
    if (conf->janitor.interval_ms > 0)
        slot_init(g, &g->slots[i++], SK_ROLE_JANITOR, 0, 1);
    if (conf->n_schedules > 0)
        slot_init(g, &g->slots[i++], SK_ROLE_SCHEDULER, 0, 1);
    return SK_OK;
}
