/* ctl_trace.c - sekalictl trace KEY [--queue Q] [--json]: one job's story
 * in time order, from every place sekali leaves a trace of it:
 *
 *   PostgreSQL  its outbox rows, its idempotency row, its crash count and the
 *               dead-letter actions on it (sekali.trace(), sql/011_status.sql),
 *               its cancellation (sekali.trace_cancel(), sql/018_cancel.sql);
 *               its dead letters (sekali.dead_letters, sql/023);
 *   journald    the log lines sekali wrote with IDEMPOTENCY_KEY=KEY.
 *
 * Without --queue, every configured queue and every queue PostgreSQL knows
 * the key in. Exit codes: 0 found, 4 nothing anywhere, 1 a source could not
 * be read, 2 bad usage. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-journal.h>

#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_http.h"
#include "ctl_out.h"
#include "ctl_reports.h"
#include "pg.h"

#define JOURNAL_MAX 1000  /* log lines shown at most, the newest kept */

struct event {
    int64_t us;       /* Unix time in microseconds; INT64_MAX: unknown */
    int     seq;      /* order of events of the same instant */
    size_t  order;    /* insertion order, the last tie-break */
    bool    coarse;   /* known to the second only: sorted at its end */
    char   *queue;
    char   *source;
    char   *what;
    char   *detail;
};

struct trace {
    const char   *key;
    const char   *only_queue;
    bool          json;
    FILE         *out;      /* where the report goes */
    size_t        scan_max; /* unused: dead letters are read from PostgreSQL, whole */
    bool          partial;  /* always false, kept in the JSON for its readers */
    struct event *ev;
    size_t        n, cap;
    char        **queues;  /* where to look for dead letters */
    size_t        n_queues;
    bool          failed;
    char          journal_note[256];
    size_t        journal_lines;
    size_t        dead_letters;
};

static void trace_usage(FILE *out)
{
    fprintf(out, "usage: sekalictl trace KEY [--queue QUEUE] [--json]\n");
}

static void add_event(struct trace *t, int64_t us, int seq, const char *queue,
                      const char *source, const char *what, const char *detail)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 32;
        struct event *bigger = realloc(t->ev, cap * sizeof(*bigger));
        if (bigger == NULL)
            return;  /* out of memory: the event is left out, not the program */
        t->ev = bigger;
        t->cap = cap;
    }
    struct event *e = &t->ev[t->n];
    *e = (struct event){ .us = us, .seq = seq, .order = t->n, .queue = strdup(queue),
                         .source = strdup(source), .what = strdup(what),
                         .detail = strdup(detail) };
    if (e->queue == NULL || e->source == NULL || e->what == NULL || e->detail == NULL) {
        free(e->queue);
        free(e->source);
        free(e->what);
        free(e->detail);
        return;
    }
    t->n++;
}

static void add_queue(struct trace *t, const char *queue)
{
    for (size_t i = 0; i < t->n_queues; i++)
        if (strcmp(t->queues[i], queue) == 0)
            return;
    char **bigger = realloc(t->queues, (t->n_queues + 1) * sizeof(*bigger));
    if (bigger == NULL)
        return;
    t->queues = bigger;
    if ((t->queues[t->n_queues] = strdup(queue)) != NULL)
        t->n_queues++;
}

