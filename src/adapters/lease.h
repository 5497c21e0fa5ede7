/* lease.h - external mode's ownership of a key: a lease in PostgreSQL.
 *
 * A handler in external mode acts outside the database, so no transaction
 * can hold the key while it runs. The claim instead commits `processing`
 * with a lease (measured by PostgreSQL's clock, never ours) and a fencing
 * token; every later write (renew, checkpoint, finish) states that fence and
 * is refused once someone took over. The SQL is sql/002_external_mode.sql.
 *
 * Every function runs one autocommit statement on a borrowed connection,
 * about the key ref names (under ref's fence, once claimed), and returns SK_OK, SK_BUSY (not ours: another owner, or fenced out), SK_DUP,
 * SK_AGAIN (connection lost) or SK_ERR, as documented per function. */
#ifndef SK_LEASE_H
#define SK_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "common.h"
#include "store.h"

#define SK_CHECKPOINTS_MAX 32

struct sk_checkpoint {
    char *name;
    char *value;
};

/* The recovery points earlier attempts left for a key. Owned: free the
 * strings with sk_lease_checkpoints_clear(). */
struct sk_checkpoints {
    struct sk_checkpoint items[SK_CHECKPOINTS_MAX];
    size_t               n;
};

/* SK_OK: ours under out->fence until the lease runs out; SK_BUSY: another
 * owner's lease still runs; SK_DUP: completed or failed before (counted). */
int sk_lease_claim(PGconn *pg, const struct sk_keyref *ref, uint32_t lease_ms,
                   struct sk_claim *out, struct sk_err *err);

/* SK_OK: extended; SK_BUSY: no longer ours. */
int sk_lease_renew(PGconn *pg, const struct sk_keyref *ref, uint32_t lease_ms,
                   struct sk_err *err);

/* Records the outcome ("completed" with result, or "failed" with error,
 * stored as sk_text_copy() makes it). SK_OK: recorded; SK_BUSY: fenced
 * out, nothing changed but the count; SK_AGAIN, SK_ERR as sk_pg_exec(). */
int sk_lease_finish(PGconn *pg, const struct sk_keyref *ref, const char *status,
                    const void *result, size_t result_len, const char *error,
                    struct sk_err *err);

/* Ends our lease at once (before a retry), if still ours. */
int sk_lease_release(PGconn *pg, const struct sk_keyref *ref, struct sk_err *err);

/* SK_OK: saved; SK_BUSY: fenced out, not saved. */
int sk_lease_save_checkpoint(PGconn *pg, const struct sk_keyref *ref, const char *name,
                             const char *value, struct sk_err *err);

/* Loads every checkpoint of the key into out (cleared first). */
int  sk_lease_load_checkpoints(PGconn *pg, const struct sk_keyref *ref,
                               struct sk_checkpoints *out, struct sk_err *err);
void sk_lease_checkpoints_clear(struct sk_checkpoints *c);

#endif
