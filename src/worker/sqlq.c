/* sqlq.c - the statements a handler queued for its COMMIT's pipeline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sqlq.h"

int sk_sqlq_add(struct sk_sqlq *q, const char *sql, int n_params, const char *const *values,
                char *why, size_t why_size)
{
    if (sql == NULL || n_params < 0 || n_params > SK_SQLQ_MAX_PARAMS ||
        (n_params > 0 && values == NULL)) {
        snprintf(why, why_size, "queue_sql(): no statement, or %d parameters (0 to %d)",
                 n_params, SK_SQLQ_MAX_PARAMS);
        return -1;
    }
    if (q->n == SK_SQLQ_MAX_STATEMENTS) {
        snprintf(why, why_size, "queue_sql(): more than %d statements for one job",
                 SK_SQLQ_MAX_STATEMENTS);
        return -1;
    }
    size_t text = strlen(sql) + 1;
    for (int i = 0; i < n_params; i++)
        text += values[i] != NULL ? strlen(values[i]) + 1 : 0;
    if (text > SK_SQLQ_MAX_BYTES - q->bytes) {
        snprintf(why, why_size, "queue_sql(): more than %d bytes queued for one job",
                 SK_SQLQ_MAX_BYTES);
        return -1;
    }
    size_t head = sizeof(struct sk_sqlq_stmt) + (size_t)n_params * sizeof(char *);
    struct sk_sqlq_stmt *st = malloc(head + text);
    if (st == NULL) {
        snprintf(why, why_size, "queue_sql(): out of memory");
        return -1;
    }
    st->values = (const char **)(st + 1);
    st->n_params = n_params;
    char *at = (char *)st + head;
    st->sql = memcpy(at, sql, strlen(sql) + 1);
    at += strlen(sql) + 1;
    for (int i = 0; i < n_params; i++) {
        st->values[i] = NULL;
        if (values[i] == NULL)
            continue;
        size_t len = strlen(values[i]) + 1;
        st->values[i] = memcpy(at, values[i], len);
        at += len;
    }
    q->st[q->n++] = st;
    q->bytes += text;
    return 0;
}

void sk_sqlq_steps(const struct sk_sqlq *q, struct sk_pg_stmt *out)
{
    for (size_t i = 0; i < q->n; i++)
        out[i] = (struct sk_pg_stmt){ .sql = q->st[i]->sql, .n_params = q->st[i]->n_params,
                                      .values = q->st[i]->values,
                                      .what = "a statement the handler queued" };
}

void sk_sqlq_clear(struct sk_sqlq *q)
{
    for (size_t i = 0; i < q->n; i++)
        free(q->st[i]);
    q->n = 0;
    q->bytes = 0;
}
