/* scoreboard.c - the shared-memory slots of scoreboard.h. */
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "scoreboard.h"

struct sk_scoreboard {
    unsigned char *base;
    size_t         n;
    size_t         stride;  /* a slot with its 2 * lock_cap lock entries, aligned */
};

int sk_scoreboard_create(struct sk_scoreboard **out, size_t n, size_t lock_cap,
                         struct sk_err *err)
{
    sk_assert(lock_cap >= 1 && lock_cap <= UINT32_MAX / 2);
    struct sk_scoreboard *sb = calloc(1, sizeof(*sb));
    if (sb == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(scoreboard)");
    size_t align = alignof(struct sk_slot);
    sb->stride = sizeof(struct sk_slot) + 2 * lock_cap * sizeof(struct sk_slot_lock);
    sb->stride = (sb->stride + align - 1) / align * align;
    /* Anonymous shared memory: inherited across fork(), gone with the
     * last process, nothing in /dev/shm to clean up after a crash. Pages
     * of lock entries never written are never backed. */
    sb->base = mmap(NULL, n * sb->stride, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    if (sb->base == MAP_FAILED) {
        int rc = sk_err_errno(err, SK_ERR, "mmap(scoreboard, %zu bytes)", n * sb->stride);
        free(sb);
        return rc;
    }
    sb->n = n;
    for (size_t i = 0; i < n; i++) {
        struct sk_slot *s = sk_scoreboard_slot(sb, i);
        atomic_init(&s->job_started_ms, 0);
        atomic_init(&s->alive_ms, 0);
        atomic_init(&s->consuming, 0);
        atomic_init(&s->paused, 0);
        atomic_init(&s->phase, SK_PHASE_IDLE);
        atomic_init(&s->ready, 0);
        atomic_init(&s->finished, 0);
        atomic_init(&s->died_in_job, 0);
        atomic_init(&s->job_seq, 0);
        s->lock_cap = (uint32_t)lock_cap;
        atomic_init(&s->n_locks, 0);
        atomic_init(&s->n_orphans, 0);
        atomic_init(&s->n_held, 0);
    }
    *out = sb;
    return SK_OK;
}

void sk_scoreboard_destroy(struct sk_scoreboard *sb)
{
    if (sb == NULL)
        return;
    munmap(sb->base, sb->n * sb->stride);
    free(sb);
}

struct sk_slot *sk_scoreboard_slot(struct sk_scoreboard *sb, size_t i)
{
    sk_assert(i < sb->n);
    return (struct sk_slot *)(void *)(sb->base + i * sb->stride);
}

void sk_slot_record_locks(struct sk_slot *s, size_t n, const char *const *keys,
                          const char *const *tokens)
{
    /* config.c bounds batch, and the supervisor sized lock_cap by it. */
    sk_assert(n <= s->lock_cap);
    /* The count first drops to 0, so that a death mid-copy never hands
     * over an entry half old, half new. */
    atomic_store(&s->n_locks, 0);
    for (size_t i = 0; i < n; i++) {
        snprintf(s->locks[i].key, sizeof(s->locks[i].key), "%s", keys[i]);
        snprintf(s->locks[i].token, sizeof(s->locks[i].token), "%s", tokens[i]);
    }
    atomic_store(&s->n_locks, (uint32_t)n);
}

void sk_slot_forget_locks(struct sk_slot *s)
{
    atomic_store(&s->n_locks, 0);
    atomic_store(&s->n_held, 0);
}

void sk_slot_set_held(struct sk_slot *s, size_t n)
{
    atomic_store_explicit(&s->n_held, (uint32_t)n, memory_order_relaxed);
}

const struct sk_slot_lock *sk_slot_orphans(const struct sk_slot *s, size_t *n)
{
    *n = atomic_load(&s->n_orphans);
    return s->locks + s->lock_cap;
}

void sk_slot_forget_orphans(struct sk_slot *s)
{
    atomic_store(&s->n_orphans, 0);
}

/* Orphans still pending are kept when the new ones fit beside them (a
 * replacement that could not reach Redis to free them, then died holding
 * locks of its own); otherwise the new ones replace them: the older have
 * had the longer time to expire by themselves. */
void sk_slot_orphan_locks(struct sk_slot *s)
{
    size_t held = atomic_exchange(&s->n_locks, 0);
    atomic_store(&s->n_held, 0);
    if (held == 0)
        return;
    size_t pending = atomic_load(&s->n_orphans);
    if (pending + held > s->lock_cap)
        pending = 0;
    memcpy(s->locks + s->lock_cap + pending, s->locks, held * sizeof(s->locks[0]));
    atomic_store(&s->n_orphans, (uint32_t)(pending + held));
}

/* Copies at most size - 1 bytes and ends the copy: the fields are fixed
 * arrays a reader scans, so each must stay terminated. */
static void put(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* A worker killed mid-write leaves the count odd: the next write starts
 * from that odd value rather than adding one, so odd always means "being
 * written". The fences order the field stores between the two counts. */
void sk_slot_publish_job(struct sk_slot *s, const char *key, const char *type,
                         uint32_t attempt, const char *trace_id)
{
    uint32_t seq = atomic_load_explicit(&s->job_seq, memory_order_relaxed) | 1u;
    atomic_store_explicit(&s->job_seq, seq, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    put(s->job_key, sizeof(s->job_key), key);
    put(s->job_type, sizeof(s->job_type), type);
    put(s->job_trace, sizeof(s->job_trace), trace_id);
    s->job_attempt = attempt;
    atomic_store_explicit(&s->job_seq, seq + 1, memory_order_release);
}

/* A reader copies, then checks that the count neither was odd nor moved;
 * a worker writes once per job, so a few tries are plenty. */
bool sk_slot_read_job(const struct sk_slot *s, struct sk_slot_job *out)
{
    for (int tries = 0; tries < 8; tries++) {
        uint32_t before = atomic_load_explicit(&s->job_seq, memory_order_acquire);
        if (before & 1u)
            continue;
        memcpy(out->key, s->job_key, sizeof(out->key));
        memcpy(out->type, s->job_type, sizeof(out->type));
        memcpy(out->trace_id, s->job_trace, sizeof(out->trace_id));
        out->attempt = s->job_attempt;
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&s->job_seq, memory_order_relaxed) == before) {
            out->key[sizeof(out->key) - 1] = '\0';
            out->type[sizeof(out->type) - 1] = '\0';
            out->trace_id[sizeof(out->trace_id) - 1] = '\0';
            return true;
        }
    }
    *out = (struct sk_slot_job){ .attempt = 0 };
    return false;
}

bool sk_slot_hand_crash(struct sk_slot *from, struct sk_slot *to)
{
    if (!atomic_load(&from->died_in_job) || atomic_load(&to->crash_handed))
        return false;
    memcpy(to->handed_crash_key, from->job_key, sizeof(to->handed_crash_key));
    atomic_store(&to->crash_handed, 1);
    atomic_store(&from->died_in_job, 0);
    return true;
}

size_t sk_slot_hand_orphans(struct sk_slot *from, struct sk_slot *to)
{
    size_t n = atomic_load(&from->n_orphans);
    if (n == 0 || atomic_load(&to->n_orphans) != 0)
        return 0;
    if (n > to->lock_cap)
        n = to->lock_cap;
    memcpy(to->locks + to->lock_cap, from->locks + from->lock_cap, n * sizeof(to->locks[0]));
    atomic_store(&to->n_orphans, (uint32_t)n);
    atomic_store(&from->n_orphans, 0);
    return n;
}
