/* sqlq.h - the statements a handler queued (host->queue_sql()) for its
 * transaction's COMMIT pipeline: copied, bounded, owned by the job until
 * its COMMIT says what becomes of them. */
#ifndef SK_SQLQ_H
#define SK_SQLQ_H

#include <stddef.h>

#include "pg.h"

#define SK_SQLQ_MAX_STATEMENTS 64          /* per job */
#define SK_SQLQ_MAX_BYTES      (256 * 1024) /* per job: texts and values */
#define SK_SQLQ_MAX_PARAMS     64          /* per statement */

/* One queued statement: a single allocation holding its text, its
 * parameters' pointers and their texts. */
struct sk_sqlq_stmt {
    const char  *sql;
    int          n_params;
    const char **values;   /* NULL entries are SQL NULLs */
};

struct sk_sqlq {
    struct sk_sqlq_stmt *st[SK_SQLQ_MAX_STATEMENTS];
    size_t               n;
    size_t               bytes;
};

/* Copies sql and its n_params text values (NULL: SQL NULL) onto q.
 * Returns 0, or -1 with why in why (why_size bytes) when a bound is
 * passed, an argument is bad or memory is short; q is unchanged then. */
int sk_sqlq_add(struct sk_sqlq *q, const char *sql, int n_params, const char *const *values,
                char *why, size_t why_size);

/* Writes q's statements as pipeline steps into out (room for q->n). */
void sk_sqlq_steps(const struct sk_sqlq *q, struct sk_pg_stmt *out);

/* Frees q's statements; q is empty and usable again. */
void sk_sqlq_clear(struct sk_sqlq *q);

#endif
