/* job_steps.h - the steps of the pipeline, over a span of n >= 1 jobs: one
 * delivery is a span of one (sk_span_process()), a batch a span of many in
 * one transaction (sk_batch_run(), batch.c, which adds only the collecting
 * and the choice of the fast or careful way). span.c drives the steps;
 * job.c decides what each means for one job. Not an interface for
 * anything else: a step may assume the order in which the callers call
 * them.
 *
 * Each step either passes a job on or settles it through sk_job_finish(),
 * which only decides the job's exit; sk_span_settle() carries every exit
 * out at the end, in delivery order. */
#ifndef SK_JOB_STEPS_H
#define SK_JOB_STEPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "amqp_lib.h"
#include <libpq-fe.h>

#include "envelope.h"
#include "lock.h"
#include "log.h"
#include "sqlq.h"
#include "store.h"

struct sk_metrics_type;
struct sk_pipeline;

/* A job's states, in order: the job is in exactly one. sk_job_transition()
 * is the only way between them: it asserts the move is legal, logs it and,
 * in a fault build, is where a test can kill the worker. Adding a state?
 * Give it a name, a failpoint (or NULL) and its legal predecessors in
 * job_state.c. */
enum sk_job_state {
    SK_JOB_NEW,          /* delivered, not yet validated */
    SK_JOB_RECEIVED,     /* validated: its key is known */
    SK_JOB_LOCKED,       /* holds the resource's Redis lock, or runs under its leader's */
    SK_JOB_CLAIMED,      /* owns the key: row lock (transactional) or lease (external) */
    SK_JOB_HANDLED,      /* the handler returned */
    SK_JOB_COMMITTED,    /* the outcome is durable */
    SK_JOB_SETTLED,      /* its exit decided (sk_job_finish()), not carried out yet */
    SK_JOB_ACKED,        /* the broker has our ack: the delivery is done with */
    SK_JOB_HANDED_BACK,  /* requeued, rejected, or its ack lost: the broker decides */
    SK_JOB_STATES
};

/* What became of a job: its outcome event's `outcome` (log.h's
 * SK_EVENT_OUTCOME, sekalid(8) LOGGING). Adding one? Name it in
 * outcome_names[] (job_state.c) and in the man page. */
enum sk_job_outcome {
    SK_OUTCOME_COMPLETED,    /* its effect is committed (external: recorded) */
    SK_OUTCOME_DUPLICATE,    /* its key was done already: not run */
    SK_OUTCOME_CANCELLED,    /* its key was cancelled: not run, or its outcome refused */
    SK_OUTCOME_FENCED_OUT,   /* another worker owns the job: that one's outcome stands */
    SK_OUTCOME_RETRY,        /* a copy comes back later as the next attempt */
    SK_OUTCOME_RESCHEDULED,  /* a copy comes back later as the same attempt */
    SK_OUTCOME_DEAD,         /* dead-lettered */
    SK_OUTCOME_HANDED_BACK,  /* back to the queue unchanged: a server failed it */
};

/* What happens to the delivery itself once the job's outcome is settled. */
enum sk_disposition {
    SK_ACK,          /* done with it: effect committed, duplicate, or a copy confirmed */
    SK_REQUEUE,      /* back to the queue unchanged */
    SK_DEAD_LETTER,  /* the broker moves it to <queue>.dead */
    SK_ACKED,        /* acked already, at once and alone (a dead letter's copy) */
};