static int by_time(const void *a, const void *b)
{
    const struct event *x = a, *y = b;
    if (x->us != y->us)
        return x->us < y->us ? -1 : 1;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static void read_pg(struct trace *t, const struct sk_conf *conf)
{
    PGconn *pg = sk_ctl_pg_take(conf);
    if (pg == NULL) {
        t->failed = true;
        return;
    }
    const char *params[] = { t->key, t->only_queue };
    const struct sk_pg_stmt st = {
        .sql = "SELECT queue, (extract(epoch FROM at) * 1000000)::int8, "
               "seq, source, event, detail FROM (SELECT * FROM sekali.trace($1, $2) "
               "UNION ALL SELECT * FROM sekali.trace_cancel($1, $2)) AS e",
        .n_params = 2, .values = params, .what = "sekali.trace",
    };
    struct sk_err err = { 0 };
    PGresult *res;
    if (sk_pg_exec(pg, &st, &res, &err) != SK_OK) {
        fprintf(stderr, "sekalictl: %s\n", err.msg);
        t->failed = true;
    } else {
        for (int i = 0; i < PQntuples(res); i++) {
            add_queue(t, PQgetvalue(res, i, 0));
            add_event(t, atoll(PQgetvalue(res, i, 1)), atoi(PQgetvalue(res, i, 2)),
                      PQgetvalue(res, i, 0), PQgetvalue(res, i, 3), PQgetvalue(res, i, 4),
                      PQgetvalue(res, i, 5));
        }
    }
    PQclear(res);
    sk_ctl_pg_give(pg);
}

/* The key's dead letters in sekali.dead_letters, of the traced queues. A
 * read of the table: the broker's <queue>.dead, which a read would hand
 * back and a quorum queue's delivery limit would count, is never read. */
static void read_dead_letters(struct trace *t, const struct sk_conf *conf)
{
    PGconn *pg = sk_ctl_pg_take(conf);
    if (pg == NULL) {
        t->failed = true;
        return;
    }
    for (size_t i = 0; i < t->n_queues; i++) {
        const char *values[] = { t->queues[i], t->key };
        const struct sk_pg_stmt st = {
            .sql = "SELECT reason, coalesce(attempts::text, '?'), error, "
                   "(extract(epoch FROM failed_at) * 1000000)::bigint, id "
                   "FROM sekali.dead_letters WHERE queue = $1 AND key = $2 ORDER BY id",
            .n_params = 2, .values = values, .what = "reading dead letters",
        };
        PGresult *res;
        struct sk_err err = { 0 };
        if (sk_pg_exec(pg, &st, &res, &err) != SK_OK) {
            fprintf(stderr, "sekalictl: %s\n", err.msg);
            t->failed = true;
            break;
        }
        for (int r = 0; r < PQntuples(res); r++) {
            char detail[1200];
            const char *error = PQgetvalue(res, r, 2);
            snprintf(detail, sizeof(detail), "dead letter %s (sekalictl dlq show %s --id %s): "
                     "reason %s after %s attempt(s)%s%s", PQgetvalue(res, r, 4), t->queues[i],
                     PQgetvalue(res, r, 4), PQgetvalue(res, r, 0), PQgetvalue(res, r, 1),
                     error[0] != '\0' ? ", error: " : "", error);
            add_event(t, strtoll(PQgetvalue(res, r, 3), NULL, 10), 10, t->queues[i], "postgres",
                      "dead-lettered", detail);
            t->dead_letters++;
        }
        PQclear(res);
    }
    sk_ctl_pg_give(pg);
}

static void read_journal(struct trace *t)
{
    sd_journal *j = NULL;
    if (access("/var/log/journal", F_OK) != 0 && access("/run/log/journal", F_OK) != 0) {
        snprintf(t->journal_note, sizeof(t->journal_note), "no journal on this host");
        return;
    }
    int r = sd_journal_open(&j, SD_JOURNAL_LOCAL_ONLY);
    if (r < 0) {
        snprintf(t->journal_note, sizeof(t->journal_note), "cannot open the journal: %s",
                 strerror(-r));
        return;
    }
    char match[700];
    snprintf(match, sizeof(match), "IDEMPOTENCY_KEY=%s", t->key);
    sd_journal_add_match(j, match, 0);
    if (t->only_queue != NULL) {
        char q[700];
        snprintf(q, sizeof(q), "QUEUE=%s", t->only_queue);
        sd_journal_add_match(j, q, 0);  /* AND with the key: different fields */
    }
    /* The newest JOURNAL_MAX lines: read backwards from the tail. */
    sd_journal_seek_tail(j);
    while (t->journal_lines < JOURNAL_MAX && sd_journal_previous(j) > 0) {
        uint64_t us = 0;
        const void *data;
        size_t len;
        sd_journal_get_realtime_usec(j, &us);
        char msg[1024] = "", queue[300] = "";
        if (sd_journal_get_data(j, "MESSAGE", &data, &len) >= 0 && len > 8)
            snprintf(msg, sizeof(msg), "%.*s", (int)(len - 8), (const char *)data + 8);
        if (sd_journal_get_data(j, "QUEUE", &data, &len) >= 0 && len > 6)
            snprintf(queue, sizeof(queue), "%.*s", (int)(len - 6), (const char *)data + 6);
        add_event(t, (int64_t)us, 20, queue, "journal", "log", msg);
        t->journal_lines++;
    }
    sd_journal_close(j);
    if (t->journal_lines == 0)
        snprintf(t->journal_note, sizeof(t->journal_note),
                 "no journal entries with IDEMPOTENCY_KEY=this key");
    else
        snprintf(t->journal_note, sizeof(t->journal_note), "%zu journal entries%s",
                 t->journal_lines, t->journal_lines == JOURNAL_MAX ? " (the newest)" : "");
}

static void put_time(int64_t us, bool coarse, char *out, size_t size)
{
    if (us == INT64_MAX) {
        snprintf(out, size, "(time unknown)");
        return;
    }
    time_t s = (time_t)(us / 1000000);
    struct tm tm;
    gmtime_r(&s, &tm);
    char base[32];
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    if (coarse)
        snprintf(out, size, "%sZ", base);
    else
        snprintf(out, size, "%s.%03dZ", base, (int)(us % 1000000 / 1000));
}

static void print(const struct trace *t, int code)
{
    FILE *out = t->out;
    char when[64];
    if (t->json) {
        fprintf(out, "{\"key\":");
        sk_ctl_put_jstr(out, t->key);
        fprintf(out, ",\"queue\":");
        if (t->only_queue != NULL)
            sk_ctl_put_jstr(out, t->only_queue);
        else
            fprintf(out, "null");
        fprintf(out, ",\"events\":[");
        for (size_t i = 0; i < t->n; i++) {
            const struct event *e = &t->ev[i];
            put_time(e->us, e->coarse, when, sizeof(when));
            fprintf(out, "%s{\"time\":", i > 0 ? "," : "");
            if (e->us == INT64_MAX)
                fprintf(out, "null");
            else
                fprintf(out, "\"%s\"", when);
            fprintf(out, ",\"queue\":");
            sk_ctl_put_jstr(out, e->queue);
            fprintf(out, ",\"source\":");
            sk_ctl_put_jstr(out, e->source);
            fprintf(out, ",\"event\":");
            sk_ctl_put_jstr(out, e->what);
            fprintf(out, ",\"detail\":");
            sk_ctl_put_jstr(out, e->detail);
            fprintf(out, "}");
        }
        fprintf(out, "],\"dead_letters\":%zu,\"dead_letters_partial\":%s,\"journal\":",
                t->dead_letters, t->partial ? "true" : "false");
        sk_ctl_put_jstr(out, t->journal_note);
        fprintf(out, ",\"exit_code\":%d}\n", code);
        return;
    }
    if (t->n == 0) {
        fprintf(out, "nothing known of key ");
        sk_ctl_put_text(out, t->key, strlen(t->key), 0);
        fprintf(out, "%s (%s)\n", t->failed ? " in the sources that answered" : "", t->journal_note);
        return;
    }
    for (size_t i = 0; i < t->n; i++) {
        const struct event *e = &t->ev[i];
        put_time(e->us, e->coarse, when, sizeof(when));
        fprintf(out, "%-24s ", when);
        sk_ctl_put_text(out, e->queue, strlen(e->queue), 0);
        fprintf(out, " %-9s %-16s ", e->source, e->what);
        sk_ctl_put_text(out, e->detail, strlen(e->detail), 0);
        fprintf(out, "\n");
    }
    fprintf(out, "journal: %s\n", t->journal_note);
}

int sk_ctl_trace(const struct sk_conf *conf, int argc, char **argv)
{
    static const struct option options[] = { { "queue", required_argument, NULL, 'q' },
                                             { "json", no_argument, NULL, 'j' },
                                             { "help", no_argument, NULL, 'h' },
                                             { NULL, 0, NULL, 0 } };
    struct trace t = { 0 };
    int opt;
    while ((opt = getopt_long(argc, argv, "q:jh", options, NULL)) != -1) {
        switch (opt) {
        case 'q': t.only_queue = optarg; break;
        case 'j': t.json = true; break;
        case 'h': trace_usage(stdout); return SK_CTL_OK;
        default: trace_usage(stderr); return SK_CTL_USAGE;
        }
    }
    /* argv[0] is "trace"; getopt moved the operands to the end. */
    if (argc - optind != 1 || argv[optind][0] == '\0' ||
        (t.only_queue != NULL && t.only_queue[0] == '\0')) {
        trace_usage(stderr);
        return SK_CTL_USAGE;
    }
    return sk_ctl_trace_report(conf, argv[optind], t.only_queue, t.json, 0, stdout);
}

int sk_ctl_trace_report(const struct sk_conf *conf, const char *key, const char *queue,
                        bool json, size_t dead_scan_max, FILE *out)
{
    struct trace t = { .key = key, .only_queue = queue, .json = json, .out = out,
                       .scan_max = dead_scan_max };
    if (strlen(t.key) > SK_KEY_MAX) {
        fprintf(stderr, "sekalictl: a key is at most %d bytes; no job has this one\n",
                SK_KEY_MAX);
        return SK_CTL_USAGE;
    }
    if (t.only_queue != NULL) {
        add_queue(&t, t.only_queue);
    } else {
        for (size_t i = 0; i < conf->n_queues; i++)
            add_queue(&t, conf->queues[i].name);
    }
    read_pg(&t, conf);
    read_dead_letters(&t, conf);
    read_journal(&t);
    if (t.n > 1)  /* t.ev is NULL when nothing was found: qsort must not see it */
        qsort(t.ev, t.n, sizeof(*t.ev), by_time);
    int code = t.failed ? SK_CTL_FAILED : t.n == 0 ? SK_CTL_NOT_FOUND : SK_CTL_OK;
    print(&t, code);
    for (size_t i = 0; i < t.n; i++) {
        free(t.ev[i].queue);
        free(t.ev[i].source);
        free(t.ev[i].what);
        free(t.ev[i].detail);
    }
    free(t.ev);
    for (size_t i = 0; i < t.n_queues; i++)
        free(t.queues[i]);
    free(t.queues);
    return code;
}
