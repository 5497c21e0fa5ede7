/* ctl_scheduled.c - sekalictl scheduled [--queue Q] [--limit N] [--json]:
 * the jobs enqueued for later (sekali.enqueue's run_at), soonest first,
 * as they wait in the outbox for the relay. One page from the relay's own
 * index (outbox_due: unpublished rows by run_at), so its cost is the page,
 * never the history; how many more wait is not counted, for that reason.
 * Keys and job types come from producers: the text form escapes them and
 * the JSON form is sk_ctl_put_jstr()'s. */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_out.h"
#include "ctl_reports.h"
#include "pg.h"

#define LIMIT_DEFAULT 50

enum { COL_ID, COL_QUEUE, COL_KEY, COL_TYPE, COL_RUN_AT, COL_IN, COL_NOW };

int sk_ctl_scheduled(const struct sk_conf *conf, int argc, char **argv)
{
    static const struct option options[] = {
        { "queue", required_argument, NULL, 'q' },
        { "limit", required_argument, NULL, 'l' },
        { "json", no_argument, NULL, 'j' },
        { NULL, 0, NULL, 0 },
    };
    const char *queue = NULL;
    size_t limit = LIMIT_DEFAULT;
    bool json = false;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'q': queue = optarg; break;
        case 'l': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*end != '\0' || optarg[0] == '-' || v == 0 || v > SK_CTL_SCHEDULED_MAX) {
                fprintf(stderr, "sekalictl: scheduled: --limit takes 1 to %d\n",
                        SK_CTL_SCHEDULED_MAX);
                return SK_CTL_USAGE;
            }
            limit = v;
            break;
        }
        case 'j': json = true; break;
        default: return SK_CTL_USAGE;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "usage: sekalictl scheduled [--queue QUEUE] [--limit N] [--json]\n");
        return SK_CTL_USAGE;
    }
    return sk_ctl_scheduled_report(conf, queue, limit, json, stdout);
}

static void print_json(FILE *out, PGresult *res, const char *queue, size_t limit)
{
    int rows = PQntuples(res);
    fputs("{\"queue\":", out);
    if (queue != NULL)
        sk_ctl_put_jstr(out, queue);
    else
        fputs("null", out);
    fprintf(out, ",\"limit\":%zu,\"now\":", limit);
    sk_ctl_put_jstr(out, PQgetvalue(res, 0, COL_NOW));
    fputs(",\"scheduled\":[", out);
    for (int r = 0; r < rows; r++) {
        if (PQgetisnull(res, r, COL_ID))
            continue;  /* the one row of an empty outbox (the join) */
        fprintf(out, "%s{\"id\":%s,\"queue\":", r > 0 ? "," : "", PQgetvalue(res, r, COL_ID));
        sk_ctl_put_jstr(out, PQgetvalue(res, r, COL_QUEUE));
        fputs(",\"key\":", out);
        sk_ctl_put_jstr(out, PQgetvalue(res, r, COL_KEY));
        fputs(",\"job_type\":", out);
        sk_ctl_put_jstr(out, PQgetvalue(res, r, COL_TYPE));
        fprintf(out, ",\"run_at\":\"%s\",\"in_seconds\":%s}", PQgetvalue(res, r, COL_RUN_AT),
                PQgetvalue(res, r, COL_IN));
    }
    fputs("]}\n", out);
}

static void print_text(FILE *out, PGresult *res)
{
    int rows = PQntuples(res), shown = 0;
    for (int r = 0; r < rows; r++) {
        if (PQgetisnull(res, r, COL_ID))
            continue;
        fprintf(out, "%s  in %6ss  ", PQgetvalue(res, r, COL_RUN_AT), PQgetvalue(res, r, COL_IN));
        sk_ctl_put_tstr(out, PQgetvalue(res, r, COL_QUEUE));
        fputs("  ", out);
        sk_ctl_put_text(out, PQgetvalue(res, r, COL_KEY), strlen(PQgetvalue(res, r, COL_KEY)),
                        120);
        fputs("  ", out);
        sk_ctl_put_tstr(out, PQgetvalue(res, r, COL_TYPE));
        fputc('\n', out);
        shown++;
    }
    if (shown == 0)
        fprintf(out, "no job is scheduled for later (PostgreSQL's clock: %s)\n",
                PQgetvalue(res, 0, COL_NOW));
}

int sk_ctl_scheduled_report(const struct sk_conf *conf, const char *queue, size_t limit,
                            bool json, FILE *out)
{
    PGconn *pg = sk_ctl_pg_take(conf);
    if (pg == NULL)
        return SK_CTL_FAILED;
    char limit_text[24];
    snprintf(limit_text, sizeof(limit_text), "%zu", limit);
    const char *values[] = { queue, limit_text };
    /* The left join keeps one row, with now(), when nothing waits. */
    const struct sk_pg_stmt st = {
        .sql = "SELECT o.id, o.queue, o.idempotency_key, o.job_type, "
               "to_char(o.run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "
               "ceil(extract(epoch FROM o.run_at - now()))::int8, "
               "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
               "FROM (SELECT 1) one LEFT JOIN LATERAL ("
               "  SELECT id, queue, idempotency_key, job_type, run_at FROM sekali.outbox "
               "   WHERE published_at IS NULL AND run_at > now() "
               "     AND ($1::text IS NULL OR queue = $1) "
               "   ORDER BY run_at, id LIMIT $2::int) o ON true "
               "ORDER BY o.run_at, o.id",
        .n_params = 2,
        .values = values,
        .what = "the scheduled jobs (sekali.outbox)",
    };
    PGresult *res;
    if (!sk_ctl_pg_exec(pg, &st, &res)) {
        sk_ctl_pg_give(pg);
        return SK_CTL_FAILED;
    }
    if (json)
        print_json(out, res, queue, limit);
    else
        print_text(out, res);
    PQclear(res);
    sk_ctl_pg_give(pg);
    return SK_CTL_OK;
}
