/* ctl.c - sekalictl, the operator's tool: its options, its commands' help,
 * and the dispatch to the file of each command (ctl_commands.h).
 *
 *   sekalictl [-c FILE] migrate [--sql-dir DIR] [--plan]       (ctl_migrate.c)
 *   sekalictl [-c FILE] enqueue QUEUE TYPE [...] [BODY | -]   (ctl_enqueue.c)
 *   sekalictl [-c FILE] dlq (list|groups|show|replay|purge) QUEUE ... (ctl_dlq.c)
 *   sekalictl [-c FILE] serve [--listen ADDR]                  (console.c)
 *   sekalictl [-c FILE] status [--json]                        (ctl_status.c)
 *   sekalictl [-c FILE] trace KEY [--queue Q] [--json]         (ctl_trace.c)
 *   sekalictl [-c FILE] doctor [--consumer-timeout D] [--json] (ctl_doctor.c, and
 *                                                              shared/doctor*.c)
 *   sekalictl [-c FILE] verify [--queue Q] [--since T] [--letters N] [--json]
 *                                                             (ctl_verify.c)
 *   sekalictl [-c FILE] schedules [--json]                     (ctl_schedules.c)
 *   sekalictl [-c FILE] scheduled [--queue Q] [--limit N] [--json]  (ctl_scheduled.c)
 *   sekalictl [-c FILE] inflight [--json]                          (ctl_inflight.c)
 *   sekalictl [-c FILE] pause QUEUE [...] | resume QUEUE      (ctl_pause.c)
 *   sekalictl [-c FILE] cancel QUEUE KEY [--reason R] [--by N] (ctl_cancel.c)
 *   sekalictl help [COMMAND] | --help | --version
 *
 * Adding a command: a file ctl_NAME.c with its sk_ctl_NAME() declared in
 * ctl_commands.h, a row below, the Makefile's CTL list, and sekalictl(8). */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ctl_commands.h"
#include "ctl_common.h"

#ifndef SK_CONF_PATH
#define SK_CONF_PATH "/etc/sekali/sekali.yaml"
#endif
#ifndef SK_SQL_DIR
#define SK_SQL_DIR "/usr/local/share/sekali/sql"
#endif

/* Each command's synopsis and what it does: `sekalictl help COMMAND`,
 * `sekalictl COMMAND --help`, and (synopses only) the general usage. */
