/* ctl_cancel.c - sekalictl cancel QUEUE KEY: records the key as cancelled
 * through sekali.cancel() (sql/018), so that its job never runs, or, if it
 * is running, its outcome is refused. The SQL function decides everything;
 * this file checks the arguments, which come from a user and are hostile
 * (bounded here, cleaned again by the function), and turns the answer into
 * a message and an exit code:
 *
 *   0  cancelled, already cancelled, or running (its outcome will be refused)
 *  10  the job already ran (completed) or was given up (failed): nothing changed
 *   4  QUEUE is not a queue of the configuration, or no such key in it (nothing
 *      recorded; --force records a key anyway)
 *   2  usage: an empty key, a value over its bound
 *   1  PostgreSQL could not be reached or refused */
#include <getopt.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_out.h"

#define REASON_MAX 500  /* bytes; sekali.cancel() keeps at most as many characters */
#define BY_MAX     100

static const struct {
    const char *outcome;  /* what sekali.cancel() returns */
    int         code;
    const char *says;
} outcomes[] = {
    { "cancelled", SK_CTL_OK, "cancelled: it will not run" },
    { "running", SK_CTL_OK,
      "cancelled while running: its outcome will be refused and not recorded" },
    { "already cancelled", SK_CTL_OK, "already cancelled: nothing changed" },
    { "already completed", SK_CTL_ALREADY_RAN, "it already ran (completed): nothing changed" },
    { "already failed", SK_CTL_ALREADY_RAN,
      "it was already given up (failed, dead-lettered): nothing changed" },
    { "unknown", SK_CTL_NOT_FOUND,
      "no such key in this queue: nothing recorded (a job published straight to the broker "
      "is known only once delivered; --force records the cancellation anyway)" },
};

static int check(const struct sk_conf *conf, const char *queue, const char *key,
                 const char *reason, const char *by);
static int tell(const char *queue, const char *key, const char *outcome, bool json);
static bool bounded(const char *what, const char *value, size_t max);

int sk_ctl_cancel(const struct sk_conf *conf, int argc, char **argv)
{
    static const struct option options[] = {
        { "reason", required_argument, NULL, 'r' },
        { "by", required_argument, NULL, 'b' },
        { "force", no_argument, NULL, 'f' },
        { "json", no_argument, NULL, 'j' },
        { NULL, 0, NULL, 0 },
    };
    const char *reason = NULL, *by = NULL;
    bool force = false, json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'r': reason = optarg; break;
        case 'b': by = optarg; break;
        case 'f': force = true; break;
        case 'j': json = true; break;
        default: return SK_CTL_SHOW_USAGE;
        }
    }
    if (argc - optind != 2)
        return SK_CTL_SHOW_USAGE;
    const char *queue = argv[optind], *key = argv[optind + 1];
    int code = check(conf, queue, key, reason, by);
    if (code != SK_CTL_OK)
        return code;
    char os_user[256];
    if (by == NULL) {
        struct passwd *pw = getpwuid(geteuid());
        snprintf(os_user, sizeof(os_user), "%s", pw != NULL ? pw->pw_name : "uid?");
        by = os_user;
    }

    PGconn *pg = sk_ctl_pg_connect(conf);
    if (pg == NULL)
        return SK_CTL_FAILED;
    const char *values[] = { queue, key, reason, by, force ? "true" : "false" };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.cancel($1, $2, $3, $4, $5::boolean)", .n_params = 5,
        .values = values, .one_row = true, .what = "sekali.cancel",
    };
    PGresult *res;
    if (!sk_ctl_pg_exec(pg, &st, &res)) {
        PQfinish(pg);
        return SK_CTL_FAILED;
    }
    code = tell(queue, key, PQgetvalue(res, 0, 0), json);
    PQclear(res);
    PQfinish(pg);
    return code;
}

/* The arguments a user gave, which are hostile: the queue must be
 * configured, the key not empty, each value within its bound. SK_CTL_OK,
 * or the exit code after saying why. */
static int check(const struct sk_conf *conf, const char *queue, const char *key,
                 const char *reason, const char *by)
{
    if (sk_conf_queue(conf, queue) == NULL) {
        fprintf(stderr, "sekalictl: cancel: no queue named ");
        sk_ctl_put_tstr(stderr, queue);
        fprintf(stderr, " in the configuration\n");
        return SK_CTL_NOT_FOUND;  /* as pause and resume answer it */
    }
    if (key[0] == '\0') {
        fprintf(stderr, "sekalictl: cancel: the key is empty\n");
        return SK_CTL_USAGE;
    }
    if (!bounded("the key", key, SK_KEY_MAX) || !bounded("--reason", reason, REASON_MAX) ||
        !bounded("--by", by, BY_MAX))
        return SK_CTL_USAGE;
    return SK_CTL_OK;
}

/* Says what sekali.cancel() answered (outcome), as JSON or a line; returns
 * the exit code the answer means. */
static int tell(const char *queue, const char *key, const char *outcome, bool json)
{
    int code = SK_CTL_FAILED;
    const char *says = "unexpected answer from sekali.cancel()";
    for (size_t i = 0; i < SK_ARRAY_LEN(outcomes); i++) {
        if (strcmp(outcomes[i].outcome, outcome) == 0) {
            code = outcomes[i].code;
            says = outcomes[i].says;
        }
    }
    if (json) {
        printf("{\"queue\":");
        sk_ctl_put_jstr(stdout, queue);
        printf(",\"key\":");
        sk_ctl_put_jstr(stdout, key);
        printf(",\"outcome\":");
        sk_ctl_put_jstr(stdout, outcome);
        printf("}\n");
    } else {
        FILE *out = code == SK_CTL_OK ? stdout : stderr;
        fprintf(out, "%s", code == SK_CTL_OK ? "" : "sekalictl: cancel: ");
        sk_ctl_put_tstr(out, queue);
        fprintf(out, "/");
        sk_ctl_put_tstr(out, key);
        fprintf(out, ": %s\n", says);
    }
    return code;
}

/* Refuses (with a message) a value longer than max bytes; NULL passes. */
static bool bounded(const char *what, const char *value, size_t max)
{
    if (value == NULL)
        return true;
    size_t len = strlen(value);
    if (len <= max)
        return true;
    fprintf(stderr, "sekalictl: cancel: %s is %zu bytes, at most %zu are allowed\n", what, len,
            max);
    return false;
}
