/* span_way.h - private to src/worker/span*.c: a way through one
 * transaction, and the steps of a span that live in files of their own.
 *
 * span.c drives (the claim, the handlers, the choice of way, the reruns);
 * span_commit.c sends a transaction's COMMIT and settles each job by its
 * answer; span_blame.c says whose a failed transaction's failure is;
 * span_settle.c recounts the duplicates a rolled-back claim counted and
 * carries out the span's exits. Calls go one way only, down
 * that list (span.c calls them all, none calls span.c), so the recursion
 * of a rerun stays in span.c. */
#ifndef SK_SPAN_WAY_H
#define SK_SPAN_WAY_H

#include <stdbool.h>
#include <stddef.h>

#include "job_steps.h"
#include "pipeline.h"

/* A way through one transaction: how its keys are claimed, how a
 * handler's failure is undone, and how the outcomes commit. Chosen once
 * per transaction (batch.c: fast, or careful for an outbox job; a job
 * alone: one). Adding a way? A row in span.c's ways[] and a name in enum
 * sk_way. */
struct sk_span_way {
    int  (*claim)(struct sk_store *st, const struct sk_keyref *refs, size_t m,
                  struct sk_claim *out, bool *dups, struct sk_err *err);
    int  (*commit)(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                   struct sk_err *err);
    bool alone;         /* one job: the claim's answers and the transaction are its own */
    bool results_only;  /* the claim wrote the keys completed: the COMMIT adds results */
    enum {
        AT_COMMIT,      /* the job's transaction is rolled back at its commit */
        TO_SAVEPOINT,   /* the handler runs in a savepoint, rolled back alone */
        ALL_AGAIN,      /* the whole transaction goes; the others run again, careful */
    } failure;
    const char *lost;   /* why its jobs go back when a handler's transaction fails */
};

/* span_commit.c: the handled jobs' queued statements, completions and the
 * COMMIT in one round trip (with the back keys in s->refs given back, of a
 * batch closed early). Returns the COMMIT's answer; *queued says whether
 * it carried queued statements. SK_AGAIN: the span was handed back (an
 * unknown outcome, or no memory for the statements), nothing left to do. */
int  sk_span_commit(struct sk_pipeline *p, struct sk_span *s, const struct sk_span_way *w,
                    size_t back, bool *queued, struct sk_err *err);
/* span_commit.c: the ways' COMMITs, rows of span.c's ways[]. */
int  sk_span_commit_one(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                        struct sk_err *err);
int  sk_span_commit_fast(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                         struct sk_err *err);
int  sk_span_commit_careful(struct sk_pipeline *p, struct sk_span *s, size_t m, size_t back,
                            struct sk_err *err);
/* span_commit.c: each handled job after the COMMIT answered rc: completed,
 * or its failure settled. True when some were rewound for another
 * transaction (a batch-mate's key cancelled). */
bool sk_span_settle_outcomes(struct sk_pipeline *p, struct sk_span *s,
                             const struct sk_span_way *w, int rc, const struct sk_err *err);

/* span_blame.c: the transaction is lost before any COMMIT: every job still
 * in it is handed back unchanged. */
void sk_span_abandon(struct sk_pipeline *p, struct sk_span *s, const char *why);
/* span_blame.c: the fast way's first failed handler. True when the others
 * are rewound to run again, careful; false when the transaction was lost
 * with it (all handed back). */
bool sk_span_blame_handler(struct sk_pipeline *p, struct sk_span *s, struct sk_job *failed);
/* span_blame.c: a COMMIT of several jobs with queued statements failed.
 * True when a job's key was cancelled: the others are rewound to run
 * again together; false: they are rewound to run again each alone. */
bool sk_span_blame_queued(struct sk_pipeline *p, struct sk_span *s);

/* span_settle.c: the duplicates a rolled-back transaction's claim counted,
 * written again on their own (before the next claim, and at the end). */
void sk_span_recount_duplicates(struct sk_pipeline *p, struct sk_span *s);

/* span_settle.c: the exits of the settled jobs ahead of the first live
 * one, sent between two transactions of the span. */
void sk_span_settle_done(struct sk_pipeline *p, struct sk_span *s);
/* span_settle.c: which of the span's locks the heartbeat found lost,
 * counted and logged before they are released. */
void sk_span_count_lost_locks(struct sk_pipeline *p, struct sk_span *s);

#endif
