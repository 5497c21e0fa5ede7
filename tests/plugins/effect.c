/* effect.c - the test suites' handler: records one row per execution.
 *
 * Every run inserts into sekali_test.effects inside the job's transaction, so
 * the row count per key is exactly the number of times the job's effect was
 * committed. The body selects a behaviour:
 *   "stall"    on the first delivery: write MARKER_DIR/stall.<pid> and block
 *              until killed (a worker dying mid-handler); later deliveries run
 *   "fail"     return SEKALI_FAIL
 *   "retry"    return SEKALI_RETRY on the first delivery
 *   "retry_always"  return SEKALI_RETRY on every delivery
 *   "sleep:MS" sleep MS milliseconds, then record the effect
 *   "span:MS"  the same, and record with it the job's resource key and when
 *              the handler started and ended (microseconds since the epoch), so that
 *              a test can count how many jobs of one resource ran at once
 *              (the chaos soak's CHAOS_CONCURRENCY check)
 *   "abort"    abort(): the handler kills its own worker (SIGABRT), every time
 *   "segv"     the same with SIGSEGV
 *   "settings" record the effect, and save as the result the session's
 *              lock_timeout, statement_timeout and synchronous_commit
 *   anything   record the effect and return SEKALI_OK
 *   "hold"     write MARKER_DIR/hold.<pid>, wait until MARKER_DIR/release
 *              exists, then record the effect (a job running while it is
 *              cancelled, which does not ask)
 *   "hold_ask" the same, but after the wait ask host->cancelled() (ABI 1.5):
 *              if 1, write MARKER_DIR/cancelled.<pid> and return SEKALI_FAIL
 *              without recording the effect
 *   "pay"      external mode: on a fresh first attempt, save the checkpoint
 *              "charged", write MARKER_DIR/stall.<pid> and wait until
 *              MARKER_DIR/release exists; then record the execution and call
 *              the "payment service" (sekali_test.payments, first request per
 *              key wins), noting the checkpoint it found
 *   "chain:N"  record the effect and, for N > 0, enqueue "chain:N-1" to the same
 *              queue with idempotency key "<key>+" (host->enqueue_job, ABI 1.3),
 *              in the same transaction
 *   "options"  record the effect and enqueue a job of type "later" with every
 *              option of host->enqueue_job(): idempotency key "<key>/later",
 *              resource key "res-<key>", dedupe key "dedupe-<queue>-<key>"
 *              held for an hour, to run at 2100-01-01 (so it stays in the
 *              outbox), priority 7 (ABI 1.6)
 *   "priority:N" record the effect and enqueue a job of type "later" with
 *              priority N (host->enqueue_job, ABI 1.6): N outside 0..255
 *              makes the enqueue fail and the job retry
 *   "occ:NAME" add 1 to sekali_test.occ_rows' row NAME with a version-guarded
 *              update (optimistic concurrency); on the first attempt, between
 *              reading the row and updating it, write MARKER_DIR/occ.<pid> and
 *              wait for MARKER_DIR/release, so that a test can make two jobs
 *              read the same version; a lost race is reported with
 *              host->conflict()
 * Config: `marker_dir: DIR`, `fail_init: yes` (init fails: a bad config that
 * check() lets through), `check_fail: WHY` (check() rejects the config). The
 * handler reaches the host through job->host (ABI 1.3).
 *
 * Built as handlers are, with -std=c11 and nothing more: it asks for POSIX
 * (nanosleep, kill, getpid) itself. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <sekali/handler.h>

struct state {
    const struct sekali_host *host;
    char                      marker_dir[512];
};

static int effect_check(const struct sekali_host *host, const char *config, char *err,
                        size_t err_size)
{
    char why[256];
    if (host->config_get(config, "check_fail", why, sizeof(why)) < 0)
        return SEKALI_OK;
    snprintf(err, err_size, "check_fail: %s", why);
    return SEKALI_FAIL;
}

static int effect_init(const struct sekali_host *host, const char *config, void **out)
{
    char fail[16] = "";
    host->config_get(config, "fail_init", fail, sizeof(fail));
    if (strcmp(fail, "yes") == 0 || strcmp(fail, "true") == 0)
        return SEKALI_FAIL;
    struct state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return SEKALI_RETRY;
    s->host = host;
    host->config_get(config, "marker_dir", s->marker_dir, sizeof(s->marker_dir));
    *out = s;
    return SEKALI_OK;
}

static int body_is(const struct sekali_job *job, const char *word)
{
    return job->body_len == strlen(word) && memcmp(job->body, word, job->body_len) == 0;
}

static void stall(struct state *s)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/stall.%ld", s->marker_dir, (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0)
        close(fd);
    /* Bounded, so that a test that forgets to kill us cannot hang CI. */
    for (int i = 0; i < 1200; i++) {
        struct timespec t = { .tv_sec = 0, .tv_nsec = 100 * 1000000L };
        nanosleep(&t, NULL);
    }
}

