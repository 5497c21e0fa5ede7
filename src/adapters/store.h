/* store.h - the idempotency store in PostgreSQL (libpq).
 *
 * One struct sk_store is one connection, owned by one thread. The job's
 * transaction runs on it: sk_store_claim() opens it and writes the key's row
 * completed (locked, and true only if the transaction commits), the handler
 * writes its effect on sk_store_conn(), and sk_store_complete() commits, all
 * or nothing. */
#ifndef SK_STORE_H
#define SK_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "common.h"
#include "pg.h"

struct sk_store;

/* Which job's key a store or lease call is about. The strings are borrowed
 * from the caller for the call. fence is what the claim returned and
 * fence_text its decimal form, written once by sk_keyref_set_fence() for
 * every statement that states the fence; both are empty (0, "") before the
 * claim, when only the calls that take no fence may be made. */
struct sk_keyref {
    const char *queue;
    const char *key;
    const char *owner;     /* the claiming worker's name */
    const char *job_id;
    const char *job_type;
    int64_t     fence;
    char        fence_text[24];
};

void sk_keyref_set_fence(struct sk_keyref *ref, int64_t fence);

/* Whether the job may hold a dedupe key of the outbox (sekali.enqueue()):
 * its key's row must then be written completed only with its COMMIT,
 * since that write releases the dedupe key (sql/004, 014), and a release
 * written at the claim would keep the producers of that key waiting on the
 * row for as long as the job runs. */
bool sk_keyref_may_hold_dedupe(const struct sk_keyref *ref);

struct sk_claim {
    int64_t fence;
    int     attempts;
    bool    cancelled;  /* SK_DUP (or dup[i]) because the key was cancelled */
};

/* Connects and prepares the statements. SK_OK, SK_AGAIN (unreachable), or
 * SK_ERR (authentication or schema missing: run sekalictl migrate). */
int  sk_store_open(struct sk_store **out, const struct sk_postgres_conf *conf,
                   const char *application_name, struct sk_err *err);
void sk_store_close(struct sk_store *s);

/* Connects again if the connection was lost. SK_OK, SK_AGAIN or SK_ERR. */
int sk_store_reconnect(struct sk_store *s, struct sk_err *err);

/* Borrowed: the connection the job's transaction runs on. */
PGconn *sk_store_conn(struct sk_store *s);

/* BEGIN and claim (queue, key) in one round trip, the row written completed
 * (sekali.claim_completed, sql/017): the transaction must commit only if
 * the job succeeded, and is rolled back otherwise. (A job from the outbox,
 * which may hold a dedupe key, is claimed processing by sekali.claim() and
 * completed by sk_store_complete().) Returns SK_OK with the
 * transaction open and the row locked; SK_DUP when the key already completed
 * or failed (the duplicate is counted and the transaction committed); SK_BUSY
 * when another transaction held the key past postgres.lock_timeout; SK_AGAIN
 * when the connection failed (the caller must not ack); SK_ERR otherwise.
 * Blocks while another transaction holds the same key, up to lock_timeout. */
int sk_store_claim(struct sk_store *s, const struct sk_keyref *ref, struct sk_claim *out,
                   struct sk_err *err);

/* After sk_store_claim(): saves result (if result_len > 0) under ref's fence
 * (or, for a job claimed processing, marks the key completed) and COMMITs,
 * in one round trip. SK_OK once committed; SK_ERR when the transaction could
 * not commit (the handler left it failed, or the fence was lost) and was
 * rolled back; SK_AGAIN when the connection failed and the outcome is unknown
 * (the caller must not ack: a redelivery's claim finds out). */
int sk_store_complete(struct sk_store *s, const struct sk_keyref *ref, const void *result,
                      size_t result_len, struct sk_err *err);

/* Batch mode (see batch.c): n jobs in one transaction.
 *
 * sk_store_claim_many() is BEGIN and sekali.claim_many() in one round trip:
 * each key claimed as sk_store_claim() would, the transaction left open.
 * SK_OK with out[i] and dup[i] (true: the key was finished before, its
 * duplicate counted in this transaction) for each ref; otherwise nothing is
 * claimed and the transaction is rolled back: SK_BUSY (a key was held past
 * lock_timeout), SK_AGAIN or SK_ERR as for sk_store_claim(). */
int sk_store_claim_many(struct sk_store *s, const struct sk_keyref *refs, size_t n,
                        struct sk_claim *out, bool *dup, struct sk_err *err);

/* sk_store_claim_many() for a transaction that commits only if every job
 * in it succeeds (batch.c's fast path): the claimed keys' rows are written
 * completed at once (sekali.claim_completing, sql/016), so no completion
 * follows; a failure must roll the whole transaction back. Same codes. */
int sk_store_claim_completing(struct sk_store *s, const struct sk_keyref *refs, size_t n,
                              struct sk_claim *out, bool *dup, struct sk_err *err);

/* Opens the savepoint one job's handler runs in; first: the batch's first
 * (otherwise the previous job's is released in the same round trip). */
int sk_store_savepoint(struct sk_store *s, bool first, struct sk_err *err);

/* Rolls back to the job's savepoint and undoes its claim (sekali.unclaim),
 * in one round trip; the rest of the batch stays. SK_OK, SK_AGAIN, SK_ERR. */
