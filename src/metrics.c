/* metrics.c - the shared counters of metrics.h, and their rendering in
 * Prometheus' text exposition format 0.0.4.
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
#include <inttypes.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backoff.h"
#include "metrics.h"

/* A counter shared between processes must not hide a lock: a process killed
 * while holding it would wedge every other. */
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2 &&
               ATOMIC_INT_LOCK_FREE == 2, "sekali's metrics need lock-free 64-bit atomics");

#define NS_PER_S UINT64_C(1000000000)
#define BUCKETS  14

/* Upper bounds of the duration buckets (inclusive, as Prometheus' `le`);
 * the last bucket, +Inf, has none. Keep both tables in step. */
static const uint64_t bucket_ns[BUCKETS - 1] = {
    5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 500000000,
    NS_PER_S, 2500 * UINT64_C(1000000), 5 * NS_PER_S, 10 * NS_PER_S, 30 * NS_PER_S,
    60 * NS_PER_S,
};
static const char *const bucket_le[BUCKETS] = {
    "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60",
    "+Inf",
};

enum { SLOT_FREE = 0, SLOT_CLAIMING, SLOT_READY };

struct sk_metrics_type {
    _Atomic uint64_t counter[SK_METRIC_COUNT];
    _Atomic uint64_t dead[SK_METRICS_REASONS];
    _Atomic uint64_t lock_wait_ns;
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
    struct name_slot       queue_names[SK_METRICS_OUTBOX_QUEUES + 1];
    struct sk_metrics_outq queues[SK_METRICS_OUTBOX_QUEUES + 1];
};

struct sk_metrics {
    struct outbox_area      *outbox;  /* the shared mapping starts here, */
    struct sk_metrics_queue *queues;  /* and goes on with one part per queue */
    size_t                   n;
    size_t                   size;
};

/* One (queue, job type) as rendered: the sum of the slots of that name,
 * read once per scrape. */
struct row {
    const char *name;
    uint64_t    counter[SK_METRIC_COUNT];
    uint64_t    dead[SK_METRICS_REASONS];
    uint64_t    lock_wait_ns;
    uint64_t    duration[BUCKETS];
    uint64_t    duration_ns;
};

struct family {
    const char *name;
    const char *help;
};

/* Indexed by enum sk_metric. */
static const struct family counters[SK_METRIC_COUNT] = {
    [SK_METRIC_DELIVERIES] = { "sekali_deliveries_total",
        "Deliveries received from the broker, malformed ones included." },
    [SK_METRIC_REDELIVERIES] = { "sekali_redeliveries_total",
        "Deliveries that the broker flagged as redelivered, or of an attempt after the first." },
    [SK_METRIC_EXECUTIONS] = { "sekali_executions_total",
        "Handler calls, including calls that never returned (the worker died)." },
    [SK_METRIC_COMPLETIONS] = { "sekali_completions_total",
        "Jobs whose effect and completion were committed." },
    [SK_METRIC_DUPLICATES] = { "sekali_duplicates_total",
        "Deliveries of a key already completed or failed, acked without running the handler." },
    [SK_METRIC_RETRIES] = { "sekali_retries_total",
        "Jobs re-scheduled for another attempt after a RETRY or a failed commit." },
    [SK_METRIC_LOCK_BUSY] = { "sekali_lock_busy_total",
        "Deliveries whose resource lock stayed held by another owner for lock.busy_wait." },
    [SK_METRIC_LOCKS_LOST] = { "sekali_locks_lost_total",
        "Jobs whose Redis lock or external-mode lease was found lost while they ran." },
    [SK_METRIC_FENCED_OUT] = { "sekali_fenced_out_total",
        "External mode: outcomes refused because another worker took the job over." },
    [SK_METRIC_OCC_CONFLICTS] = { "sekali_occ_conflicts_total",
        "Jobs whose handler found its row changed by another job (host->conflict()) and retried." },
};

/* Indexed by enum sk_metrics_reason. */
static const char *const reasons[SK_METRICS_REASONS] = {
    [SK_METRICS_MALFORMED] = "malformed",
    [SK_METRICS_FAILED] = "failed",
    [SK_METRICS_RETRIES_EXHAUSTED] = "retries_exhausted",
    [SK_METRICS_CRASHED] = "crashed",
};