/* Waits for the test to create MARKER_DIR/release, at most two minutes. */
static void wait_for_release(struct state *s)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/release", s->marker_dir);
    for (int i = 0; i < 2400 && access(path, F_OK) != 0; i++) {
        struct timespec t = { .tv_sec = 0, .tv_nsec = 50 * 1000000L };
        nanosleep(&t, NULL);
    }
}

/* Creates MARKER_DIR/NAME.<pid>, for a test waiting on this step. */
static void mark(struct state *s, const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.%ld", s->marker_dir, name, (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0)
        close(fd);
}

static int64_t wall_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

/* "span:MS": the times are taken here, around the handler's own work, so
 * that the interval lies inside the time the job held its resource's
 * permit (taken before handle(), given back after the commit). */
static int span(struct state *s, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    char ms[16] = "", pid[16], fence[24], attempt[16], started[24], ended[24];
    memcpy(ms, (const char *)job->body + 5, job->body_len - 5 < 15 ? job->body_len - 5 : 15);
    long n = atol(ms);
    snprintf(started, sizeof(started), "%lld", (long long)wall_us());
    struct timespec t = { .tv_sec = n / 1000, .tv_nsec = (n % 1000) * 1000000L };
    nanosleep(&t, NULL);
    snprintf(ended, sizeof(ended), "%lld", (long long)wall_us());
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    snprintf(fence, sizeof(fence), "%lld", (long long)job->fence);
    snprintf(attempt, sizeof(attempt), "%u", job->delivery_attempt);
    const char *values[] = { job->queue, job->idempotency_key, job->job_id, pid,  fence,
                             attempt,    job->resource_key,    started,     ended };
    PGresult *res = PQexecParams(s->host->pg(ctx),
                                 "INSERT INTO sekali_test.effects "
                                 "(queue, idempotency_key, job_id, pid, fence, attempt, "
                                 "resource, started_us, ended_us) "
                                 "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                                 9, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        s->host->set_error(ctx, PQresultErrorMessage(res));
    PQclear(res);
    return ok ? SEKALI_OK : SEKALI_RETRY;
}

static int pay(struct state *s, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    const char *charged = s->host->checkpoint(ctx, "charged");
    char note[128];
    snprintf(note, sizeof(note), "%s", charged != NULL ? charged : "fresh");
    if (charged == NULL && job->delivery_attempt == 1 && s->marker_dir[0] != '\0') {
        char value[64];
        snprintf(value, sizeof(value), "charged by fence %lld", (long long)job->fence);
        if (s->host->checkpoint_save(ctx, "charged", value) != 0)
            return SEKALI_RETRY;
        char path[600];
        snprintf(path, sizeof(path), "%s/stall.%ld", s->marker_dir, (long)getpid());
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0)
            close(fd);
        wait_for_release(s);
    }

    char pid[16], fence[24];
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    snprintf(fence, sizeof(fence), "%lld", (long long)job->fence);
    const char *values[] = { job->queue, job->idempotency_key, job->job_id, pid, fence, note };
    PGconn *pg = s->host->pg(ctx);
    PGresult *res = PQexecParams(pg,
                                 "WITH run AS (INSERT INTO sekali_test.effects "
                                 "(queue, idempotency_key, job_id, pid, fence, attempt) "
                                 "VALUES ($1, $2, $3, $4::int, $5::bigint, 0)) "
                                 "INSERT INTO sekali_test.payments "
                                 "(queue, idempotency_key, fence, pid, note) "
                                 "VALUES ($1, $2, $5::bigint, $4::int, $6) ON CONFLICT DO NOTHING",
                                 6, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        s->host->set_error(ctx, PQresultErrorMessage(res));
    PQclear(res);
    return ok ? SEKALI_OK : SEKALI_RETRY;
}

/* Read, (on the first attempt) wait for the test, then update only the
 * version read. */
static int occ(struct state *s, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    const struct sekali_host *host = job->host;
    PGconn *pg = host->pg(ctx);
    const char *name[] = { (const char *)job->body + 4 };  /* NUL-terminated since 1.3 */
    PGresult *res = PQexecParams(pg, "SELECT version FROM sekali_test.occ_rows WHERE name = $1",
                                 1, NULL, name, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        host->set_error(ctx, PQresultStatus(res) != PGRES_TUPLES_OK ? PQresultErrorMessage(res)
                                                                    : "no such occ row");
        PQclear(res);
        return SEKALI_FAIL;
    }
    char version[32];
    snprintf(version, sizeof(version), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    if (job->delivery_attempt == 1 && s->marker_dir[0] != '\0') {
        char path[600];
        snprintf(path, sizeof(path), "%s/occ.%ld", s->marker_dir, (long)getpid());
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0)
            close(fd);
        wait_for_release(s);
    }
    const char *values[] = { name[0], version };
    res = PQexecParams(pg, "UPDATE sekali_test.occ_rows SET total = total + 1, "
                           "version = version + 1 WHERE name = $1 AND version = $2::bigint",
                       2, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        host->set_error(ctx, PQresultErrorMessage(res));
        int status = sekali_sqlstate_transient(PQresultErrorField(res, PG_DIAG_SQLSTATE))
            ? SEKALI_RETRY : SEKALI_FAIL;
        PQclear(res);
        return status;
    }
    int updated = atoi(PQcmdTuples(res));
    PQclear(res);
    if (updated == 0)
        return host->conflict(ctx, "occ row changed since it was read");
    return SEKALI_OK;
}

static int effect_handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    struct state *s = state;
    if (job->body_len > 4 && memcmp(job->body, "occ:", 4) == 0) {
        int status = occ(s, job, ctx);
        if (status != SEKALI_OK)
            return status;
    }
    if (body_is(job, "pay"))
        return pay(s, job, ctx);
    if (job->body_len > 5 && memcmp(job->body, "span:", 5) == 0)
        return span(s, job, ctx);
    if ((body_is(job, "hold") || body_is(job, "hold_ask")) && s->marker_dir[0] != '\0') {
        mark(s, "hold");
        wait_for_release(s);
        if (body_is(job, "hold_ask") && s->host->abi_minor >= 5 && s->host->cancelled(ctx)) {
            mark(s, "cancelled");
            s->host->set_error(ctx, "cancelled: stopped before the effect");
            return SEKALI_FAIL;
        }
    }
    if (body_is(job, "abort"))
        abort();
    if (body_is(job, "segv"))
        raise(SIGSEGV);  /* as a wild pointer would, without undefined behaviour */
    if (body_is(job, "fail")) {
        s->host->set_error(ctx, "the job asked to fail");
        return SEKALI_FAIL;
    }
    if (body_is(job, "retry") && job->delivery_attempt == 1) {
        s->host->set_error(ctx, "the job asked to be retried");
        return SEKALI_RETRY;
    }
    if (body_is(job, "retry_always")) {
        s->host->set_error(ctx, "the job always asks to be retried");
        return SEKALI_RETRY;
    }
    if (body_is(job, "stall") && job->delivery_attempt == 1 && s->marker_dir[0] != '\0')
        stall(s);
    if (job->body_len > 6 && memcmp(job->body, "sleep:", 6) == 0) {
        char ms[16] = "";
        memcpy(ms, (const char *)job->body + 6, job->body_len - 6 < 15 ? job->body_len - 6 : 15);
        long n = atol(ms);
        struct timespec t = { .tv_sec = n / 1000, .tv_nsec = (n % 1000) * 1000000L };
        nanosleep(&t, NULL);
    }

    char pid[16], fence[24], attempt[16];
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    snprintf(fence, sizeof(fence), "%lld", (long long)job->fence);
    snprintf(attempt, sizeof(attempt), "%u", job->delivery_attempt);
    const char *values[] = { job->queue, job->idempotency_key, job->job_id, pid, fence, attempt };
    PGresult *res = PQexecParams(s->host->pg(ctx),
                                 "INSERT INTO sekali_test.effects "
                                 "(queue, idempotency_key, job_id, pid, fence, attempt) "
                                 "VALUES ($1, $2, $3, $4, $5, $6)",
                                 6, NULL, values, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        s->host->set_error(ctx, PQresultErrorMessage(res));
    PQclear(res);
    if (ok && job->body_len > 6 && memcmp(job->body, "chain:", 6) == 0) {
        char digits[16] = "";
        size_t n_digits = job->body_len - 6 < sizeof(digits) - 1 ? job->body_len - 6
                                                                  : sizeof(digits) - 1;
        memcpy(digits, (const char *)job->body + 6, n_digits);  /* bodies are not strings */
        int left = atoi(digits);
        if (left > 0) {
            char next_body[32], next_key[600];
            int len = snprintf(next_body, sizeof(next_body), "chain:%d", left - 1);
            snprintf(next_key, sizeof(next_key), "%s+", job->idempotency_key);
            struct sekali_enqueue next = {
                .struct_size = sizeof(next), .queue = job->queue, .job_type = job->job_type,
                .body = next_body, .body_len = (size_t)len, .idempotency_key = next_key,
            };
            if (job->host->abi_minor < 3 || job->host->enqueue_job(ctx, &next, NULL, 0) != 0)
                return SEKALI_RETRY;
        }
    }
    if (ok && body_is(job, "options")) {
        char key[600], resource[600], dedupe[600];
        snprintf(key, sizeof(key), "%s/later", job->idempotency_key);
        snprintf(resource, sizeof(resource), "res-%s", job->idempotency_key);
        /* Dedupe keys are global: the queue keeps runs of a test apart. */
        snprintf(dedupe, sizeof(dedupe), "dedupe-%s-%s", job->queue, job->idempotency_key);
        struct sekali_enqueue later = {
            .struct_size = sizeof(later), .queue = job->queue, .job_type = "later",
            .body = "ok", .body_len = 2, .idempotency_key = key, .resource_key = resource,
            .dedupe_key = dedupe, .run_at_ms = 4102444800000LL, .dedupe_ttl_ms = 3600000,
            .priority = 7,
        };
        if (job->host->enqueue_job(ctx, &later, NULL, 0) != 0)
            return SEKALI_RETRY;
    }
    if (ok && job->body_len > 9 && memcmp(job->body, "priority:", 9) == 0) {
        char digits[16] = "";
        size_t n_digits = job->body_len - 9 < sizeof(digits) - 1 ? job->body_len - 9
                                                                 : sizeof(digits) - 1;
        memcpy(digits, (const char *)job->body + 9, n_digits);  /* bodies are not strings */
        char key[600];
        snprintf(key, sizeof(key), "%s/later", job->idempotency_key);
        struct sekali_enqueue later = {
            .struct_size = sizeof(later), .queue = job->queue, .job_type = "later",
            .body = "ok", .body_len = 2, .idempotency_key = key,
            .run_at_ms = 4102444800000LL, .priority = atoi(digits),
        };
        if (job->host->abi_minor < 6 || job->host->enqueue_job(ctx, &later, NULL, 0) != 0)
            return SEKALI_RETRY;
    }
    char receipt[256];
    int n = snprintf(receipt, sizeof(receipt), "done by %s", pid);
    if (ok && body_is(job, "settings")) {
        res = PQexec(s->host->pg(ctx), "SELECT string_agg(name || '=' || setting, ';' ORDER BY "
                                       "name) FROM pg_settings WHERE name IN ('lock_timeout', "
                                       "'statement_timeout', 'synchronous_commit')");
        ok = PQresultStatus(res) == PGRES_TUPLES_OK;
        if (ok)
            n = snprintf(receipt, sizeof(receipt), "%s", PQgetvalue(res, 0, 0));
        PQclear(res);
    }
    s->host->set_result(ctx, receipt, (size_t)n);
    return ok ? SEKALI_OK : SEKALI_RETRY;
}

static void effect_fini(void *state)
{
    free(state);
}

SEKALI_HANDLER_DEFINE(.name = "effect", .version = "test", .check = effect_check,
                      .init = effect_init, .handle = effect_handle, .fini = effect_fini)
