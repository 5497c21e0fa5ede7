/* history.c - the janitor's minute rows of sekali.history (sql/037): what
 * each queue completed, retried, dead-lettered and absorbed as duplicates,
 * for the console's charts beyond the five minutes its sampler keeps.
 *
 * The workers already count all of it in shared memory for /metrics, so a
 * job pays nothing more: each janitor round reads the totals, adds the
 * difference from the last round to the current minute's row (one
 * statement for every queue, by PostgreSQL's clock, so that hosts add up
 * in one row), and skips the statement when nothing happened. With the
 * default interval that is one INSERT a minute while jobs run. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "history.h"
#include "log.h"
#include "pg.h"

enum { COMPLETED, RETRIED, DEAD, DUPLICATES, FIGURES };

struct sk_history {
    const struct sk_conf  *conf;
    struct sk_metrics     *m;
    size_t                 n;
    uint64_t             (*last)[FIGURES];  /* per queue: totals written */
    struct sk_metrics_row *rows;            /* scratch: SK_METRICS_TYPES + 1 */
};

static void totals(struct sk_history *h, size_t q, uint64_t *out);
static bool fell(const uint64_t *now, const uint64_t *last);
static void put_array(FILE *f, struct sk_history *h, uint64_t (*now)[FIGURES], int figure);

struct sk_history *sk_history_new(const struct sk_conf *conf, struct sk_metrics *m, bool fresh)
{
    struct sk_history *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    h->conf = conf;
    h->m = m;
    h->n = conf->n_queues < sk_metrics_queues(m) ? conf->n_queues : sk_metrics_queues(m);
    h->last = calloc(h->n + 1, sizeof(*h->last));
    h->rows = calloc(SK_METRICS_TYPES + 1, sizeof(*h->rows));
    if (h->last == NULL || h->rows == NULL) {
        sk_history_free(h);
        return NULL;
    }
    for (size_t q = 0; q < h->n && !fresh; q++)
        totals(h, q, h->last[q]);
    return h;
}

void sk_history_free(struct sk_history *h)
{
    if (h == NULL)
        return;
    free(h->last);
    free(h->rows);
    free(h);
}

int sk_history_write(struct sk_history *h, PGconn *pg)
{
    uint64_t (*now)[FIGURES] = calloc(h->n + 1, sizeof(*now));
    if (now == NULL)
        return SK_AGAIN;
    bool any = false;
    for (size_t q = 0; q < h->n; q++) {
        totals(h, q, now[q]);
        /* Cannot happen today: counters only rise, and the area is this
         * janitor's generation's for the janitor's whole life (a reload
         * brings a new area and a new janitor, `fresh`). Should a later
         * change lower a total, the queue counts from zero again: its
         * totals are written whole, not as differences wrapped around
         * 2^64, which bigint refuses in this round and every later one.
         * Kept when the write fails, as the counts are. */
        if (fell(now[q], h->last[q]))
            memset(h->last[q], 0, sizeof(h->last[q]));
        for (int f = 0; f < FIGURES; f++)
            any |= now[q][f] != h->last[q][f];
    }
    if (!any) {
        free(now);
        return SK_OK;
    }
    /* Arrays as text literals: queue names are bounded by the config,
     * and quoted for an array literal by put_array(). */
    char *text[FIGURES + 1] = { 0 };
    size_t len;
    int rc = SK_AGAIN;
    for (int f = -1; f < FIGURES; f++) {
        FILE *out = open_memstream(&text[f + 1], &len);
        if (out == NULL)
            goto done;
        put_array(out, h, now, f);
        if (fclose(out) != 0)
            goto done;
    }
    const char *params[] = { text[0], text[1], text[2], text[3], text[4] };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.add_history($1::text[], $2::bigint[], $3::bigint[], "
               "$4::bigint[], $5::bigint[])",
        .n_params = 5, .values = params, .what = "sekali.add_history" };
    struct sk_err err = { 0 };
    rc = sk_pg_exec(pg, &st, NULL, &err);
    if (rc != SK_OK) {
        sk_log_warn("janitor: writing sekali.history failed: %s", err.msg);
        goto done;
    }
    memcpy(h->last, now, h->n * sizeof(*now));
done:
    for (int f = 0; f <= FIGURES; f++)
        free(text[f]);
    free(now);
    return rc;
}

/* A queue's totals over its job types, as the area holds them now. */
static void totals(struct sk_history *h, size_t q, uint64_t *out)
{
    memset(out, 0, FIGURES * sizeof(*out));
    size_t n = sk_metrics_read_types(h->m, q, h->rows);
    for (size_t i = 0; i < n; i++) {
        const struct sk_metrics_row *r = &h->rows[i];
        out[COMPLETED] += r->counter[SK_METRIC_COMPLETIONS];
        out[RETRIED] += r->counter[SK_METRIC_RETRIES];
        out[DUPLICATES] += r->counter[SK_METRIC_DUPLICATES];
        for (int d = 0; d < SK_METRICS_REASONS; d++)
            out[DEAD] += r->dead[d];
    }
}

/* Whether any of a queue's totals is below the one last written. */
static bool fell(const uint64_t *now, const uint64_t *last)
{
    for (int f = 0; f < FIGURES; f++)
        if (now[f] < last[f])
            return true;
    return false;
}

/* One array literal: the queues' names (figure -1) or one figure's
 * differences, for the queues where something happened. */
static void put_array(FILE *f, struct sk_history *h, uint64_t (*now)[FIGURES], int figure)
{
    bool first = true;
    fputc('{', f);
    for (size_t q = 0; q < h->n; q++) {
        if (memcmp(now[q], h->last[q], sizeof(now[q])) == 0)
            continue;
        fputs(first ? "" : ",", f);
        first = false;
        if (figure >= 0) {
            fprintf(f, "%" PRIu64, now[q][figure] - h->last[q][figure]);
            continue;
        }
        fputc('"', f);
        for (const char *c = h->conf->queues[q].name; *c != '\0'; c++) {
            if (*c == '"' || *c == '\\')
                fputc('\\', f);
            fputc(*c, f);
        }
        fputc('"', f);
    }
    fputc('}', f);
}
