/* scoreboard.h - what each worker tells the supervisor, in shared memory.
 *
 * The supervisor maps one slot per worker before forking; each worker writes
 * only its own slot. The supervisor reads it, and writes it only while no
 * worker runs on it: at reap time (died_in_job, the orphaned lock) and
 * before forking (the new worker's phase and progress start from zero).
 * Plain atomics, no locks: a worker killed mid-write cannot leave a lock
 * held. Times are CLOCK_MONOTONIC milliseconds, which all processes of one
 * host share. */
#ifndef SK_SCOREBOARD_H
#define SK_SCOREBOARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "lock.h"

/* Where a worker is with its job: at reap time the supervisor counts a
 * death against the job only if it came while the handler ran (see
 * sk_deaths_judge() in deaths.c). */
enum sk_slot_phase {
    SK_PHASE_IDLE,     /* no delivery in hand */
    SK_PHASE_JOB,      /* parsing, locking, claiming, committing, acking */
    SK_PHASE_HANDLER,  /* inside the handler's handle() */
};

#define SK_SLOT_LOCK_KEY_MAX SK_LOCK_KEY_MAX  /* see sk_lock_key() */

struct sk_slot {
    _Atomic int64_t job_started_ms;  /* 0 while idle */
    _Atomic int64_t alive_ms;        /* the worker's loop last turned; 0 before */
    _Atomic int     consuming;       /* 1 while subscribed to its queue */
    _Atomic int     phase;           /* enum sk_slot_phase */
    /* Progress since this worker started, for the restart policy: it was
     * ready (consumed) once, and how many deliveries it saw to an end.
     * Zeroed by the supervisor before each fork. */
    _Atomic int      ready;
    _Atomic uint64_t finished;
    /* The idempotency key of the job in hand ("" before its claim). Read by
     * no one while its worker lives, so a plain array. */
    char            job_key[SK_KEY_MAX + 1];
    /* Set by the supervisor when the worker died of its job (its key stays
     * in job_key); cleared by the replacement once it has recorded the
     * crash in PostgreSQL. */
    _Atomic int     died_in_job;
    /* The Redis lock the worker holds or is asking for: lock_held is set
     * after key and token are written, before the SET, and cleared after the
     * release or the refusal. */
    _Atomic int     lock_held;
    char            lock_key[SK_SLOT_LOCK_KEY_MAX];
    char            lock_token[SK_LOCK_TOKEN_LEN + 1];
    /* A lock a dead worker of this slot left behind: the supervisor moves it
     * here at reap time, and a replacement deletes it (compare by token)
     * before it consumes, then clears orphan_held. */
    _Atomic int     orphan_held;
    char            orphan_key[SK_SLOT_LOCK_KEY_MAX];
    char            orphan_token[SK_LOCK_TOKEN_LEN + 1];
};

struct sk_scoreboard;

/* Maps n zeroed slots shared with children forked later. */
int  sk_scoreboard_create(struct sk_scoreboard **out, size_t n, struct sk_err *err);
void sk_scoreboard_destroy(struct sk_scoreboard *sb);

struct sk_slot *sk_scoreboard_slot(struct sk_scoreboard *sb, size_t i);

#endif
