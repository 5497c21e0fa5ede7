/* metrics.c - the shared counters of metrics.h: the area, the lock-free
 * counting, and the reading that metrics_text.c renders.
 *
 * Why a module of its own and not more scoreboard fields: the scoreboard
 * has one slot per worker process, written by that worker alone, and says
 * what the worker is doing now. Metrics add up what every worker of a queue
 * has done, so they are per queue and job type, written by many processes
 * at once, and have to outlive the worker that counted them.
 *
 * Job type names are claimed without a lock: a slot goes FREE -> CLAIMING by
 * compare-and-swap, its name is written, then READY is published with release
 * ordering; readers look at a name only once they saw READY (acquire). Slots
 * are claimed in order, so the claimed ones are a prefix of the table. Two
 * workers meeting the same new name at once may both claim a slot for it:
 * lookups then use the first, and rendering adds up slots of one name. A
 * worker killed while CLAIMING leaves that slot unused, nothing else. */
#include <stddef.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "clock.h"
#include "metrics.h"

/* A counter shared between processes must not hide a lock: a process killed
 * while holding it would wedge every other. */
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2 &&
               ATOMIC_INT_LOCK_FREE == 2, "sekali's metrics need lock-free 64-bit atomics");

#define NS_PER_S UINT64_C(1000000000)
#define BUCKETS  SK_METRICS_BUCKETS

const uint64_t sk_metrics_bucket_ns[BUCKETS - 1] = {
    5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 500000000,
    NS_PER_S, 2500 * UINT64_C(1000000), 5 * NS_PER_S, 10 * NS_PER_S, 30 * NS_PER_S,
    60 * NS_PER_S, 120 * NS_PER_S, 300 * NS_PER_S, 600 * NS_PER_S, 1800 * NS_PER_S,
    3600 * NS_PER_S, 7200 * NS_PER_S, 14400 * NS_PER_S, 28800 * NS_PER_S, 86400 * NS_PER_S,
};
_Static_assert(SK_METRICS_BUCKET_60S < BUCKETS - 1, "the 60 s bound is one of them");

/* Indexed by enum sk_metrics_reason: the one spelling of each reason, in
 * the x-sekali-reason header and the metric label alike. Label values and
 * header values a shell passes unquoted, hence no spaces. */
static const char *const reasons[SK_METRICS_REASONS] = {
    [SK_METRICS_MALFORMED] = "malformed",
    [SK_METRICS_FAILED] = "failed",
    [SK_METRICS_RETRIES_EXHAUSTED] = "retries_exhausted",
    [SK_METRICS_CRASHED] = "crashed",
    [SK_METRICS_BEYOND_RETENTION] = "beyond_retention",
    [SK_METRICS_UNRECORDED] = "unrecorded",
};

enum { SLOT_FREE = 0, SLOT_CLAIMING, SLOT_READY };

struct sk_metrics_type {
    _Atomic uint64_t counter[SK_METRIC_COUNT];
    _Atomic uint64_t dead[SK_METRICS_REASONS];
    _Atomic uint64_t lock_wait_ns;
    _Atomic uint64_t rate_delay_ns;
    _Atomic uint64_t duration[BUCKETS];  /* per bucket, not cumulative */
    _Atomic uint64_t duration_ns;
};

/* A name claimed for one series: a job type, or an outbox's target queue. */
struct name_slot {
    _Atomic uint32_t state;
    char             name[SK_METRICS_NAME_MAX + 1];  /* immutable once READY */
};

struct sk_metrics_queue {
    _Atomic uint64_t       restarts;
    _Atomic int64_t        workers_up;
    _Atomic uint64_t       locks_released_for_dead;
    _Atomic uint64_t       workers_paused;
    _Atomic uint64_t       workers_blocked;
    _Atomic uint64_t       locks_held;
    /* Parallel arrays; the last entry is "other". */
    struct name_slot       type_names[SK_METRICS_TYPES + 1];
    struct sk_metrics_type types[SK_METRICS_TYPES + 1];
};

/* What the relays did and what the outbox holds, for one target queue. The
 * backlog gauges are one relay's latest sample of the table: lag_ms was the
 * oldest due row's wait then, sampled_ms the CLOCK_MONOTONIC time of it. */
struct sk_metrics_outq {
    _Atomic uint64_t published;
    _Atomic uint64_t unroutable;
    _Atomic uint64_t pending;
    _Atomic uint64_t failed_rows;
    _Atomic uint64_t lag_ms;
    _Atomic uint64_t sampled_ms;
};

