/* scoreboard.h - what each worker tells the supervisor, in shared memory.
 *
 * The supervisor maps one slot per worker before forking; each worker writes
 * only its own slot and the supervisor only reads, but for died_in_job.
 * Plain atomics, no locks: a worker killed mid-write cannot leave a lock
 * held. Times are CLOCK_MONOTONIC milliseconds, which all processes of one
 * host share. */
#ifndef SK_SCOREBOARD_H
#define SK_SCOREBOARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

struct sk_slot {
    _Atomic int64_t job_started_ms;  /* 0 while idle */
    _Atomic int64_t alive_ms;        /* the worker's loop last turned; 0 before */
    _Atomic int     consuming;       /* 1 while subscribed to its queue */
    /* The idempotency key of the job in hand ("" before its claim). Read by
     * no one while its worker lives, so a plain array. */
    char            job_key[SK_KEY_MAX + 1];
    /* Set by the supervisor when the worker died with a job in hand (its key
     * stays in job_key); cleared by the replacement once it has recorded
     * the crash in PostgreSQL. */
    _Atomic int     died_in_job;
};

struct sk_scoreboard;

/* Maps n zeroed slots shared with children forked later. */
int  sk_scoreboard_create(struct sk_scoreboard **out, size_t n, struct sk_err *err);
void sk_scoreboard_destroy(struct sk_scoreboard *sb);

struct sk_slot *sk_scoreboard_slot(struct sk_scoreboard *sb, size_t i);

#endif