static size_t claim(struct name_slot *names, size_t n, const char *name, size_t max_len);
static size_t collect(struct sk_metrics_queue *mq, struct row *rows);
static void add_slot(struct row *r, struct sk_metrics_type *t);
static void render_outbox(FILE *f, struct outbox_area *o);
static uint64_t lag_now(struct sk_metrics_outq *oq, uint64_t now);
static void header(FILE *f, const char *name, const char *type, const char *help);
static void labels(FILE *f, const char *queue, const char *job_type);
static void label_value(FILE *f, const char *s);
static void seconds(FILE *f, uint64_t ns);

int sk_metrics_create(struct sk_metrics **out, size_t n_queues, struct sk_err *err)
{
    _Static_assert(sizeof(struct outbox_area) % _Alignof(struct sk_metrics_queue) == 0,
                   "the queues' part must start aligned after the outbox's");
    struct sk_metrics *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(metrics)");
    /* Anonymous shared memory, as the scoreboard: inherited across fork(),
     * zeroed by the kernel, and gone with the last process. */
    m->size = sizeof(*m->outbox) + n_queues * sizeof(*m->queues);
    m->outbox = mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m->outbox == MAP_FAILED) {
        free(m);
        return sk_err_errno(err, SK_ERR, "mmap(metrics, %zu queues)", n_queues);
    }
    m->queues = (struct sk_metrics_queue *)(m->outbox + 1);
    m->n = n_queues;
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