static const struct command {
    const char *name;
    const char *synopsis;
    const char *help;
    int (*run)(const struct sk_conf *conf, int argc, char **argv);  /* NULL: help */
} commands[] = {
    { "migrate", "migrate [--sql-dir DIR] [--plan] [--json]",
      "Apply the schema migrations (DIR/NNN_name.sql, default " SK_SQL_DIR ") not yet\n"
      "applied, each once, in name order, under an advisory lock. First prints the\n"
      "plan: each pending file, online or in one transaction, the tables it touches\n"
      "with their size, the lock it takes on each and an estimate of its time.\n"
      "  --sql-dir DIR   read the migrations from DIR (also $SEKALI_SQL_DIR)\n"
      "  --plan          print the plan only; change nothing\n"
      "  --json          print {\"plan\": [...], \"applied\": [names], \"migrations\": N}\n"
      "                  (with --plan, \"pending\": N instead of \"applied\")\n",
      sk_ctl_migrate },
    { "enqueue",
      "enqueue QUEUE TYPE [--key K] [--resource R] [--dedupe D] [--at TIME]\n"
      "          [--priority N] [--traceparent TP [--tracestate TS]] [--content-type T]\n"
      "          [--tenant T] [--direct [--id ID]] [--json] [BODY | -]",
      "Enqueue one job through the outbox (sekali.enqueue: a relay publishes it), or\n"
      "with --direct publish it straight to QUEUE and wait for the broker's confirm;\n"
      "prints the job id. The body comes from the argument, or from stdin when it is\n"
      "- or absent.\n"
      "  --key K            idempotency key (default: the job id)\n"
      "  --resource R       resource key the job's lock is taken on\n"
      "  --dedupe D         refuse a second job with dedupe key D while one is held\n"
      "  --at TIME          run at TIME (a PostgreSQL timestamptz), not now\n"
      "  --priority N       AMQP priority 0-255 (honoured up to the queue's max_priority)\n"
      "  --traceparent TP   W3C trace context the job runs in (its tracestate: --tracestate)\n"
      "  --content-type T   content type of the message (default application/json)\n"
      "  --tenant T         whose job it is: the queue's tenant_header, and its lane\n"
      "  --direct           publish to the broker at once, not through the outbox\n"
      "  --id ID            with --direct: the message id (default: a random one)\n"
      "  --json             print {\"job_id\": ID}\n",
      sk_ctl_enqueue },
    { "status", "status [--json]",
      "Per queue: workers up and consuming, ready, delayed and dead messages (the\n"
      "broker), keys processing and failed, the oldest processing key's age, the\n"
      "outbox rows pending and their lag (PostgreSQL); the relays' and janitor's\n"
      "last round (sekalid's /metrics, when metrics.listen is set).\n"
      "  --json   one JSON document\n"
      "Exits 0 when healthy, 5 when sekalid is not running or a queue has no\n"
      "consumer, 1 when a source could not be read.\n",
      sk_ctl_status },
    { "trace", "trace KEY [--queue QUEUE] [--json]",
      "Everything sekali recorded about idempotency key KEY, in time order: its\n"
      "outbox rows, its idempotency row, crashes, dead-letter actions, its dead\n"
      "letters (left in place) and its journal lines.\n"
      "  --queue QUEUE   only QUEUE (default: every queue where KEY is known)\n"
      "  --json          one JSON document\n"
      "Exits 0 when something was found, 4 when nothing was, 1 when a source could\n"
      "not be read.\n",
      sk_ctl_trace },
    { "doctor", "doctor [--consumer-timeout DURATION] [--json]",
      "Check the settings outside sekali that its guarantee rests on: the schema,\n"
      "each queue's arguments, dead-letter queue, delivery limit and timeouts,\n"
      "Redis' eviction policy, role and Sentinel quorum, PostgreSQL's synchronous\n"
      "commit and standbys, the clocks, retention against the oldest waiting job.\n"
      "Each check passes, warns or fails, with its fix (docs/doctor.md).\n"
      "  --consumer-timeout D   the broker's consumer_timeout (AMQP does not tell it;\n"
      "                         default: RabbitMQ's 30m)\n"
      "  --json                 one JSON document\n"
      "Exits 0 when every check passed, 6 when some warned, 7 when some failed.\n",
      sk_ctl_doctor },
    { "verify", "verify [--queue QUEUE] [--since T] [--letters N] [--json]",
      "Reconcile the outbox, the idempotency keys, the dead letters and the broker's\n"
      "queues over a window, and report jobs lost (enqueued, but neither completed,\n"
      "failed, dead-lettered nor waiting), stuck (processing past their lease) and\n"
      "dead letters whose key is not failed (inconsistent), with their keys.\n"
      "  --queue QUEUE   only QUEUE (default: every configured queue)\n"
      "  --since T       the window: a duration back from now (default 24h) or a time\n"
      "                  PostgreSQL reads (2026-12-01 14:00Z)\n"
      "  --letters N     check the keys of the oldest N keyed dead letters of each\n"
      "                  queue (default 1000, at most 1000000; 0: none)\n"
      "  --json          one JSON document\n"
      "Exits 0 when nothing is lost or stuck, 8 when something is, 1 when a source\n"
      "could not be read.\n",
      sk_ctl_verify },
    { "schedules", "schedules [--json]",
      "Each schedule (schedules: in the config, and those PostgreSQL holds a row for):\n"
      "its spec and queue, its last tick and next tick (UTC), the key of its last job\n"
      "and that job's state (enqueued, published, processing, completed, failed, or\n"
      "gone once retention purged it), and how many ticks were enqueued and how many\n"
      "were missed and left out (missed: skip or once).\n"
      "  --json   one JSON document\n",
      sk_ctl_schedules },
    { "scheduled", "scheduled [--queue QUEUE] [--limit N] [--json]",
      "The jobs enqueued for later (sekali.enqueue's run_at) that wait in the outbox,\n"
      "soonest first: when each runs (UTC, PostgreSQL's clock) and in how many\n"
      "seconds, its queue, idempotency key and job type.\n"
      "  --queue QUEUE   only QUEUE's\n"
      "  --limit N       at most N of them, 1 to 1000 (default 50)\n"
      "  --json          one JSON document\n",
      sk_ctl_scheduled },
    { "inflight", "inflight [--json]",
      "The jobs running now, oldest first: for how long, the queue, the worker's pid,\n"
      "whether the handler runs (handler) or sekali's own steps do (job), the attempt,\n"
      "idempotency key, job type, start (UTC) and trace id. Read from sekalid's\n"
      "metrics endpoint (metrics.listen), since an uncommitted claim is not in\n"
      "PostgreSQL; it fails when sekalid does not run.\n"
      "  --json   one JSON document: {\"now\", \"inflight\": [{\"queue\", \"pid\", \"phase\",\n"
      "           \"key\", \"job_type\", \"attempt\", \"trace_id\", \"started_at\", \"age_ms\"}]}\n",
      sk_ctl_inflight },
    { "dlq",
      "dlq list QUEUE [SELECTORS] [--after ID | --offset N] [--limit N] [--json]\n"
      "  dlq groups QUEUE [--json]\n"
      "  dlq show QUEUE (KEY | --id ID) [--json]\n"
      "  dlq replay QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] [--json]\n"
      "  dlq purge QUEUE (SELECTORS | --all) [--dry-run] [--by NAME] [--json]\n"
      "  dlq import QUEUE [--dry-run] [--scan-max N] [--json]",
      "The dead letters of QUEUE, kept in PostgreSQL (sekali.dead_letters): list,\n"
      "groups and show read them and change nothing; groups counts them by reason\n"
      "and error fingerprint (numbers and ids masked); replay re-arms each selected\n"
      "key and enqueues its job again through the outbox (a relay must run); purge\n"
      "deletes them (their keys stay failed); import moves what QUEUE.dead holds\n"
      "into the table.\n"
      "SELECTORS, all of which a letter must match:\n"
      "  --key K           the dead letters of key K (repeatable: any of them)\n"
      "  --id ID           one dead letter, by the id list prints\n"
      "  --reason R        those dead-lettered for reason R\n"
      "  --fingerprint F   those whose error has fingerprint F (see groups)\n"
      "  --all             every dead letter (replay, purge; no selector with it)\n"
      "  --dry-run         replay, purge, import: say what would be done, change nothing\n"
      "  --after ID | --offset N, --limit N   list: a page of the selected letters\n"
      "  --scan-max N      import: read at most the first N letters of QUEUE.dead\n"
      "  --by NAME         who acts, for the audit row (default: the OS user)\n"
      "  --json            one JSON document\n"
      "Exits 3 when some dead letters were refused, 4 when nothing matched.\n",
      sk_ctl_dlq },
    { "serve", "serve [--listen ADDR]",
      "Serve the operator's console (console.listen, or ADDR): the queues, the dead\n"
      "letters grouped and acted on, a key's story, in a browser and as JSON under\n"
      "/api/ (docs/console.md). Read-only without a login with console.token_file's\n"
      "token. Runs until SIGTERM or SIGINT.\n"
      "  --listen ADDR   HOST:PORT to listen on instead of console.listen\n",
      sk_ctl_serve },
    { "pause", "pause QUEUE [--reason R] [--by NAME] [--wait DURATION] [--json]",
      "Pause QUEUE on every host, until resume, across restarts (a row in PostgreSQL):\n"
      "each worker finishes the job in hand and cancels its consumer; the messages\n"
      "stay in the broker and the outbox relay goes on publishing to QUEUE. Returns\n"
      "once QUEUE has no consumer left: no job of it starts after that.\n"
      "  --reason R       why, shown by status\n"
      "  --by NAME        who pauses (default: the OS user)\n"
      "  --wait DURATION  how long to wait for the consumers to go (default 30s)\n"
      "  --json           print {\"queue\", \"state\", \"changed\", \"consumers\"}\n"
      "Exits 4 when QUEUE is not configured, 9 when consumers were left after the\n"
      "wait (the pause holds; they stop as their jobs finish).\n",
      sk_ctl_pause },
    { "resume", "resume QUEUE [--json]",
      "Resume QUEUE: its workers on every host consume again within a second or two\n"
      "(LISTEN/NOTIFY, with polling as the fallback). Resuming a queue that is not\n"
      "paused changes nothing.\n"
      "  --json   print {\"queue\", \"state\", \"changed\"}\n",
      sk_ctl_resume },
    { "cancel", "cancel QUEUE KEY [--reason R] [--by NAME] [--force] [--json]",
      "Cancel the job of idempotency key KEY in QUEUE (sekali.cancel): it will not\n"
      "run, and its unpublished outbox rows are removed; if it is running, its\n"
      "outcome is refused (transactional mode: the COMMIT is rolled back; external\n"
      "mode: the completion is fenced out). A completed job is left as it is.\n"
      "  --reason R   why, for the record (at most 500 bytes)\n"
      "  --by NAME    who cancels (default: the OS user; at most 100 bytes)\n"
      "  --force      record the cancellation of a key PostgreSQL does not know yet\n"
      "  --json       print {\"queue\", \"key\", \"outcome\"}\n"
      "Exits 0 when cancelled (or already), 10 when the job already ran, 4 when the\n"
      "key is unknown or QUEUE is not configured.\n",
      sk_ctl_cancel },
    { "help", "help [COMMAND]", "Describe COMMAND, or list the commands.\n", NULL },
};

