/* console_api.c - the console's JSON API under /api/ (docs/console.md): the
 * reports of sekalictl (ctl_reports.h) run in this process, their JSON
 * written straight into the answer, so the console and `sekalictl --json`
 * cannot drift apart. Each request is bounded: a page of at most 100
 * letters, a body preview of 64 KiB. Dead letters are read from
 * sekali.dead_letters, never from the broker, so no GET changes them.
 *
 *   GET  /api/status                      sekalictl status --json
 *   GET  /api/rates                       console_rates.c
 *   GET  /api/dlq/groups?queue=Q          sekalictl dlq groups Q --json
 *   GET  /api/dlq/list?queue=Q&...        sekalictl dlq list Q ... --json (offset|after, limit)
 *   GET  /api/dlq/show?queue=Q&key=K|id=N sekalictl dlq show Q K|--id N --json
 *   GET  /api/trace?key=K[&queue=Q]       sekalictl trace K --json
 *   POST /api/dlq/replay, /api/dlq/purge  sekalictl dlq replay|purge ... --json
 *   GET  /api/schedules                   sekalictl schedules --json
 *   GET  /api/scheduled[?queue=Q&limit=N]  sekalictl scheduled --json
 *   GET  /api/inflight                    sekalictl inflight --json
 *   GET  /api/retries                     retries in delay queues, per bucket (ctl_delays.c)
 *   GET  /api/history?queue=Q&hours=H     outcomes per minute (console_history.c)
 *   POST /api/pause (queue, reason)       sekalictl pause Q --reason R --by OPERATOR --json
 *   POST /api/resume (queue)              sekalictl resume Q --json */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "console.h"
#include "ctl_common.h"
#include "ctl_delays.h"
#include "ctl_reports.h"

#define PAGE_DEFAULT   50
#define PAGE_MAX       100
#define OFFSET_MAX     100000000
#define PREVIEW        (64 * 1024)
#define ACTION_WAIT_S  60
/* A pause answers once the queue's consumers are gone, or after this long
 * with state "pausing" (a job still running): an HTTP thread should not
 * wait out sekalictl's 30 s. */
#define PAUSE_WAIT_MS  (10 * 1000)
#define REASON_MAX     200

/* A number argument within [0, max], or def when absent; false: bad. */
static bool number(struct sk_console_call *c, const char *name, size_t def, size_t max,
                   size_t *out)
{
    const char *s = sk_console_arg(c, name);
    *out = def;
    if (s == NULL || s[0] == '\0')
        return true;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || s[0] == '-' || v > max)
        return false;
    *out = (size_t)v;
    return true;
}

/* Only the queues this configuration serves: the console probes nothing
 * else on the broker. */
static const char *queue_arg(struct sk_console_call *c)
{
    const char *q = sk_console_arg(c, "queue");
    return q != NULL && sk_conf_queue(c->con->conf, q) != NULL ? q : NULL;
}

static bool lock_dlq(struct sk_console_call *c, int seconds)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    if (pthread_mutex_timedlock(&c->con->dlq_lock, &until) == 0)
        return true;
    sk_console_fail(c, 503, "busy: another dead-letter action is running; try again");
    return false;
}

/* Runs call, a report writing to `out`, into doc_ (len_ bytes) and its
 * code into code_: how every report of this file begins. */
#define RUN_INTO_DOC(c, call)                                            \
        char *doc_ = NULL;                                               \
        size_t len_ = 0;                                                 \
        FILE *out = open_memstream(&doc_, &len_);                        \
        if (out == NULL)                                                 \
            return sk_console_fail(c, 500, "out of memory");             \
        int code_ = (call);                                              \
        fclose(out)

/* Runs a report into the answer. */
#define REPORT(c, call)                                                  \
    do {                                                                 \
        RUN_INTO_DOC(c, call);                                           \
        sk_console_json(c, code_ == SK_CTL_USAGE ? 400 : 200, doc_, len_);  \
    } while (0)

/* A report that may fail to reach a server: it then printed nothing (its
 * error went to the console's log), so the answer says so instead. */
#define ACTION(c, call)                                                  \
    do {                                                                 \
        RUN_INTO_DOC(c, call);                                           \
        if (code_ == SK_CTL_FAILED || len_ == 0) {                       \
            free(doc_);                                                  \
            return sk_console_fail(c, 502, "PostgreSQL or RabbitMQ could not be reached or " \
                                   "refused (the console's log says why)");              \
        }                                                                \
        sk_console_json(c, 200, doc_, len_);                             \
    } while (0)

