/* scoreboard.h - what each worker tells the supervisor, in shared memory.
 *
 * The supervisor maps one slot per worker before forking; each worker writes
 * only its own slot. The supervisor reads it, and writes it only while no
 * worker runs on it: at reap time (died_in_job, the orphaned locks) and
 * before forking (the new worker's phase and progress start from zero).
 * Plain atomics, no locks: a worker killed mid-write cannot leave a lock
 * held. Times are CLOCK_MONOTONIC milliseconds, which all processes of one
 * host share.
 *
 * Locks. A slot ends in two lists of lock_cap entries each (lock_cap: the
 * largest queues[].batch of the generation's config, at least 1; config.c
 * bounds batch), so slots are sk_scoreboard_slot()'s stride apart, not
 * sizeof(struct sk_slot):
 *
 *   locks[0 .. n_locks)                         held or being asked for
 *   locks[lock_cap .. lock_cap + n_orphans)     a dead worker's, to free
 *
 * A worker writes every lock it is about to ask for before its SET is sent
 * (sk_slot_record_locks()), so a death between the SET and the record
 * cannot leave a lock nobody knows of; an entry whose SET never succeeded
 * is harmless, since a delete by a token that never owned the key deletes
 * nothing. It forgets them after their release. At reap time the
 * supervisor moves the held ones to the orphans (sk_slot_orphan_locks()),
 * and the replacement frees them all before it consumes. */
#ifndef SK_SCOREBOARD_H
#define SK_SCOREBOARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "lock.h"
#include "trace_context.h"

/* Where a worker is with its job: at reap time the supervisor counts a
 * death against the job only if it came while the handler ran (see
 * sk_deaths_judge() in deaths.c). */
enum sk_slot_phase {
    SK_PHASE_IDLE,     /* no delivery in hand */
    SK_PHASE_JOB,      /* parsing, locking, claiming, committing, acking */
    SK_PHASE_HANDLER,  /* inside the handler's handle() */
};

#define SK_SLOT_LOCK_KEY_MAX SK_LOCK_KEY_MAX  /* see sk_lock_key() */
#define SK_SLOT_WHY_MAX      256

/* One Redis lock as a slot records it. */
struct sk_slot_lock {
    char key[SK_SLOT_LOCK_KEY_MAX];
    char token[SK_LOCK_TOKEN_LEN + 1];
};

struct sk_slot {
    _Atomic int64_t job_started_ms;  /* 0 while idle */
    _Atomic int64_t alive_ms;        /* the worker's loop last turned; 0 before */
    _Atomic int     consuming;       /* 1 while subscribed to its queue */
    _Atomic int     paused;          /* 1 while its queue is paused (sekalictl pause) */
    /* 1 while its handler cannot run (ready() refused): the worker holds no
     * delivery, and blocked_why says why (for STATUS=, /readyz and
     * sekalictl status). The worker writes the text, then the flag; the
     * text's last byte stays NUL, so a read racing a rewrite is garbled at
     * worst, never unbounded. */
    _Atomic int     blocked;
    char            blocked_why[SK_SLOT_WHY_MAX];
    _Atomic int     phase;           /* enum sk_slot_phase */
    /* Progress since this worker started, for the restart policy: it was
     * ready (consumed) once, and how many deliveries it saw to an end.
     * Zeroed by the supervisor before each fork. */
    _Atomic int      ready;
    _Atomic uint64_t finished;
    /* The job in hand, for its replacement and for the jobs in flight
     * (sekalictl inflight): its idempotency key ("" before it is parsed),
     * type, attempt and trace. Written only by sk_slot_publish_job(), under
     * job_seq (a sequence count, odd while a write is under way), so that a
     * reader gets one job's fields or none and no lock is ever held; the
     * key outlives the worker for the crash count. */
    _Atomic uint32_t job_seq;
    char            job_key[SK_KEY_MAX + 1];
    char            job_type[256];
    char            job_trace[SK_TRACE_ID_LEN + 1];
    uint32_t        job_attempt;
    /* Set by the supervisor when the worker died of its job (its key stays
     * in job_key); cleared by the replacement once it has recorded the
     * crash in PostgreSQL. */
    _Atomic int     died_in_job;
    /* The same for a retired generation's worker that died of its job and
     * has no replacement: the supervisor hands its crash to this live
     * worker (sk_slot_hand_crash()), which records it and clears the flag.
     * A key of its own, since this worker's job_key is its own job's. */
    char            handed_crash_key[SK_KEY_MAX + 1];
    _Atomic int     crash_handed;
    /* The Redis locks: see "Locks" above. lock_cap is written once, before
     * any fork; the counts say how many entries of each list are valid. */
    uint32_t         lock_cap;
    _Atomic uint32_t n_locks;
    _Atomic uint32_t n_orphans;
    /* Of the recorded locks, those Redis granted and no release has
     * answered for yet (a deferred release included): what the worker
     * holds, not what it asks for, for sekali_locks_held. Zeroed with the
     * held list when the worker is reaped. */
    _Atomic uint32_t n_held;
    struct sk_slot_lock locks[];  /* 2 * lock_cap: held, then orphans */
};

