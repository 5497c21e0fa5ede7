/* console_history.c - GET /api/history?queue=Q&hours=H: a queue's outcomes
 * over the last H hours (1 to 168, default 24) from sekali.history
 * (sql/037, written by sekalid's janitor), where the overview's charts
 * (console_rates.c) keep only five minutes in memory. At most 360 points:
 * the minutes are summed into steps of H/6 minutes (one minute up to six
 * hours). The read is a range of the table's primary key (queue, minute),
 * so it costs the minutes asked for, however long the table. PostgreSQL
 * writes the JSON, so the queue's name is escaped by json_build_object. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console.h"
#include "ctl_common.h"

#define HOURS_DEFAULT 24
#define HOURS_MAX     168
#define POINTS_MAX    360

static const char SQL[] =
    "SELECT json_build_object("
    "  'queue', $1::text, 'hours', $2::int, 'step_minutes', $3::int,"
    "  'now', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),"
    "  'points', coalesce((SELECT json_agg(json_build_object("
    "      't', to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI\"Z\"'),"
    "      'completed', c, 'retried', r, 'dead_lettered', d, 'duplicates', u) ORDER BY t)"
    "    FROM (SELECT to_timestamp(floor(extract(epoch FROM minute) / ($3 * 60)) * ($3 * 60))"
    "                 AS t, sum(completed) AS c, sum(retried) AS r,"
    "                 sum(dead_lettered) AS d, sum(duplicates) AS u"
    "            FROM sekali.history"
    "           WHERE queue = $1 AND minute >= now() - make_interval(hours => $2)"
    "           GROUP BY 1) AS steps), '[]'::json))::text";

void sk_console_history(struct sk_console_call *c)
{
    const char *queue = sk_console_arg(c, "queue"), *hours_arg = sk_console_arg(c, "hours");
    if (queue == NULL || sk_conf_queue(c->con->conf, queue) == NULL)
        return sk_console_fail(c, 400, "queue: not a queue of this configuration");
    long hours = HOURS_DEFAULT;
    if (hours_arg != NULL && hours_arg[0] != '\0') {
        char *end;
        errno = 0;
        hours = strtol(hours_arg, &end, 10);
        if (errno != 0 || *end != '\0' || hours < 1 || hours > HOURS_MAX)
            return sk_console_fail(c, 400, "hours: a whole number from 1 to 168");
    }
    long step = (hours * 60 + POINTS_MAX - 1) / POINTS_MAX;
    char hours_text[16], step_text[16];
    snprintf(hours_text, sizeof(hours_text), "%ld", hours);
    snprintf(step_text, sizeof(step_text), "%ld", step);
    const char *params[] = { queue, hours_text, step_text };
    const struct sk_pg_stmt st = { .sql = SQL, .n_params = 3, .values = params,
                                   .one_row = true, .what = "reading sekali.history" };
    PGconn *pg = sk_ctl_pg_take(c->con->conf);
    PGresult *res = NULL;
    if (pg == NULL || !sk_ctl_pg_exec(pg, &st, &res)) {
        sk_ctl_pg_give(pg);
        return sk_console_fail(c, 502, "PostgreSQL could not be reached or refused (the "
                               "console's log says why; sekali.history is sql/037)");
    }
    size_t len = (size_t)PQgetlength(res, 0, 0);
    char *doc = malloc(len + 1);
    if (doc != NULL)
        memcpy(doc, PQgetvalue(res, 0, 0), len + 1);
    PQclear(res);
    sk_ctl_pg_give(pg);
    if (doc == NULL)
        return sk_console_fail(c, 500, "out of memory");
    sk_console_json(c, 200, doc, len);
}
