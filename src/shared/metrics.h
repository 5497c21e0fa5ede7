/* metrics.h - the counters behind /metrics, in memory shared by the
 * supervisor, every worker and every outbox relay.
 *
 * The supervisor maps one area before forking; workers and relays count into
 * it (metrics.c), and the supervisor reads it to answer a scrape, rendered
 * by metrics_text.c. Per queue, each job type has its own counters; a queue holds SK_METRICS_TYPES type names, claimed on
 * first use, and counts the rest under "other". Everything is a lock-free
 * atomic, updated with relaxed ordering: a worker killed halfway through an
 * update can lose at most that update, never wedge the area, and counting
 * costs a job a few atomic adds, no syscall and no lock. */
#ifndef SK_METRICS_H
#define SK_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "config.h"

#define SK_METRICS_TYPES    32  /* job type names per queue; more are counted as "other" */
#define SK_METRICS_TYPE_MAX 63  /* longest job type name, in bytes; longer is "other" */
#define SK_METRICS_OUTBOX_QUEUES 32  /* target queues the relays count apart; more: "other" */
#define SK_METRICS_NAME_MAX 255  /* longest name of any series (AMQP's queue name limit) */
#define SK_METRICS_BUCKETS  23   /* of the job duration histogram, +Inf included */
#define SK_METRICS_BUCKET_60S 12  /* index of the 60 s bound, the least a scrape shows */

/* The monotonic counters of one (queue, job type). Adding one? Name and
 * describe it in metrics_text.c's `counters` table, and in sekalid(8)'s
 * METRICS, which check_metrics holds equal to a scrape. */
enum sk_metric {
    SK_METRIC_DELIVERIES,    /* every delivery, malformed ones included */
    SK_METRIC_REDELIVERIES,  /* deliveries flagged redelivered, or past attempt 1 */
    SK_METRIC_EXECUTIONS,    /* handler calls */
    SK_METRIC_COMPLETIONS,   /* outcomes committed as completed */
    SK_METRIC_DUPLICATES,    /* deliveries of a key already completed or failed */
    SK_METRIC_RETRIES,       /* confirmed retry copies (handler RETRY or failed commit) */
    SK_METRIC_LOCK_BUSY,     /* deliveries whose resource lock stayed busy for busy_wait */
    SK_METRIC_LOCKS_LOST,    /* jobs whose lock or lease the heartbeat found lost */
    SK_METRIC_FENCED_OUT,    /* external mode: outcomes refused under a stale fence */
    SK_METRIC_OCC_CONFLICTS, /* handler RETRYs through host->conflict() (ABI 1.3) */
    SK_METRIC_CANCELLED,     /* deliveries acked unrun or rolled back: key cancelled */
    SK_METRIC_BATCH_RERUNS,  /* handler runs rolled back with a batch-mate's failure */
    SK_METRIC_BATCH_DEFERRED, /* jobs left unrun for the next transaction: batch closed early */
    SK_METRIC_TRACE_DROPPED, /* deliveries whose traceparent/tracestate was dropped or cut */
    SK_METRIC_RATE_LIMITED,  /* deliveries re-scheduled to wait for a slot of the rate limit */
    SK_METRIC_SPANS_EXPORTED, /* job runs' spans a collector accepted (span_export.c) */
    SK_METRIC_SPANS_DROPPED, /* ... and those given up: queue full, collector down or refusing */
    SK_METRIC_LANE_FORWARDS, /* intake deliveries forwarded to their tenant's lane (forward.c) */
    SK_METRIC_COUNT
};

/* Why a job was dead-lettered by sekali (not by the broker's delivery_limit).
 * Adding one? Name it in metrics.c's `reasons` table, and in sekalid(8). */
enum sk_metrics_reason {
    SK_METRICS_MALFORMED,          /* failed validation */
    SK_METRICS_FAILED,             /* handler returned FAIL, or an invalid status */
    SK_METRICS_RETRIES_EXHAUSTED,  /* RETRY on the last allowed attempt */
    SK_METRICS_CRASHED,            /* its worker died running it max_crashes times */
    SK_METRICS_BEYOND_RETENTION,   /* published longer ago than its queue's retention */
    SK_METRICS_UNRECORDED,         /* its outcome refused by PostgreSQL for its data */
    SK_METRICS_REASONS
};

struct sk_metrics;        /* the whole area: every queue */
struct sk_metrics_queue;  /* one queue's part */
struct sk_metrics_type;   /* one (queue, job type)'s counters */
struct sk_metrics_outq;   /* the outbox's figures for one target queue */
struct sk_metrics_schedule;  /* one configured schedule's figures */