void sk_metrics_duration(struct sk_metrics_type *t, uint64_t ns)
{
    size_t b = 0;
    while (b < BUCKETS - 1 && ns > bucket_ns[b])
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
        if (atomic_load_explicit(&o->queue_names[k].state, memory_order_acquire) != SLOT_READY)
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

void sk_metrics_lock_released_for_dead(struct sk_metrics_queue *mq)
{
    atomic_fetch_add_explicit(&mq->locks_released_for_dead, 1, memory_order_relaxed);
}

int sk_metrics_render(struct sk_metrics *m, const struct sk_conf *conf, char **out,
                      size_t *len)
{
    sk_assert(conf->n_queues == m->n);
    struct row *rows = calloc(m->n * (SK_METRICS_TYPES + 1), sizeof(*rows));
    size_t *n_rows = calloc(m->n, sizeof(*n_rows));
    char *buf = NULL;
    size_t size = 0;
    FILE *f = rows != NULL && n_rows != NULL ? open_memstream(&buf, &size) : NULL;
    if (f == NULL) {
        free(rows);
        free(n_rows);
        return SK_ERR;
    }
    /* Read everything first: each family below then shows the same moment. */
    for (size_t q = 0; q < m->n; q++)
        n_rows[q] = collect(&m->queues[q], &rows[q * (SK_METRICS_TYPES + 1)]);
#define EACH_ROW(r)                                                             \
    for (size_t q = 0; q < m->n; q++)                                           \
        for (struct row *r = &rows[q * (SK_METRICS_TYPES + 1)],                 \
                        *r##_end = r + n_rows[q]; r < r##_end; r++)

    for (int c = 0; c < SK_METRIC_COUNT; c++) {
        header(f, counters[c].name, "counter", counters[c].help);
        EACH_ROW(r) {
            fputs(counters[c].name, f);
            labels(f, conf->queues[q].name, r->name);
            fprintf(f, "} %" PRIu64 "\n", r->counter[c]);
        }
    }

    header(f, "sekali_dead_letters_total", "counter",
           "Jobs sekali dead-lettered to <queue>.dead, by reason: malformed, failed, "
           "retries_exhausted, crashed.");
    EACH_ROW(r) {
        for (int why = 0; why < SK_METRICS_REASONS; why++) {
            fputs("sekali_dead_letters_total", f);
            labels(f, conf->queues[q].name, r->name);
            fprintf(f, ",reason=\"%s\"} %" PRIu64 "\n", reasons[why], r->dead[why]);
        }
    }

    header(f, "sekali_lock_wait_seconds_total", "counter",
           "Time spent waiting for resource locks held by another owner.");
    EACH_ROW(r) {
        fputs("sekali_lock_wait_seconds_total", f);
        labels(f, conf->queues[q].name, r->name);
        fputs("} ", f);
        seconds(f, r->lock_wait_ns);
        fputc('\n', f);
    }

    header(f, "sekali_job_duration_seconds", "histogram",
           "Completed jobs' time from claim to commit.");
    EACH_ROW(r) {
        uint64_t cumulative = 0;
        for (int b = 0; b < BUCKETS; b++) {
            cumulative += r->duration[b];
            fputs("sekali_job_duration_seconds_bucket", f);
            labels(f, conf->queues[q].name, r->name);
            fprintf(f, ",le=\"%s\"} %" PRIu64 "\n", bucket_le[b], cumulative);
        }
        fputs("sekali_job_duration_seconds_sum", f);
        labels(f, conf->queues[q].name, r->name);
        fputs("} ", f);
        seconds(f, r->duration_ns);
        fputc('\n', f);
        /* The +Inf bucket's count, so that the two always agree. */
        fputs("sekali_job_duration_seconds_count", f);
        labels(f, conf->queues[q].name, r->name);
        fprintf(f, "} %" PRIu64 "\n", cumulative);
    }
#undef EACH_ROW

    header(f, "sekali_worker_restarts_total", "counter",
           "Workers the supervisor started again after one died.");
    for (size_t q = 0; q < m->n; q++) {
        fputs("sekali_worker_restarts_total", f);
        labels(f, conf->queues[q].name, NULL);
        fprintf(f, "} %" PRIu64 "\n",
                atomic_load_explicit(&m->queues[q].restarts, memory_order_relaxed));
    }
    header(f, "sekali_locks_released_for_dead_total", "counter",
           "Redis locks of dead workers deleted by their replacements, before lock_ttl.");
    for (size_t q = 0; q < m->n; q++) {
        fputs("sekali_locks_released_for_dead_total", f);
        labels(f, conf->queues[q].name, NULL);
        fprintf(f, "} %" PRIu64 "\n", atomic_load_explicit(&m->queues[q].locks_released_for_dead,
                                                          memory_order_relaxed));
    }
    header(f, "sekali_workers_up", "gauge", "Worker processes running now.");
    for (size_t q = 0; q < m->n; q++) {
        int64_t up = atomic_load_explicit(&m->queues[q].workers_up, memory_order_relaxed);
        fputs("sekali_workers_up", f);
        labels(f, conf->queues[q].name, NULL);
        fprintf(f, "} %" PRId64 "\n", up > 0 ? up : 0);
    }
    header(f, "sekali_lock_ttl_seconds", "gauge",
           "The queue's Redis lock lease (lock_ttl), for queues that take the lock.");
    for (size_t q = 0; q < m->n; q++) {
        if (!conf->queues[q].lock)
            continue;
        fputs("sekali_lock_ttl_seconds", f);
        labels(f, conf->queues[q].name, NULL);
        fputs("} ", f);
        seconds(f, (uint64_t)conf->queues[q].lock_ttl_ms * 1000000);
        fputc('\n', f);
    }
    header(f, "sekali_job_timeout_seconds", "gauge",
           "The queue's job_timeout, past which a job's worker is killed; 0 means none.");
    for (size_t q = 0; q < m->n; q++) {
        fputs("sekali_job_timeout_seconds", f);
        labels(f, conf->queues[q].name, NULL);
        fputs("} ", f);
        seconds(f, (uint64_t)conf->queues[q].job_timeout_ms * 1000000);
        fputc('\n', f);
    }

    if (conf->outbox.relays > 0)
        render_outbox(f, m->outbox);
    if (conf->outbox.relays > 0) {
        header(f, "sekali_relay_last_round_timestamp_seconds", "gauge",
               "When an outbox relay last finished a batch (Unix time); 0 before the first.");
        fputs("sekali_relay_last_round_timestamp_seconds ", f);
        seconds(f, atomic_load_explicit(&m->outbox->relay_round_ms, memory_order_relaxed) *
                       1000000);
        fputc('\n', f);
    }
    if (conf->janitor.interval_ms > 0) {
        header(f, "sekali_janitor_last_round_timestamp_seconds", "gauge",
               "When the janitor last finished a round (Unix time); 0 before the first.");
        fputs("sekali_janitor_last_round_timestamp_seconds ", f);
        seconds(f, atomic_load_explicit(&m->outbox->janitor_round_ms, memory_order_relaxed) *
                       1000000);
        fputc('\n', f);
    }

    int failed = ferror(f);
    if (fclose(f) != 0 || failed) {
        free(buf);
        buf = NULL;
    }
    free(rows);
    free(n_rows);
    if (buf == NULL)
        return SK_ERR;
    *out = buf;
    *len = size;
    return SK_OK;
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

/* The relays' figures, one series per target queue seen. */
static void render_outbox(FILE *f, struct outbox_area *o)
{
    /* Each family reads one field of struct sk_metrics_outq; the lag, not a
     * plain field, is marked by LAG. */
    enum { LAG = SIZE_MAX };
    static const struct {
        const char *name, *type, *help;
        size_t      field;
    } families[] = {
        { "sekali_outbox_published_total", "counter",
          "Outbox rows the relays published and the broker confirmed, by target queue.",
          offsetof(struct sk_metrics_outq, published) },
        { "sekali_outbox_unroutable_total", "counter",
          "Outbox rows the broker refused (no such queue, or nacked), marked with publish_error.",
          offsetof(struct sk_metrics_outq, unroutable) },
        { "sekali_outbox_pending", "gauge", "Due outbox rows waiting to be published.",
          offsetof(struct sk_metrics_outq, pending) },
        { "sekali_outbox_failed_rows", "gauge",
          "Unpublished outbox rows holding a publish_error, waiting for an operator.",
          offsetof(struct sk_metrics_outq, failed_rows) },
        { "sekali_outbox_lag_seconds", "gauge",
          "How long the oldest due outbox row has been waiting to be published.", LAG },
    };
    uint64_t now = (uint64_t)sk_now_ms();
    for (size_t fam = 0; fam < SK_ARRAY_LEN(families); fam++) {
        header(f, families[fam].name, families[fam].type, families[fam].help);
        for (size_t k = 0; k <= SK_METRICS_OUTBOX_QUEUES; k++) {
            if (atomic_load_explicit(&o->queue_names[k].state, memory_order_acquire) !=
                SLOT_READY)
                continue;
            struct sk_metrics_outq *oq = &o->queues[k];
            fputs(families[fam].name, f);
            labels(f, o->queue_names[k].name, NULL);
            fputs("} ", f);
            if (families[fam].field == LAG) {
                seconds(f, lag_now(oq, now) * 1000000);
            } else {
                _Atomic uint64_t *value =
                    (_Atomic uint64_t *)((char *)oq + families[fam].field);
                fprintf(f, "%" PRIu64, atomic_load_explicit(value, memory_order_relaxed));
            }
            fputc('\n', f);
        }
    }
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

/* Fills rows with the queue's job types, one row per distinct name, and
 * returns how many. */
static size_t collect(struct sk_metrics_queue *mq, struct row *rows)
{
    size_t n = 0;
    for (size_t i = 0; i <= SK_METRICS_TYPES; i++) {
        struct name_slot *s = &mq->type_names[i];
        if (atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_READY)
            continue;
        size_t r = 0;
        while (r < n && strcmp(rows[r].name, s->name) != 0)
            r++;
        if (r == n)
            rows[n++].name = s->name;
        add_slot(&rows[r], &mq->types[i]);
    }
    return n;
}

static void add_slot(struct row *r, struct sk_metrics_type *t)
{
    for (int c = 0; c < SK_METRIC_COUNT; c++)
        r->counter[c] += atomic_load_explicit(&t->counter[c], memory_order_relaxed);
    for (int why = 0; why < SK_METRICS_REASONS; why++)
        r->dead[why] += atomic_load_explicit(&t->dead[why], memory_order_relaxed);
    r->lock_wait_ns += atomic_load_explicit(&t->lock_wait_ns, memory_order_relaxed);
    for (int b = 0; b < BUCKETS; b++)
        r->duration[b] += atomic_load_explicit(&t->duration[b], memory_order_relaxed);
    r->duration_ns += atomic_load_explicit(&t->duration_ns, memory_order_relaxed);
}

static void header(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Opens the label set: {queue="...",job_type="..." (job_type only when
 * given); the caller adds more labels and the closing brace. */
static void labels(FILE *f, const char *queue, const char *job_type)
{
    fputs("{queue=\"", f);
    label_value(f, queue);
    fputc('"', f);
    if (job_type != NULL) {
        fputs(",job_type=\"", f);
        label_value(f, job_type);
        fputc('"', f);
    }
}

/* The format's three escapes. Job types come from producers; the envelope
 * already made sure they are UTF-8 without NUL. */
static void label_value(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '"')
            fputs("\\\"", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

/* Exact decimal seconds: no float rounding in a counter that only grows. */
static void seconds(FILE *f, uint64_t ns)
{
    fprintf(f, "%" PRIu64 ".%09" PRIu64, ns / NS_PER_S, ns % NS_PER_S);
}
