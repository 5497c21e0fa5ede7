/* janitor.c - retention: deletes what no longer protects anything.
 *
 * Every janitor.interval it deletes, per queue, idempotency keys finished
 * (completed or failed) longer ago than the queue's retention, with their
 * checkpoints; outbox rows published longer ago than outbox_retention;
 * dedupe keys released or expired more than an hour ago; and crash counts
 * (sql/006) a day old. A finished key protects against late
 * duplicates, so retention must be longer than any redelivery can be late.
 * A row still `processing`, an unpublished outbox row or a live dedupe key
 * is never touched.
 *
 * Each DELETE takes at most janitor.batch rows and commits on its own, so
 * it never holds many row locks or a long transaction; a round repeats
 * batches until one comes back short. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "backoff.h"
#include "janitor.h"
#include "log.h"
#include "process.h"
#include "store.h"

/* Runs sql (with $1 = batch and the given extra parameters) until a batch
 * deletes fewer rows than asked. Returns rows deleted, or -1. */
static long long drain(PGconn *pg, const char *sql, const char *const *params, int n_params,
                       int batch, const char *what)
{
    long long total = 0;
    for (;;) {
        PGresult *res = PQexecParams(pg, sql, n_params, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
            sk_log_warn("janitor: deleting %s failed: %s", what, PQresultErrorMessage(res));
            PQclear(res);
            return -1;
        }
        long long n = atoll(PQcmdTuples(res));
        PQclear(res);
        total += n;
        if (n < batch || sk_process_stopping())
            return total;
    }
}

static int round_once(const struct sk_conf *conf, PGconn *pg)
{
    char batch[16], ms[24];
    snprintf(batch, sizeof(batch), "%d", conf->janitor.batch);
    for (size_t i = 0; i < conf->n_queues && !sk_process_stopping(); i++) {
        const struct sk_queue_conf *q = &conf->queues[i];
        snprintf(ms, sizeof(ms), "%u", q->retention_ms);
        const char *params[] = { batch, q->name, ms };
        long long n = drain(pg,
            "WITH gone AS (DELETE FROM sekali.idempotency_keys WHERE ctid IN ("
            "  SELECT ctid FROM sekali.idempotency_keys WHERE queue = $2"
            "  AND status IN ('completed', 'failed')"
            "  AND updated_at < now() - make_interval(secs => $3::bigint / 1000.0)"
            "  LIMIT $1::int) RETURNING queue, key) "
            "DELETE FROM sekali.checkpoints c USING gone "
            "WHERE c.queue = gone.queue AND c.key = gone.key",
            params, 3, conf->janitor.batch, "idempotency keys");
        if (n < 0)
            return SK_AGAIN;
    }
    snprintf(ms, sizeof(ms), "%u", conf->janitor.outbox_retention_ms);
    const char *outbox[] = { batch, ms };
    if (drain(pg, "DELETE FROM sekali.outbox WHERE ctid IN (SELECT ctid FROM sekali.outbox "
                  "WHERE published_at < now() - make_interval(secs => $2::bigint / 1000.0) "
                  "LIMIT $1::int)", outbox, 2, conf->janitor.batch, "outbox rows") < 0)
        return SK_AGAIN;
    const char *dedupe[] = { batch };
    /* An hour's grace: a released key still tells who held it, when asked. */
    if (drain(pg, "DELETE FROM sekali.job_dedupe WHERE ctid IN (SELECT ctid FROM "
                  "sekali.job_dedupe WHERE released_at < now() - interval '1 hour' "
                  "OR expires_at < now() - interval '1 hour' LIMIT $1::int)",
              dedupe, 1, conf->janitor.batch, "dedupe keys") < 0)
        return SK_AGAIN;
    /* A crash loop crashes within minutes: a day-old count is history. */
    if (drain(pg, "DELETE FROM sekali.job_crashes WHERE ctid IN (SELECT ctid FROM "
                  "sekali.job_crashes WHERE last_crash < now() - interval '1 day' "
                  "LIMIT $1::int)", dedupe, 1, conf->janitor.batch, "crash counts") < 0)
        return SK_AGAIN;
    return SK_OK;
}

int sk_janitor_run(const struct sk_conf *conf, struct sk_slot *slot, struct sk_metrics *metrics)
{
    sk_log_info("janitor started");

    struct sk_backoff backoff = { .base_ms = 500, .cap_ms = 30000 };
    PGconn *pg = NULL;
    while (!sk_process_stopping()) {
        atomic_store(&slot->alive_ms, sk_now_ms());
        struct sk_err err = { 0 };
        if (pg == NULL && (pg = sk_store_dial(&conf->postgres, "sekali janitor", &err)) == NULL) {
            atomic_store(&slot->consuming, 0);
            sk_sleep_ms(sk_backoff_next(&backoff));
            continue;
        }
        atomic_store(&slot->consuming, 1);
        if (round_once(conf, pg) != SK_OK) {
            PQfinish(pg);
            pg = NULL;
            sk_sleep_ms(sk_backoff_next(&backoff));
            continue;
        }
        sk_backoff_reset(&backoff);
        sk_metrics_janitor_round(metrics);
        /* Sleep in short steps, so that the supervisor sees us alive. */
        for (uint32_t slept = 0; slept < conf->janitor.interval_ms && !sk_process_stopping();
             slept += 200) {
            atomic_store(&slot->alive_ms, sk_now_ms());
            sk_sleep_ms(200);
        }
    }
    PQfinish(pg);
    sk_log_info("janitor stopping");
    return SK_EXIT_OK;
}