static void usage(FILE *out)
{
    fprintf(out, "usage: sekalictl [-c FILE] COMMAND [ARGS]\n"
                 "       sekalictl help COMMAND | --help | --version\n"
                 "commands:\n");
    for (size_t i = 0; i < SK_ARRAY_LEN(commands); i++)
        fprintf(out, "  %s\n", commands[i].synopsis);
    fprintf(out, "options:\n"
                 "  -c, --config FILE   configuration file (default " SK_CONF_PATH ")\n"
                 "  -h, --help          print this help and exit\n"
                 "  -V, --version       print the version and exit\n"
                 "exit codes: 0 done, 1 runtime failure, 2 usage or configuration, 3 some\n"
                 "dead letters refused, 4 nothing matched, 5 status: not healthy, 6 doctor:\n"
                 "warnings, 7 doctor: failures, 8 verify: jobs lost or stuck, 9 pause:\n"
                 "consumers left after the wait, 10 cancel: the job already ran\n");
}

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < SK_ARRAY_LEN(commands); i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static void command_help(const struct command *c, FILE *out)
{
    fprintf(out, "usage: sekalictl [-c FILE] %s\n\n%s", c->synopsis, c->help);
}

/* sekalictl help [COMMAND] */
static int cmd_help(int argc, char **argv)
{
    if (argc == 1) {
        usage(stdout);
        return SK_CTL_OK;
    }
    const struct command *c = argc == 2 ? find_command(argv[1]) : NULL;
    if (c == NULL) {
        if (argc == 2)
            fprintf(stderr, "sekalictl: no command \"%s\"\n", argv[1]);
        usage(stderr);
        return SK_CTL_USAGE;
    }
    command_help(c, stdout);
    return SK_CTL_OK;
}