/* Supervisor, before forking: maps a zeroed area for n_queues queues and
 * n_schedules schedules, shared with children forked later. SK_OK or SK_ERR. */
int  sk_metrics_create(struct sk_metrics **out, size_t n_queues, size_t n_schedules,
                       struct sk_err *err);
/* Unmaps the area; accepts NULL. No other thread may still read it. */
void sk_metrics_destroy(struct sk_metrics *m);

/* Borrowed: queue q's part (q indexes conf->queues), valid while m is. */
struct sk_metrics_queue *sk_metrics_queue(struct sk_metrics *m, size_t q);

/* Worker: the counters of job_type ("" for a message without a type),
 * claiming one of the queue's free type names on its first use (with
 * compare-and-swap: no lock), or "other" when the table is full or the name
 * longer than SK_METRICS_TYPE_MAX. Never fails, never blocks. */
struct sk_metrics_type *sk_metrics_lookup(struct sk_metrics_queue *mq, const char *job_type);

/* Worker: counting. Relaxed atomic adds; safe from any thread or process. */
void sk_metrics_inc(struct sk_metrics_type *t, enum sk_metric c);
void sk_metrics_dead_letter(struct sk_metrics_type *t, enum sk_metrics_reason reason);
/* Adds ns of waiting for a busy lock. */
void sk_metrics_lock_wait(struct sk_metrics_type *t, uint64_t ns);
/* Adds ns of delay given to a job over its queue's rate limit. */
void sk_metrics_rate_delay(struct sk_metrics_type *t, uint64_t ns);
/* Observes one job's duration, claim to commit, in the histogram. */
void sk_metrics_duration(struct sk_metrics_type *t, uint64_t ns);

/* Outbox relay: the figures of target queue `queue` (any queue a row names,
 * served by this sekalid or not), claimed like job types: "other" past
 * SK_METRICS_OUTBOX_QUEUES names. Never fails, never blocks. */
struct sk_metrics_outq *sk_metrics_outbox_lookup(struct sk_metrics *m, const char *queue);
/* Relay: a row's publish was confirmed, or refused (unroutable or nacked). */
void sk_metrics_outbox_published(struct sk_metrics_outq *oq);
void sk_metrics_outbox_unroutable(struct sk_metrics_outq *oq);

/* One target queue's backlog in a sample of the outbox table. */
struct sk_outbox_backlog {
    const char *queue;
    uint64_t    pending;      /* due rows not yet published */
    uint64_t    failed_rows;  /* unpublished rows that hold a publish_error */
    uint64_t    lag_ms;       /* how long the oldest due row has been due; 0: none */
};

/* Relay: whether this relay should sample the backlog now. True for one
 * caller at most once per every_ms, however many relays ask. */
bool sk_metrics_outbox_sample_due(struct sk_metrics *m, int64_t every_ms);
/* Relay: records a sample of the whole table; a queue missing from it has
 * no backlog. Between samples, the lag of a queue with pending rows is
 * rendered as growing with the time since the sample, so a relay that
 * stopped sampling (the database is down) still shows the lag rising. */
void sk_metrics_outbox_backlog(struct sk_metrics *m, const struct sk_outbox_backlog *b, size_t n);

/* Relay, janitor or scheduler: a round (a relay's batch, the janitor's
 * sweep of every table, the scheduler's look at every schedule) has just
 * finished; rendered as the wall-clock time of the latest one, so that
 * sekalictl status and alerts can tell a stuck process. */
void sk_metrics_relay_round(struct sk_metrics *m);
void sk_metrics_janitor_round(struct sk_metrics *m);
void sk_metrics_scheduler_round(struct sk_metrics *m);

/* Scheduler: schedule i's figures (i indexes conf->schedules). */
struct sk_metrics_schedule *sk_metrics_schedule(struct sk_metrics *m, size_t i);
/* Scheduler: a tick transaction committed, enqueueing `enqueued` ticks and
 * dropping `missed` due ones (the schedule's missed policy). */
void sk_metrics_schedule_fired(struct sk_metrics_schedule *ms, uint64_t enqueued,
                               uint64_t missed);
/* Scheduler: one of the schedule's statements failed (it waits, then tries
 * again); a row another host holds is not a failure. */
void sk_metrics_schedule_failed(struct sk_metrics_schedule *ms);
/* Scheduler: the schedule's row holds this last tick (Unix seconds),
 * whichever host enqueued it. */
