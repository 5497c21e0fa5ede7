/* ctl_pause.c - sekalictl pause and resume: a queue's pause, for every host.
 *
 *   sekalictl pause QUEUE [--reason R] [--by NAME] [--wait DURATION] [--json]
 *   sekalictl resume QUEUE [--json]
 *
 * The pause is a row in PostgreSQL (sekali.pause(), sql/019) that every
 * worker reads, whichever host it runs on, and that a restart keeps. A
 * worker obeys between jobs: it finishes the job in hand, then cancels its
 * consumer. So `pause` returns only once the queue has no consumer left
 * (the broker's count covers every host): from then on no job of the queue
 * starts until `resume`. A consumer that outlasts --wait (a long job, or a
 * sekalid too old to know pauses) is reported with exit 9; the pause
 * stands either way. */
#include <getopt.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "clock.h"
#include "config_value.h"
#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_out.h"
#include "ctl_reports.h"

#define WAIT_DEFAULT_MS (30 * 1000)
#define WAIT_STEP_MS    100

static int wait_for_consumers(const struct sk_conf *conf, const char *queue, uint64_t wait_ms,
                              uint32_t *left, struct sk_err *err);
static void put_result(FILE *out, bool json, const char *queue, const char *state,
                       bool changed, long long consumers);

int sk_ctl_pause(const struct sk_conf *conf, int argc, char **argv)
{
    static const struct option options[] = {
        { "reason", required_argument, NULL, 'r' },
        { "by", required_argument, NULL, 'b' },
        { "wait", required_argument, NULL, 'w' },
        { "json", no_argument, NULL, 'j' },
        { NULL, 0, NULL, 0 },
    };
    const char *reason = NULL, *by = NULL;
    uint64_t wait_ms = WAIT_DEFAULT_MS;
    bool json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        struct sk_err err = { 0 };
        switch (opt) {
        case 'r': reason = optarg; break;
        case 'b': by = optarg; break;
        case 'w':
            if (sk_conf_value_parse_duration(optarg, &wait_ms, &err) != SK_OK) {
                fprintf(stderr, "sekalictl: pause --wait: %s\n", err.msg);
                return SK_CTL_USAGE;
            }
            break;
        case 'j': json = true; break;
        default: return SK_CTL_SHOW_USAGE;
        }
    }
    if (argc - optind != 1)
        return SK_CTL_SHOW_USAGE;
    const char *queue = argv[optind];
    /* A pause of a name no worker consumes would be obeyed by nobody. */
    if (sk_conf_queue(conf, queue) == NULL) {
        fprintf(stderr, "sekalictl: pause: ");
        sk_ctl_put_tstr(stderr, queue);
        fprintf(stderr, " is not a queue of this configuration\n");
        return SK_CTL_NOT_FOUND;
    }
    char os_user[256];
    struct passwd *pw = getpwuid(geteuid());
    snprintf(os_user, sizeof(os_user), "%s", pw != NULL ? pw->pw_name : "uid?");
    return sk_ctl_pause_report(conf, queue, reason, by != NULL ? by : os_user, wait_ms, json,
                               stdout);
}

/* Runs sekali.pause() or sekali.resume() on a connection taken for it; both
 * answer whether they changed the queue's state. */
static bool call_changed(const struct sk_conf *conf, const struct sk_pg_stmt *st, bool *changed)
{
    PGconn *pg = sk_ctl_pg_take(conf);
    if (pg == NULL)
        return false;
    PGresult *res;
    bool ok = sk_ctl_pg_exec(pg, st, &res);
    *changed = ok && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    if (ok)
        PQclear(res);
    sk_ctl_pg_give(pg);
    return ok;
}

int sk_ctl_pause_report(const struct sk_conf *conf, const char *queue, const char *reason,
                        const char *by, uint64_t wait_ms, bool json, FILE *out)
{
    const char *values[] = { queue, reason, by };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.pause($1, $2, $3)", .n_params = 3, .values = values,
        .one_row = true, .what = "sekali.pause",
    };
    bool changed;
    if (!call_changed(conf, &st, &changed))
        return SK_CTL_FAILED;

    uint32_t left = 0;
    struct sk_err err = { 0 };
    if (wait_for_consumers(conf, queue, wait_ms, &left, &err) != SK_OK) {
        fprintf(stderr, "sekalictl: pause: %s is paused, but its consumers cannot be counted: "
                "%s\n", queue, err.msg);
        return SK_CTL_FAILED;
    }
    if (left > 0) {
        put_result(out, json, queue, "pausing", changed, left);
        fprintf(stderr, "sekalictl: pause: %s is paused, but %u consumer%s still subscribed "
                "after the wait (a job still running, or a consumer that is not a sekalid "
                "knowing pauses); they stop taking jobs as they finish\n", queue, left,
                left == 1 ? " is" : "s are");
        return SK_CTL_WAITING;
    }
    put_result(out, json, queue, "paused", changed, 0);
    return SK_CTL_OK;
}

int sk_ctl_resume(const struct sk_conf *conf, int argc, char **argv)
{
    bool json;
    if (!sk_ctl_json_option(argc, argv, &json) || argc - optind != 1)
        return SK_CTL_SHOW_USAGE;
    return sk_ctl_resume_report(conf, argv[optind], json, stdout);
}

int sk_ctl_resume_report(const struct sk_conf *conf, const char *queue, bool json, FILE *out)
{
    const char *values[] = { queue };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.resume($1)", .n_params = 1, .values = values,
        .one_row = true, .what = "sekali.resume",
    };
    bool changed;
    if (!call_changed(conf, &st, &changed))
        return SK_CTL_FAILED;
    /* Resuming a queue that was not paused changes nothing and is no
     * error: a runbook may resume unconditionally. */
    put_result(out, json, queue, "running", changed, -1);
    return SK_CTL_OK;
}

/* Polls the queue's consumer count (a passive declare: creates nothing)
 * until it is 0 or wait_ms passed; *left is the last count. */
static int wait_for_consumers(const struct sk_conf *conf, const char *queue, uint64_t wait_ms,
                              uint32_t *left, struct sk_err *err)
{
    struct sk_broker *b = NULL;
    int rc = sk_ctl_broker_take(conf, &b, err);
    int64_t until = sk_now_ms() + (int64_t)wait_ms;
    while (rc == SK_OK) {
        bool exists;
        uint32_t messages;
        rc = sk_broker_queue_probe(b, queue, &exists, &messages, left, err);
        if (rc != SK_OK || *left == 0 || sk_now_ms() >= until)
            break;
        sk_sleep_ms(WAIT_STEP_MS);
    }
    sk_ctl_broker_give(b);
    return rc;
}

static void put_result(FILE *out, bool json, const char *queue, const char *state,
                       bool changed, long long consumers)
{
    if (json) {
        fprintf(out, "{\"queue\":");
        sk_ctl_put_jstr(out, queue);
        fprintf(out, ",\"state\":\"%s\",\"changed\":%s", state, changed ? "true" : "false");
        if (consumers >= 0)
            fprintf(out, ",\"consumers\":%lld", consumers);
        fprintf(out, "}\n");
        return;
    }
    sk_ctl_put_tstr(out, queue);
    if (strcmp(state, "running") == 0)
        fprintf(out, changed ? ": resumed\n" : ": was not paused\n");
    else if (strcmp(state, "paused") == 0)
        fprintf(out, changed ? ": paused; no consumer left\n"
                       : ": was already paused; no consumer left\n");
    else
        fprintf(out, ": paused; %lld consumer%s left\n", consumers, consumers == 1 ? "" : "s");
}
