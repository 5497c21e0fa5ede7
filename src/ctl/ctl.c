/* ctl.c - sekalictl, the operator's tool: apply the schema, enqueue a job;
 * the dead-letter commands live in ctl_dlq.c.
 *
 *   sekalictl [-c FILE] migrate [--sql-dir DIR]
 *   sekalictl [-c FILE] enqueue QUEUE TYPE [--key K] [--resource R] [--dedupe D]
 *                               [--at TIME] [--direct [--id ID]] [BODY | -]
 *   sekalictl [-c FILE] dlq (list|show|replay|purge) QUEUE ...
 *   sekalictl [-c FILE] status [--json]                   (ctl_status.c)
 *   sekalictl [-c FILE] trace KEY [--queue Q] [--json]    (ctl_trace.c)
 *   sekalictl help [COMMAND] | --help | --version
 *
 * Migrations are the files DIR/NNN_name.sql, applied in name order, each in
 * its own transaction together with its row in sekali.schema_migrations, under
 * an advisory lock so that two hosts migrating at once do not race. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "broker.h"
#include "config.h"
#include "ctl.h"
#include "pg.h"

#ifndef SK_CONF_PATH
#define SK_CONF_PATH "/etc/sekali/sekali.yaml"
#endif
#ifndef SK_SQL_DIR
#define SK_SQL_DIR "/usr/local/share/sekali/sql"
#endif

/* Any fixed number works; it only has to be the same for every sekalictl. */
#define MIGRATION_LOCK_ID 0x73656b616c69LL  /* "sekali" */

static int run_command(const struct sk_conf *conf, const char *command, int argc, char **argv);
static int cmd_migrate(const struct sk_conf *conf, int argc, char **argv);
static bool migrate_args(int argc, char **argv, const char **dir, bool *json);
static bool migrations_begin(PGconn *pg);
static void print_applied(const char *name, bool json, int before);
static bool migration_done(PGconn *pg, const char *name, bool *done);
static bool migration_apply(PGconn *pg, const char *dir, const char *name);
static int cmd_enqueue(const struct sk_conf *conf, int argc, char **argv);
static void print_job_id(const char *id, bool json)
{
    if (json) {
        printf("{\"job_id\":");
        sk_ctl_put_jstr(stdout, id);
        printf("}\n");
    } else {
        printf("%s\n", id);
    }
}

static int enqueue_outbox(const struct sk_conf *conf, const char *queue,
                          const struct sk_message *msg, const char *dedupe, const char *run_at,
                          bool json);
static void print_job_id(const char *id, bool json);
static bool read_body(const char *arg, struct sk_message *msg, char **body);
static int enqueue_direct(const struct sk_conf *conf, const char *queue,
                          const struct sk_message *msg, bool json);
static bool exec_ok(PGconn *pg, const char *sql, const char *what);
static bool exec_stmt(PGconn *pg, const struct sk_pg_stmt *st, PGresult **out);
static char *read_all(FILE *f, size_t *len);
static int only_sql(const struct dirent *d);

/* Each command's synopsis and what it does: `sekalictl help COMMAND`,
 * `sekalictl COMMAND --help`, and (synopses only) the general usage. */
