/* scoreboard.c - the shared-memory slots of scoreboard.h. */
#include <stdlib.h>
#include <sys/mman.h>

#include "scoreboard.h"

struct sk_scoreboard {
    struct sk_slot *slots;
    size_t          n;
};

int sk_scoreboard_create(struct sk_scoreboard **out, size_t n, struct sk_err *err)
{
    struct sk_scoreboard *sb = calloc(1, sizeof(*sb));
    if (sb == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(scoreboard)");
    /* Anonymous shared memory: inherited across fork(), gone with the
     * last process, nothing in /dev/shm to clean up after a crash. */
    sb->slots = mmap(NULL, n * sizeof(*sb->slots), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sb->slots == MAP_FAILED) {
        free(sb);
        return sk_err_errno(err, SK_ERR, "mmap(scoreboard)");
    }
    sb->n = n;
    for (size_t i = 0; i < n; i++) {
        atomic_init(&sb->slots[i].job_started_ms, 0);
        atomic_init(&sb->slots[i].alive_ms, 0);
        atomic_init(&sb->slots[i].consuming, 0);
        atomic_init(&sb->slots[i].phase, SK_PHASE_IDLE);
        atomic_init(&sb->slots[i].ready, 0);
        atomic_init(&sb->slots[i].finished, 0);
        atomic_init(&sb->slots[i].died_in_job, 0);
        atomic_init(&sb->slots[i].lock_held, 0);
        atomic_init(&sb->slots[i].orphan_held, 0);
    }
    *out = sb;
    return SK_OK;
}

void sk_scoreboard_destroy(struct sk_scoreboard *sb)
{
    if (sb == NULL)
        return;
    munmap(sb->slots, sb->n * sizeof(*sb->slots));
    free(sb);
}

struct sk_slot *sk_scoreboard_slot(struct sk_scoreboard *sb, size_t i)
{
    sk_assert(i < sb->n);
    return &sb->slots[i];
}
