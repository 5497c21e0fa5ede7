/* ctl_status.c - sekalictl status: is sekalid running, and how is each of
 * its queues doing, from the three places that know:
 *
 *   the broker     ready messages and consumers of the queue, of its delay
 *                  queues and of <queue>.dead (passive queue.declare: it
 *                  creates nothing; AMQP does not report unacked messages);
 *   PostgreSQL     keys processing and failed, the oldest processing key,
 *                  the outbox rows waiting for the queue
 *                  (sekali.queue_status(), sql/011_status.sql), and whether
 *                  the queue is paused (sekali.queue_pauses, sql/019);
 *   sekalid        workers up and the relays' and janitor's last rounds,
 *                  which live in the supervisor's shared memory and are
 *                  read through its /metrics endpoint when metrics.listen
 *                  is set.
 *
 * A paused queue without consumers is as it should be, not unhealthy.
 *
 * Exit codes: 0 every queue has a consumer (or is paused) and sekalid answers; 5
 * (SK_CTL_UNHEALTHY) sekalid is not running or a queue has no consumer; 1 a
 * source could not be read (and nothing unhealthy was seen). */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker.h"
#include "ctl_commands.h"
#include "ctl_reports.h"
#include "ctl_common.h"
#include "ctl_delays.h"
#include "ctl_http.h"
#include "ctl_out.h"
#include "pg.h"

#define SCRAPE_TIMEOUT_MS 3000

/* One queue's figures; a figure whose source failed is marked unknown. */
struct qstat {
    const struct sk_queue_conf *conf;
    bool     broker_ok, exists;
    uint32_t ready, consumers, dead, delayed, delay_queues;
    struct sk_ctl_delays delays;  /* per bucket; delayed and delay_queues sum it */
    bool     dead_exists;
    long long dead_letters;   /* rows of sekali.dead_letters: the record */
    bool     up_known;
    double   up;
    bool     pg_ok, oldest_known;
    long long processing, failed, outbox_pending, outbox_refused;
    double   oldest_s, outbox_lag_s;
    bool     paused;
    double   paused_s;
    char     pause_reason[1001], paused_by[256];
    double   blocked;       /* workers whose handler cannot run (0 if unknown) */
    char     blocked_why[512]; /* sekalid's /readyz line for the queue, or "" */
    char     problem[640];  /* "" when healthy */
};

struct status {
    const struct sk_conf *conf;
    bool          json;
    FILE         *out;              /* where the report goes */
    struct qstat *q;
    char         *metrics;          /* the scraped text; NULL if none */
    char          metrics_why[300]; /* why there is none */
    char          broker_why[300], pg_why[300];
    char          pg_clear[300];    /* set when PostgreSQL is remote and not TLS */
    int           running;          /* 1 yes, 0 no, -1 unknown */
    double        now;
};

static void read_broker(struct status *s);
static void read_pg(struct status *s);
static void read_metrics(struct status *s);
static void read_blocked_why(struct status *s);
static void read_pause(PGconn *pg, struct qstat *q);
static void print_queue_text(const struct status *s, const struct qstat *q);
static void print_text(const struct status *s);
static void print_json(const struct status *s, int code);
static void json_queue(FILE *out, const struct qstat *q);
static void put_text_or_null(FILE *out, const char *text);
static int judge(struct status *s);

static void status_usage(FILE *out)
{
    fprintf(out, "usage: sekalictl status [--json]\n");
}

int sk_ctl_status(const struct sk_conf *conf, int argc, char **argv)
{
    static const struct option options[] = { { "json", no_argument, NULL, 'j' },
                                             { "help", no_argument, NULL, 'h' },
                                             { NULL, 0, NULL, 0 } };
    bool json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "jh", options, NULL)) != -1) {
        switch (opt) {
        case 'j': json = true; break;
        case 'h': status_usage(stdout); return SK_CTL_OK;
        default: status_usage(stderr); return SK_CTL_USAGE;
        }
    }
    if (optind != argc) {
        status_usage(stderr);
        return SK_CTL_USAGE;
    }
    return sk_ctl_status_report(conf, json, stdout);
}