static const struct command {
    const char *name;
    const char *synopsis;
    const char *help;
} commands[] = {
    { "migrate", "migrate [--sql-dir DIR] [--json]",
      "Apply the schema migrations (DIR/NNN_name.sql, default " SK_SQL_DIR ") not yet\n"
      "applied, each once, in name order, under an advisory lock.\n"
      "  --sql-dir DIR   read the migrations from DIR (also $SEKALI_SQL_DIR)\n"
      "  --json          print {\"applied\": [names], \"migrations\": N}\n" },
    { "enqueue",
      "enqueue QUEUE TYPE [--key K] [--resource R] [--dedupe D] [--at TIME]\n"
      "          [--content-type T] [--direct [--id ID]] [--json] [BODY | -]",
      "Enqueue one job through the outbox (sekali.enqueue: a relay publishes it), or\n"
      "with --direct publish it straight to QUEUE and wait for the broker's confirm;\n"
      "prints the job id. The body comes from the argument, or from stdin when it is\n"
      "- or absent.\n"
      "  --key K            idempotency key (default: the job id)\n"
      "  --resource R       resource key the job's lock is taken on\n"
      "  --dedupe D         refuse a second job with dedupe key D while one is held\n"
      "  --at TIME          run at TIME (a PostgreSQL timestamptz), not now\n"
      "  --content-type T   content type of the message (default application/json)\n"
      "  --direct           publish to the broker at once, not through the outbox\n"
      "  --id ID            with --direct: the message id (default: a random one)\n"
      "  --json             print {\"job_id\": ID}\n" },
    { "status", "status [--json]",
      "Per queue: workers up and consuming, ready, delayed and dead messages (the\n"
      "broker), keys processing and failed, the oldest processing key's age, the\n"
      "outbox rows pending and their lag (PostgreSQL); the relays' and janitor's\n"
      "last round (sekalid's /metrics, when metrics.listen is set).\n"
      "  --json   one JSON document\n"
      "Exits 0 when healthy, 5 when sekalid is not running or a queue has no\n"
      "consumer, 1 when a source could not be read.\n" },
    { "trace", "trace KEY [--queue QUEUE] [--json]",
      "Everything sekali recorded about idempotency key KEY, in time order: its\n"
      "outbox rows, its idempotency row, crashes, dead-letter actions, its dead\n"
      "letters (left in place) and its journal lines.\n"
      "  --queue QUEUE   only QUEUE (default: every queue where KEY is known)\n"
      "  --json          one JSON document\n"
      "Exits 0 when something was found, 4 when nothing was, 1 when a source could\n"
      "not be read.\n" },
    { "dlq",
      "dlq list QUEUE [--json]\n"
      "  dlq show QUEUE KEY [--json]\n"
      "  dlq replay QUEUE (--key K | --reason R | --all) [--by NAME] [--json]\n"
      "  dlq purge QUEUE (--key K | --reason R | --all) [--by NAME] [--json]",
      "The dead letters of QUEUE.dead: list and show leave them in place; replay\n"
      "re-arms each selected key and enqueues its job again through the outbox (a\n"
      "relay must run); purge removes them (their keys stay failed).\n"
      "  --key K      the dead letters of key K\n"
      "  --reason R   those dead-lettered for reason R\n"
      "  --all        every dead letter\n"
      "  --by NAME    who acts, for the audit row (default: the OS user)\n"
      "  --json       one JSON document\n"
      "Exits 3 when some dead letters were refused, 4 when nothing matched.\n" },
    { "help", "help [COMMAND]", "Describe COMMAND, or list the commands.\n" },
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
                 "dead letters refused, 4 nothing matched, 5 status: not healthy\n");
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
    int code = run_command(conf, command, sub_argc, sub_argv);
    sk_conf_free(conf);
    return code;
}

static int run_command(const struct sk_conf *conf, const char *command, int argc, char **argv)
{
    if (strcmp(command, "migrate") == 0)
        return cmd_migrate(conf, argc, argv);
    if (strcmp(command, "enqueue") == 0)
        return cmd_enqueue(conf, argc, argv);
    if (strcmp(command, "status") == 0)
        return sk_ctl_status(conf, argc, argv);
    if (strcmp(command, "trace") == 0)
        return sk_ctl_trace(conf, argc, argv);
    return sk_ctl_dlq(conf, argc, argv);
}

static int cmd_migrate(const struct sk_conf *conf, int argc, char **argv)
{
    const char *dir = getenv("SEKALI_SQL_DIR") != NULL ? getenv("SEKALI_SQL_DIR") : SK_SQL_DIR;
    bool json = false, opened = false;
    if (!migrate_args(argc, argv, &dir, &json)) {
        command_help(find_command("migrate"), stderr);
        return SK_CTL_USAGE;
    }
    struct dirent **files = NULL;
    int n = scandir(dir, &files, only_sql, alphasort);
    if (n < 0) {
        fprintf(stderr, "sekalictl: cannot read %s: %s\n", dir, strerror(errno));
        return 1;
    }
    PGconn *pg = sk_ctl_pg_connect(conf);
    int code = 1;
    if (pg == NULL || !migrations_begin(pg))
        goto out;

    int applied = 0;
    if (json) {
        printf("{\"applied\":[");
        opened = true;
    }
    for (int i = 0; i < n; i++) {
        const char *name = files[i]->d_name;
        bool done;
        if (!migration_done(pg, name, &done))
            goto out;
        if (done)
            continue;
        if (!migration_apply(pg, dir, name))
            goto out;
        print_applied(name, json, applied++);
    }
    if (json)
        printf("],\"migrations\":%d}\n", n);
    else if (applied == 0)
        printf("schema is up to date (%d migrations)\n", n);
    code = 0;

out:
    /* A failure halfway still closes the document, listing what was applied. */
    if (opened && code != 0)
        printf("],\"migrations\":%d,\"failed\":true}\n", n);
    PQfinish(pg);
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
    return code;
}

/* One line, or one element of the JSON document's list. */
static void print_applied(const char *name, bool json, int before)
{
    if (json) {
        printf("%s", before > 0 ? "," : "");
        sk_ctl_put_jstr(stdout, name);
    } else {
        printf("applied %s\n", name);
    }
}

