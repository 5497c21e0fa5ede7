/* letter.h - a dead letter's row in sekali.dead_letters (sql/023), the
 * store of record for dead letters: what a worker writes before it acks a
 * job it will not run again. */
#ifndef SK_LETTER_H
#define SK_LETTER_H

#include <stddef.h>

#include "amqp_lib.h"
#include <libpq-fe.h>

#include "common.h"
#include "metrics.h"

struct sk_job;
struct sk_pipeline;

/* What the worker knows of a dead letter beyond its message. Borrowed
 * strings; NULL where unknown. */
struct sk_letter {
    const char *queue;
    const char *key;            /* NULL: none usable (malformed) */
    const char *job_id, *job_type;
    const char *resource_key;   /* NULL: the key is the resource */
    const char *reason;         /* the metric reason's name, e.g. retries_exhausted */
    const char *error;
    const char *malformed;      /* why it can never be replayed; NULL: it can */
    const char *owner;          /* the worker */
    const char *fence_text;     /* leased (external mode): fail under this fence */
    const char *first_failure;  /* x-sekali-first-failure, ISO 8601, or NULL/"" */
    int         attempts;       /* 0: unknown */
    size_t      body_max;       /* bytes of the body kept (a malformed one may be huge) */
};

/* Records the key failed and its dead letter in one transaction
 * (sekali.fail_dead): SK_OK, SK_BUSY when a leased job was fenced out
 * (nothing recorded), else SK_AGAIN or SK_ERR with nothing recorded.
 * Blocks for one round trip. */
int sk_letter_fail(PGconn *pg, const struct sk_letter *l, const amqp_envelope_t *delivery,
                   struct sk_err *err);

/* Records a dead letter whose key is not recorded failed (malformed,
 * beyond retention), in a statement of its own: SK_OK, else SK_AGAIN or
 * SK_ERR with nothing recorded. */
int sk_letter_record(PGconn *pg, const struct sk_letter *l, const amqp_envelope_t *delivery,
                     struct sk_err *err);

/* Copies len bytes of s into out (size > 0) as valid UTF-8 without NUL:
 * invalid bytes and NUL become U+FFFD, and a cut falls on a character's
 * boundary. Returns out. */
char *sk_letter_text(char *out, size_t size, const void *s, size_t len);

/* How a job becomes a dead letter. Each settles the job (sk_job_finish());
 * a round trip to PostgreSQL, and one to the broker for a copy. The worker
 * process's main thread only, outside any job transaction. */

/* Records the job's key failed with its letter, then acks; a PostgreSQL
 * down hands the job back, a refusal for good makes it unrecorded. */
void sk_letter_give_up(struct sk_pipeline *p, struct sk_job *j, enum sk_metrics_reason reason,
                       const char *why);
/* A letter whose key stays as it is (malformed when !parsed, beyond
 * retention, unrecorded): its row, else a copy to <queue>.dead, else the
 * broker's own dead-lettering. */
void sk_letter_dead(struct sk_pipeline *p, struct sk_job *j, bool parsed,
                    enum sk_metrics_reason reason, const char *why);
/* An outcome (`what`: "its completion", "its failure") that PostgreSQL
 * refused for good: dead-lettered as unrecorded, saying why. */
void sk_letter_unrecorded(struct sk_pipeline *p, struct sk_job *j, const char *what,
                          const char *why, const struct sk_err *refusal);

#endif