static void api_schedules(struct sk_console_call *c)
{
    ACTION(c, sk_ctl_schedules_report(c->con->conf, true, out));
}

static void api_scheduled(struct sk_console_call *c)
{
    const char *queue = sk_console_arg(c, "queue");
    size_t limit;
    if (queue != NULL && queue[0] == '\0')
        queue = NULL;
    if (queue != NULL && sk_conf_queue(c->con->conf, queue) == NULL)
        return sk_console_fail(c, 400, "queue: not a queue of this configuration");
    if (!number(c, "limit", PAGE_DEFAULT, SK_CTL_SCHEDULED_MAX, &limit) || limit == 0)
        return sk_console_fail(c, 400, "limit: 1 to 1000");
    ACTION(c, sk_ctl_scheduled_report(c->con->conf, queue, limit, true, out));
}

/* Not ACTION(): what fails here is sekalid's metrics endpoint, and the
 * answer should say so. */
static void api_inflight(struct sk_console_call *c)
{
    RUN_INTO_DOC(c, sk_ctl_inflight_report(c->con->conf, true, out));
    if (code_ != SK_CTL_OK || len_ == 0) {
        free(doc_);
        return sk_console_fail(c, 502, "sekalid's metrics endpoint (metrics.listen) could not "
                               "be reached: it alone knows the jobs in flight");
    }
    sk_console_json(c, 200, doc_, len_);
}

/* POST /api/pause, /api/resume: the operator of the session is recorded as
 * `sekalictl pause --by` records it. */
static void api_pause(struct sk_console_call *c, bool pause)
{
    if (!sk_console_may_act(c))
        return;
    const char *queue = queue_arg(c);
    if (queue == NULL)
        return sk_console_fail(c, 400, "queue: not a queue of this configuration");
    if (!pause) {
        ACTION(c, sk_ctl_resume_report(c->con->conf, queue, true, out));
        return;
    }
    const char *reason = sk_console_arg(c, "reason");
    if (reason != NULL && reason[0] == '\0')
        reason = NULL;
    if (reason != NULL && strlen(reason) > REASON_MAX)
        return sk_console_fail(c, 400, "reason: at most 200 bytes");
    ACTION(c, sk_ctl_pause_report(c->con->conf, queue, reason, c->operator, PAUSE_WAIT_MS,
                                  true, out));
}

/* What the broker could not tell is null in the document, which is still
 * sent (with 502): the page shows the error beside the queues' names. */
static void api_retries(struct sk_console_call *c)
{
    RUN_INTO_DOC(c, sk_ctl_retries_report(c->con->conf, out));
    sk_console_json(c, code_ == SK_CTL_OK ? 200 : 502, doc_, len_);
}

static void api_status(struct sk_console_call *c)
{
    REPORT(c, sk_ctl_status_report(c->con->conf, true, out));
}

static void api_trace(struct sk_console_call *c)
{
    const char *key = sk_console_arg(c, "key"), *queue = sk_console_arg(c, "queue");
    if (key == NULL || key[0] == '\0' || strlen(key) > SK_KEY_MAX)
        return sk_console_fail(c, 400, "key: 1 to 512 bytes");
    if (queue != NULL && queue[0] == '\0')
        queue = NULL;
    if (queue != NULL && sk_conf_queue(c->con->conf, queue) == NULL)
        return sk_console_fail(c, 400, "queue: not a queue of this configuration");
    REPORT(c, sk_ctl_trace_report(c->con->conf, key, queue, true, 0, out));
}

/* The selectors of list, replay and purge: reason, fingerprint, key(s), all. */
static bool selectors(struct sk_console_call *c, struct sk_ctl_dlq_req *req, const char **keys)
{
    req->reason = sk_console_arg(c, "reason");
    req->fingerprint = sk_console_arg(c, "fingerprint");
    if (req->reason != NULL && req->reason[0] == '\0')
        req->reason = NULL;
    if (req->fingerprint != NULL && req->fingerprint[0] == '\0')
        req->fingerprint = NULL;
    req->keys = keys;
    if (c->post) {
        req->n_keys = sk_console_args(c, "key", keys, SK_CONSOLE_KEYS_MAX);
    } else {
        const char *k = sk_console_arg(c, "key");
        if (k != NULL && k[0] != '\0') {
            keys[0] = k;
            req->n_keys = 1;
        }
    }
    const char *all = sk_console_arg(c, "all");
    req->all = all != NULL && strcmp(all, "1") == 0;
    return true;
}

