/* ctl_verify.c - sekalictl verify: after an incident, which jobs of a
 * window were lost or are stuck? It reconciles what sekali recorded:
 *
 *   the outbox      every job enqueued in the window, joined to its
 *                   idempotency key: completed, failed, cancelled, processing, or no
 *                   key yet (waiting: in a queue, a delay queue, a
 *                   worker's hands, <queue>.dead, or lost);
 *   dead letters    the letter of a window's job without a key, found by
 *                   its key; the key of each of the oldest 1,000 letters
 *                   (--letters; sekali.dead_letters, read and left as
 *                   they are);
 *   the broker      what the work queue, its delay queues and <queue>.dead
 *                   hold (counted, never read), and the most its consumers
 *                   can hold unacked (prefetch_max each);
 *   the keys        processing past their lease: no owner renews them
 *                   (a worker dead, frozen or cut off), so they are stuck
 *                   until a redelivery takes them over.
 *
 * lost = jobs without a key that neither a dead letter nor the broker can
 * account for. The broker does not say which messages it holds (reading
 * a work queue would count as a delivery), so when it holds some the keys
 * listed as lost are the oldest candidates, and the count is a lower
 * bound. Jobs published straight to the broker have no outbox row and
 * are not seen.
 *
 * Cost: the outbox window is read in batches by primary key, each row's key
 * found by the keys' primary key; each batch is a short statement and no
 * row is locked. Exit codes: 0 nothing lost or stuck (inconsistent dead
 * letters are reported, not judged), 8 (SK_CTL_LOST) some, 1 a source
 * could not be read, 2 usage. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#include "broker.h"
#include "config_value.h"
#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_out.h"
#include "pg.h"

#define BATCH      5000   /* outbox rows a statement */
#define LIST_MAX   100    /* keys listed per finding and queue */
/* Keyed dead letters whose key is checked per queue, by default and at
 * most: each is a probe of the keys' primary key, and over a long history
 * that index and the keys' pages are far larger than memory, so each probe
 * is a read from disk or two (10,000 took 2.5 s at 30 M keys). */
#define LETTERS_DEFAULT 1000
#define LETTERS_MAX     1000000
#define DEFAULT_SINCE_MS (24u * 3600 * 1000)
#define STR_(x) #x
#define STR(x)  STR_(x)

struct keylist {
    char  *key[LIST_MAX];
    size_t n;
};

struct vqueue {
    const struct sk_queue_conf *conf;
    long long enqueued, completed, failed, cancelled, processing, waiting, pending;
    long long dead, dead_without_key, inconsistent, stuck, lost;
    long long dead_checked;  /* keyed letters whose key read_dead() checked */
    long long ready, delayed, in_flight_max, dead_queue;
    struct keylist waiting_keys, dead_keys, inconsistent_keys, stuck_keys, lost_keys;
};

struct verify {
    const struct sk_conf *conf;
    struct vqueue        *q;
    size_t                n;
    bool                  json, failed;
    long long             letters;        /* keyed dead letters checked per queue */
    char                  since_arg[64];  /* "-N" ms back from now, or a time */
    char                  since[64];      /* the window's start, as PostgreSQL said it */
};

static bool verify_args(struct verify *v, int argc, char **argv, const char **queue);
static bool resolve_since(struct verify *v, PGconn *pg);
static bool read_outbox(struct verify *v, PGconn *pg);
static bool read_stuck(struct verify *v, PGconn *pg);
static bool read_broker(struct verify *v, PGconn *pg);
static bool read_dead(const struct verify *v, struct vqueue *q, PGconn *pg);
static void judge(struct verify *v);
static void print_text(const struct verify *v);
static void print_json(const struct verify *v, int code);
static void keep(struct keylist *l, const char *key, size_t len);
static bool listed(const struct keylist *l, const char *key);
static void keylist_free(struct keylist *l);