struct sk_job {
    enum sk_job_state      state;
    const amqp_envelope_t *delivery;  /* borrowed until sk_span_settle() */
    struct sk_envelope     env;
    struct sk_metrics_type *metrics;
    struct sk_log_job      log;
    struct {
        char     key[SK_LOCK_KEY_MAX];
        char     token[SK_LOCK_TOKEN_LEN + 1];
        bool     held;        /* this job took it, and releases it */
        /* An earlier job of the span locks the same resource (1 + its
         * index; 0: none): this one runs under that lock, after it, in
         * this worker, instead of finding it busy and being re-scheduled. */
        size_t   leader;
        bool     shared;      /* runs under its leader's lock */
        bool     lost;        /* the heartbeat found it lost (settling) */
        int      refusal;     /* why it was refused (lock_refused()) */
        uint64_t busy_since;  /* CLOCK_MONOTONIC at its first refusal; 0: none */
        /* Refused while the span held other locks: it waits, unclaimed,
         * until they are committed and released (sk_span_deferred()). */
        bool     deferred;
    } lock;
    struct sk_claim    claim;
    struct sk_keyref   ref;         /* the key, for the store and the lease */
    uint64_t           claimed_ns;  /* CLOCK_MONOTONIC at the claim, for the duration */
    uint64_t           admitted_ns; /* CLOCK_MONOTONIC at admission, for the outcome's ms */
    bool               same_key;    /* an earlier job of the span has the same key */
    /* A duplicate whose count (written by its batch's claim) only the
     * batch's COMMIT makes true: still set once that rolled back. */
    bool               dup_uncounted;
    bool               leased;      /* external mode: the heartbeat renews our lease */
    /* The handler's outcome, kept until the span's COMMIT says what
     * becomes of it. */
    struct sk_outcome {
        int      status;          /* the handler's, or RETRY when the step around it failed */
        bool     conflict;
        uint32_t retry_after_ms;  /* host->retry_after(), with a RETRY */
        char     error[512];
        void    *result;          /* a copy of ctx->result, for the completion and the reply */
        size_t   result_len;
        struct sk_sqlq queued;    /* host->queue_sql()'s, for the COMMIT's pipeline */
    } out;
    /* The exit is only decided by sk_job_finish(), and carried out by
     * sk_span_settle() once the whole span is settled, in delivery order:
     * an ack covers every earlier delivery (a multiple-ack), so no ack may
     * leave before every job ahead of it is settled. */
    struct {
        enum sk_disposition how;
        enum sk_job_outcome outcome;
        char     reason[32];   /* the outcome's reason, a word; "": none */
        int      dead_reason;  /* an enum sk_metrics_reason, for SK_DEAD_LETTER */
        char     text[1300];   /* the exit's log line: dead_letter()'s is the longest */
        uint32_t pause_ms;     /* a server is failing: wait this long after the exit */
    } exit;
};

/* How a span's keys are claimed, and so how its handlers run and commit:
 * each a row of span.c's table of ways. */
enum sk_way {
    SK_WAY_ONE,      /* one job in its own transaction: claimed completed, the row locked */
    SK_WAY_FAST,     /* claimed completed, handlers straight in the transaction */
    SK_WAY_CAREFUL,  /* claimed processing, each handler in a savepoint */
};

/* A settled job's lock, not released yet: it goes with the next acquire
 * (one script, one round trip for both) or when the worker would wait for
 * a delivery (sk_span_release_locks()). It stays in the scoreboard until
 * then, so a worker dying meanwhile leaves it to its replacement to free,
 * as a lock held mid-job; and it is not renewed, so it lives at most its
 * TTL. What the job's log lines carried is copied for the line a lock
 * found expired at release logs. */
struct sk_release {
    char     key[SK_LOCK_KEY_MAX];
    char     token[SK_LOCK_TOKEN_LEN + 1];
    char     job_id[SK_KEY_MAX + 1];
    char     idempotency_key[SK_KEY_MAX + 1];
    char     resource_key[SK_KEY_MAX + 1];
    int64_t  fence;
    uint32_t delivery_attempt;
};

/* n >= 1 deliveries going through the pipeline together: one job is a span
 * of one. Kept by the pipeline between spans (sk_span_of()), so that a span
 * costs no allocation. The scratch arrays (keys to index) are the round
 * trips' over the span: a step fills and reads them within one call, and
 * keeps nothing in them across another step (a job run alone uses them
 * too). */
struct sk_span {
    size_t           cap, n;
    size_t           ran_before_close;  /* handlers a transaction ran before it closed early */
    struct sk_release *releases;    /* up to cap locks of settled jobs, to release */
    size_t           n_releases;
    struct sk_job      *jobs;
    amqp_envelope_t *deliveries;    /* for a caller that collects them (batch.c) */
    const char     **keys, **tokens;  /* 2 x cap: the releases, then the span's locks */
    int             *rcs;             /* 2 x cap, as keys */
    bool            *lost;
    struct sk_keyref *refs;
    const struct sk_keyref **ref_ptrs;
    const void     **results;
    size_t          *result_lens;
    struct sk_claim *claims;
    bool            *dups;
    size_t          *index;         /* which job each scratch entry is */
};

/* The pipeline's span, made on first use for up to max(queue->batch_max, 1)
 * jobs; NULL when there is no memory for it. */
struct sk_span *sk_span_of(struct sk_pipeline *p);
/* Appends a new job for delivery (borrowed until sk_span_settle()). */
void sk_span_add(struct sk_span *s, const amqp_envelope_t *delivery);
/* Validates and counts each delivery, takes every lock of the span (one
 * round trip a try, waiting out busy ones up to lock.busy_wait only while
 * none is held; a busy one is deferred while others are held) and watches
 * them, and dead-letters the jobs that killed too many workers. */
void sk_span_start(struct sk_pipeline *p, struct sk_span *s);
/* One transaction over the span's live jobs, the way given (fast or
 * careful): every key claimed in one round trip (a later job with an
 * earlier one's key is left out, marked same_key), each handler run, the
 * completions and the COMMIT in one round trip, each job settled. A key
 * held by another worker sends each job alone. True when jobs are left for
 * another transaction (closed early, or a COMMIT refused for a batch-mate's
 * cancelled key); the exits of the jobs settled ahead of them are then
 * sent. */