int sk_ctl_status_report(const struct sk_conf *conf, bool json, FILE *out)
{
    struct status s = { .conf = conf, .running = -1, .json = json, .out = out };
    s.q = calloc(conf->n_queues, sizeof(*s.q));
    if (s.q == NULL) {
        fprintf(stderr, "sekalictl: out of memory\n");
        return SK_CTL_FAILED;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s.now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    for (size_t i = 0; i < conf->n_queues; i++)
        s.q[i].conf = &conf->queues[i];

    read_metrics(&s);
    read_broker(&s);
    read_pg(&s);
    int code = judge(&s);
    if (s.json)
        print_json(&s, code);
    else
        print_text(&s);
    free(s.metrics);
    free(s.q);
    return code;
}

/* The exit code from what was read, naming each queue's problem on the way:
 * unhealthy when sekalid or a queue's consumers are missing, failed when
 * something could not be read. */
static int judge(struct status *s)
{
    /* Without an endpoint, consumers on the queues are the sign of life. */
    if (s->conf->metrics.listen_host != NULL) {
        s->running = s->metrics != NULL;
    } else if (s->broker_why[0] == '\0') {
        s->running = 0;
        /* A paused queue has no consumer while sekalid runs: then no sign. */
        for (size_t i = 0; i < s->conf->n_queues; i++)
            if (s->q[i].paused && s->running == 0)
                s->running = -1;
        for (size_t i = 0; i < s->conf->n_queues; i++)
            if (s->q[i].consumers > 0)
                s->running = 1;
    }
    bool unhealthy = s->running == 0, failed = s->running == -1;
    for (size_t i = 0; i < s->conf->n_queues; i++) {
        struct qstat *q = &s->q[i];
        if (!q->broker_ok)
            failed = true;
        else if (!q->exists)
            snprintf(q->problem, sizeof(q->problem), "the queue does not exist");
        else if (q->blocked > 0 && q->blocked_why[0] != '\0')
            snprintf(q->problem, sizeof(q->problem), "%s", q->blocked_why);
        else if (q->blocked > 0)
            snprintf(q->problem, sizeof(q->problem), "the handler cannot run on %.0f of %d "
                     "workers (sekalid's log says why: event handler_not_ready)", q->blocked,
                     q->conf->workers);
        else if (q->consumers == 0 && !q->paused)
            snprintf(q->problem, sizeof(q->problem), "no consumer");
        else if (q->up_known && q->up < q->conf->workers)
            snprintf(q->problem, sizeof(q->problem), "%.0f of %d workers up", q->up,
                     q->conf->workers);
        if (q->problem[0] != '\0' && (!q->exists || q->consumers == 0 || q->blocked > 0))
            unhealthy = true;
        if (!q->pg_ok)
            failed = true;
    }
    return unhealthy ? SK_CTL_UNHEALTHY : failed ? SK_CTL_FAILED : SK_CTL_OK;
}

static void read_metrics(struct status *s)
{
    const struct sk_metrics_conf *m = &s->conf->metrics;
    if (m->listen_host == NULL) {
        snprintf(s->metrics_why, sizeof(s->metrics_why), "metrics disabled");
        return;
    }
    char why[256];
    s->metrics = sk_ctl_http_get(m->listen_host, m->listen_port, "/metrics", m->token,
                                 SCRAPE_TIMEOUT_MS, why, sizeof(why));
    if (s->metrics == NULL) {
        snprintf(s->metrics_why, sizeof(s->metrics_why), "%s", why);
        return;
    }
    bool any_blocked = false, found;
    for (size_t i = 0; i < s->conf->n_queues; i++) {
        s->q[i].up = sk_ctl_metric(s->metrics, "sekali_workers_up", s->q[i].conf->name,
                                   &s->q[i].up_known);
        s->q[i].blocked = sk_ctl_metric(s->metrics, "sekali_workers_blocked", s->q[i].conf->name,
                                        &found);
        if (!found || s->q[i].blocked < 0)
            s->q[i].blocked = 0;
        any_blocked |= s->q[i].blocked > 0;
    }
    if (any_blocked)
        read_blocked_why(s);
}

/* Why a queue's handler cannot run is text, which /metrics does not carry:
 * sekalid's /readyz line has it, one "; "-separated segment per queue
 * ("<queue>: the handler cannot run (...): <why>"). */
static void read_blocked_why(struct status *s)
{
    const struct sk_metrics_conf *m = &s->conf->metrics;
    char why[256];
    char *text = sk_ctl_http_get(m->listen_host, m->listen_port, "/readyz", m->token,
                                 SCRAPE_TIMEOUT_MS, why, sizeof(why));
    if (text == NULL)
        return;
    for (size_t i = 0; i < s->conf->n_queues; i++) {
        struct qstat *q = &s->q[i];
        char head[300];
        snprintf(head, sizeof(head), "%s: the handler cannot run (", q->conf->name);
        for (const char *at = strstr(text, head); at != NULL; at = strstr(at + 1, head)) {
            if (at != text && !(at - text >= 2 && at[-2] == ';' && at[-1] == ' ') &&
                !(at - text >= 2 && at[-2] == ':' && at[-1] == ' '))
                continue;  /* the name is the tail of a longer queue's */
            size_t n = strcspn(at + strlen(q->conf->name) + 2, ";\n");
            snprintf(q->blocked_why, sizeof(q->blocked_why), "%.*s", (int)n,
                     at + strlen(q->conf->name) + 2);
            break;
        }
    }
    free(text);
}

static void read_broker(struct status *s)
{
    struct sk_broker *b = NULL;
    struct sk_err err = { 0 };
    if (sk_ctl_broker_take(s->conf, &b, &err) != SK_OK) {
        snprintf(s->broker_why, sizeof(s->broker_why), "%s", err.msg);
        return;
    }
    for (size_t i = 0; i < s->conf->n_queues; i++) {
        struct qstat *q = &s->q[i];
        char dead[600];
        sk_broker_dead_name(q->conf->name, dead, sizeof(dead), NULL);   /* names fit: config caps them */
        uint32_t dead_consumers, lane_ready = 0, lane_consumers = 0;
        if (sk_broker_queue_probe(b, q->conf->name, &q->exists, &q->ready, &q->consumers,
                                  &err) != SK_OK ||
            sk_broker_queue_probe(b, dead, &q->dead_exists, &q->dead, &dead_consumers, &err) !=
                SK_OK ||
            sk_ctl_delays_read(b, q->conf, &q->delays, &err) != SK_OK ||
            sk_broker_lanes_probe(b, q->conf->name, (unsigned)q->conf->lanes, &lane_ready,
                                  &lane_consumers, &err) != SK_OK) {
            snprintf(s->broker_why, sizeof(s->broker_why), "%s", err.msg);
            break;
        }
        /* A queue with lanes holds its jobs there; its consumers are the
         * intake's, one a worker. */
        q->ready += lane_ready;
        q->delayed = q->delays.messages;
        q->delay_queues = q->delays.n;
        q->broker_ok = true;
    }
    sk_ctl_broker_give(b);
}

static void read_pg(struct status *s)
{
    PGconn *pg = sk_ctl_pg_take(s->conf);
    if (pg == NULL) {
        snprintf(s->pg_why, sizeof(s->pg_why), "PostgreSQL connection failed");
        return;
    }
    if (sk_pg_clear_text_remote(pg))
        snprintf(s->pg_clear, sizeof(s->pg_clear), "%.100s:%.10s is reached without TLS "
                 "(add sslmode=verify-full to postgres.conninfo)", PQhost(pg), PQport(pg));
    for (size_t i = 0; i < s->conf->n_queues; i++) {
        struct qstat *q = &s->q[i];
        const char *params[] = { q->conf->name };
        const struct sk_pg_stmt st = { .sql = "SELECT * FROM sekali.queue_status($1)",
                                       .n_params = 1, .values = params, .one_row = true,
                                       .what = "sekali.queue_status" };
        struct sk_err err = { 0 };
        PGresult *res;
        if (sk_pg_exec(pg, &st, &res, &err) != SK_OK) {
            snprintf(s->pg_why, sizeof(s->pg_why), "%s", err.msg);
            s->pg_why[strcspn(s->pg_why, "\n")] = '\0';
            break;
        }
        q->pg_ok = true;
        q->processing = atoll(PQgetvalue(res, 0, 0));
        q->failed = atoll(PQgetvalue(res, 0, 1));
        q->oldest_known = !PQgetisnull(res, 0, 2);
        q->oldest_s = q->oldest_known ? atof(PQgetvalue(res, 0, 2)) : 0;
        q->outbox_pending = atoll(PQgetvalue(res, 0, 3));
        q->outbox_refused = atoll(PQgetvalue(res, 0, 4));
        q->outbox_lag_s = atof(PQgetvalue(res, 0, 5));
        PQclear(res);
        read_pause(pg, q);
        /* Counted as letters come and go (sql/029); a database not yet
         * migrated there counts its letters. */
        const struct sk_pg_stmt dead = { .sql = "SELECT sekali.dead_letter_count($1)",
                                         .n_params = 1, .values = params, .one_row = true,
                                         .what = "counting dead letters" };
        struct sk_pg_stmt scan = dead;
        scan.sql = "SELECT count(*) FROM sekali.dead_letters WHERE queue = $1";
        if (sk_pg_exec(pg, &dead, &res, NULL) == SK_OK || sk_pg_exec(pg, &scan, &res, NULL) == SK_OK) {
            q->dead_letters = atoll(PQgetvalue(res, 0, 0));
            PQclear(res);
        }
    }
    sk_ctl_pg_give(pg);
}

/* Best effort: a database from before sql/019 has no pauses to show. */
static void read_pause(PGconn *pg, struct qstat *q)
{
    const char *params[] = { q->conf->name };
    const struct sk_pg_stmt st = {
        .sql = "SELECT coalesce(reason, ''), coalesce(paused_by, ''), "
               "extract(epoch FROM now() - paused_at) FROM sekali.queue_pauses WHERE queue = $1",
        .n_params = 1, .values = params, .what = "reading sekali.queue_pauses",
    };
    PGresult *res;
    if (sk_pg_exec(pg, &st, &res, NULL) != SK_OK)
        return;
    q->paused = PQntuples(res) == 1;
    if (q->paused) {
        snprintf(q->pause_reason, sizeof(q->pause_reason), "%s", PQgetvalue(res, 0, 0));
        snprintf(q->paused_by, sizeof(q->paused_by), "%s", PQgetvalue(res, 0, 1));
        q->paused_s = atof(PQgetvalue(res, 0, 2));
    }
    PQclear(res);
}

/* A last-round gauge: the Unix time, or 0 with *known false. */
static double last_round(const struct status *s, const char *metric, bool *known)
{
    *known = false;
    if (s->metrics == NULL)
        return 0;
    bool found;
    double t = sk_ctl_metric(s->metrics, metric, NULL, &found);
    *known = found && t > 0;
    return t;
}

static void put_round_text(const struct status *s, const char *what, const char *metric)
{
    FILE *out = s->out;
    bool known;
    double t = last_round(s, metric, &known);
    char iso[64];
    fprintf(out, "%s: ", what);
    if (s->metrics == NULL)
        fprintf(out, "last round unknown (%s)\n", s->metrics_why);
    else if (!known)
        fprintf(out, "no round finished yet\n");
    else {
        sk_ctl_iso_time((uint64_t)t, iso, sizeof(iso));
        fprintf(out, "last round %s (%.1fs ago)\n", iso, s->now - t > 0 ? s->now - t : 0);
    }
}

/* One queue's lines of print_text(). */
static void print_queue_text(const struct status *s, const struct qstat *q)
{
    FILE *out = s->out;
    fprintf(out, "\nqueue ");
    sk_ctl_put_text(out, q->conf->name, strlen(q->conf->name), 0);
    fprintf(out, ": %s\n", q->problem[0] != '\0' ? q->problem : !q->broker_ok ? "unknown"
                      : q->paused ? "paused" : "ok");
    if (q->paused) {
        /* Reason and name are the operator's text: printed escaped. */
        fprintf(out, "  paused      for %.0fs", q->paused_s);
        if (q->paused_by[0] != '\0') {
            fprintf(out, " by ");
            sk_ctl_put_tstr(out, q->paused_by);
        }
        if (q->pause_reason[0] != '\0') {
            fprintf(out, ": ");
            sk_ctl_put_tstr(out, q->pause_reason);
        }
        fprintf(out, " (sekalictl resume %s)\n", q->conf->name);
    }
    fprintf(out, "  workers     %d configured, ", q->conf->workers);
    if (q->up_known)
        fprintf(out, "%.0f up", q->up);
    else
        fprintf(out, "up unknown (%s)", s->metrics != NULL ? "not in /metrics" : s->metrics_why);
    if (q->broker_ok)
        fprintf(out, ", %u consuming\n", q->consumers);
    else
        fprintf(out, ", consuming unknown\n");
    if (q->broker_ok)
        fprintf(out, "  messages    %u ready, unacked unknown (AMQP does not report it), "
               "%u delayed in %u delay queues, %u in the %s.dead mirror\n",
               q->ready, q->delayed, q->delay_queues, q->dead, q->conf->name);
    else
        fprintf(out, "  messages    unknown (broker unreachable)\n");
    if (q->pg_ok) {
        fprintf(out, "  keys        %lld processing", q->processing);
        if (q->oldest_known)
            fprintf(out, " (oldest first claimed %.1fs ago)", q->oldest_s);
        fprintf(out, ", %lld failed, %lld dead letters\n", q->failed, q->dead_letters);
        fprintf(out, "  outbox      %lld pending, lag %.1fs, %lld refused by the broker\n",
               q->outbox_pending, q->outbox_lag_s, q->outbox_refused);
    } else {
        fprintf(out, "  keys        unknown (PostgreSQL unreachable)\n");
    }
}

static void print_text(const struct status *s)
{
    FILE *out = s->out;
    const struct sk_conf *conf = s->conf;
    if (conf->metrics.listen_host != NULL)
        fprintf(out, "sekalid: %s (metrics endpoint %s:%d %s%s)\n",
               s->running == 1 ? "running" : "NOT RUNNING", conf->metrics.listen_host,
               conf->metrics.listen_port, s->metrics != NULL ? "answered" : "did not answer: ",
               s->metrics != NULL ? "" : s->metrics_why);
    else
        fprintf(out, "sekalid: %s (judged by the queues' consumers: metrics disabled)\n",
               s->running == 1 ? "running" : s->running == 0 ? "NOT RUNNING" : "unknown");
    if (s->broker_why[0] != '\0') {
        fprintf(out, "broker: ");
        sk_ctl_put_tstr(out, s->broker_why);
        fprintf(out, "\n");
    }
    if (s->pg_why[0] != '\0') {
        fprintf(out, "postgresql: ");
        sk_ctl_put_tstr(out, s->pg_why);
        fprintf(out, "\n");
    }
    if (s->pg_clear[0] != '\0') {
        fprintf(out, "postgresql: WARNING: ");
        sk_ctl_put_tstr(out, s->pg_clear);
        fprintf(out, "\n");
    }
    for (size_t i = 0; i < conf->n_queues; i++)
        print_queue_text(s, &s->q[i]);
    fprintf(out, "\n");
    if (conf->outbox.relays > 0) {
        char what[64];
        snprintf(what, sizeof(what), "outbox relays (%d)", conf->outbox.relays);
        put_round_text(s, what, "sekali_relay_last_round_timestamp_seconds");
    } else {
        fprintf(out, "outbox relays: none configured\n");
    }
    if (conf->janitor.interval_ms > 0)
        put_round_text(s, "janitor", "sekali_janitor_last_round_timestamp_seconds");
    else
        fprintf(out, "janitor: disabled\n");
}

static void put_num_or_null(FILE *out, bool known, double v)
{
    if (known && isfinite(v))
        fprintf(out, "%.3f", v);
    else
        fprintf(out, "null");
}

static void put_round_json(const struct status *s, const char *name, int configured,
                           const char *metric)
{
    FILE *out = s->out;
    bool known;
    double t = last_round(s, metric, &known);
    fprintf(out, ",\"%s\":{\"configured\":%d,\"last_round\":", name, configured);
    if (known) {
        char iso[64];
        sk_ctl_iso_time((uint64_t)t, iso, sizeof(iso));
        fprintf(out, "\"%s\",\"last_round_age_seconds\":%.3f", iso, s->now - t > 0 ? s->now - t : 0);
    } else {
        fprintf(out, "null,\"last_round_age_seconds\":null");
    }
    fprintf(out, "}");
}

static void print_json(const struct status *s, int code)
{
    FILE *out = s->out;
    const struct sk_conf *conf = s->conf;
    fprintf(out, "{\"sekalid\":{\"running\":%s,\"metrics\":",
           s->running == 1 ? "true" : s->running == 0 ? "false" : "null");
    if (s->metrics != NULL)
        fprintf(out, "\"answered\"");
    else
        sk_ctl_put_jstr(out, s->metrics_why);
    fprintf(out, "},\"broker_error\":");
    put_text_or_null(out, s->broker_why);
    fprintf(out, ",\"postgresql_error\":");
    put_text_or_null(out, s->pg_why);
    fprintf(out, ",\"postgresql_warning\":");
    put_text_or_null(out, s->pg_clear);
    fprintf(out, ",\"queues\":[");
    for (size_t i = 0; i < conf->n_queues; i++) {
        fprintf(out, "%s", i > 0 ? "," : "");
        json_queue(out, &s->q[i]);
    }
    fprintf(out, "]");
    put_round_json(s, "relays", conf->outbox.relays, "sekali_relay_last_round_timestamp_seconds");
    put_round_json(s, "janitor", conf->janitor.interval_ms > 0,
                   "sekali_janitor_last_round_timestamp_seconds");
    fprintf(out, ",\"exit_code\":%d}\n", code);
}

/* What could not be read is null, not zero: a script must not take "the
 * broker did not answer" for "the queue is empty". */
static void json_queue(FILE *out, const struct qstat *q)
{
    fprintf(out, "{\"name\":");
    sk_ctl_put_jstr(out, q->conf->name);
    fprintf(out, ",\"healthy\":%s,\"problem\":", q->problem[0] == '\0' && q->broker_ok ? "true"
                                                                               : "false");
    put_text_or_null(out, q->problem);
    if (q->paused) {
        fprintf(out, ",\"paused\":{\"seconds\":%.3f,\"by\":", q->paused_s);
        put_text_or_null(out, q->paused_by);
        fprintf(out, ",\"reason\":");
        put_text_or_null(out, q->pause_reason);
        fprintf(out, "}");
    } else {
        fprintf(out, ",\"paused\":%s", q->pg_ok ? "false" : "null");
    }
    fprintf(out, ",\"workers_configured\":%d,\"workers_up\":", q->conf->workers);
    if (q->up_known)
        fprintf(out, "%.0f", q->up);
    else
        fprintf(out, "null");
    if (q->broker_ok)
        fprintf(out, ",\"consumers\":%u,\"ready\":%u,\"unacked\":null,\"delayed\":%u,"
               "\"delay_queues\":%u,\"dead_mirror\":%u", q->consumers, q->ready, q->delayed,
               q->delay_queues, q->dead);
    else
        fprintf(out, ",\"consumers\":null,\"ready\":null,\"unacked\":null,\"delayed\":null,"
               "\"delay_queues\":null,\"dead_mirror\":null");
    fprintf(out, ",\"delay_buckets\":");
    if (q->broker_ok)
        sk_ctl_delays_json(out, &q->delays);
    else
        fprintf(out, "null");
    if (q->pg_ok) {
        fprintf(out, ",\"processing\":%lld,\"failed\":%lld,\"dead\":%lld,"
               "\"oldest_processing_seconds\":", q->processing, q->failed, q->dead_letters);
        put_num_or_null(out, q->oldest_known, q->oldest_s);
        fprintf(out, ",\"outbox_pending\":%lld,\"outbox_refused\":%lld,"
               "\"outbox_lag_seconds\":%.3f", q->outbox_pending, q->outbox_refused,
               q->outbox_lag_s);
    } else {
        fprintf(out, ",\"processing\":null,\"failed\":null,\"dead\":null,"
               "\"oldest_processing_seconds\":null,"
               "\"outbox_pending\":null,\"outbox_refused\":null,\"outbox_lag_seconds\":null");
    }
    fprintf(out, "}");
}

/* An empty string is JSON null. */
static void put_text_or_null(FILE *out, const char *text)
{
    if (text[0] != '\0')
        sk_ctl_put_jstr(out, text);
    else
        fprintf(out, "null");
}