struct outbox_area {
    _Atomic uint64_t       last_sample_ms;  /* CLOCK_MONOTONIC; claimed by compare-and-swap */
    _Atomic uint64_t       relay_round_ms;  /* CLOCK_REALTIME of the latest round; 0: none */
    _Atomic uint64_t       janitor_round_ms;
    _Atomic uint64_t       scheduler_round_ms;
    struct name_slot       queue_names[SK_METRICS_OUTBOX_QUEUES + 1];
    struct sk_metrics_outq queues[SK_METRICS_OUTBOX_QUEUES + 1];
};

/* One configured schedule, as this sekalid's scheduler saw it; indexed
 * like conf->schedules, so no name is claimed. */
struct sk_metrics_schedule {
    _Atomic uint64_t enqueued;
    _Atomic uint64_t missed;
    _Atomic uint64_t failures;
    _Atomic uint64_t last_tick_s;
};

struct sk_metrics {
    struct outbox_area         *outbox;     /* the shared mapping starts here, */
    struct sk_metrics_queue    *queues;     /* goes on with one part per queue, */
    struct sk_metrics_schedule *schedules;  /* then one per schedule */
    size_t                      n, n_schedules;
    size_t                      size;
};

static size_t claim(struct name_slot *names, size_t n, const char *name, size_t max_len);
static bool ready(struct name_slot *s);
static void add_slot(struct sk_metrics_row *r, struct sk_metrics_type *t);
static uint64_t lag_now(struct sk_metrics_outq *oq, uint64_t now);
static uint64_t wall_ms(void);

int sk_metrics_create(struct sk_metrics **out, size_t n_queues, size_t n_schedules,
                      struct sk_err *err)
{
    _Static_assert(sizeof(struct outbox_area) % _Alignof(struct sk_metrics_queue) == 0,
                   "the queues' part must start aligned after the outbox's");
    _Static_assert(sizeof(struct sk_metrics_queue) % _Alignof(struct sk_metrics_schedule) == 0,
                   "the schedules' part must start aligned after the queues'");
    struct sk_metrics *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(metrics)");
    /* Anonymous shared memory, as the scoreboard: inherited across fork(),
     * zeroed by the kernel, and gone with the last process. */
    m->size = sizeof(*m->outbox) + n_queues * sizeof(*m->queues) +
              n_schedules * sizeof(*m->schedules);
    m->outbox = mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m->outbox == MAP_FAILED) {
        free(m);
        return sk_err_errno(err, SK_ERR, "mmap(metrics, %zu queues)", n_queues);
    }
    m->queues = (struct sk_metrics_queue *)(m->outbox + 1);
    m->schedules = (struct sk_metrics_schedule *)(m->queues + n_queues);
    m->n = n_queues;
    m->n_schedules = n_schedules;
    for (size_t q = 0; q < n_queues; q++)
        memcpy(m->queues[q].type_names[SK_METRICS_TYPES].name, "other", sizeof("other"));
    memcpy(m->outbox->queue_names[SK_METRICS_OUTBOX_QUEUES].name, "other", sizeof("other"));
    *out = m;
    return SK_OK;
}

void sk_metrics_destroy(struct sk_metrics *m)
{
    if (m == NULL)
        return;
    munmap(m->outbox, m->size);
    free(m);
}

struct sk_metrics_queue *sk_metrics_queue(struct sk_metrics *m, size_t q)
{
    sk_assert(q < m->n);
    return &m->queues[q];
}

struct sk_metrics_type *sk_metrics_lookup(struct sk_metrics_queue *mq, const char *job_type)
{
    return &mq->types[claim(mq->type_names, SK_METRICS_TYPES, job_type, SK_METRICS_TYPE_MAX)];
}

struct sk_metrics_outq *sk_metrics_outbox_lookup(struct sk_metrics *m, const char *queue)
{
    return &m->outbox->queues[claim(m->outbox->queue_names, SK_METRICS_OUTBOX_QUEUES, queue,
                                    SK_METRICS_NAME_MAX)];
}

/* The index of name's slot among the n of names, claiming a free one on
 * first use; n (the "other" slot, after them) when all are taken or the name
 * is longer than max_len. */