int sk_ctl_verify(const struct sk_conf *conf, int argc, char **argv)
{
    struct verify v = { .conf = conf, .letters = LETTERS_DEFAULT };
    const char *only = NULL;
    if (!verify_args(&v, argc, argv, &only))
        return SK_CTL_SHOW_USAGE;
    v.q = calloc(conf->n_queues, sizeof(*v.q));
    if (v.q == NULL) {
        fprintf(stderr, "sekalictl: out of memory\n");
        return SK_CTL_FAILED;
    }
    for (size_t i = 0; i < conf->n_queues; i++)
        if (only == NULL || strcmp(only, conf->queues[i].name) == 0)
            v.q[v.n++].conf = &conf->queues[i];
    if (v.n == 0) {
        fprintf(stderr, "sekalictl: no queue %s in %s\n", only, conf->path);
        free(v.q);
        return SK_CTL_USAGE;
    }
    PGconn *pg = sk_ctl_pg_connect(conf);
    int code = SK_CTL_FAILED;
    /* Each batch is small: parallel workers would only cost their start
     * and take them from the production queries. */
    if (pg != NULL)
        sk_pg_run(pg, "SET max_parallel_workers_per_gather = 0", NULL);
    if (pg != NULL && resolve_since(&v, pg) && read_outbox(&v, pg) && read_stuck(&v, pg) && read_broker(&v, pg)) {
        judge(&v);
        code = SK_CTL_OK;
        for (size_t i = 0; i < v.n; i++)
            if (v.q[i].lost > 0 || v.q[i].stuck > 0)
                code = SK_CTL_LOST;
        if (v.json)
            print_json(&v, code);
        else
            print_text(&v);
    }
    PQfinish(pg);
    for (size_t i = 0; i < v.n; i++) {
        keylist_free(&v.q[i].waiting_keys);
        keylist_free(&v.q[i].dead_keys);
        keylist_free(&v.q[i].inconsistent_keys);
        keylist_free(&v.q[i].stuck_keys);
        keylist_free(&v.q[i].lost_keys);
    }
    free(v.q);
    return code;
}

/* false: a usage error. --since takes a duration back from now (24h) or a
 * time PostgreSQL reads (2026-12-01 14:00Z); --letters the keyed dead
 * letters to check, 0 to LETTERS_MAX. */
static bool verify_args(struct verify *v, int argc, char **argv, const char **queue)
{
    static const struct option options[] = {
        { "json", no_argument, NULL, 'j' },
        { "queue", required_argument, NULL, 'q' },
        { "since", required_argument, NULL, 's' },
        { "letters", required_argument, NULL, 'l' },
        { NULL, 0, NULL, 0 },
    };
    const char *since = NULL;
    uint64_t letters;
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (opt == 'j')
            v->json = true;
        else if (opt == 'q')
            *queue = optarg;
        else if (opt == 's')
            since = optarg;
        else if (opt == 'l' && sk_ctl_whole_number(optarg, LETTERS_MAX, &letters))
            v->letters = (long long)letters;
        else
            return false;
    }
    uint64_t ms = DEFAULT_SINCE_MS;
    struct sk_err err = { 0 };
    if (since == NULL || sk_conf_value_parse_duration(since, &ms, &err) == SK_OK)
        snprintf(v->since_arg, sizeof(v->since_arg), "-%llu", (unsigned long long)ms);
    else if (strlen(since) < sizeof(v->since_arg) && since[0] != '-')
        snprintf(v->since_arg, sizeof(v->since_arg), "%s", since);
    else
        return false;
    return optind == argc;
}

static struct vqueue *queue_of(struct verify *v, const char *name)
{
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->q[i].conf->name, name) == 0)
            return &v->q[i];
    return NULL;
}