/* Whether a command's own arguments ask for its help (before any "--"). */
static bool asks_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    return false;
}

int main(int argc, char **argv)
{
    const char *path = SK_CONF_PATH;
    static const struct option options[] = {
        { "config", required_argument, NULL, 'c' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    /* "+": stop at the command, whose own options come after it. */
    while ((opt = getopt_long(argc, argv, "+c:hV", options, NULL)) != -1) {
        switch (opt) {
        case 'c': path = optarg; break;
        case 'h': usage(stdout); return SK_CTL_OK;
        case 'V': printf("sekalictl %s\n", SK_VERSION); return SK_CTL_OK;
        default: usage(stderr); return SK_CTL_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return SK_CTL_USAGE;
    }
    const char *command = argv[optind];
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    const struct command *c = find_command(command);
    if (c == NULL) {
        fprintf(stderr, "sekalictl: unknown command \"%s\"\n", command);
        usage(stderr);
        return SK_CTL_USAGE;
    }
    /* Help needs no configuration. */
    if (strcmp(command, "help") == 0)
        return cmd_help(sub_argc, sub_argv);
    if (asks_help(sub_argc, sub_argv)) {
        command_help(c, stdout);
        return SK_CTL_OK;
    }

    struct sk_conf *conf = NULL;
    struct sk_err err = { 0 };
    if (sk_conf_load(path, &conf, &err) != SK_OK) {
        fprintf(stderr, "sekalictl: %s\n", err.msg);
        return SK_CTL_USAGE;
    }
    optind = 0;  /* 0, not 1: glibc then also forgets the "+" of the first scan */
    int code = c->run(conf, sub_argc, sub_argv);
    sk_conf_free(conf);
    if (code == SK_CTL_SHOW_USAGE) {
        command_help(c, stderr);
        code = SK_CTL_USAGE;
    }
    return code;
}