int sk_store_rollback_job(struct sk_store *s, const struct sk_keyref *ref, struct sk_err *err);

/* The next sk_store_complete(), sk_store_complete_many() or
 * sk_store_commit_results() sends these n statements (their results
 * unread) before its completions, in the same pipeline and round trip; a
 * failing one rolls the transaction back (SK_ERR). Borrowed until that
 * call returns; forgotten by it or by sk_store_rollback(). */
void sk_store_send_first(struct sk_store *s, const struct sk_pg_stmt *steps, size_t n);

/* Marks the n keys completed, each with its result, and COMMITs, in one
 * round trip: sk_store_complete() for a batch, with its codes. A batch
 * closed early (span.c) first gives back the n_back keys (back[0..n_back),
 * claimed in this transaction by either claim above) whose handlers did not
 * run, in the same round trip (sekali.unclaim_many, sql/021), so that the
 * COMMIT makes only the others true; back may be NULL when n_back is 0. */
int sk_store_complete_many(struct sk_store *s, const struct sk_keyref *const *refs,
                           const void *const *results, const size_t *result_lens, size_t n,
                           const struct sk_keyref *back, size_t n_back, struct sk_err *err);

/* After sk_store_claim_completing(): sets the n results (only jobs that
 * have one), gives back the n_back keys as sk_store_complete_many() does,
 * and COMMITs, in one round trip, with sk_store_complete()'s codes. */
int sk_store_commit_results(struct sk_store *s, const struct sk_keyref *const *refs,
                            const void *const *results, const size_t *result_lens, size_t n,
                            const struct sk_keyref *back, size_t n_back, struct sk_err *err);

/* The least of the connection's last round trips (the claims, the COMMITs,
 * the preparing at connect), in ns: what one more round trip to this
 * PostgreSQL costs now; 0 before the first. A lock wait or a slow COMMIT
 * among them does not raise it; a server that stays slow does, within a
 * few transactions. The store's thread only; does not block. */
uint64_t sk_store_rtt_ns(const struct sk_store *s);

/* Rolls back the job's transaction. SK_OK, SK_AGAIN (connection lost: the
 * server rolled it back) or SK_ERR. */
int sk_store_rollback(struct sk_store *s, struct sk_err *err);

/* Records the key as failed with `error` in its own transaction (after a
 * rollback). A completed key stays completed. The error is stored as
 * sk_text_copy() makes it (valid UTF-8, at most SK_TEXT_ERROR_MAX bytes).
 * SK_OK, SK_AGAIN or SK_ERR (sk_pg_refused_for_good() tells whether sending
 * it again could help). */
int sk_store_fail(struct sk_store *s, const struct sk_keyref *ref, const char *error,
                  struct sk_err *err);

/* Counts a crash of (queue, key): its worker died while running it. In a
 * transaction of its own, outside any job. *crashes gets the new count.
 * SK_OK, SK_AGAIN or SK_ERR. */
int sk_store_record_crash(struct sk_store *s, const char *queue, const char *key, int *crashes,
                          struct sk_err *err);

/* How many crashes are recorded for ref's key; 0 when none, and when the
 * key is finished (completed, failed or cancelled: a copy of it is a
 * duplicate, to be acked as such, not dead-lettered). Outside any job transaction. SK_OK,
 * SK_AGAIN or SK_ERR. */
int sk_store_crashes(struct sk_store *s, const struct sk_keyref *ref, int *crashes,
                     struct sk_err *err);

/* For a reply: whether ref's key was already replied to (or has nothing
 * to reply: it failed), and its saved result (a new buffer the caller frees;
 * NULL when there is none). Runs outside any job transaction. SK_OK,
 * SK_AGAIN or SK_ERR. */
int sk_store_reply_state(struct sk_store *s, const struct sk_keyref *ref, bool *replied,
                         char **result, size_t *result_len, struct sk_err *err);

/* After a job's commit was refused or its outcome fenced out: whether
 * ref's key was cancelled (sql/018), in which case its row is now written
 * cancelled, in a transaction of its own. SK_OK, SK_AGAIN or SK_ERR. */
int sk_store_settle_cancelled(struct sk_store *s, const struct sk_keyref *ref, bool *cancelled,
                              struct sk_err *err);

/* Whether (queue, key) has been cancelled (host->cancelled()), asked on pg:
 * the job's transaction or the worker's idle connection. Does not change
 * the transaction's state unless the query fails. SK_OK, SK_AGAIN, SK_ERR. */
int sk_store_is_cancelled(PGconn *pg, const char *queue, const char *key, bool *cancelled,
                          struct sk_err *err);

/* Records that the reply went out (after the broker confirmed it). */
int sk_store_mark_replied(struct sk_store *s, const struct sk_keyref *ref, struct sk_err *err);

/* Counts one more duplicate delivery of each of the n keys (of one queue)
 * in a transaction of its own, as a batch's claim counts them: for the
 * duplicates whose count a rolled-back batch took with it. Outside any
 * transaction; blocks one round trip. */
int sk_store_count_duplicates(struct sk_store *s, const struct sk_keyref *const *refs, size_t n,
                              struct sk_err *err);

#endif