struct sk_scoreboard;

/* Maps n zeroed slots shared with children forked later, each with room
 * for lock_cap held locks and as many orphans (lock_cap >= 1). */
int  sk_scoreboard_create(struct sk_scoreboard **out, size_t n, size_t lock_cap,
                          struct sk_err *err);
void sk_scoreboard_destroy(struct sk_scoreboard *sb);

struct sk_slot *sk_scoreboard_slot(struct sk_scoreboard *sb, size_t i);

/* The worker's side, on its own slot. Records n locks (n <= lock_cap) as
 * held, replacing what was recorded: call it before their SET is sent. */
void sk_slot_record_locks(struct sk_slot *s, size_t n, const char *const *keys,
                          const char *const *tokens);
/* The recorded locks were released (or refused, or given up on). */
void sk_slot_forget_locks(struct sk_slot *s);
/* How many of the recorded locks Redis granted and are not released yet. */
void sk_slot_set_held(struct sk_slot *s, size_t n);
/* The orphans a predecessor left: *n entries, valid until
 * sk_slot_forget_orphans(). */
const struct sk_slot_lock *sk_slot_orphans(const struct sk_slot *s, size_t *n);
void sk_slot_forget_orphans(struct sk_slot *s);

/* The worker's side: names the job in hand (key "" for none yet). A few
 * stores and copies, no syscall: it runs for every job. */
void sk_slot_publish_job(struct sk_slot *s, const char *key, const char *type,
                         uint32_t attempt, const char *trace_id);

/* A copy of a slot's job, as one write left it. */
struct sk_slot_job {
    char     key[SK_KEY_MAX + 1];
    char     type[256];
    char     trace_id[SK_TRACE_ID_LEN + 1];
    uint32_t attempt;
};

/* Any process's side, while the worker may be writing: copies the job
 * fields; false if every try raced a write (the caller shows the job
 * without them). Never waits. */
bool sk_slot_read_job(const struct sk_slot *s, struct sk_slot_job *out);

/* The supervisor's side, once the slot's worker is reaped: its held locks
 * become the slot's orphans, for the replacement to free. */
void sk_slot_orphan_locks(struct sk_slot *s);

/* For a dead worker that gets no replacement (its generation is retiring):
 * moves from's orphans to to, a live worker's slot, whose worker frees
 * them before its next delivery. Only into a slot with no orphans pending:
 * its worker then is not reading that list, and reads the new entries only
 * after it sees their count, which is stored last. At most to->lock_cap
 * move; the rest are dropped (they expire). Returns how many moved. */
size_t sk_slot_hand_orphans(struct sk_slot *from, struct sk_slot *to);

/* The same for the crash such a worker died of (died_in_job): moves it to
 * to, a live worker's slot with no handed crash pending, whose worker
 * records it against the job's key before it frees any lock. Call it
 * before sk_slot_hand_orphans() into the same slot: the worker reads the
 * orphan count first, so once it sees the locks it sees the crash. False
 * when there is no crash to hand or to cannot take one now. */
bool sk_slot_hand_crash(struct sk_slot *from, struct sk_slot *to);

#endif