/* false: a usage error. */
static bool migrate_args(int argc, char **argv, const char **dir, bool *json)
{
    static const struct option options[] = { { "sql-dir", required_argument, NULL, 'd' },
                                             { "json", no_argument, NULL, 'j' },
                                             { NULL, 0, NULL, 0 } };
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (opt == 'j')
            *json = true;
        else if (opt == 'd')
            *dir = optarg;
        else
            return false;
    }
    return optind == argc;
}

/* Takes the migration lock and makes sure the table of applied versions
 * exists. The session is sekalid's (the same dial), but a migration waits
 * for its locks as long as it takes (behind another migrate, or a table a
 * long transaction holds) instead of failing after a claim's timeout. */
static bool migrations_begin(PGconn *pg)
{
    char lock_sql[96];
    snprintf(lock_sql, sizeof(lock_sql), "SELECT pg_advisory_lock(%lld)", MIGRATION_LOCK_ID);
    return exec_ok(pg, "SET lock_timeout = 0", "SET lock_timeout") &&
           exec_ok(pg, lock_sql, "pg_advisory_lock") &&
           exec_ok(pg, "CREATE SCHEMA IF NOT EXISTS sekali;"
                       "CREATE TABLE IF NOT EXISTS sekali.schema_migrations ("
                       "  version text PRIMARY KEY,"
                       "  applied_at timestamptz NOT NULL DEFAULT now())",
                   "create sekali.schema_migrations");
}

static bool migration_done(PGconn *pg, const char *name, bool *done)
{
    const char *params[] = { name };
    const struct sk_pg_stmt st = {
        .sql = "SELECT 1 FROM sekali.schema_migrations WHERE version = $1",
        .n_params = 1, .values = params, .what = "reading sekali.schema_migrations",
    };
    PGresult *res;
    if (!exec_stmt(pg, &st, &res))
        return false;
    *done = PQntuples(res) == 1;
    PQclear(res);
    return true;
}

/* Runs one file and records its version in the same transaction, so a
 * migration is applied and recorded, or neither. */
static bool migration_apply(PGconn *pg, const char *dir, const char *name)
{
    char file[4096];
    snprintf(file, sizeof(file), "%s/%s", dir, name);
    FILE *f = fopen(file, "r");
    if (f == NULL) {
        fprintf(stderr, "sekalictl: cannot open %s: %s\n", file, strerror(errno));
        return false;
    }
    size_t len;
    char *sql = read_all(f, &len);
    fclose(f);
    if (sql == NULL) {
        fprintf(stderr, "sekalictl: cannot read %s\n", file);
        return false;
    }
    bool ok = exec_ok(pg, "BEGIN", "BEGIN") && exec_ok(pg, sql, file);
    free(sql);
    const char *params[] = { name };
    const struct sk_pg_stmt record = {
        .sql = "INSERT INTO sekali.schema_migrations (version) VALUES ($1)",
        .n_params = 1, .values = params, .what = "recording the migration",
    };
    ok = ok && exec_stmt(pg, &record, NULL);
    if (!ok || !exec_ok(pg, "COMMIT", "COMMIT")) {
        exec_ok(pg, "ROLLBACK", "ROLLBACK");
        fprintf(stderr, "sekalictl: migration %s failed and was rolled back\n", name);
        return false;
    }
    return true;
}

static int cmd_enqueue(const struct sk_conf *conf, int argc, char **argv)
{
    struct sk_message msg = { .content_type = "application/json" };
    char id[33];  /* 128 random bits in hex */
    static const struct option options[] = {
        { "key", required_argument, NULL, 'k' },
        { "resource", required_argument, NULL, 'r' },
        { "id", required_argument, NULL, 'i' },
        { "content-type", required_argument, NULL, 't' },
        { "dedupe", required_argument, NULL, 'd' },
        { "at", required_argument, NULL, 'a' },
        { "direct", no_argument, NULL, 'D' },
        { "json", no_argument, NULL, 'j' },
        { NULL, 0, NULL, 0 },
    };
    const char *dedupe = NULL, *run_at = NULL;
    bool direct = false, json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'k': msg.idempotency_key = optarg; break;
        case 'r': msg.resource_key = optarg; break;
        case 'i': msg.message_id = optarg; break;
        case 't': msg.content_type = optarg; break;
        case 'd': dedupe = optarg; break;
        case 'a': run_at = optarg; break;
        case 'D': direct = true; break;
        case 'j': json = true; break;
        default: command_help(find_command("enqueue"), stderr); return SK_CTL_USAGE;
        }
    }
    if (argc - optind < 2 || argc - optind > 3) {
        command_help(find_command("enqueue"), stderr);
        return SK_CTL_USAGE;
    }
    const char *queue = argv[optind];
    msg.type = argv[optind + 1];
    if (msg.message_id == NULL) {
        /* A fresh random id per call: a retried call is a new message, and
         * only an explicit --key makes two calls the same job. */
        sk_random_hex(id, sizeof(id) - 1);
        msg.message_id = id;
    }

    char *body = NULL;
    if (!read_body(argc - optind == 3 ? argv[optind + 2] : "-", &msg, &body))
        return 1;

    int code = direct ? enqueue_direct(conf, queue, &msg, json)
                      : enqueue_outbox(conf, queue, &msg, dedupe, run_at, json);
    free(body);
    return code;
}