static void api_dlq(struct sk_console_call *c, const char *command)
{
    static const char *none[1];
    const char *keys[SK_CONSOLE_KEYS_MAX];
    struct sk_ctl_dlq_req req = { .command = command, .json = true, .preview = PREVIEW,
                                  .keys = none };
    bool writes = strcmp(command, "replay") == 0 || strcmp(command, "purge") == 0;
    if (writes && !sk_console_may_act(c))
        return;
    if (!writes && c->post)
        return sk_console_fail(c, 405, "use GET");
    if ((req.queue = queue_arg(c)) == NULL)
        return sk_console_fail(c, 400, "queue: not a queue of this configuration");
    int operands = 0;
    if (strcmp(command, "list") == 0) {
        selectors(c, &req, keys);
        size_t after = 0;
        if (!number(c, "offset", 0, OFFSET_MAX, &req.offset) ||
            !number(c, "limit", PAGE_DEFAULT, PAGE_MAX, &req.limit) ||
            !number(c, "after", 0, SIZE_MAX, &after) || (after > 0 && req.offset > 0))
            return sk_console_fail(c, 400, "offset or after, and limit (at most 100), are "
                                "whole numbers");
        req.after = after;
        if (req.limit == 0)
            req.limit = PAGE_DEFAULT;
    } else if (strcmp(command, "groups") == 0) {
    } else if (strcmp(command, "show") == 0) {
        /* By key, or by id: a malformed letter has no key. */
        const char *k = sk_console_arg(c, "key");
        size_t id = 0;
        if (!number(c, "id", 0, SIZE_MAX, &id))
            return sk_console_fail(c, 400, "id: a whole number");
        req.id = id;
        if (id == 0 && (k == NULL || k[0] == '\0'))
            return sk_console_fail(c, 400, "key or id: which dead letter");
        if (id == 0) {
            keys[0] = k;
            req.keys = keys;
            req.n_keys = 1;
            operands = 1;
        }
    } else {
        selectors(c, &req, keys);
        const char *dry = sk_console_arg(c, "dry_run");
        req.dry_run = dry != NULL && strcmp(dry, "1") == 0;
        req.by = c->operator;
    }
    if (!sk_ctl_dlq_req_ok(&req, operands))
        return sk_console_fail(c, 400, writes ? "an action takes all=1 or selectors (reason, "
                            "fingerprint, key)" : "bad arguments");
    if (!writes) {
        REPORT(c, sk_ctl_dlq_run(c->con->conf, &req, out));
        return;
    }
    if (!lock_dlq(c, ACTION_WAIT_S))
        return;
    REPORT(c, sk_ctl_dlq_run(c->con->conf, &req, out));
    pthread_mutex_unlock(&c->con->dlq_lock);
}

bool sk_console_api(struct sk_console_call *c)
{
    const char *api = c->path + strlen("/api/");
    bool get = !c->post;
    if (strcmp(api, "dlq/replay") == 0 || strcmp(api, "dlq/purge") == 0) {
        api_dlq(c, api + 4);  /* refuses a GET itself, with nothing done */
        return true;
    }
    if (strcmp(api, "pause") == 0 || strcmp(api, "resume") == 0) {
        api_pause(c, api[0] == 'p');  /* sk_console_may_act() refuses a GET */
        return true;
    }
    if (!get && (strcmp(api, "status") == 0 || strcmp(api, "rates") == 0 ||
                 strncmp(api, "dlq/", 4) == 0 || strcmp(api, "trace") == 0 ||
                 strcmp(api, "schedules") == 0 || strcmp(api, "scheduled") == 0 ||
                 strcmp(api, "inflight") == 0 || strcmp(api, "retries") == 0 ||
                 strcmp(api, "history") == 0)) {
        sk_console_fail(c, 405, "use GET");
        return true;
    }
    if (strcmp(api, "status") == 0)
        api_status(c);
    else if (strcmp(api, "rates") == 0)
        sk_console_rates_json(c->con->rates, c);
    else if (strcmp(api, "trace") == 0)
        api_trace(c);
    else if (strcmp(api, "schedules") == 0)
        api_schedules(c);
    else if (strcmp(api, "scheduled") == 0)
        api_scheduled(c);
    else if (strcmp(api, "inflight") == 0)
        api_inflight(c);
    else if (strcmp(api, "retries") == 0)
        api_retries(c);
    else if (strcmp(api, "history") == 0)
        sk_console_history(c);
    else if (strcmp(api, "dlq/groups") == 0 || strcmp(api, "dlq/list") == 0 ||
             strcmp(api, "dlq/show") == 0)
        api_dlq(c, api + 4);
    else
        return false;
    return true;
}