/* The window's start by PostgreSQL's clock (the rows' times are its). */
static bool resolve_since(struct verify *v, PGconn *pg)
{
    const char *params[] = { v->since_arg };
    const struct sk_pg_stmt st = {
        .sql = "SELECT CASE WHEN $1 ~ '^-[0-9]+$' "
               "THEN now() - make_interval(secs => substr($1, 2)::float8 / 1000) "
               "ELSE $1::timestamptz END",
        .n_params = 1, .values = params, .one_row = true, .what = "--since",
    };
    PGresult *res;
    if (!sk_ctl_pg_exec(pg, &st, &res))
        return false;
    snprintf(v->since, sizeof(v->since), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return true;
}

/* The window's outbox rows and their keys' status, BATCH rows a statement
 * in id order. */
static bool read_outbox(struct verify *v, PGconn *pg)
{
    char last[32] = "0";
    for (;;) {
        const char *params[] = { last, v->since };
        const struct sk_pg_stmt st = {
            /* A job without a key may have been dead-lettered before it had
             * one: its letter is found by its key (dead_letters_key), so the
             * cost is the window's, never the letters'. */
            .sql = "SELECT o.id, o.queue, o.idempotency_key, o.published_at IS NOT NULL, "
                   "o.run_at > now(), coalesce(k.status, ''), k.status IS NULL AND EXISTS ("
                   "SELECT 1 FROM sekali.dead_letters d WHERE d.queue = o.queue "
                   "AND d.key = o.idempotency_key AND d.malformed IS NULL) "
                   "FROM sekali.outbox o "
                   "CROSS JOIN LATERAL sekali.key_status(o.queue, o.idempotency_key) k(status) "
                   "WHERE o.id > $1::bigint AND o.created_at >= $2::timestamptz "
                   "ORDER BY o.id LIMIT " STR(BATCH),
            .n_params = 2, .values = params, .what = "reading the outbox window",
        };
        PGresult *res;
        if (!sk_ctl_pg_exec(pg, &st, &res))
            return false;
        int rows = PQntuples(res);
        for (int r = 0; r < rows; r++) {
            struct vqueue *q = queue_of(v, PQgetvalue(res, r, 1));
            if (q == NULL)
                continue;
            const char *key = PQgetvalue(res, r, 2);
            const char *status = PQgetvalue(res, r, 5);
            q->enqueued++;
            if (strcmp(status, "completed") == 0) {
                q->completed++;
            } else if (strcmp(status, "failed") == 0) {
                q->failed++;
            } else if (strcmp(status, "cancelled") == 0) {
                q->cancelled++;  /* sql/018: it will never run, and is not lost */
            } else if (strcmp(status, "processing") == 0) {
                q->processing++;
            } else if (PQgetvalue(res, r, 3)[0] == 'f' || PQgetvalue(res, r, 4)[0] == 't') {
                q->pending++;  /* the relay has not published it yet, or it is not due */
            } else {
                q->waiting++;
                keep(&q->waiting_keys, key, strlen(key));
                if (PQgetvalue(res, r, 6)[0] == 't') {
                    q->dead_without_key++;
                    keep(&q->dead_keys, key, strlen(key));
                }
            }
        }
        if (rows > 0)
            snprintf(last, sizeof(last), "%s", PQgetvalue(res, rows - 1, 0));
        PQclear(res);
        if (rows < BATCH)
            return true;
    }
}

/* Keys processing past their lease: nobody renews them. */
static bool read_stuck(struct verify *v, PGconn *pg)
{
    for (size_t i = 0; i < v->n; i++) {
        struct vqueue *q = &v->q[i];
        const char *params[] = { q->conf->name };
        const struct sk_pg_stmt st = {
            .sql = "SELECT key, count(*) OVER () FROM sekali.idempotency_keys "
                   "WHERE queue = $1 AND status = 'processing' AND lease_until < now() "
                   "ORDER BY lease_until LIMIT " STR(LIST_MAX),
            .n_params = 1, .values = params, .what = "reading stuck keys",
        };
        PGresult *res;
        if (!sk_ctl_pg_exec(pg, &st, &res))
            return false;
        for (int r = 0; r < PQntuples(res); r++) {
            q->stuck = atoll(PQgetvalue(res, r, 1));
            keep(&q->stuck_keys, PQgetvalue(res, r, 0), (size_t)PQgetlength(res, r, 0));
        }
        PQclear(res);
    }
    return true;
}

/* The queue's dead letters: their number as sql/029 keeps it, and the
 * status of the keys of the oldest v->letters keyed letters (a read of the
 * table, which leaves them as they are), each of which should be failed.
 * A bound, said in the output, because a check of every letter would cost
 * what the queue has ever dead-lettered; the window's jobs without a key
 * are matched to their letters by key (read_outbox). A malformed letter
 * never had a key sekali could record. */
static bool read_dead(const struct verify *v, struct vqueue *q, PGconn *pg)
{
    char max[24];
    snprintf(max, sizeof(max), "%lld", v->letters);
    const char *params[] = { q->conf->name, max };
    const struct sk_pg_stmt st = {
        .sql = "SELECT d.key, coalesce(sekali.key_status(d.queue, d.key), '') "
               "FROM sekali.dead_letters d WHERE d.queue = $1 AND d.key IS NOT NULL "
               "AND d.malformed IS NULL ORDER BY d.id LIMIT $2::integer",
        .n_params = 2, .values = params, .what = "the dead letters' keys",
    };
    const struct sk_pg_stmt count = {
        .sql = "SELECT sekali.dead_letter_count($1)", .n_params = 1,
        .values = params, .one_row = true, .what = "counting dead letters",
    };
    PGresult *res;
    if (!sk_ctl_pg_exec(pg, &count, &res))
        return false;
    q->dead = atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    if (!sk_ctl_pg_exec(pg, &st, &res))
        return false;
    q->dead_checked = PQntuples(res);
    for (int r = 0; r < PQntuples(res); r++) {
        const char *key = PQgetvalue(res, r, 0), *status = PQgetvalue(res, r, 1);
        if (strcmp(status, "failed") != 0) {
            q->inconsistent++;
            keep(&q->inconsistent_keys, key, strlen(key));
        }
    }
    PQclear(res);
    return true;
}

/* What the broker holds: the work queue, its delay queues, its consumers'
 * windows, and <queue>.dead (the broker's own dead letters not imported
 * yet, and the mirror's copies), counted, never read. */
static bool read_broker(struct verify *v, PGconn *pg)
{
    struct sk_err err = { 0 };
    struct sk_broker *b = NULL;
    if (sk_broker_open(&b, &v->conf->amqp, &err) != SK_OK) {
        fprintf(stderr, "sekalictl: %s\n", err.msg);
        return false;
    }
    for (size_t i = 0; i < v->n; i++) {
        struct vqueue *q = &v->q[i];
        bool exists;
        uint32_t ready = 0, consumers = 0, depth = 0, dc, delayed = 0, delay_queues;
        uint32_t lane_ready = 0, lane_consumers = 0;
        char dead[600];
        sk_broker_dead_name(q->conf->name, dead, sizeof(dead), NULL);
        bool ok = sk_broker_queue_probe(b, q->conf->name, &exists, &ready, &consumers, &err) ==
                      SK_OK &&
                  sk_ctl_delayed(b, q->conf, &delayed, &delay_queues, &err) == SK_OK &&
                  sk_broker_queue_probe(b, dead, &exists, &depth, &dc, &err) == SK_OK &&
                  sk_broker_lanes_probe(b, q->conf->name, (unsigned)q->conf->lanes, &lane_ready,
                                        &lane_consumers, &err) == SK_OK;
        /* A job waiting in a lane is held, not lost; so is each lane
         * consumer's window, and the intake's wider one. */
        q->ready = (long long)ready + lane_ready;
        q->delayed = delayed;
        q->dead_queue = depth;
        unsigned intake = q->conf->lanes > 0
            ? sk_lane_intake_window((unsigned)q->conf->prefetch_max)
            : (unsigned)q->conf->prefetch_max;
        q->in_flight_max = (long long)consumers * intake +
                           (long long)lane_consumers * q->conf->prefetch_max;
        if (!ok) {
            fprintf(stderr, "sekalictl: reading the broker for %s: %s\n", q->conf->name,
                    err.msg[0] != '\0' ? err.msg : "failed");
            sk_broker_close(b);
            return false;
        }
        if (!read_dead(v, q, pg)) {
            sk_broker_close(b);
            return false;
        }
    }
    sk_broker_close(b);
    return true;
}

/* Jobs without a key that neither the dead letters nor the broker account
 * for are lost; with the broker holding nothing, exactly those. */
static void judge(struct verify *v)
{
    for (size_t i = 0; i < v->n; i++) {
        struct vqueue *q = &v->q[i];
        long long held = q->ready + q->delayed + q->dead_queue + q->in_flight_max;
        long long lost = q->waiting - q->dead_without_key - held;
        q->lost = lost > 0 ? lost : 0;
        for (size_t k = 0; k < q->waiting_keys.n && q->lost_keys.n < (size_t)q->lost; k++)
            if (!listed(&q->dead_keys, q->waiting_keys.key[k]))
                keep(&q->lost_keys, q->waiting_keys.key[k], strlen(q->waiting_keys.key[k]));
    }
}

static void text_keys(const char *what, long long n, const struct keylist *l)
{
    if (n == 0)
        return;
    printf("  %s %lld:", what, n);
    for (size_t k = 0; k < l->n; k++) {
        printf(" ");
        sk_ctl_put_text(stdout, l->key[k], strlen(l->key[k]), 80);
    }
    printf("%s\n", (long long)l->n < n ? " ..." : "");
}

static void print_text(const struct verify *v)
{
    printf("since %s\n", v->since);
    for (size_t i = 0; i < v->n; i++) {
        const struct vqueue *q = &v->q[i];
        printf("%s: enqueued %lld, completed %lld, failed %lld, processing %lld, waiting %lld, "
               "pending %lld, cancelled %lld; broker: ready %lld, delayed %lld, dead %lld\n",
               q->conf->name, q->enqueued, q->completed, q->failed, q->processing, q->waiting,
               q->pending, q->cancelled, q->ready, q->delayed, q->dead);
        text_keys("lost", q->lost, &q->lost_keys);
        text_keys("stuck", q->stuck, &q->stuck_keys);
        text_keys("inconsistent", q->inconsistent, &q->inconsistent_keys);
        if (q->lost == 0 && q->stuck == 0 && q->inconsistent == 0)
            printf("  nothing lost, stuck or inconsistent\n");
        if (q->dead_checked == v->letters && q->dead > v->letters)
            printf("  inconsistent: the oldest %lld keyed dead letters checked, of %lld "
                   "(--letters checks more)\n", v->letters, q->dead);
    }
}

static void json_keys(const char *name, long long n, const struct keylist *l)
{
    printf(",\"%s\":%lld,\"%s_keys\":[", name, n, name);
    for (size_t k = 0; k < l->n; k++) {
        printf("%s", k > 0 ? "," : "");
        sk_ctl_put_jstr(stdout, l->key[k]);
    }
    printf("]");
}

static void print_json(const struct verify *v, int code)
{
    printf("{\"since\":");
    sk_ctl_put_jstr(stdout, v->since);
    printf(",\"queues\":[");
    for (size_t i = 0; i < v->n; i++) {
        const struct vqueue *q = &v->q[i];
        printf("%s{\"queue\":", i > 0 ? "," : "");
        sk_ctl_put_jstr(stdout, q->conf->name);
        printf(",\"counts\":{\"enqueued\":%lld,\"completed\":%lld,\"failed\":%lld,"
               "\"processing\":%lld,\"waiting\":%lld,\"pending\":%lld,\"cancelled\":%lld,"
               "\"ready\":%lld,\"delayed\":%lld,\"dead_letters\":%lld}", q->enqueued,
               q->completed, q->failed, q->processing, q->waiting, q->pending, q->cancelled,
               q->ready, q->delayed, q->dead);
        json_keys("lost", q->lost, &q->lost_keys);
        json_keys("stuck", q->stuck, &q->stuck_keys);
        json_keys("inconsistent", q->inconsistent, &q->inconsistent_keys);
        printf(",\"dead_letters_checked\":%lld}", q->dead_checked);
    }
    printf("],\"exit\":%d}\n", code);
}

/* Keeps a copy of the first LIST_MAX keys. */
static void keep(struct keylist *l, const char *key, size_t len)
{
    if (l->n < LIST_MAX && (l->key[l->n] = strndup(key, len)) != NULL)
        l->n++;
}

static bool listed(const struct keylist *l, const char *key)
{
    for (size_t k = 0; k < l->n; k++)
        if (strcmp(l->key[k], key) == 0)
            return true;
    return false;
}

static void keylist_free(struct keylist *l)
{
    for (size_t k = 0; k < l->n; k++)
        free(l->key[k]);
}