static size_t claim(struct name_slot *names, size_t n, const char *name, size_t max_len)
{
    size_t len = strlen(name);
    for (size_t i = 0; len <= max_len && i < n; i++) {
        struct name_slot *s = &names[i];
        uint32_t state = atomic_load_explicit(&s->state, memory_order_acquire);
        /* A failed exchange leaves the slot's current state in `state`:
         * taken meanwhile, it may have been taken for this very name. */
        if (state == SLOT_FREE &&
            atomic_compare_exchange_strong_explicit(&s->state, &state, SLOT_CLAIMING,
                                                    memory_order_acquire,
                                                    memory_order_acquire)) {
            memcpy(s->name, name, len + 1);
            atomic_store_explicit(&s->state, SLOT_READY, memory_order_release);
            return i;
        }
        if (state == SLOT_READY && strcmp(s->name, name) == 0)
            return i;
    }
    struct name_slot *other = &names[n];
    if (atomic_load_explicit(&other->state, memory_order_relaxed) != SLOT_READY)
        atomic_store_explicit(&other->state, SLOT_READY, memory_order_release);
    return n;
}

void sk_metrics_inc(struct sk_metrics_type *t, enum sk_metric c)
{
    atomic_fetch_add_explicit(&t->counter[c], 1, memory_order_relaxed);
}

void sk_metrics_dead_letter(struct sk_metrics_type *t, enum sk_metrics_reason reason)
{
    atomic_fetch_add_explicit(&t->dead[reason], 1, memory_order_relaxed);
}

void sk_metrics_lock_wait(struct sk_metrics_type *t, uint64_t ns)
{
    atomic_fetch_add_explicit(&t->lock_wait_ns, ns, memory_order_relaxed);
}

void sk_metrics_rate_delay(struct sk_metrics_type *t, uint64_t ns)
{
    atomic_fetch_add_explicit(&t->rate_delay_ns, ns, memory_order_relaxed);
}