bool sk_span_transaction(struct sk_pipeline *p, struct sk_span *s, enum sk_way way);
/* Each job left out for an earlier job's key, alone, once that one is
 * settled: it finds the leader's outcome as any later copy would. */
void sk_span_followers(struct sk_pipeline *p, struct sk_span *s);
/* Once every other job of the span is settled: the jobs deferred for a
 * busy lock ask for it again, holding nothing (the span's other locks
 * released with that acquire), as sk_span_start() asks. True when some are
 * ready for another transaction. */
bool sk_span_deferred(struct sk_pipeline *p, struct sk_span *s);
/* span_lock.c: takes the locks of the span's received jobs, one round trip
 * a try, defers or re-schedules the busy ones, and has the heartbeat watch
 * those taken (sk_span_start(), sk_span_deferred()). */
void sk_span_lock(struct sk_pipeline *p, struct sk_span *s);
/* span_lock.c: sk_span_lock() with the queue's rate limit asked in the
 * first round's write (limit.h) and answered before a busy lock is waited
 * for: no round trip of the limit's own (sk_span_start()). */
void sk_span_admit_lock(struct sk_pipeline *p, struct sk_span *s);
/* span_lock.c: the span's locks join the releases waiting (settling). */
void sk_span_unlock(struct sk_pipeline *p, struct sk_span *s);
/* Every job's exit, in delivery order, after the span's locks went in one
 * round trip; then the pause a failing server asked for. */
void sk_span_settle(struct sk_pipeline *p, struct sk_span *s);

/* Not settled yet: still on its way through the steps. */
static inline bool sk_job_live(const struct sk_job *j)
{
    return j->state < SK_JOB_SETTLED;
}

/* Validates the delivery and counts it; dead-letters what can never run. */
bool sk_job_admit(struct sk_pipeline *p, struct sk_job *j);
/* Once locked: false, dead-lettered, for a job that killed max_crashes
 * workers. */
bool sk_job_survivable(struct sk_pipeline *p, struct sk_job *j);
/* What a claim's answer means for the job: true when it owns its key. */
bool sk_job_claimed(struct sk_pipeline *p, struct sk_job *j, int rc, const struct sk_err *err);
/* External mode: claims the job's lease, runs the handler outside any
 * transaction and records its outcome under the lease's fence; settles
 * the job. */
void sk_job_run_external(struct sk_pipeline *p, struct sk_job *j);
/* Runs the handler on pg with p->ctx, reset by the caller. */
int  sk_job_call_handler(struct sk_pipeline *p, struct sk_job *j, PGconn *pg);
/* RETRY, FAIL or an invalid status, with the handler's error text and
 * whether it reported a conflict. Outside any job transaction. */
void sk_job_settle_failure(struct sk_pipeline *p, struct sk_job *j, int status, const char *error,
                           bool conflict);
void sk_job_reply(struct sk_pipeline *p, struct sk_job *j, const void *result, size_t len);
/* After the job's outcome was refused (its COMMIT rolled back, or fenced
 * out): true, with the job settled (counted, acked), when that was because
 * its key was cancelled while it ran; false otherwise, the job untouched.
 * Outside any job transaction. */
bool sk_job_refused_cancelled(struct sk_pipeline *p, struct sk_job *j);
/* A confirmed copy for later (job.c): `outcome` is the cause in a word or
 * two ("lock busy", "retry"), the outcome event's reason with _ for spaces;
 * the next attempt past the job's own makes it a retry. */
bool sk_job_later(struct sk_pipeline *p, struct sk_job *j, uint32_t delay_ms,
                  uint32_t next_attempt, const char *error, const char *outcome);
void sk_job_transition(struct sk_job *j, enum sk_job_state to);
/* Back to before the claim, whose transaction was rolled back unseen. */
void sk_job_rewind(struct sk_job *j);
/* Decides the job's exit (carried out by sk_span_settle()): the job is
 * settled. outcome and reason (a word, or NULL) are what its outcome event
 * will say, text its prose. */
void sk_job_finish(struct sk_job *j, enum sk_disposition d, enum sk_job_outcome outcome,
                   const char *reason, const char *text);
/* SK_OUTCOME_HANDED_BACK (SK_REQUEUE) with a pause of 0.1-1 s after the
 * exit: a server failed the job on its way. */
void sk_job_hand_back(struct sk_job *j, const char *reason, const char *text);
/* The exit carried out (sent: the broker took the ack or reject; false:
 * the consumer was lost): the job's last state, and its outcome event. */
void sk_job_exited(struct sk_job *j, bool sent);

#endif