void sk_metrics_schedule_last_tick(struct sk_metrics_schedule *ms, int64_t unix_s);

/* Supervisor: a worker of queue q was forked (restarted: it replaces one that
 * died), or has exited. */
void sk_metrics_worker_started(struct sk_metrics *m, size_t q, bool restarted);
void sk_metrics_worker_exited(struct sk_metrics *m, size_t q);
/* Supervisor: how many of queue q's workers say it is paused now (counted
 * from their slots at each report, so a dead worker never leaves one). */
void sk_metrics_workers_paused(struct sk_metrics *m, size_t q, uint64_t n);
/* Workers of queue q whose handler cannot run (ready() refused): they hold
 * no delivery. Set by the supervisor from the scoreboard. */
void sk_metrics_workers_blocked(struct sk_metrics *m, size_t q, uint64_t n);
/* Resource locks (or concurrency permits) the running workers of queue q
 * hold in Redis now, their releases not yet sent included. Set by the
 * supervisor from the scoreboard. */
void sk_metrics_locks_held(struct sk_metrics *m, size_t q, uint64_t n);
/* Worker: it deleted n Redis locks a dead worker of its slot still held. */
void sk_metrics_locks_released_for_dead(struct sk_metrics_queue *mq, uint64_t n);

/* The name of a dead-letter reason, e.g. "retries_exhausted": both the
 * x-sekali-reason header of the dead letter and the metric's reason label.
 * A static string. */
const char *sk_metrics_reason_name(enum sk_metrics_reason reason);

/* Upper bounds of the duration buckets, in ns (inclusive, as Prometheus'
 * `le`); the last bucket, +Inf, has none. Counted up to a day; a scrape
 * shows a queue's buckets only up to its longest limit (metrics_text.c). */
extern const uint64_t sk_metrics_bucket_ns[SK_METRICS_BUCKETS - 1];

/* Reading, for rendering: plain copies of the atomics, each read once. */

/* One (queue, job type): the sum of the slots claimed for that name. */
struct sk_metrics_row {
    const char *name;  /* borrowed from the area */
    uint64_t    counter[SK_METRIC_COUNT];
    uint64_t    dead[SK_METRICS_REASONS];
    uint64_t    lock_wait_ns;
    uint64_t    rate_delay_ns;
    uint64_t    duration[SK_METRICS_BUCKETS];  /* per bucket, not cumulative */
    uint64_t    duration_ns;
};

/* One queue's process figures. Every field a uint64_t: metrics_text.c
 * renders them by offset. */
struct sk_metrics_procs {
    uint64_t restarts;
    uint64_t workers_up;
    uint64_t locks_released_for_dead;
    uint64_t workers_paused;
    uint64_t workers_blocked;
    uint64_t locks_held;
};

/* One outbox target queue's figures; lag_ms already grown by the time
 * since its sample (see sk_metrics_outbox_backlog()). The counts are
 * rendered by offset: keep them uint64_t. */
struct sk_metrics_outrow {
    const char *queue;  /* borrowed from the area */
    uint64_t    published, unroutable, pending, failed_rows, lag_ms;
};

/* Fills rows (room for SK_METRICS_TYPES + 1) with queue q's job types, one
 * row per distinct name, and returns how many. */
size_t sk_metrics_read_types(struct sk_metrics *m, size_t q, struct sk_metrics_row *rows);
struct sk_metrics_procs sk_metrics_read_procs(struct sk_metrics *m, size_t q);
/* Fills rows (room for SK_METRICS_OUTBOX_QUEUES + 1) with every target
 * queue seen; returns how many. */
size_t sk_metrics_read_outbox(struct sk_metrics *m, struct sk_metrics_outrow *rows);
/* Wall-clock ms of the relays', the janitor's and the scheduler's latest
 * round; 0: none. */
uint64_t sk_metrics_read_relay_round(struct sk_metrics *m);
uint64_t sk_metrics_read_janitor_round(struct sk_metrics *m);
uint64_t sk_metrics_read_scheduler_round(struct sk_metrics *m);

/* One schedule's figures. */
struct sk_metrics_schedrow {
    uint64_t enqueued, missed, failures;
    uint64_t last_tick_s;  /* 0: not seen yet */
};
struct sk_metrics_schedrow sk_metrics_read_schedule(struct sk_metrics *m, size_t i);
/* The number of queues, and of schedules, the area was created for. */
size_t sk_metrics_queues(const struct sk_metrics *m);
size_t sk_metrics_schedules(const struct sk_metrics *m);

#endif
