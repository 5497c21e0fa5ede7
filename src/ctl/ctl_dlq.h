/* ctl_dlq.h - what the parts of sekalictl dlq share: the command's state
 * (ctl_dlq.c runs the commands), the selection and printing of letters
 * from sekali.dead_letters (ctl_dlq_read.c), and the import of the letters
 * a broker's <queue>.dead holds (ctl_dlq_import.c). */
#ifndef SK_CTL_DLQ_H
#define SK_CTL_DLQ_H

#include <stdbool.h>
#include <stdio.h>

#include <libpq-fe.h>

#include "common.h"
#include "config.h"
#include "ctl_reports.h"

#define SK_DLQ_GROUPS_MAX 200   /* groups listed; the rest are counted as "other" */

/* One dead letter's row; its strings point into the result it came from
 * (NULL where the column is NULL). */
struct sk_dlq_letter {
    const char *id, *key, *job_id, *job_type, *reason, *error, *malformed, *first, *last;
    const char *recorded_by, *origin, *status, *fingerprint, *host, *worker;
    long        body_size, attempts, key_attempts, crashes, replays;  /* -1: unknown */
    bool        truncated;
};

struct sk_dlq {
    const struct sk_conf        *conf;
    const struct sk_ctl_dlq_req *req;
    const char                  *queue;
    char                         dead[600];   /* <queue>.dead, for import and the mirror */
    PGconn                      *pg;
    FILE                        *out;
    bool                         json, first_item, more;
    char                         actor[256], os_user[256];
    long                         depth;       /* letters of the queue; -1: not counted */
    long                         matched, done, already, refused;  /* matched -1: not counted */
    long                         groups, other, last_id, shown;
    bool                        *key_seen;    /* replay: which --key found a letter */
    struct sk_err                err;
};

/* The columns every read selects, and the row they make (ctl_dlq_read.c). */
extern const char sk_dlq_columns[];
void sk_dlq_letter_of(PGresult *res, int row, struct sk_dlq_letter *l);
bool sk_dlq_replayable(const struct sk_dlq_letter *l);

/* The WHERE clause of the request's selectors over sekali.dead_letters d,
 * with its parameters ($1 is the queue). sk_dlq_where() fills it (false:
 * out of memory); sk_dlq_where_free() frees it. */
struct sk_dlq_where {
    char        sql[512];
    const char *values[8];
    int         n;
    char       *keys;          /* the text[] literal of --key */
    char        reason[128];
};
bool sk_dlq_where(const struct sk_dlq *d, struct sk_dlq_where *w);
void sk_dlq_where_free(struct sk_dlq_where *w);

/* The reads: SK_OK or SK_ERR with d->err. */
int sk_dlq_list(struct sk_dlq *d);
int sk_dlq_show(struct sk_dlq *d);
int sk_dlq_groups(struct sk_dlq *d);
int sk_dlq_import(struct sk_dlq *d);

/* One result line (or JSON object) of replay, purge or import. */
void sk_dlq_result(struct sk_dlq *d, const char *key, const char *id, const char *reason,
                   const char *outcome, const char *new_job_id, const char *detail);

/* JSON bits. */
void sk_dlq_json_item(struct sk_dlq *d);
void sk_dlq_json_null_or(FILE *f, const char *name, const char *s);

#endif
