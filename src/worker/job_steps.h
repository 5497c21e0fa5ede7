/* job_steps.h - the steps of the pipeline, shared by its two drivers: one
 * delivery at a time (job.c) and a batch of them in one transaction
 * (batch.c). Not an interface for anything else: a step may assume the
 * order in which the drivers call them.
 *
 * Each step is a function of one struct job: it either passes the job on
 * (returns true) or settles it through sk_job_finish(), the job's only exit. */
#ifndef SK_JOB_STEPS_H
#define SK_JOB_STEPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <amqp.h>
#include <libpq-fe.h>

#include "envelope.h"
#include "lock.h"
#include "log.h"
#include "store.h"

struct sk_metrics_type;
struct sk_pipeline;

/* A job's states, in order. sk_job_transition() is the only way between
 * them: it asserts the move is legal, logs it and, in a fault build, is
 * where a test can kill the worker. Adding a state? Give it a name, a
 * failpoint (or NULL) and its legal predecessors in job.c. */
enum job_state {
    JOB_NEW,          /* delivered, not yet validated */
    JOB_RECEIVED,     /* validated: its key is known */
    JOB_LOCKED,       /* holds the resource's Redis lock */
    JOB_CLAIMED,      /* owns the key: row lock (transactional) or lease (external) */
    JOB_HANDLED,      /* the handler returned */
    JOB_COMMITTED,    /* the outcome is durable */
    JOB_ACKED,        /* the broker has our ack: the delivery is done with */
    JOB_HANDED_BACK,  /* requeued, rejected, or its ack lost: the broker decides */
    JOB_STATES
};

/* What happens to the delivery itself once the job's outcome is settled. */
enum disposition {
    ACK,          /* done with it: effect committed, duplicate, or a copy confirmed */
    REQUEUE,      /* back to the queue unchanged */
    DEAD_LETTER,  /* the broker moves it to <queue>.dead */
};

struct job {
    enum job_state         state;
    const amqp_envelope_t *delivery;
    struct sk_envelope env;
    uint64_t           delivery_tag;
    char               lock_key[SK_LOCK_KEY_MAX];
    char               lock_token[SK_LOCK_TOKEN_LEN + 1];
    bool               locked;
    struct sk_lock    *redis;       /* the connection that took the lock */
    bool               leased;      /* external mode: the heartbeat renews our lease */
    struct sk_claim    claim;
    struct sk_keyref   ref;         /* the key, for the store and the lease */
    uint64_t           claimed_ns;  /* CLOCK_MONOTONIC at the claim, for the duration */
    struct sk_metrics_type *metrics;
    struct sk_log_job  log;
    /* In a batch the exit is only decided by sk_job_finish(), and carried
     * out by sk_job_exit() once the whole batch is settled, in delivery
     * order: an ack covers every earlier delivery (a multiple-ack), so no
     * ack may leave before every job ahead of it is settled. */
    bool               deferred;
    bool               exit_decided;
    enum disposition   exit;
    char               outcome[256];
};

/* Validates the delivery and counts it; dead-letters what can never run. */
bool sk_job_admit(struct sk_pipeline *p, struct job *j);
/* Once locked: false, dead-lettered, for a job that killed max_crashes
 * workers. */
bool sk_job_survivable(struct sk_pipeline *p, struct job *j);
/* What a refused lock means (rc SK_BUSY or SK_AGAIN: the job is
 * re-scheduled); true for SK_OK. */
bool sk_job_lock_refused(struct sk_pipeline *p, struct job *j, int rc);
/* The job's own claim (its own transaction), then sk_job_claimed(). */
bool sk_job_claim(struct sk_pipeline *p, struct job *j);
/* What a claim's answer means for the job: true when it owns its key. */
bool sk_job_claimed(struct sk_pipeline *p, struct job *j, int rc, const struct sk_err *err);
/* Handler, completion and COMMIT of one claimed job, then its exit. */
void sk_job_run_transactional(struct sk_pipeline *p, struct job *j);
/* Runs the handler on pg with p->ctx, reset by the caller. */
int  sk_job_call_handler(struct sk_pipeline *p, struct job *j, PGconn *pg);
/* RETRY, FAIL or an invalid status, with the handler's error text and
 * whether it reported a conflict. Outside any job transaction. */
void sk_job_settle_failure(struct sk_pipeline *p, struct job *j, int status, const char *error,
                           bool conflict);
void sk_job_reply(struct sk_pipeline *p, struct job *j, const void *result, size_t len);
bool sk_job_later(struct sk_pipeline *p, struct job *j, uint32_t delay_ms,
                  uint32_t next_attempt, const char *error, const char *outcome);
void sk_job_transition(struct job *j, enum job_state to);
/* Back to before the claim, whose transaction was rolled back unseen. */
void sk_job_rewind(struct job *j);
/* The job's exit: at once, or for a deferred job only decided (SK_OK). */
int  sk_job_finish(struct sk_pipeline *p, struct job *j, enum disposition d, const char *outcome);
/* Carries an exit out: the ack or reject, the lock's release, the log line.
 * Returns the broker's answer, SK_OK or SK_AGAIN. */
int  sk_job_exit(struct sk_pipeline *p, struct job *j, enum disposition d, const char *outcome);

#endif