/* The body is the argument, or stdin for "-"; *body is what the caller frees. */
static bool read_body(const char *arg, struct sk_message *msg, char **body)
{
    if (strcmp(arg, "-") != 0) {
        msg->body = arg;
        msg->body_len = strlen(arg);
        return true;
    }
    *body = read_all(stdin, &msg->body_len);
    if (*body == NULL) {
        fprintf(stderr, "sekalictl: cannot read the body from stdin\n");
        return false;
    }
    msg->body = *body;
    return true;
}

/* --direct: publish with confirms, bypassing the outbox. */
static int enqueue_direct(const struct sk_conf *conf, const char *queue,
                          const struct sk_message *msg, bool json)
{
    struct sk_broker *b = NULL;
    struct sk_err err = { 0 };
    /* A queue of the configuration is declared as sekalid declares it; any
     * other must already exist (the mandatory publish reports it if not). */
    const struct sk_queue_conf *q = sk_conf_queue(conf, queue);
    int rc = sk_broker_open(&b, &conf->amqp, &err);
    if (rc == SK_OK && q != NULL) {
        struct sk_queue_shape shape = sk_conf_queue_shape(q);
        rc = sk_broker_declare(b, queue, &shape, &err);
    }
    if (rc == SK_OK)
        rc = sk_broker_confirm_select(b, &err);
    if (rc == SK_OK)
        rc = sk_broker_publish(b, queue, msg, &err);
    sk_broker_close(b);
    if (rc != SK_OK) {
        fprintf(stderr, "sekalictl: enqueue to %s failed: %s\n", queue, err.msg);
        return 1;
    }
    print_job_id(msg->message_id, json);
    return 0;
}

static int enqueue_outbox(const struct sk_conf *conf, const char *queue,
                          const struct sk_message *msg, const char *dedupe, const char *run_at,
                          bool json)
{
    PGconn *pg = sk_ctl_pg_connect(conf);
    if (pg == NULL)
        return 1;
    const char *values[] = { queue, msg->type, msg->body, msg->idempotency_key, dedupe,
                             msg->resource_key, run_at };
    const int lengths[] = { 0, 0, (int)msg->body_len, 0, 0, 0, 0 };
    const int formats[] = { 0, 0, 1, 0, 0, 0, 0 };
    const struct sk_pg_stmt st = {
        .sql = "SELECT sekali.enqueue($1, $2, $3, $4, $5, $6, coalesce($7::timestamptz, now()))",
        .n_params = 7, .values = values, .lengths = lengths, .formats = formats,
        .one_row = true, .what = "sekali.enqueue",
    };
    PGresult *res;
    int code = 1;
    if (exec_stmt(pg, &st, &res)) {
        print_job_id(PQgetvalue(res, 0, 0), json);
        PQclear(res);
        code = 0;
    }
    PQfinish(pg);
    return code;
}

PGconn *sk_ctl_pg_connect(const struct sk_conf *conf)
{
    struct sk_err err = { 0 };
    PGconn *pg = sk_pg_dial(&conf->postgres, "sekalictl", &err);
    if (pg == NULL)
        fprintf(stderr, "sekalictl: %s\n", err.msg);
    return pg;
}

/* SQL text (a migration file may hold many statements), or false after
 * saying why on stderr. */
static bool exec_ok(PGconn *pg, const char *sql, const char *what)
{
    const struct sk_pg_stmt st = { .sql = sql, .what = what };
    return exec_stmt(pg, &st, NULL);
}

static bool exec_stmt(PGconn *pg, const struct sk_pg_stmt *st, PGresult **out)
{
    struct sk_err err = { 0 };
    if (sk_pg_exec(pg, st, out, &err) == SK_OK)
        return true;
    fprintf(stderr, "sekalictl: %s\n", err.msg);
    return false;
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return NULL;
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                return NULL;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int only_sql(const struct dirent *d)
{
    size_t len = strlen(d->d_name);
    return len > 4 && strcmp(d->d_name + len - 4, ".sql") == 0 && d->d_name[0] != '.';
}