void sk_metrics_duration(struct sk_metrics_type *t, uint64_t ns)
{
    size_t b = 0;
    while (b < BUCKETS - 1 && ns > sk_metrics_bucket_ns[b])
        b++;
    atomic_fetch_add_explicit(&t->duration[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->duration_ns, ns, memory_order_relaxed);
}

void sk_metrics_outbox_published(struct sk_metrics_outq *oq)
{
    atomic_fetch_add_explicit(&oq->published, 1, memory_order_relaxed);
}

void sk_metrics_outbox_unroutable(struct sk_metrics_outq *oq)
{
    atomic_fetch_add_explicit(&oq->unroutable, 1, memory_order_relaxed);
}

bool sk_metrics_outbox_sample_due(struct sk_metrics *m, int64_t every_ms)
{
    uint64_t now = (uint64_t)sk_now_ms();
    uint64_t last = atomic_load_explicit(&m->outbox->last_sample_ms, memory_order_relaxed);
    if (last != 0 && now - last < (uint64_t)every_ms)
        return false;
    /* Of relays asking at once, the one whose exchange succeeds samples. */
    return atomic_compare_exchange_strong_explicit(&m->outbox->last_sample_ms, &last, now,
                                                   memory_order_relaxed, memory_order_relaxed);
}

void sk_metrics_outbox_backlog(struct sk_metrics *m, const struct sk_outbox_backlog *b, size_t n)
{
    struct outbox_area *o = m->outbox;
    uint64_t pending[SK_METRICS_OUTBOX_QUEUES + 1] = { 0 };
    uint64_t failed[SK_METRICS_OUTBOX_QUEUES + 1] = { 0 };
    uint64_t lag[SK_METRICS_OUTBOX_QUEUES + 1] = { 0 };
    for (size_t i = 0; i < n; i++) {
        size_t k = claim(o->queue_names, SK_METRICS_OUTBOX_QUEUES, b[i].queue,
                         SK_METRICS_NAME_MAX);
        pending[k] += b[i].pending;
        failed[k] += b[i].failed_rows;
        if (b[i].lag_ms > lag[k])
            lag[k] = b[i].lag_ms;
    }
    uint64_t now = (uint64_t)sk_now_ms();
    for (size_t k = 0; k <= SK_METRICS_OUTBOX_QUEUES; k++) {
        if (!ready(&o->queue_names[k]))
            continue;
        struct sk_metrics_outq *oq = &o->queues[k];
        atomic_store_explicit(&oq->pending, pending[k], memory_order_relaxed);
        atomic_store_explicit(&oq->failed_rows, failed[k], memory_order_relaxed);
        atomic_store_explicit(&oq->lag_ms, lag[k], memory_order_relaxed);
        atomic_store_explicit(&oq->sampled_ms, now, memory_order_relaxed);
    }
}

void sk_metrics_worker_started(struct sk_metrics *m, size_t q, bool restarted)
{
    struct sk_metrics_queue *mq = sk_metrics_queue(m, q);
    atomic_fetch_add_explicit(&mq->workers_up, 1, memory_order_relaxed);
    if (restarted)
        atomic_fetch_add_explicit(&mq->restarts, 1, memory_order_relaxed);
}

void sk_metrics_worker_exited(struct sk_metrics *m, size_t q)
{
    atomic_fetch_sub_explicit(&sk_metrics_queue(m, q)->workers_up, 1, memory_order_relaxed);
}

void sk_metrics_workers_paused(struct sk_metrics *m, size_t q, uint64_t n)
{
    atomic_store_explicit(&sk_metrics_queue(m, q)->workers_paused, n, memory_order_relaxed);
}

void sk_metrics_workers_blocked(struct sk_metrics *m, size_t q, uint64_t n)
{
    atomic_store_explicit(&sk_metrics_queue(m, q)->workers_blocked, n, memory_order_relaxed);
}

void sk_metrics_locks_held(struct sk_metrics *m, size_t q, uint64_t n)
{
    atomic_store_explicit(&sk_metrics_queue(m, q)->locks_held, n, memory_order_relaxed);
}

void sk_metrics_locks_released_for_dead(struct sk_metrics_queue *mq, uint64_t n)
{
    atomic_fetch_add_explicit(&mq->locks_released_for_dead, n, memory_order_relaxed);
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void sk_metrics_relay_round(struct sk_metrics *m)
{
    atomic_store_explicit(&m->outbox->relay_round_ms, wall_ms(), memory_order_relaxed);
}

void sk_metrics_janitor_round(struct sk_metrics *m)
{
    atomic_store_explicit(&m->outbox->janitor_round_ms, wall_ms(), memory_order_relaxed);
}

void sk_metrics_scheduler_round(struct sk_metrics *m)
{
    atomic_store_explicit(&m->outbox->scheduler_round_ms, wall_ms(), memory_order_relaxed);
}

struct sk_metrics_schedule *sk_metrics_schedule(struct sk_metrics *m, size_t i)
{
    sk_assert(i < m->n_schedules);
    return &m->schedules[i];
}

void sk_metrics_schedule_fired(struct sk_metrics_schedule *ms, uint64_t enqueued,
                               uint64_t missed)
{
    atomic_fetch_add_explicit(&ms->enqueued, enqueued, memory_order_relaxed);
    atomic_fetch_add_explicit(&ms->missed, missed, memory_order_relaxed);
}

void sk_metrics_schedule_failed(struct sk_metrics_schedule *ms)
{
    atomic_fetch_add_explicit(&ms->failures, 1, memory_order_relaxed);
}

void sk_metrics_schedule_last_tick(struct sk_metrics_schedule *ms, int64_t unix_s)
{
    atomic_store_explicit(&ms->last_tick_s, unix_s > 0 ? (uint64_t)unix_s : 0,
                          memory_order_relaxed);
}

/* A sampled lag, grown by the time since its sample while rows wait. */
static uint64_t lag_now(struct sk_metrics_outq *oq, uint64_t now)
{
    if (atomic_load_explicit(&oq->pending, memory_order_relaxed) == 0)
        return 0;
    uint64_t lag = atomic_load_explicit(&oq->lag_ms, memory_order_relaxed);
    uint64_t sampled = atomic_load_explicit(&oq->sampled_ms, memory_order_relaxed);
    return lag + (now > sampled ? now - sampled : 0);
}

size_t sk_metrics_read_types(struct sk_metrics *m, size_t q, struct sk_metrics_row *rows)
{
    struct sk_metrics_queue *mq = sk_metrics_queue(m, q);
    size_t n = 0;
    for (size_t i = 0; i <= SK_METRICS_TYPES; i++) {
        struct name_slot *s = &mq->type_names[i];
        if (!ready(s))
            continue;
        size_t r = 0;
        while (r < n && strcmp(rows[r].name, s->name) != 0)
            r++;
        if (r == n)
            rows[n++] = (struct sk_metrics_row){ .name = s->name };
        add_slot(&rows[r], &mq->types[i]);
    }
    return n;
}

static void add_slot(struct sk_metrics_row *r, struct sk_metrics_type *t)
{
    for (int c = 0; c < SK_METRIC_COUNT; c++)
        r->counter[c] += atomic_load_explicit(&t->counter[c], memory_order_relaxed);
    for (int why = 0; why < SK_METRICS_REASONS; why++)
        r->dead[why] += atomic_load_explicit(&t->dead[why], memory_order_relaxed);
    r->lock_wait_ns += atomic_load_explicit(&t->lock_wait_ns, memory_order_relaxed);
    r->rate_delay_ns += atomic_load_explicit(&t->rate_delay_ns, memory_order_relaxed);
    for (int b = 0; b < BUCKETS; b++)
        r->duration[b] += atomic_load_explicit(&t->duration[b], memory_order_relaxed);
    r->duration_ns += atomic_load_explicit(&t->duration_ns, memory_order_relaxed);
}

struct sk_metrics_procs sk_metrics_read_procs(struct sk_metrics *m, size_t q)
{
    struct sk_metrics_queue *mq = sk_metrics_queue(m, q);
    int64_t up = atomic_load_explicit(&mq->workers_up, memory_order_relaxed);
    return (struct sk_metrics_procs){
        .restarts = atomic_load_explicit(&mq->restarts, memory_order_relaxed),
        .workers_up = up > 0 ? (uint64_t)up : 0,
        .locks_released_for_dead =
            atomic_load_explicit(&mq->locks_released_for_dead, memory_order_relaxed),
        .workers_paused = atomic_load_explicit(&mq->workers_paused, memory_order_relaxed),
        .workers_blocked = atomic_load_explicit(&mq->workers_blocked, memory_order_relaxed),
        .locks_held = atomic_load_explicit(&mq->locks_held, memory_order_relaxed),
    };
}

size_t sk_metrics_read_outbox(struct sk_metrics *m, struct sk_metrics_outrow *rows)
{
    struct outbox_area *o = m->outbox;
    uint64_t now = (uint64_t)sk_now_ms();
    size_t n = 0;
    for (size_t k = 0; k <= SK_METRICS_OUTBOX_QUEUES; k++) {
        if (!ready(&o->queue_names[k]))
            continue;
        struct sk_metrics_outq *oq = &o->queues[k];
        rows[n++] = (struct sk_metrics_outrow){
            .queue = o->queue_names[k].name,
            .published = atomic_load_explicit(&oq->published, memory_order_relaxed),
            .unroutable = atomic_load_explicit(&oq->unroutable, memory_order_relaxed),
            .pending = atomic_load_explicit(&oq->pending, memory_order_relaxed),
            .failed_rows = atomic_load_explicit(&oq->failed_rows, memory_order_relaxed),
            .lag_ms = lag_now(oq, now),
        };
    }
    return n;
}

uint64_t sk_metrics_read_relay_round(struct sk_metrics *m)
{
    return atomic_load_explicit(&m->outbox->relay_round_ms, memory_order_relaxed);
}

uint64_t sk_metrics_read_janitor_round(struct sk_metrics *m)
{
    return atomic_load_explicit(&m->outbox->janitor_round_ms, memory_order_relaxed);
}

uint64_t sk_metrics_read_scheduler_round(struct sk_metrics *m)
{
    return atomic_load_explicit(&m->outbox->scheduler_round_ms, memory_order_relaxed);
}

struct sk_metrics_schedrow sk_metrics_read_schedule(struct sk_metrics *m, size_t i)
{
    struct sk_metrics_schedule *ms = sk_metrics_schedule(m, i);
    return (struct sk_metrics_schedrow){
        .enqueued = atomic_load_explicit(&ms->enqueued, memory_order_relaxed),
        .missed = atomic_load_explicit(&ms->missed, memory_order_relaxed),
        .failures = atomic_load_explicit(&ms->failures, memory_order_relaxed),
        .last_tick_s = atomic_load_explicit(&ms->last_tick_s, memory_order_relaxed),
    };
}

size_t sk_metrics_queues(const struct sk_metrics *m)
{
    return m->n;
}

size_t sk_metrics_schedules(const struct sk_metrics *m)
{
    return m->n_schedules;
}

const char *sk_metrics_reason_name(enum sk_metrics_reason reason)
{
    sk_assert(reason >= 0 && reason < SK_METRICS_REASONS);
    return reasons[reason];
}

/* A name's slot is read only once its claim is published. */
static bool ready(struct name_slot *s)
{
    return atomic_load_explicit(&s->state, memory_order_acquire) == SLOT_READY;
}
