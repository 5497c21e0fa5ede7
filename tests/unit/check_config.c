/* check_config.c - the config loader against the fixtures in tests/data/.
 *
 * Good fixtures prove each key lands in its field and each default holds;
 * one broken fixture per kind of mistake pins the exact message, position
 * included, because `sekalid -t` output is what an operator acts on. Run
 * from the repository root: fixture paths are relative to it. */
#include "config.h"
#include "config_value.h"
#include "suite.h"

#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#define DATA "tests/data/"

struct bad_case {
    const char *file;
    const char *env;      /* set to "x" for this case; the others are unset */
    const char *message;  /* the whole of err.msg */
};

static const char *const test_env[] = {
    "SEKALI_TEST_AMQP_PASSWORD", "SEKALI_TEST_REDIS_PASSWORD", "SEKALI_TEST_SURELY_UNSET",
};

/* One per kind of mistake. Lines and columns are 1-based, as editors count. */
static const struct bad_case bad_cases[] = {
    { "bad_schedule_cron.yaml", NULL,
      DATA "bad_schedule_cron.yaml:11:18: invalid cron expression \"0 3 * 13 *\": month 13 is "
      "out of range 1-12" },
    { "bad_schedule_zone.yaml", NULL,
      DATA "bad_schedule_zone.yaml:12:15: unknown time zone \"Europe/Berlinn\": expected an IANA "
      "name such as Europe/Berlin, found in the tz database (/usr/share/zoneinfo)" },
    { "bad_schedule_queue.yaml", NULL,
      DATA "bad_schedule_queue.yaml:12:12: schedule \"nightly-report\": queue \"reportz\" is not "
      "one of the queues configured here" },
    { "bad_schedule_job_type.yaml", NULL,
      DATA "bad_schedule_job_type.yaml:12:12: schedule \"nightly-report\": queue \"reports\" does "
      "not accept the schedule's job_type" },
    { "bad_schedule_both.yaml", NULL,
      DATA "bad_schedule_both.yaml:11:12: schedule \"nightly-report\": give either cron or every, "
      "not both" },
    { "bad_schedule_never.yaml", NULL,
      DATA "bad_schedule_never.yaml:11:11: cron expression \"0 0 30 2 *\" never fires: no month "
      "has that day" },
    { "bad_schedule_every.yaml", NULL,
      DATA "bad_schedule_every.yaml:11:12: every must be a whole number of seconds, got 1500ms" },
    { "bad_syntax.yaml", NULL,
      DATA "bad_syntax.yaml:6:1: syntax error: found unexpected end of stream "
      "(while scanning a quoted scalar that starts at 4:13)" },
    { "bad_syntax_indent.yaml", NULL,
      DATA "bad_syntax_indent.yaml:3:13: syntax error: mapping values are not allowed in this context" },
    { "bad_utf8.yaml", NULL,
      DATA "bad_utf8.yaml:3:13: syntax error: incomplete UTF-8 octet sequence" },
    { "bad_empty.yaml", NULL,
      DATA "bad_empty.yaml:1:1: empty file: expected a mapping of sections" },
    { "bad_comments_only.yaml", NULL,
      DATA "bad_comments_only.yaml:1:1: empty file: expected a mapping of sections" },
    { "bad_two_documents.yaml", NULL,
      DATA "bad_two_documents.yaml:7:1: found a second YAML document; a config file holds one" },
    { "bad_root_sequence.yaml", NULL,
      DATA "bad_root_sequence.yaml:1:1: top level: expected a mapping, got a sequence" },
    { "bad_unknown_key.yaml", NULL,
      DATA "bad_unknown_key.yaml:8:5: unknown key \"prefetchh\" in queues[0]" },
    { "bad_unknown_section.yaml", NULL,
      DATA "bad_unknown_section.yaml:3:1: unknown key \"rabbit\" at the top level" },
    { "bad_type_mapping.yaml", NULL,
      DATA "bad_type_mapping.yaml:2:3: amqp: expected a mapping, got a sequence" },
    { "bad_type_sequence.yaml", NULL,
      DATA "bad_type_sequence.yaml:6:3: queues: expected a sequence, got a mapping" },
    { "bad_type_scalar.yaml", NULL,
      DATA "bad_type_scalar.yaml:2:8: url: expected an amqp:// URL or a list of them, got a "
      "mapping" },
    { "bad_type_integer.yaml", NULL,
      DATA "bad_type_integer.yaml:2:9: port: expected an integer, got \"six-three-seven-nine\"" },
    { "bad_type_boolean.yaml", NULL,
      DATA "bad_type_boolean.yaml:8:11: lock: expected a boolean (true/false/yes/no/on/off), "
      "got \"maybe\"" },
    { "bad_type_queue_item.yaml", NULL,
      DATA "bad_type_queue_item.yaml:6:5: queues[0]: expected a mapping, got a scalar" },
    { "bad_missing_url.yaml", NULL,
      DATA "bad_missing_url.yaml:2:3: missing required key \"url\" in amqp" },
    { "bad_missing_queues.yaml", NULL,
      DATA "bad_missing_queues.yaml:1:1: missing required key \"queues\" at the top level" },
    { "bad_missing_handler.yaml", NULL,
      DATA "bad_missing_handler.yaml:6:5: missing required key \"handler\" in queues[0]" },
    { "bad_queues_empty.yaml", NULL,
      DATA "bad_queues_empty.yaml:5:9: queues must list at least one queue" },
    { "bad_duration.yaml", NULL,
      DATA "bad_duration.yaml:3:14: invalid duration \"30x\": expected a number followed by "
      "ms, s, m or h" },
    { "bad_duration_bare.yaml", NULL,
      DATA "bad_duration_bare.yaml:1:19: invalid duration \"30\": expected a number followed by "
      "ms, s, m or h" },
    { "bad_duration_range.yaml", NULL,
      DATA "bad_duration_range.yaml:3:14: heartbeat must be between 0 and 1h, got 2h" },
    { "bad_lock_ttl_min.yaml", NULL,
      DATA "bad_lock_ttl_min.yaml:2:8: ttl must be between 100ms and 24h, got 50ms" },
    { "bad_size.yaml", NULL,
      DATA "bad_size.yaml:8:15: invalid size \"1.5MiB\": expected a number optionally followed "
      "by B, kB, KiB, MB, MiB, GB or GiB" },
    { "bad_size_range.yaml", NULL,
      DATA "bad_size_range.yaml:8:15: max_body must be between 1B and 128MiB, got 256MiB" },
    /* Past 80 KiB a message's headers could outgrow a frame on their way
     * through its retries and dead-lettering (config.c). */
    { "bad_max_headers.yaml", NULL,
      DATA "bad_max_headers.yaml:8:18: max_headers must be between 1B and 80KiB, got 1MiB" },
    { "bad_range.yaml", NULL,
      DATA "bad_range.yaml:8:14: workers must be between 1 and 256, got 0" },
    { "bad_port_range.yaml", NULL,
      DATA "bad_port_range.yaml:2:9: port must be between 1 and 65535, got 70000" },
    { "bad_duplicate_key.yaml", NULL,
      DATA "bad_duplicate_key.yaml:4:3: duplicate key \"port\" in redis" },
    { "bad_duplicate_queue.yaml", NULL,
      DATA "bad_duplicate_queue.yaml:11:11: duplicate queue name \"invoices\" "
      "(first defined at line 6)" },
    { "bad_queue_collision.yaml", NULL,
      DATA "bad_queue_collision.yaml:8:11: queue name \"invoices.dead\" collides with "
      "\"invoices\" (line 6): \"invoices.dead\" is one of \"invoices\"'s dead-letter or "
      "delay queues" },
    { "bad_queue_collision_delay.yaml", NULL,
      DATA "bad_queue_collision_delay.yaml:8:11: queue name \"mail\" collides with "
      "\"mail.delay.1250\" (line 6): \"mail.delay.1250\" is one of \"mail\"'s dead-letter "
      "or delay queues" },
    { "bad_queue_name.yaml", NULL,
      DATA "bad_queue_name.yaml:6:11: invalid name \"send invoices\": use 1 to 200 characters "
      "from A-Z a-z 0-9 . _ -" },
    { "bad_queue_name_amq.yaml", NULL,
      DATA "bad_queue_name_amq.yaml:6:11: invalid name \"amq.invoices\": names starting with "
      "\"amq.\" are reserved by RabbitMQ" },
    { "bad_enum_mode.yaml", NULL,
      DATA "bad_enum_mode.yaml:8:11: unknown mode \"batch\": expected transactional or external" },
    { "bad_batch_external.yaml", NULL,
      DATA "bad_batch_external.yaml:9:12: batch 16 needs mode: transactional (an external job "
      "records its own outcome under its own lease)" },
    { "bad_batch_prefetch.yaml", NULL,
      DATA "bad_batch_prefetch.yaml:8:15: prefetch 8 is smaller than batch 16: a worker could "
      "never fill its batch" },
    { "bad_batch_max.yaml", NULL,
      DATA "bad_batch_max.yaml:9:16: batch_max 16 is smaller than batch 32" },
    { "bad_batch_max_one.yaml", NULL,
      DATA "bad_batch_max_one.yaml:9:16: batch_max 64 needs a batch above 1 (batch 1 runs each "
      "job in a transaction of its own)" },
    { "bad_batch_max_prefetch.yaml", NULL,
      DATA "bad_batch_max_prefetch.yaml:8:15: prefetch 32 is smaller than batch_max 64: a "
      "worker could never fill its batch" },
    { "bad_priority_quorum.yaml", NULL,
      DATA "bad_priority_quorum.yaml:9:19: max_priority on a quorum queue must be at most 31 "
      "(RabbitMQ 4.3's 32 levels; queue_type: classic takes up to 255), got 32" },
    { "bad_priority_range.yaml", NULL,
      DATA "bad_priority_range.yaml:8:19: max_priority must be between 0 and 255, got 256" },
    { "bad_batch_range.yaml", NULL,
      DATA "bad_batch_range.yaml:8:12: batch must be between 1 and 256, got 0" },
    { "bad_enum_declare.yaml", NULL,
      DATA "bad_enum_declare.yaml:8:14: unknown declare \"passiv\": expected auto or passive" },
    { "bad_enum_level.yaml", NULL,
      DATA "bad_enum_level.yaml:2:10: unknown level \"verbose\": expected debug, info, warn or error" },
    { "bad_enum_format.yaml", NULL,
      DATA "bad_enum_format.yaml:2:11: unknown format \"xml\": expected auto, json or text" },
    { "bad_empty_host.yaml", NULL,
      DATA "bad_empty_host.yaml:2:9: host must not be empty" },
    { "bad_amqp_url.yaml", NULL,
      DATA "bad_amqp_url.yaml:2:8: url: invalid AMQP URL: expected "
      "amqp[s]://[user[:password]@]host[:port]/[vhost]" },
    { "bad_amqps.yaml", NULL,
      DATA "bad_amqps.yaml:2:31: url[1]: amqp:// where url[0] is amqps://: a cluster's nodes "
      "all speak TLS or none does" },
    { "bad_amqp_tls_plain.yaml", NULL,
      DATA "bad_amqp_tls_plain.yaml:4:5: amqp.tls needs amqps:// URLs: with amqp:// the link "
      "would be clear text" },
    { "bad_amqp_tls_key.yaml", NULL,
      DATA "bad_amqp_tls_key.yaml:4:5: amqp.tls: cert_file and key_file go together: a client "
      "certificate needs its key" },
    { "bad_amqp_external.yaml", NULL,
      DATA "bad_amqp_external.yaml:3:19: auth_mechanism external logs in with a client "
      "certificate: give amqp.tls.cert_file and key_file" },
    { "bad_amqp_nodes_entry.yaml", NULL,
      DATA "bad_amqp_nodes_entry.yaml:4:7: url[1]: invalid AMQP URL: expected "
      "amqp[s]://[user[:password]@]host[:port]/[vhost]" },
    { "bad_amqp_nodes_user.yaml", NULL,
      DATA "bad_amqp_nodes_user.yaml:4:7: url[1]: its user differs from url[0]'s: a cluster's "
      "nodes share users and vhosts; write them in the first URL" },
    { "bad_amqp_nodes_twice.yaml", NULL,
      DATA "bad_amqp_nodes_twice.yaml:2:57: url[2]: the same node as url[0]" },
    { "bad_amqp_nodes_empty.yaml", NULL,
      DATA "bad_amqp_nodes_empty.yaml:2:8: url: the list of nodes is empty" },
    { "bad_conninfo.yaml", NULL,
      DATA "bad_conninfo.yaml:4:13: conninfo: missing \"=\" after \"dbname\" in connection info string" },
    { "bad_conninfo_option.yaml", NULL,
      DATA "bad_conninfo_option.yaml:4:13: conninfo: invalid connection option \"colour\"" },
    { "bad_two_passwords.yaml", NULL,
      DATA "bad_two_passwords.yaml:3:17: password_env conflicts with the password in url: "
      "give the password one way only" },
    { "bad_two_passwords_pg.yaml", NULL,
      DATA "bad_two_passwords_pg.yaml:5:18: password_file conflicts with the password in "
      "conninfo: give the password one way only" },
    { "bad_env_and_file.yaml", "SEKALI_TEST_REDIS_PASSWORD",
      DATA "bad_env_and_file.yaml:3:18: password_file conflicts with password_env: "
      "give the password one way only" },
    { "bad_password_env_unset.yaml", NULL,
      DATA "bad_password_env_unset.yaml:2:17: password_env: environment variable "
      "SEKALI_TEST_SURELY_UNSET is not set" },
    { "bad_password_file_missing.yaml", NULL,
      DATA "bad_password_file_missing.yaml:2:18: password_file: cannot open "
      "/nonexistent/sekali/redis-password: No such file or directory" },
    { "bad_job_types.yaml", NULL,
      DATA "bad_job_types.yaml:8:33: job_types[1]: expected a scalar, got a mapping" },
    { "bad_first_error_wins.yaml", NULL,
      DATA "bad_first_error_wins.yaml:3:14: invalid duration \"forever\": expected a number "
      "followed by ms, s, m or h" },
    { "bad_deep_config.yaml", NULL,
      DATA "bad_deep_config.yaml:8:78: config: nested deeper than 64 levels" },
    { "bad_metrics_port.yaml", NULL,
      DATA "bad_metrics_port.yaml:2:11: listen: port must be between 1 and 65535, got \"70000\"" },
    { "bad_restart_initial.yaml", NULL,
      DATA "bad_restart_initial.yaml:4:12: initial must be between 1ms and 1h, got 0ms" },
    { "bad_restart_max.yaml", NULL,
      DATA "bad_restart_max.yaml:5:8: invalid duration \"soon\": expected a number followed by "
      "ms, s, m or h" },
    { "bad_restart_key.yaml", NULL,
      DATA "bad_restart_key.yaml:5:3: unknown key \"cap\" in restart" },
    { "bad_metrics_host.yaml", NULL,
      DATA "bad_metrics_host.yaml:2:19: listen: missing host in \":9187\" (127.0.0.1:PORT for "
      "this machine only, 0.0.0.0:PORT for every interface)" },
};

static struct sk_conf *load_ok(const char *path)
{
    struct sk_err err = { 0 };
    struct sk_conf *conf = NULL;

    int rc = sk_conf_load(path, &conf, &err);
    ck_assert_msg(rc == SK_OK, "%s: %s", path, err.msg);
    ck_assert_ptr_nonnull(conf);
    return conf;
}

/* Returns the message of a load that must fail; valid until the next call. */
static const char *load_error(const char *path)
{
    static struct sk_err err;
    struct sk_conf *conf = NULL;

    memset(&err, 0, sizeof(err));
    int rc = sk_conf_load(path, &conf, &err);
    if (rc == SK_OK)
        sk_conf_free(conf);
    ck_assert_msg(rc == SK_ERR, "%s loaded, but should have failed", path);
    ck_assert_ptr_null(conf);
    return err.msg;
}

/* Writes text to a new file under /tmp named from tmpl (which must end in
 * XXXXXX plus suffix_len more characters) and returns its path in tmpl. */
static void write_temp(char *tmpl, int suffix_len, const char *text)
{
    int fd = mkstemps(tmpl, suffix_len);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* Every way a password can be written, each in a config that fails to load:
 * the message must still say where and what, and never the password, since
 * it goes to `sekalid -t`, the reload log line and systemd's status line. */
#define SECRET "Sup3rS3cret"

static const struct bad_case secret_cases[] = {
    { "bad_secret_pg_uri_percent.yaml", NULL,
      DATA "bad_secret_pg_uri_percent.yaml:4:13: conninfo: the password in the URI is malformed "
      "(invalid percent-encoded token: \"...\"); percent-encode it, or move it to password_file" },
    { "bad_secret_pg_uri_host.yaml", NULL,
      DATA "bad_secret_pg_uri_host.yaml:4:13: conninfo: end of string reached when looking for "
      "matching \"]\" in IPv6 host address in URI: \"...\" (quoted text left out: conninfo "
      "holds a password)" },
    { "bad_secret_pg_uri_param.yaml", NULL,
      DATA "bad_secret_pg_uri_param.yaml:4:13: conninfo: missing key/value separator \"=\" in "
      "URI query parameter: \"...\" (quoted text left out: conninfo holds a password)" },
    { "bad_secret_pg_uri_query.yaml", NULL,
      DATA "bad_secret_pg_uri_query.yaml:4:13: conninfo: forbidden value %00 in percent-encoded "
      "value: \"...\" (quoted text left out: conninfo holds a password)" },
    { "bad_secret_pg_keyword.yaml", NULL,
      DATA "bad_secret_pg_keyword.yaml:4:13: conninfo: missing \"=\" after \"...\" in "
      "connection info string (quoted text left out: conninfo holds a password)" },
    { "bad_secret_pg_keyword_quote.yaml", NULL,
      DATA "bad_secret_pg_keyword_quote.yaml:4:13: conninfo: unterminated quoted string in "
      "connection info string (quoted text left out: conninfo holds a password)" },
    { "bad_secret_pg_keyword_option.yaml", NULL,
      DATA "bad_secret_pg_keyword_option.yaml:4:13: conninfo: invalid connection option "
      "\"...\" (quoted text left out: conninfo holds a password)" },
    { "bad_secret_amqp_url.yaml", NULL,
      DATA "bad_secret_amqp_url.yaml:2:8: url: invalid AMQP URL: expected "
      "amqp[s]://[user[:password]@]host[:port]/[vhost]" },
    { "bad_secret_amqp_url_percent.yaml", NULL,
      DATA "bad_secret_amqp_url_percent.yaml:2:8: url: invalid AMQP URL: expected "
      "amqp[s]://[user[:password]@]host[:port]/[vhost]" },
    { "bad_secret_amqp_nodes.yaml", NULL,
      DATA "bad_secret_amqp_nodes.yaml:4:7: url[1]: its password differs from url[0]'s: a "
      "cluster's nodes share users and vhosts; write them in the first URL" },
    { "bad_secret_amqp_nodes_url.yaml", NULL,
      DATA "bad_secret_amqp_nodes_url.yaml:4:7: url[1]: invalid AMQP URL: expected "
      "amqp[s]://[user[:password]@]host[:port]/[vhost]" },
    { "bad_secret_env_and_url.yaml", "SEKALI_TEST_SECRET",
      DATA "bad_secret_env_and_url.yaml:4:17: password_env conflicts with the password in url: "
      "give the password one way only" },
    { "bad_secret_env_conninfo.yaml", "SEKALI_TEST_SECRET",
      DATA "bad_secret_env_conninfo.yaml:7:13: conninfo: missing \"=\" after \"dbname\" in "
      "connection info string" },
};

/* "Sup3r S3cret" in bad_secret_pg_keyword.yaml is two words: neither may show. */
static void assert_no_secret(const char *msg)
{
    static const char *const parts[] = { SECRET, "Sup3r", "S3cret" };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        ck_assert_msg(strstr(msg, parts[i]) == NULL, "the message shows the password: %s", msg);
}

/* A config whose redis section reads its password from password_file. */
static void write_config_with_file(char *cfg, const char *password_file)
{
    char text[512];

    snprintf(text, sizeof(text),
             "amqp: {url: \"amqp://127.0.0.1/\"}\n"
             "postgres: {conninfo: \"dbname=sekali\"}\n"
             "redis:\n  password_file: %s\n"
             "queues: [{name: q, handler: h.so}]\n", password_file);
    write_temp(cfg, 5, text);
}

START_TEST(test_each_broken_fixture_is_reported_with_its_position)
{
    const struct bad_case *c = &bad_cases[_i];
    char path[PATH_MAX];

    for (size_t i = 0; i < sizeof(test_env) / sizeof(test_env[0]); i++)
        unsetenv(test_env[i]);
    if (c->env != NULL)
        setenv(c->env, "x", 1);
    snprintf(path, sizeof(path), DATA "%s", c->file);
    ck_assert_str_eq(load_error(path), c->message);
}
END_TEST

START_TEST(test_each_password_form_is_left_out_of_the_error)
{
    const struct bad_case *c = &secret_cases[_i];
    char path[PATH_MAX];

    unsetenv("SEKALI_TEST_SECRET");
    if (c->env != NULL)
        setenv(c->env, SECRET, 1);
    snprintf(path, sizeof(path), DATA "%s", c->file);
    const char *msg = load_error(path);
    assert_no_secret(msg);
    ck_assert_str_eq(msg, c->message);
}
END_TEST

START_TEST(test_missing_file_is_reported_without_position)
{
    ck_assert_str_eq(load_error(DATA "no_such_file.yaml"),
                     DATA "no_such_file.yaml: cannot open: No such file or directory");
}
END_TEST

START_TEST(test_directory_is_reported_as_unreadable)
{
    ck_assert_str_eq(load_error("tests/data"), "tests/data: cannot read: Is a directory");
}
END_TEST

START_TEST(test_failed_load_leaves_the_old_snapshot_in_place)
{
    struct sk_conf *live = load_ok(DATA "good_minimal.yaml"), *conf = live;
    struct sk_err err = { 0 };

    ck_assert_int_eq(sk_conf_load(DATA "bad_range.yaml", &conf, &err), SK_ERR);
    ck_assert_ptr_eq(conf, live);
    ck_assert_int_eq(err.code, SK_ERR);
    sk_conf_free(live);
}
END_TEST

static void count_advice(const char *text, void *arg)
{
    ck_assert_ptr_nonnull(strstr(text, "outbox.relays"));
    (*(int *)arg)++;
}

/* An sk_conf_advise() callback: appends each warning to the buffer arg
 * (4096 bytes), one a line. */
static void keep_advice(const char *text, void *arg)
{
    char *buf = arg;
    size_t used = strlen(buf);
    snprintf(buf + used, 4096 - used, "%s\n", text);
}

START_TEST(test_schedules_load_with_their_defaults)
{
    int advice = 0;
    struct sk_conf *c = load_ok(DATA "good_schedules.yaml");
    ck_assert_uint_eq(c->n_schedules, 2);
    const struct sk_schedule_conf *n = &c->schedules[0], *q = &c->schedules[1];
    ck_assert_str_eq(n->name, "nightly-report");
    ck_assert_str_eq(n->cron_text, "0 3 * * *");
    ck_assert_str_eq(n->timezone, "Europe/Berlin");
    ck_assert_str_eq(n->when.zone, "Europe/Berlin");
    ck_assert_str_eq(n->queue, "reports");
    ck_assert_str_eq(n->body, "{\"kind\": \"nightly\"}");
    ck_assert_int_eq(n->missed, SK_MISSED_ALL);
    ck_assert_uint_eq(n->grace_ms, 5 * 60 * 1000);
    ck_assert_ptr_null(q->cron_text);
    ck_assert_uint_eq(q->when.every_s, 900);
    ck_assert_str_eq(q->when.zone, "UTC");
    ck_assert_int_eq(q->missed, SK_MISSED_ONCE);
    ck_assert_uint_eq(q->grace_ms, 60 * 1000);
    ck_assert_str_eq(q->body, "{}");
    char spec[128];
    sk_conf_schedule_spec(n, spec, sizeof(spec));
    ck_assert_str_eq(spec, "cron 0 3 * * * Europe/Berlin");
    sk_conf_schedule_spec(q, spec, sizeof(spec));
    ck_assert_str_eq(spec, "every 15m");
    /* No relay here: said at start and by sekalid -t. */
    ck_assert_int_eq(sk_conf_advise(c, count_advice, &advice), 1);
    ck_assert_int_eq(advice, 1);
    sk_conf_free(c);
    c = load_ok(DATA "good_minimal.yaml");
    ck_assert_uint_eq(c->n_schedules, 0);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_minimal_config_takes_every_default)
{
    struct sk_conf *c = load_ok(DATA "good_minimal.yaml");

    ck_assert_str_eq(c->path, DATA "good_minimal.yaml");
    ck_assert_str_eq(c->amqp.nodes[0].host, "127.0.0.1");
    ck_assert_int_eq(c->amqp.nodes[0].port, 5672);
    ck_assert_uint_eq(c->amqp.n_nodes, 1);
    ck_assert_str_eq(c->amqp.vhost, "/");
    ck_assert_str_eq(c->amqp.user, "guest");
    ck_assert_str_eq(c->amqp.password, "guest");
    ck_assert_uint_eq(c->amqp.heartbeat_ms, 30000);
    ck_assert_uint_eq(c->amqp.connect_timeout_ms, 5000);
    ck_assert_str_eq(c->redis.host, "127.0.0.1");
    ck_assert_int_eq(c->redis.port, 6379);
    ck_assert_int_eq(c->redis.db, 0);
    ck_assert_ptr_null(c->redis.password);
    ck_assert_uint_eq(c->redis.timeout_ms, 2000);
    ck_assert_str_eq(c->postgres.conninfo, "host=127.0.0.1 dbname=sekali");
    ck_assert_ptr_null(c->postgres.password);
    ck_assert_uint_eq(c->lock.ttl_ms, 30000);
    ck_assert_uint_eq(c->lock.busy_wait_ms, 2000);
    ck_assert_int_eq(c->log.level, SK_LOG_INFO);
    ck_assert_int_eq(c->log.format, SK_LOG_FORMAT_AUTO);
    ck_assert_uint_eq(c->shutdown_timeout_ms, 30000);
    ck_assert_ptr_null(c->metrics.listen_host);

    ck_assert_uint_eq(c->n_queues, 1);
    const struct sk_queue_conf *q = &c->queues[0];
    ck_assert_str_eq(q->name, "invoices");
    ck_assert_str_eq(q->handler, "/usr/lib/sekali/handlers/invoice.so");
    ck_assert_ptr_null(q->handler_config);
    ck_assert_int_eq(q->workers, 1);
    ck_assert_int_eq(q->prefetch, 32);
    ck_assert_int_eq(q->batch, 16);
    ck_assert_uint_eq(q->batch_wait_ms, 0);
    ck_assert_uint_eq(q->batch_close_after_ms, 100);
    ck_assert_int_eq(q->mode, SK_MODE_TRANSACTIONAL);
    ck_assert(q->lock);
    ck_assert_uint_eq(q->lock_ttl_ms, 30000);
    ck_assert_uint_eq(q->max_body, 1024 * 1024);
    ck_assert_ptr_null(q->job_types);
    ck_assert_uint_eq(q->n_job_types, 0);
    ck_assert_uint_eq(q->job_timeout_ms, 0);
    ck_assert_int_eq(q->max_crashes, 3);
    sk_conf_free(c);
}
END_TEST

/* An unset prefetch grows to two batches; a set one is kept. */
/* A config of the given queues (YAML list items), loaded; the file is gone. */
static struct sk_conf *load_queues(const char *queues)
{
    char dir[] = "/tmp/sk-batch-XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/c.yaml", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "amqp:\n  url: amqp://127.0.0.1/\npostgres:\n  conninfo: \"dbname=x\"\n"
               "queues:\n%s", queues);
    ck_assert_int_eq(fclose(f), 0);
    struct sk_conf *c = load_ok(path);
    unlink(path);
    rmdir(dir);
    return c;
}

START_TEST(test_batch_raises_an_unset_prefetch_to_two_batches)
{
    struct sk_conf *c = load_queues(
        "  - name: a\n    handler: /h.so\n    batch: 16\n    batch_wait: 5ms\n"
        "  - name: b\n    handler: /h.so\n    batch: 16\n    prefetch: 20\n");
    ck_assert_int_eq(c->queues[0].batch, 16);
    ck_assert_int_eq(c->queues[0].prefetch, 32);
    ck_assert_uint_eq(c->queues[0].batch_wait_ms, 5);
    ck_assert_int_eq(c->queues[1].prefetch, 20);
    sk_conf_free(c);
}
END_TEST

/* RabbitMQ 4.3's quorum queues take x-max-priority up to 31: the config
 * accepts it (whether the broker does is said at the declaration). */
START_TEST(test_quorum_queue_takes_max_priority_up_to_31)
{
    struct sk_conf *c = load_queues(
        "  - name: a\n    handler: /h.so\n    queue_type: quorum\n    max_priority: 31\n");
    ck_assert_int_eq(c->queues[0].max_priority, 31);
    struct sk_queue_shape shape = sk_conf_queue_shape(&c->queues[0]);
    ck_assert(shape.quorum);
    ck_assert_uint_eq(shape.max_priority, 31);
    sk_conf_free(c);
}
END_TEST

/* Unset, batch is 16 in transactional mode, at most a set prefetch, and 1
 * in external mode, whose prefetch stays 10; batch: 1 is kept. */
START_TEST(test_batch_defaults_to_16_within_the_prefetch_window)
{
    struct sk_conf *c = load_queues(
        "  - name: a\n    handler: /h.so\n    config: {x: 1}\n"
        "  - name: b\n    handler: /h.so\n    prefetch: 4\n"
        "  - name: c\n    handler: /h.so\n    prefetch: 20\n    batch_close_after: 5ms\n"
        "  - name: d\n    handler: /h.so\n    mode: external\n"
        "  - name: e\n    handler: /h.so\n    batch: 1\n    config: {x: 2}\n");
    static const struct { int batch, prefetch; } want[] = {
        { 16, 32 }, { 4, 4 }, { 16, 20 }, { 1, 10 }, { 1, 10 },
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(want); i++) {
        ck_assert_msg(c->queues[i].batch == want[i].batch, "queue %zu: batch %d, want %d", i,
                      c->queues[i].batch, want[i].batch);
        ck_assert_msg(c->queues[i].prefetch == want[i].prefetch, "queue %zu: prefetch %d, want %d",
                      i, c->queues[i].prefetch, want[i].prefetch);
    }
    ck_assert_uint_eq(c->queues[2].batch_close_after_ms, 5);
    ck_assert_uint_eq(c->queues[0].batch_close_after_ms, 100);
    /* A handler's check() reads its queue's batch (host->config_queue()),
     * to refuse a shared transaction it cannot live with. */
    char buf[16];
    sk_conf_where_begin(c);
    ck_assert_int_eq(sk_conf_queue_setting(c->queues[0].handler_config, "batch", buf,
                                           sizeof(buf)), 2);
    ck_assert_str_eq(buf, "16");
    ck_assert_int_eq(sk_conf_queue_setting(c->queues[4].handler_config, "batch", buf,
                                           sizeof(buf)), 1);
    ck_assert_str_eq(buf, "1");
    sk_conf_where_begin(NULL);
    sk_conf_free(c);
}
END_TEST

/* What a far PostgreSQL may grow a worker's batch and prefetch to
 * (batch_size.c): batch_max, 256 unless set, at most a set prefetch, which
 * stays as set; an unset prefetch may grow to two of batch_max. A batch of
 * 1 (external mode's too) does not grow. */
START_TEST(test_batch_max_and_the_prefetch_it_may_grow_to)
{
    struct sk_conf *c = load_queues(
        "  - name: a\n    handler: /h.so\n"
        "  - name: b\n    handler: /h.so\n    prefetch: 4\n"
        "  - name: c\n    handler: /h.so\n    prefetch: 20\n"
        "  - name: d\n    handler: /h.so\n    mode: external\n"
        "  - name: e\n    handler: /h.so\n    batch: 1\n"
        "  - name: f\n    handler: /h.so\n    batch: 8\n    batch_max: 64\n"
        "  - name: g\n    handler: /h.so\n    batch_max: 16\n"
        "  - name: h\n    handler: /h.so\n    batch: 8\n    batch_max: 32\n    prefetch: 40\n");
    static const struct { int batch, batch_max, prefetch, prefetch_max; } want[] = {
        { 16, 256, 32, 512 }, { 4, 4, 4, 4 }, { 16, 20, 20, 20 }, { 1, 1, 10, 10 },
        { 1, 1, 10, 10 }, { 8, 64, 16, 128 }, { 16, 16, 32, 32 }, { 8, 32, 40, 40 },
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(want); i++) {
        const struct sk_queue_conf *q = &c->queues[i];
        ck_assert_msg(q->batch == want[i].batch && q->batch_max == want[i].batch_max &&
                      q->prefetch == want[i].prefetch && q->prefetch_max == want[i].prefetch_max,
                      "queue %s: batch %d/%d prefetch %d/%d, want %d/%d %d/%d", q->name,
                      q->batch, q->batch_max, q->prefetch, q->prefetch_max, want[i].batch,
                      want[i].batch_max, want[i].prefetch, want[i].prefetch_max);
    }
    sk_conf_free(c);
}
END_TEST

START_TEST(test_restart_backoff_defaults_to_200ms_up_to_30s)
{
    struct sk_conf *c = load_ok(DATA "good_minimal.yaml");
    ck_assert_uint_eq(c->restart.initial_ms, 200);
    ck_assert_uint_eq(c->restart.max_ms, 30000);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_restart_section_sets_the_backoff)
{
    struct sk_conf *c = load_ok(DATA "good_restart.yaml");
    ck_assert_uint_eq(c->restart.initial_ms, 50);
    ck_assert_uint_eq(c->restart.max_ms, 120000);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_amqp_url_lists_the_nodes_of_a_cluster_in_order)
{
    struct sk_conf *c = load_ok(DATA "good_amqp_nodes.yaml");

    ck_assert_uint_eq(c->amqp.n_nodes, 3);
    ck_assert_str_eq(c->amqp.nodes[0].host, "mq1.example");
    ck_assert_int_eq(c->amqp.nodes[0].port, 5672);
    ck_assert_str_eq(c->amqp.nodes[1].host, "mq2.example");
    ck_assert_int_eq(c->amqp.nodes[1].port, 5673);
    ck_assert_str_eq(c->amqp.nodes[2].host, "mq3.example");
    ck_assert_int_eq(c->amqp.nodes[2].port, 5672);
    ck_assert_str_eq(c->amqp.user, "worker");
    ck_assert_str_eq(c->amqp.password, "s3cret");
    ck_assert_str_eq(c->amqp.vhost, "jobs");
    sk_conf_free(c);
}
END_TEST

START_TEST(test_amqps_without_a_tls_section_verifies_against_the_system_store)
{
    struct sk_conf *c = load_ok(DATA "good_amqps.yaml");

    ck_assert(c->amqp.tls.enabled);
    ck_assert(c->amqp.tls.verify);
    ck_assert_ptr_null(c->amqp.tls.ca_file);
    ck_assert_ptr_null(c->amqp.tls.server_name);
    ck_assert_int_eq(c->amqp.nodes[0].port, 5671);
    ck_assert_int_eq(c->amqp.nodes[1].port, 5676);
    ck_assert_int_eq(c->amqp.auth, SK_AMQP_AUTH_PLAIN);
    sk_conf_free(c);
}
END_TEST

/* The files are read at load, so a bad one fails `sekalid -t` and a
 * reload at its key, and a good one lands resolved. */
START_TEST(test_tls_files_are_checked_at_load_and_blamed_at_their_key)
{
    char cfg[] = "/tmp/sk-conf-XXXXXX.yaml", key[] = "/tmp/sk-key-XXXXXX", text[2048], want[2048];
    char cwd[512], pem[4096];
    FILE *in = fopen("tests/data/tls/client.key", "r");
    ck_assert_ptr_nonnull(in);
    size_t n = fread(pem, 1, sizeof(pem) - 1, in);
    fclose(in);
    pem[n] = '\0';
    write_temp(key, 0, pem);
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof(cwd)));
    snprintf(text, sizeof(text),
             "amqp:\n  url: amqps://mq.example/\n  auth_mechanism: external\n  tls:\n"
             "    ca_file: %s/tests/data/tls/ca.crt\n    cert_file: %s/tests/data/tls/client.crt\n"
             "    key_file: %s\n    server_name: mq.internal\n"
             "postgres: {conninfo: \"dbname=sekali\"}\nqueues: [{name: q, handler: h.so}]\n",
             cwd, cwd, key);
    write_temp(cfg, 5, text);

    ck_assert_int_eq(chmod(key, 0640), 0);
    struct sk_conf *c = load_ok(cfg);
    ck_assert_str_eq(c->amqp.tls.key_file, key);
    ck_assert_str_eq(c->amqp.tls.server_name, "mq.internal");
    ck_assert_int_eq(c->amqp.auth, SK_AMQP_AUTH_EXTERNAL);
    sk_conf_free(c);

    ck_assert_int_eq(chmod(key, 0604), 0);
    snprintf(want, sizeof(want), "%s:7:15: amqp.tls.key_file: %s has mode 0604: a private key "
             "must not be open to others (chmod 600 or 640)", cfg, key);
    ck_assert_str_eq(load_error(cfg), want);
    unlink(key);
    snprintf(want, sizeof(want), "%s:7:15: amqp.tls.key_file: cannot open %s: No such file or "
             "directory", cfg, key);
    ck_assert_str_eq(load_error(cfg), want);
    unlink(cfg);
}
END_TEST

START_TEST(test_metrics_token_file_is_read_at_load_and_must_be_a_bearer_token)
{
    char cfg[] = "/tmp/sk-conf-XXXXXX.yaml", tok[] = "/tmp/sk-token-XXXXXX", text[1024], want[1200];
    write_temp(tok, 0, "abc-DEF_123.~+/=\n");
    snprintf(text, sizeof(text), "amqp: {url: \"amqp://127.0.0.1/\"}\n"
             "postgres: {conninfo: \"dbname=sekali\"}\n"
             "metrics:\n  listen: 127.0.0.1:9187\n  token_file: %s\n"
             "queues: [{name: q, handler: h.so}]\n", tok);
    write_temp(cfg, 5, text);
    struct sk_conf *c = load_ok(cfg);
    ck_assert_str_eq(c->metrics.token, "abc-DEF_123.~+/=");
    sk_conf_free(c);

    FILE *f = fopen(tok, "w");
    ck_assert_ptr_nonnull(f);
    fputs("Sup3r S3cret\r\nX-Injected: yes\n", f);
    fclose(f);
    snprintf(want, sizeof(want), "%s:5:15: token_file: the token must be at most 512 characters "
             "of A-Z a-z 0-9 - . _ ~ + / = (a bearer token, RFC 6750)", cfg);
    const char *msg = load_error(cfg);
    ck_assert_str_eq(msg, want);
    assert_no_secret(msg);
    unlink(tok);
    unlink(cfg);
}
END_TEST

/* tracing: off by default; an endpoint must be an http(s) URL with a
 * host and no credentials, blamed at its value's position. */
START_TEST(test_tracing_endpoint_is_an_http_url_without_credentials)
{
    static const char base[] =
        "amqp:\n  url: amqp://127.0.0.1/\npostgres:\n  conninfo: \"host=127.0.0.1\"\n"
        "queues:\n  - name: invoices\n    handler: /x.so\n";
    char path[] = "/tmp/sk-tracing-XXXXXX.yaml";
    write_temp(path, 5, base);
    struct sk_conf *c = load_ok(path);
    ck_assert_ptr_null(c->tracing.otlp_endpoint);
    ck_assert_str_eq(c->tracing.service_name, "sekali");
    ck_assert_uint_eq(c->tracing.otlp_timeout_ms, 2000);
    sk_conf_free(c);
    unlink(path);

    static const struct { const char *value, *error; } cases[] = {
        { "https://otel.example:4318/v1/traces", NULL },
        { "\"\"", NULL },
        { "ftp://otel.example/v1/traces", "expected an http:// or https:// URL" },
        { "http:///v1/traces", "the URL has no host" },
        { "\"http://a b/v1/traces\"", "a blank or control character at byte 9" },
        { "https://user:Sup3rS3cret@otel.example/v1/traces", "no user or password in the URL" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[1024], p2[] = "/tmp/sk-tracing-XXXXXX.yaml";
        snprintf(text, sizeof(text), "%stracing:\n  otlp_endpoint: %s\n  service_name: billing\n"
                 "  otlp_timeout: 500ms\n", base, cases[i].value);
        write_temp(p2, 5, text);
        if (cases[i].error == NULL) {
            c = load_ok(p2);
            ck_assert_str_eq(c->tracing.service_name, "billing");
            ck_assert_uint_eq(c->tracing.otlp_timeout_ms, 500);
            if (cases[i].value[0] == '"')
                ck_assert_ptr_null(c->tracing.otlp_endpoint);
            else
                ck_assert_str_eq(c->tracing.otlp_endpoint, cases[i].value);
            sk_conf_free(c);
        } else {
            const char *msg = load_error(p2);
            char where[64];
            snprintf(where, sizeof(where), ":9:18: otlp_endpoint: ");
            ck_assert_msg(strstr(msg, where) != NULL && strstr(msg, cases[i].error) != NULL,
                          "%s: got \"%s\"", cases[i].value, msg);
            ck_assert_msg(strstr(msg, "Sup3rS3cret") == NULL, "the password in \"%s\"", msg);
        }
        unlink(p2);
    }
}
END_TEST

/* tracing.otlp_headers: token names, values plain or read from a file or
 * a variable, each mistake placed at file:line:column, and no message
 * showing a value (the secret file holds CR LF and an injected header). */
START_TEST(test_tracing_headers_are_checked_and_their_secrets_never_shown)
{
    static const char base[] =
        "amqp:\n  url: amqp://127.0.0.1/\npostgres:\n  conninfo: \"host=127.0.0.1\"\n"
        "queues:\n  - name: invoices\n    handler: /x.so\n"
        "tracing:\n  otlp_endpoint: https://otel.example/v1/traces\n  otlp_headers:\n";
    char key[] = "/tmp/sk-otlp-key-XXXXXX", bad[] = "/tmp/sk-otlp-bad-XXXXXX";
    char text[4096], cfg[] = "/tmp/sk-tracing-XXXXXX.yaml";
    write_temp(key, 0, SECRET "-key\n");
    write_temp(bad, 0, SECRET "\r\nX-Injected: yes\n");
    setenv("SK_TEST_OTLP_KEY", SECRET "-env", 1);
    unsetenv("SK_TEST_OTLP_UNSET");
    snprintf(text, sizeof(text), "%s    x-honeycomb-team: {value_file: %s}\n"
             "    x-honeycomb-dataset: sekali\n    X-Env: {value_env: SK_TEST_OTLP_KEY}\n"
             "    x-plain: {value: \"a b\\tc\"}\n", base, key);
    write_temp(cfg, 5, text);
    struct sk_conf *c = load_ok(cfg);
    ck_assert_uint_eq(c->tracing.n_otlp_headers, 4);
    const struct sk_otlp_header *h = c->tracing.otlp_headers;
    ck_assert_str_eq(h[0].name, "x-honeycomb-team");
    ck_assert_str_eq(h[0].value, SECRET "-key");
    ck_assert(h[0].secret);
    ck_assert_str_eq(h[1].value, "sekali");
    ck_assert(!h[1].secret);
    ck_assert_str_eq(h[2].value, SECRET "-env");
    ck_assert(h[2].secret);
    ck_assert_str_eq(h[3].value, "a b\tc");
    sk_conf_free(c);
    unlink(cfg);

    char many[2048] = "";
    for (int i = 0; i <= 16; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "    x-h%d: v\n", i);
    char from_bad[600], both[600];
    snprintf(from_bad, sizeof(from_bad), "    x-key: {value_file: %s}\n", bad);
    snprintf(both, sizeof(both), "    x-key: {value: a, value_file: %s}\n", key);
    const struct { const char *yaml, *where, *error; } cases[] = {
        { "    \"x team\": abc\n", ":11:5: ", "a header name has only A-Z a-z 0-9 and ! # $ % & "
          "' * + - . ^ _ ` | ~ (RFC 9110's token); byte 2 is not one" },
        { "    \"\": abc\n", ":11:5: ", "a header name is 1 to 128 characters" },
        { from_bad, ":11:12: ", "otlp_headers: x-key: the value (from value_env or value_file) "
          "has a control character (CR, LF or another) at byte 12" },
        { "    x-key: \"a\\nb\"\n", ":11:12: ", "the value has a control character" },
        { "    x-key: \"\"\n", ":11:12: ", "the value must be 1 to 4096 bytes" },
        { "    x-key:\n", ":11:11: ", "the value is empty" },
        { "    Content-Type: text/plain\n", ":11:5: ", "Content-Type is set by sekali itself" },
        { "    x-a: 1\n    X-A: 2\n", ":12:5: ", "X-A is given twice (names ignore case)" },
        { both, ":11:12: ", "give one of value, value_env or value_file" },
        { "    x-key: {value_env: SK_TEST_OTLP_UNSET}\n", ":11:24: ",
          "environment variable SK_TEST_OTLP_UNSET is not set" },
        { "    x-key: {secret: a}\n", ":11:13: ", "secret" },
        { "    x-key: [a]\n", ":11:12: ", "expected a value or {value_file: path}" },
        { many, ":11:5: ", "otlp_headers: at most 16 headers, got 17" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char p2[] = "/tmp/sk-tracing-XXXXXX.yaml";
        snprintf(text, sizeof(text), "%s%s", base, cases[i].yaml);
        write_temp(p2, 5, text);
        const char *msg = load_error(p2);
        ck_assert_msg(strstr(msg, cases[i].where) != NULL && strstr(msg, cases[i].error) != NULL,
                      "case %zu: got \"%s\"", i, msg);
        assert_no_secret(msg);
        unlink(p2);
    }
    unsetenv("SK_TEST_OTLP_KEY");
    unlink(key);
    unlink(bad);
}
END_TEST

START_TEST(test_full_config_sets_every_key)
{
    struct sk_conf *c = load_ok(DATA "good_full.yaml");

    ck_assert_str_eq(c->amqp.nodes[0].host, "mq.example");
    ck_assert_int_eq(c->amqp.nodes[0].port, 5673);
    ck_assert_str_eq(c->amqp.vhost, "jobs");
    ck_assert_str_eq(c->amqp.user, "worker");
    ck_assert_str_eq(c->amqp.password, "s3cret");
    ck_assert_uint_eq(c->amqp.heartbeat_ms, 0);
    ck_assert_uint_eq(c->amqp.connect_timeout_ms, 250);
    ck_assert_str_eq(c->redis.host, "redis.example");
    ck_assert_int_eq(c->redis.port, 6380);
    ck_assert_int_eq(c->redis.db, 3);
    ck_assert_uint_eq(c->redis.timeout_ms, 1500);
    ck_assert_str_eq(c->postgres.conninfo, "host=db.example port=5433 dbname=sekali user=sekali");
    ck_assert_uint_eq(c->lock.ttl_ms, 20000);
    ck_assert_uint_eq(c->lock.busy_wait_ms, 0);
    ck_assert_int_eq(c->log.level, SK_LOG_DEBUG);
    ck_assert_int_eq(c->log.format, SK_LOG_FORMAT_JSON);
    ck_assert_uint_eq(c->shutdown_timeout_ms, 60000);
    ck_assert_str_eq(c->metrics.listen_host, "::1");
    ck_assert_int_eq(c->metrics.listen_port, 9187);

    ck_assert_uint_eq(c->n_queues, 2);
    const struct sk_queue_conf *q = &c->queues[0];
    ck_assert_str_eq(q->name, "invoices");
    ck_assert_int_eq(q->workers, 4);
    ck_assert_int_eq(q->prefetch, 8);
    ck_assert_int_eq(q->mode, SK_MODE_EXTERNAL);
    ck_assert(!q->lock);
    ck_assert_uint_eq(q->lock_ttl_ms, 45000);
    ck_assert_uint_eq(q->max_body, 64 * 1024);
    ck_assert_uint_eq(q->n_job_types, 2);
    ck_assert_str_eq(q->job_types[0], "create_invoice");
    ck_assert_str_eq(q->job_types[1], "void_invoice");
    ck_assert_uint_eq(q->job_timeout_ms, 5 * 60 * 1000);
    ck_assert_int_eq(q->max_crashes, 0);
    ck_assert_str_eq(c->queues[1].name, "mail.out_1");
    ck_assert_uint_eq(c->queues[1].n_job_types, 0);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_lock_ttl_defaults_to_lock_section_even_when_it_comes_later)
{
    struct sk_conf *c = load_ok(DATA "good_full.yaml");

    /* queues: precedes lock: in the file, and the second queue sets no lock_ttl. */
    ck_assert_uint_eq(c->queues[1].lock_ttl_ms, 20000);
    ck_assert_uint_eq(c->queues[0].lock_ttl_ms, 45000);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_null_sections_keep_their_defaults)
{
    struct sk_conf *c = load_ok(DATA "good_null_sections.yaml");

    ck_assert_str_eq(c->redis.host, "127.0.0.1");
    ck_assert_uint_eq(c->lock.ttl_ms, 30000);
    ck_assert_ptr_null(c->queues[0].handler_config);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_queue_is_found_by_name)
{
    struct sk_conf *c = load_ok(DATA "good_full.yaml");

    ck_assert_ptr_eq(sk_conf_queue(c, "mail.out_1"), &c->queues[1]);
    ck_assert_ptr_eq(sk_conf_queue(c, "invoices"), &c->queues[0]);
    ck_assert_ptr_null(sk_conf_queue(c, "invoice"));
    ck_assert_ptr_null(sk_conf_queue(NULL, "invoices"));
    sk_conf_free(c);
}
END_TEST

START_TEST(test_free_accepts_null)
{
    sk_conf_free(NULL);
}
END_TEST

START_TEST(test_relative_handler_is_resolved_against_config_directory)
{
    struct sk_conf *c = load_ok(DATA "good_full.yaml");
    char dir[PATH_MAX], want[PATH_MAX + 64];

    ck_assert_ptr_nonnull(realpath("tests/data", dir));
    snprintf(want, sizeof(want), "%s/handlers/invoice.so", dir);
    ck_assert_str_eq(c->queues[0].handler, want);
    snprintf(want, sizeof(want), "%s/../handlers/mail.so", dir);
    ck_assert_str_eq(c->queues[1].handler, want);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_absolute_handler_is_kept_as_written)
{
    struct sk_conf *c = load_ok(DATA "good_minimal.yaml");

    ck_assert_str_eq(c->queues[0].handler, "/usr/lib/sekali/handlers/invoice.so");
    sk_conf_free(c);
}
END_TEST

/* The value of key in the root mapping of doc, or NULL. */
static yaml_node_t *lookup(yaml_document_t *doc, yaml_node_t *map, const char *key)
{
    ck_assert_int_eq(map->type, YAML_MAPPING_NODE);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        if (strcmp((const char *)k->data.scalar.value, key) == 0)
            return yaml_document_get_node(doc, p->value);
    }
    return NULL;
}

START_TEST(test_handler_config_is_reemitted_as_yaml)
{
    struct sk_conf *c = load_ok(DATA "good_full.yaml");
    const char *text = c->queues[0].handler_config;
    yaml_parser_t parser;
    yaml_document_t doc;

    ck_assert_str_eq(text, "table: invoices\nretries: 3\nnested:\n  list:\n  - a\n  - \"b\"\n");

    /* And it reads back as the same tree. */
    ck_assert(yaml_parser_initialize(&parser));
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    ck_assert(yaml_parser_load(&parser, &doc));
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    ck_assert_str_eq((const char *)lookup(&doc, root, "table")->data.scalar.value, "invoices");
    ck_assert_str_eq((const char *)lookup(&doc, root, "retries")->data.scalar.value, "3");
    yaml_node_t *list = lookup(&doc, lookup(&doc, root, "nested"), "list");
    ck_assert_int_eq(list->type, YAML_SEQUENCE_NODE);
    ck_assert_int_eq(list->data.sequence.items.top - list->data.sequence.items.start, 2);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_absent_handler_config_is_null)
{
    struct sk_conf *c = load_ok(DATA "good_full.yaml");

    ck_assert_ptr_null(c->queues[1].handler_config);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_aliases_in_handler_config_are_not_expanded)
{
    struct sk_conf *c = load_ok(DATA "good_aliases.yaml");

    /* Expanded, the laughs would be 9^9 scalars; shared, they are a page. */
    ck_assert_uint_lt(strlen(sk_conf_queue(c, "laughs")->handler_config), 4096);
    ck_assert_ptr_nonnull(strstr(sk_conf_queue(c, "laughs")->handler_config, "i:\n- *id008\n"));
    ck_assert_str_eq(sk_conf_queue(c, "loop")->handler_config, "&id001\n- 1\n- *id001\n");
    ck_assert_str_eq(sk_conf_queue(c, "scalar")->handler_config, "just text\n");
    sk_conf_free(c);
}
END_TEST

START_TEST(test_url_password_is_used_and_empty_vhost_means_default)
{
    struct sk_conf *c = load_ok(DATA "good_null_sections.yaml");

    ck_assert_str_eq(c->amqp.user, "sekali");
    ck_assert_str_eq(c->amqp.password, "pw");
    ck_assert_str_eq(c->amqp.vhost, "/");
    sk_conf_free(c);
}
END_TEST

START_TEST(test_conninfo_password_moves_out_of_conninfo)
{
    struct sk_conf *c = load_ok(DATA "good_null_sections.yaml");

    ck_assert_str_eq(c->postgres.password, "pg pw");
    ck_assert_str_eq(c->postgres.conninfo, "user='sekali' connect_timeout='5' dbname='sekali' "
                     "host='db.example' port='5433'");
    sk_conf_free(c);
}
END_TEST

START_TEST(test_password_env_is_read_at_load)
{
    setenv("SEKALI_TEST_AMQP_PASSWORD", "from env", 1);
    struct sk_conf *c = load_ok(DATA "good_password_env.yaml");

    ck_assert_str_eq(c->amqp.password, "from env");
    ck_assert_str_eq(c->amqp.user, "sekali");
    ck_assert_str_eq(c->redis.password, "from env");
    sk_conf_free(c);
}
END_TEST

START_TEST(test_empty_password_env_is_refused)
{
    setenv("SEKALI_TEST_SURELY_UNSET", "", 1);
    ck_assert_str_eq(load_error(DATA "bad_password_env_unset.yaml"),
                     DATA "bad_password_env_unset.yaml:2:17: password_env: environment variable "
                     "SEKALI_TEST_SURELY_UNSET is empty");
    unsetenv("SEKALI_TEST_SURELY_UNSET");
}
END_TEST

START_TEST(test_password_file_loses_exactly_one_trailing_newline)
{
    static const struct { const char *content, *password; } cases[] = {
        { "hunter2\n", "hunter2" }, { "hunter2", "hunter2" },
        { "two\n\n", "two\n" }, { "crlf\r\n", "crlf" }, { " spaced ", " spaced " },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char pw[] = "/tmp/sekali-pw-XXXXXX", cfg[] = "/tmp/sekali-conf-XXXXXX.yaml";
        write_temp(pw, 0, cases[i].content);
        write_config_with_file(cfg, pw);
        struct sk_conf *c = load_ok(cfg);
        unlink(pw);
        unlink(cfg);
        ck_assert_str_eq(c->redis.password, cases[i].password);
        sk_conf_free(c);
    }
}
END_TEST

START_TEST(test_relative_password_file_follows_config_directory)
{
    char pw[] = "/tmp/sekali-pw-XXXXXX", cfg[] = "/tmp/sekali-conf-XXXXXX.yaml";
    char cwd[PATH_MAX];

    write_temp(pw, 0, "relative\n");
    write_config_with_file(cfg, pw + strlen("/tmp/"));
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof(cwd)));
    ck_assert_int_eq(chdir("/"), 0);  /* the cwd must not matter */
    struct sk_conf *c = load_ok(cfg);
    ck_assert_int_eq(chdir(cwd), 0);
    unlink(pw);
    unlink(cfg);
    ck_assert_str_eq(c->redis.password, "relative");
    ck_assert_str_eq(c->queues[0].handler, "/tmp/h.so");
    sk_conf_free(c);
}
END_TEST

START_TEST(test_empty_password_file_is_refused)
{
    char pw[] = "/tmp/sekali-pw-XXXXXX", cfg[] = "/tmp/sekali-conf-XXXXXX.yaml";
    char want[256];

    write_temp(pw, 0, "\n");
    write_config_with_file(cfg, pw);
    snprintf(want, sizeof(want), "%s:4:18: password_file: %s is empty", cfg, pw);
    const char *msg = load_error(cfg);
    unlink(pw);
    unlink(cfg);
    ck_assert_str_eq(msg, want);
}
END_TEST

START_TEST(test_unreadable_password_file_is_reported_at_its_key)
{
    char cfg[] = "/tmp/sekali-conf-XXXXXX.yaml";
    char want[256];

    write_config_with_file(cfg, "/tmp");
    snprintf(want, sizeof(want), "%s:4:18: password_file: cannot read /tmp: Is a directory", cfg);
    const char *msg = load_error(cfg);
    unlink(cfg);
    ck_assert_str_eq(msg, want);
}
END_TEST

START_TEST(test_password_file_with_a_nul_byte_is_refused_without_showing_it)
{
    char pw[] = "/tmp/sekali-pw-XXXXXX", cfg[] = "/tmp/sekali-conf-XXXXXX.yaml";
    char want[256];

    int fd = mkstemp(pw);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "Sup3r\0S3cret\n", 13), 13);
    close(fd);
    write_config_with_file(cfg, pw);
    snprintf(want, sizeof(want), "%s:4:18: password_file: %s contains a NUL byte", cfg, pw);
    const char *msg = load_error(cfg);
    unlink(pw);
    unlink(cfg);
    assert_no_secret(msg);
    ck_assert_str_eq(msg, want);
}
END_TEST

/* Nobody writes to the FIFO: the load must not wait for a writer. The
 * alarm turns a hang into a failure of this test alone. */
START_TEST(test_password_file_that_is_a_fifo_is_refused_without_blocking)
{
    char dir[] = "/tmp/sekali-fifo-XXXXXX", fifo[64], cfg[] = "/tmp/sekali-conf-XXXXXX.yaml";
    char want[256];

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/pw", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    write_config_with_file(cfg, fifo);
    alarm(10);
    const char *msg = load_error(cfg);
    alarm(0);
    snprintf(want, sizeof(want), "%s:4:18: password_file: cannot read %s: not a regular file "
             "(a FIFO, device or socket)", cfg, fifo);
    unlink(fifo);
    rmdir(dir);
    unlink(cfg);
    ck_assert_str_eq(msg, want);
}
END_TEST

/* The TLS files of every server (here redis.tls's ca_file and amqp.tls's
 * key_file) are checked at load: a FIFO among them must not hang
 * `sekalid -t` or a reload waiting for a writer. */
START_TEST(test_tls_file_that_is_a_fifo_is_refused_without_blocking)
{
    char dir[] = "/tmp/sekali-fifo-XXXXXX", fifo[64], cfg[] = "/tmp/sekali-conf-XXXXXX.yaml";
    char text[1024], want[256];

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/ca.pem", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    static const char *const sections[] = {
        "redis:\n  tls:\n    ca_file: %s\n",
        "amqp:\n  url: amqps://mq.example/\n  tls:\n    cert_file: %s\n    key_file: %s\n",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(sections); i++) {
        char section[256];
        snprintf(section, sizeof(section), sections[i], fifo, fifo);
        snprintf(text, sizeof(text), "%s%spostgres: {conninfo: \"dbname=sekali\"}\n"
                 "queues: [{name: q, handler: h.so}]\n",
                 i == 0 ? "amqp: {url: \"amqp://127.0.0.1/\"}\n" : "", section);
        write_temp(cfg, 5, text);
        alarm(10);
        const char *msg = load_error(cfg);
        alarm(0);
        snprintf(want, sizeof(want), "%s: cannot open %s: not a regular file (a FIFO, device "
                 "or socket)", i == 0 ? "redis.tls.ca_file" : "amqp.tls.cert_file", fifo);
        ck_assert_msg(strstr(msg, want) != NULL, "said \"%s\", not \"%s\"", msg, want);
        unlink(cfg);
        memcpy(cfg + strlen(cfg) - 11, "XXXXXX", 6);
    }
    unlink(fifo);
    rmdir(dir);
}
END_TEST

START_TEST(test_config_file_that_is_a_fifo_is_refused_without_blocking)
{
    char dir[] = "/tmp/sekali-fifo-XXXXXX", fifo[64], want[256];

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/sekali.yaml", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    alarm(10);
    const char *msg = load_error(fifo);
    alarm(0);
    snprintf(want, sizeof(want), "%s: cannot read: not a regular file (a FIFO, device or "
             "socket)", fifo);
    unlink(fifo);
    rmdir(dir);
    ck_assert_str_eq(msg, want);
}
END_TEST

START_TEST(test_example_config_loads)
{
    setenv("SEKALI_AMQP_PASSWORD", "amqp-secret", 1);
    setenv("SEKALI_PG_PASSWORD", "pg-secret", 1);
    struct sk_conf *c = load_ok("conf/sekali.yaml");

    ck_assert_str_eq(c->amqp.user, "sekali");
    ck_assert_str_eq(c->amqp.password, "amqp-secret");
    ck_assert_str_eq(c->amqp.vhost, "/");
    ck_assert_str_eq(c->postgres.conninfo, "host=127.0.0.1 port=5432 dbname=sekali user=sekali");
    ck_assert_str_eq(c->postgres.password, "pg-secret");
    const struct sk_queue_conf *q = sk_conf_queue(c, "invoices");
    ck_assert_ptr_nonnull(q);
    ck_assert_str_eq(q->handler, "/usr/local/lib/sekali/handlers/invoice.so");
    ck_assert_str_eq(q->handler_config, "table: invoices\n");
    ck_assert_ptr_null(c->metrics.listen_host);
    sk_conf_free(c);
}
END_TEST

/* Loads a minimal config whose metrics section is `metrics: <section>`;
 * returns the error message, or "" with host and port filled. */
static const char *load_listen(const char *section, char *host, size_t size, int *port)
{
    static char msg[256];
    char cfg[] = "/tmp/sekali-listen-XXXXXX.yaml", text[512];
    struct sk_conf *c = NULL;
    struct sk_err err = { 0 };

    snprintf(text, sizeof(text),
             "amqp: {url: \"amqp://127.0.0.1/\"}\n"
             "postgres: {conninfo: \"dbname=sekali\"}\n"
             "queues: [{name: q, handler: h.so}]\n"
             "metrics: %s\n", section);
    write_temp(cfg, 5, text);
    int rc = sk_conf_load(cfg, &c, &err);
    unlink(cfg);
    if (rc != SK_OK) {
        /* Drop "path:line:column: ": the fixtures pin positions. */
        const char *p = err.msg;
        for (int colons = 0; *p != '\0' && colons < 3; p++)
            colons += *p == ':';
        snprintf(msg, sizeof(msg), "%s", *p == ' ' ? p + 1 : p);
        return msg;
    }
    snprintf(host, size, "%s", c->metrics.listen_host ? c->metrics.listen_host : "(off)");
    *port = c->metrics.listen_port;
    sk_conf_free(c);
    return "";
}

START_TEST(test_metrics_listen_takes_host_and_port)
{
    static const struct { const char *section, *host; int port; } cases[] = {
        { "{listen: 127.0.0.1:9187}", "127.0.0.1", 9187 },
        { "{listen: \"0.0.0.0:1\"}", "0.0.0.0", 1 },
        { "{listen: \"[::1]:65535\"}", "::1", 65535 },
        { "{listen: localhost:9187}", "localhost", 9187 },
        { "{listen: metrics-1.example.com:80}", "metrics-1.example.com", 80 },
        { "{listen: \"\"}", "(off)", 0 },
        { "{listen: }", "(off)", 0 },
        { "{}", "(off)", 0 },
        { "", "(off)", 0 },
    };
    char host[256];
    int port;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        port = 0;
        ck_assert_str_eq(load_listen(cases[i].section, host, sizeof(host), &port), "");
        ck_assert_str_eq(host, cases[i].host);
        ck_assert_int_eq(port, cases[i].port);
    }
}
END_TEST

START_TEST(test_metrics_listen_refuses_what_cannot_be_an_address)
{
    static const struct { const char *section, *message; } cases[] = {
        { "{listen: \"9187\"}", "listen: expected host:port, got \"9187\"" },
        { "{listen: \"127.0.0.1\"}", "listen: expected host:port, got \"127.0.0.1\"" },
        { "{listen: \"127.0.0.1:\"}", "listen: port must be between 1 and 65535, got \"\"" },
        { "{listen: \"127.0.0.1:0\"}", "listen: port must be between 1 and 65535, got \"0\"" },
        { "{listen: \"127.0.0.1:-1\"}",
          "listen: port must be between 1 and 65535, got \"-1\"" },
        { "{listen: \"127.0.0.1:http\"}",
          "listen: port must be between 1 and 65535, got \"http\"" },
        { "{listen: \"127.0.0.1:9187 \"}",
          "listen: port must be between 1 and 65535, got \"9187 \"" },
        { "{listen: \"256.0.0.1:9187\"}", "listen: invalid IPv4 address \"256.0.0.1\"" },
        { "{listen: \"::1:9187\"}",
          "listen: an IPv6 address needs brackets, as in [::1]:9187, got \"::1:9187\"" },
        { "{listen: \"[::1]\"}", "listen: expected [IPv6 address]:port, got \"[::1]\"" },
        { "{listen: \"[::g]:9187\"}", "listen: invalid IPv6 address \"::g\"" },
        { "{listen: \"bad_host:9187\"}", "listen: invalid host name \"bad_host\"" },
        { "{listen: \"-host:9187\"}", "listen: invalid host name \"-host\"" },
        { "{listen: \"host.:9187\"}", "listen: invalid host name \"host.\"" },
        { "{listen: [127.0.0.1:9187]}", "listen: expected a scalar, got a sequence" },
        { "{port: 9187}", "unknown key \"port\" in metrics" },
        { "127.0.0.1:9187", "metrics: expected a mapping, got a scalar" },
    };
    char host[256];
    int port;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_str_eq(load_listen(cases[i].section, host, sizeof(host), &port),
                         cases[i].message);
}
END_TEST

static const char *load_text(const char *text, struct sk_conf **out);

/* Loads a minimal config whose fourth line is `redis: <section>`; returns
 * the error message without the file name ("line:column: ..."), or "" with
 * the loaded config in *out, which the caller frees. */
static const char *load_redis(const char *section, struct sk_conf **out)
{
    char text[512];

    snprintf(text, sizeof(text),
             "amqp: {url: \"amqp://127.0.0.1/\"}\n"
             "postgres: {conninfo: \"dbname=sekali\"}\n"
             "queues: [{name: q, handler: h.so}]\n"
             "redis: %s\n", section);
    return load_text(text, out);
}

/* Loads text as a config file: "" with the config in *out (the caller
 * frees), or the error without the file name ("line:column: ..."). */
static const char *load_text(const char *text, struct sk_conf **out)
{
    static char msg[256];
    char cfg[] = "/tmp/sekali-conf-XXXXXX.yaml";
    struct sk_err err = { 0 };

    write_temp(cfg, 5, text);
    *out = NULL;
    int rc = sk_conf_load(cfg, out, &err);
    unlink(cfg);
    if (rc == SK_OK)
        return "";
    ck_assert_msg(strncmp(err.msg, cfg, strlen(cfg)) == 0 && err.msg[strlen(cfg)] == ':',
                  "no file name in \"%s\"", err.msg);
    snprintf(msg, sizeof(msg), "%s", err.msg + strlen(cfg) + 1);
    return msg;
}

/* A header (an API key, as a rule) to an http:// collector beyond loopback
 * crosses the network in clear: said at start and by sekalid -t, never
 * with the value; not for https://, loopback, or an export without
 * headers. */
START_TEST(test_tracing_headers_in_clear_beyond_loopback_are_warned_about)
{
    static const struct { const char *endpoint, *headers; int advice; } cases[] = {
        { "http://10.1.2.3:4318/v1/traces", "{x-key: k3y-value}", 1 },
        { "http://collector.internal/v1/traces", "{x-key: k3y-value}", 1 },
        { "http://127.0.0.1:4318/v1/traces", "{x-key: k3y-value}", 0 },
        { "http://LOCALHOST:4318/v1/traces", "{x-key: k3y-value}", 0 },
        { "http://[::1]:4318/v1/traces", "{x-key: k3y-value}", 0 },
        { "http://localhost.evil.example/v1/traces", "{x-key: k3y-value}", 1 },
        { "http://127.0.0.9:4318/v1/traces", "{x-key: k3y-value}", 0 },
        { "http://127.evil.example/v1/traces", "{x-key: k3y-value}", 1 },
        { "https://10.1.2.3:4318/v1/traces", "{x-key: k3y-value}", 0 },
        { "http://10.1.2.3:4318/v1/traces", "{}", 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text),
                 "amqp: {url: \"amqp://127.0.0.1/\"}\n"
                 "postgres: {conninfo: \"dbname=sekali\"}\n"
                 "queues: [{name: q, handler: h.so}]\n"
                 "tracing: {otlp_endpoint: \"%s\", otlp_headers: %s}\n",
                 cases[i].endpoint, cases[i].headers);
        struct sk_conf *c;
        const char *msg = load_text(text, &c);
        ck_assert_msg(msg[0] == '\0', "%s: %s", cases[i].endpoint, msg);
        static char said[4096];
        said[0] = '\0';
        int advice = sk_conf_advise(c, keep_advice, said);
        ck_assert_msg(advice == cases[i].advice, "%s %s: %d warnings: %s", cases[i].endpoint,
                      cases[i].headers, advice, said);
        ck_assert_msg(advice == 0 || strstr(said, "sent in clear text") != NULL, "%s", said);
        ck_assert_msg(strstr(said, "k3y-value") == NULL, "the header's value in: %s", said);
        sk_conf_free(c);
    }
}
END_TEST

/* Loads a minimal config whose queue has `rate_limit: <value>` on line 5,
 * at column 17; returns the error without the file name, or "" with the
 * config in *out (the caller frees). */
static const char *load_rate(const char *value, struct sk_conf **out)
{
    char text[512];

    snprintf(text, sizeof(text),
             "amqp: {url: \"amqp://127.0.0.1/\"}\n"
             "postgres: {conninfo: \"dbname=sekali\"}\n"
             "queues:\n"
             "  - {name: q, handler: h.so,\n"
             "     rate_limit: %s}\n", value);
    return load_text(text, out);
}

START_TEST(test_rate_limit_takes_a_rate_or_a_mapping)
{
    static const struct {
        const char *value;
        uint32_t    count, period_ms, burst;
        int         per;
    } cases[] = {
        { "100/s", 100, 1000, 100, SK_RATE_PER_QUEUE },
        { "5/m", 5, 60000, 5, SK_RATE_PER_QUEUE },
        { "10/2s", 10, 2000, 10, SK_RATE_PER_QUEUE },
        { "1/500ms", 1, 500, 1, SK_RATE_PER_QUEUE },
        { "{rate: 100/s, burst: 20}", 100, 1000, 20, SK_RATE_PER_QUEUE },
        { "{rate: 3/h, per: resource}", 3, 3600000, 3, SK_RATE_PER_RESOURCE },
        { "~", 0, 0, 0, SK_RATE_PER_QUEUE },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sk_conf *c;
        ck_assert_str_eq(load_rate(cases[i].value, &c), "");
        const struct sk_rate_conf *r = &c->queues[0].rate;
        ck_assert_msg(r->count == cases[i].count && r->period_ms == cases[i].period_ms &&
                      r->burst == cases[i].burst && (int)r->per == cases[i].per,
                      "%s: count %u period %u burst %u per %d", cases[i].value, r->count,
                      r->period_ms, r->burst, (int)r->per);
        sk_conf_free(c);
    }
}
END_TEST

/* Each refused with the value's line and column, and why. */
START_TEST(test_rate_limit_refuses_a_bad_rate_at_its_position)
{
    static const struct { const char *value, *message; } cases[] = {
        { "100", "5:18: rate_limit: invalid rate \"100\": expected <count>/<period>, e.g. "
          "100/s, 5/m or 10/2s" },
        { "100/x", "5:18: rate_limit: invalid rate \"100/x\": the period must be a duration "
          "from 1ms to 24h (ms, s, m or h), e.g. 100/s" },
        { "0/s", "5:18: rate_limit: invalid rate \"0/s\": the count must be a whole number "
          "from 1 to 1000000" },
        { "-5/s", "5:18: rate_limit: invalid rate \"-5/s\": the count must be a whole number "
          "from 1 to 1000000" },
        { "1/2d", "5:18: rate_limit: invalid rate \"1/2d\": the period must be a duration "
          "from 1ms to 24h (ms, s, m or h), e.g. 100/s" },
        { "2000/ms", "5:18: rate_limit: rate \"2000/ms\" is too high: at most 1000000 a "
          "second" },
        { "{rate: 10/s, burst: 0}", "5:38: burst must be between 1 and 1000000, got 0" },
        { "{burst: 5}", "5:18: missing required key \"rate\" in rate_limit" },
        { "{rate: 10/s, per: tenant}", "5:36: unknown per \"tenant\": expected queue or "
          "resource" },
        { "{rate: 1/24h, burst: 1000000}", "5:39: rate_limit: a burst of 1000000 at this rate "
          "is more than 30 days' worth of jobs" },
        { "[100/s]", "5:18: rate_limit: expected a rate (e.g. 100/s) or a mapping with rate, "
          "burst and per, got a sequence" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sk_conf *c;
        ck_assert_str_eq(load_rate(cases[i].value, &c), cases[i].message);
    }
}
END_TEST

/* A config of one queue q, whose mapping ends with the %s given. */
static const char one_queue[] = "amqp: {url: \"amqp://127.0.0.1/\"}\n"
                                "postgres: {conninfo: \"dbname=sekali\"}\n"
                                "queues:\n"
                                "  - {name: q, handler: h.so%s}\n";

/* queues[].concurrency: 1 unless given, 1..10000, refused at its position. */
START_TEST(test_concurrency_defaults_to_one_and_refuses_out_of_range_at_its_position)
{
    char text[512];
    struct sk_conf *c;
    const char *fmt = one_queue;
    snprintf(text, sizeof(text), fmt, "");
    ck_assert_str_eq(load_text(text, &c), "");
    ck_assert_int_eq(c->queues[0].concurrency, 1);
    sk_conf_free(c);
    snprintf(text, sizeof(text), fmt, ", concurrency: 10000");
    ck_assert_str_eq(load_text(text, &c), "");
    ck_assert_int_eq(c->queues[0].concurrency, 10000);
    sk_conf_free(c);
    static const struct { const char *value, *message; } cases[] = {
        { ", concurrency: 0", "4:43: concurrency must be between 1 and 10000, got 0" },
        { ", concurrency: 10001", "4:43: concurrency must be between 1 and 10000, got 10001" },
        { ", concurrency: three", "4:43: concurrency: expected an integer, got \"three\"" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(text, sizeof(text), fmt, cases[i].value);
        ck_assert_str_eq(load_text(text, &c), cases[i].message);
    }
}
END_TEST

/* queues[].lanes: 0 unless given, 0 or 2..32; tenant_header a bounded
 * name, x-tenant unless given; each refused at its position. A queue may
 * not be named as another's lane. */
START_TEST(test_lanes_refuse_one_and_above_32_and_a_bad_tenant_header_at_their_position)
{
    char text[1024];
    struct sk_conf *c;
    const char *fmt = one_queue;
    snprintf(text, sizeof(text), fmt, "");
    ck_assert_str_eq(load_text(text, &c), "");
    ck_assert_int_eq(c->queues[0].lanes, 0);
    ck_assert_str_eq(c->queues[0].tenant_header, "x-tenant");
    sk_conf_free(c);
    snprintf(text, sizeof(text), fmt, ", lanes: 32, tenant_header: x-org");
    ck_assert_str_eq(load_text(text, &c), "");
    ck_assert_int_eq(c->queues[0].lanes, 32);
    ck_assert_str_eq(c->queues[0].tenant_header, "x-org");
    sk_conf_free(c);
    char long_name[200];
    memset(long_name, 'h', 129);
    long_name[129] = '\0';
    char too_long[256], too_long_msg[256];
    snprintf(too_long, sizeof(too_long), ", tenant_header: %s", long_name);
    snprintf(too_long_msg, sizeof(too_long_msg), "4:45: tenant_header: expected 1 to 128 of "
             "A-Z a-z 0-9 . _ -, got \"%.64s\"", long_name);
    static const struct { const char *value, *message; } cases[] = {
        { ", lanes: 1", "4:37: lanes must be 0 (no lanes) or 2 to 32, got 1 (one lane is "
                        "the queue itself)" },
        { ", lanes: 33", "4:37: lanes must be between 0 and 32, got 33" },
        { ", tenant_header: \"x tenant\"", "4:45: tenant_header: expected 1 to 128 of "
                                         "A-Z a-z 0-9 . _ -, got \"x tenant\"" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(text, sizeof(text), fmt, cases[i].value);
        ck_assert_str_eq(load_text(text, &c), cases[i].message);
    }
    snprintf(text, sizeof(text), fmt, too_long);
    ck_assert_str_eq(load_text(text, &c), too_long_msg);
    snprintf(text, sizeof(text), "amqp: {url: \"amqp://127.0.0.1/\"}\n"
             "postgres: {conninfo: \"dbname=sekali\"}\n"
             "queues:\n"
             "  - {name: q, handler: h.so, lanes: 2}\n"
             "  - {name: q.lane.1, handler: h.so}\n");
    ck_assert_ptr_nonnull(strstr(load_text(text, &c), "is one of"));
}
END_TEST

START_TEST(test_redis_sentinels_take_a_list_of_host_port_and_a_master_name)
{
    struct sk_conf *c;

    ck_assert_str_eq(load_redis("{sentinels: [\"10.0.0.1:26379\", \"sentinel-2:26380\", "
                                "\"[::1]:26381\"], master_name: locks}", &c), "");
    ck_assert_uint_eq(c->redis.n_sentinels, 3);
    ck_assert_str_eq(c->redis.sentinels[0].host, "10.0.0.1");
    ck_assert_int_eq(c->redis.sentinels[0].port, 26379);
    ck_assert_str_eq(c->redis.sentinels[1].host, "sentinel-2");
    ck_assert_int_eq(c->redis.sentinels[1].port, 26380);
    ck_assert_str_eq(c->redis.sentinels[2].host, "::1");
    ck_assert_int_eq(c->redis.sentinels[2].port, 26381);
    ck_assert_str_eq(c->redis.master_name, "locks");
    sk_conf_free(c);

    ck_assert_str_eq(load_redis("{host: 10.0.0.9}", &c), "");
    ck_assert_uint_eq(c->redis.n_sentinels, 0);
    ck_assert_ptr_null(c->redis.master_name);
    sk_conf_free(c);
}
END_TEST

START_TEST(test_redis_sentinels_refuse_what_cannot_name_a_master)
{
    static const struct { const char *section, *message; } cases[] = {
        { "{sentinels: [\"127.0.0.1:26379\"]}",
          "4:20: redis.sentinels needs redis.master_name: the name the sentinels monitor "
          "the master by" },
        { "{master_name: locks}",
          "4:22: redis.master_name needs redis.sentinels: a list of host:port to ask for "
          "the master" },
        { "{sentinels: [], master_name: locks}",
          "4:37: redis.master_name needs redis.sentinels: a list of host:port to ask for "
          "the master" },
        { "{sentinels: \"127.0.0.1:26379\", master_name: locks}",
          "4:20: sentinels: expected a sequence of host:port, got a scalar" },
        { "{sentinels: [\"127.0.0.1:26379\", \"127.0.0.1\"], master_name: locks}",
          "4:40: sentinels[1]: expected host:port, got \"127.0.0.1\"" },
        { "{sentinels: [\":26379\"], master_name: locks}",
          "4:21: sentinels[0]: missing host in \":26379\"" },
        { "{sentinels: [\"127.0.0.1:0\"], master_name: locks}",
          "4:21: sentinels[0]: port must be between 1 and 65535, got \"0\"" },
        { "{sentinels: [{host: a}], master_name: locks}",
          "4:21: sentinels[0]: expected host:port, got a mapping" },
        { "{sentinels: [\"a:1\"], master_name: \"\"}",
          "4:42: master_name must not be empty" },
    };
    struct sk_conf *c;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_str_eq(load_redis(cases[i].section, &c), cases[i].message);
}
END_TEST

/* Loads a minimal config with `queue_extra` in its one queue and
 * `top_extra` as further top-level lines; as load_redis(). */
static const char *load_retention(const char *queue_extra, const char *top_extra,
                                  struct sk_conf **out)
{
    static char msg[256];
    char cfg[] = "/tmp/sekali-retention-XXXXXX.yaml", text[512];
    struct sk_err err = { 0 };

    snprintf(text, sizeof(text),
             "amqp: {url: \"amqp://127.0.0.1/\"}\n"
             "postgres: {conninfo: \"dbname=sekali\"}\n"
             "queues: [{name: q, handler: h.so, %s}]\n%s", queue_extra, top_extra);
    write_temp(cfg, 5, text);
    *out = NULL;
    int rc = sk_conf_load(cfg, out, &err);
    unlink(cfg);
    if (rc == SK_OK)
        return "";
    snprintf(msg, sizeof(msg), "%s", err.msg + strlen(cfg) + 1);
    return msg;
}

START_TEST(test_retention_takes_years_or_forever)
{
    struct sk_conf *conf;
    /* Ten years: more than a 32-bit millisecond count holds (~49 days). */
    ck_assert_str_eq(load_retention("retention: 87600h", "janitor: {outbox_retention: 8760h}\n",
                                    &conf), "");
    ck_assert_uint_eq(conf->queues[0].retention_ms, UINT64_C(87600) * 3600 * 1000);
    ck_assert_uint_eq(conf->janitor.outbox_retention_ms, UINT64_C(8760) * 3600 * 1000);
    sk_conf_free(conf);

    ck_assert_str_eq(load_retention("retention: forever", "janitor: {outbox_retention: forever}\n",
                                    &conf), "");
    ck_assert(conf->queues[0].retention_ms == SK_RETENTION_FOREVER);
    ck_assert(conf->janitor.outbox_retention_ms == SK_RETENTION_FOREVER);
    sk_conf_free(conf);

    ck_assert_str_eq(load_retention("retention: 876001h", "", &conf),
                     "3:46: retention must be between 1s and 876000h, or forever, got 876001h");
    ck_assert_str_eq(load_retention("retention: always", "", &conf),
                     "3:46: invalid duration \"always\": expected a number followed by ms, s, "
                     "m or h, or forever");
}
END_TEST

START_TEST(test_duration_accepts_each_unit)
{
    static const struct { const char *text; uint64_t ms; } cases[] = {
        { "250ms", 250 }, { "30s", 30000 }, { "5m", 300000 }, { "1h", 3600000 },
        { "0s", 0 }, { "0ms", 0 }, { "007s", 7000 },
        { "18446744073709551615ms", UINT64_MAX },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t ms = 1;
        struct sk_err err = { 0 };
        ck_assert_msg(sk_conf_value_parse_duration(cases[i].text, &ms, &err) == SK_OK, "%s: %s",
                      cases[i].text, err.msg);
        ck_assert_uint_eq(ms, cases[i].ms);
    }
}
END_TEST

START_TEST(test_duration_rejects_malformed_text)
{
    static const char *const cases[] = {
        "30", "", "s", "30x", "1.5s", "-5s", "+5s", " 5s", "5s ", "5 s", "5S", "5sec", "1h30m",
    };
    char want[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t ms = 42;
        struct sk_err err = { 0 };
        ck_assert_int_eq(sk_conf_value_parse_duration(cases[i], &ms, &err), SK_ERR);
        snprintf(want, sizeof(want), "invalid duration \"%s\": expected a number followed by "
                 "ms, s, m or h", cases[i]);
        ck_assert_str_eq(err.msg, want);
        ck_assert_uint_eq(ms, 42);
    }
    ck_assert_int_eq(sk_conf_value_parse_duration("30x", &(uint64_t){ 0 }, NULL), SK_ERR);
}
END_TEST

START_TEST(test_duration_detects_overflow)
{
    struct sk_err err = { 0 };
    uint64_t ms;

    ck_assert_int_eq(sk_conf_value_parse_duration("18446744073709551616ms", &ms, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "duration \"18446744073709551616ms\" is too large");
    ck_assert_int_eq(sk_conf_value_parse_duration("5124095576031h", &ms, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "duration \"5124095576031h\" is too large");
    ck_assert_int_eq(sk_conf_value_parse_duration("5124095576030h", &ms, &err), SK_OK);
    ck_assert_uint_eq(ms, UINT64_C(5124095576030) * 3600000);
    ck_assert_int_eq(sk_conf_value_parse_duration("99999999999999999999999999x", &ms, &err),
                     SK_ERR);
    ck_assert_ptr_nonnull(strstr(err.msg, "invalid duration"));
}
END_TEST

START_TEST(test_size_accepts_each_unit)
{
    static const struct { const char *text; uint64_t bytes; } cases[] = {
        { "512", 512 }, { "512B", 512 }, { "0", 0 },
        { "64KiB", 64 * 1024 }, { "1MiB", 1024 * 1024 }, { "1GiB", UINT64_C(1) << 30 },
        { "2kB", 2000 }, { "3MB", 3000000 }, { "4GB", UINT64_C(4000000000) },
        { "18446744073709551615", UINT64_MAX },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t bytes = 1;
        struct sk_err err = { 0 };
        ck_assert_msg(sk_conf_value_parse_size(cases[i].text, &bytes, &err) == SK_OK, "%s: %s",
                      cases[i].text, err.msg);
        ck_assert_uint_eq(bytes, cases[i].bytes);
    }
}
END_TEST

START_TEST(test_size_rejects_malformed_text)
{
    static const char *const cases[] = {
        "", "MiB", "1.5MiB", "-1", "1 MiB", "1mib", "1KB", "1K", "1TiB", "12XB", "0x10",
    };
    char want[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t bytes = 42;
        struct sk_err err = { 0 };
        ck_assert_int_eq(sk_conf_value_parse_size(cases[i], &bytes, &err), SK_ERR);
        snprintf(want, sizeof(want), "invalid size \"%s\": expected a number optionally followed "
                 "by B, kB, KiB, MB, MiB, GB or GiB", cases[i]);
        ck_assert_str_eq(err.msg, want);
        ck_assert_uint_eq(bytes, 42);
    }
}
END_TEST

START_TEST(test_size_detects_overflow)
{
    struct sk_err err = { 0 };
    uint64_t bytes;

    ck_assert_int_eq(sk_conf_value_parse_size("18446744073709551616", &bytes, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "size \"18446744073709551616\" is too large");
    ck_assert_int_eq(sk_conf_value_parse_size("17179869184GiB", &bytes, &err), SK_ERR);
    ck_assert_str_eq(err.msg, "size \"17179869184GiB\" is too large");
    ck_assert_int_eq(sk_conf_value_parse_size("17179869183GiB", &bytes, &err), SK_OK);
    ck_assert_uint_eq(bytes, UINT64_C(17179869183) << 30);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc;

    tc = tcase_create("errors");
    tcase_add_loop_test(tc, test_each_broken_fixture_is_reported_with_its_position,
                        0, sizeof(bad_cases) / sizeof(bad_cases[0]));
    tcase_add_test(tc, test_missing_file_is_reported_without_position);
    tcase_add_test(tc, test_tracing_endpoint_is_an_http_url_without_credentials);
    tcase_add_test(tc, test_tracing_headers_are_checked_and_their_secrets_never_shown);
    tcase_add_test(tc, test_tracing_headers_in_clear_beyond_loopback_are_warned_about);
    tcase_add_test(tc, test_directory_is_reported_as_unreadable);
    tcase_add_test(tc, test_failed_load_leaves_the_old_snapshot_in_place);
    tcase_add_test(tc, test_schedules_load_with_their_defaults);
    suite_add_tcase(s, tc);

    tc = tcase_create("values");
    tcase_add_test(tc, test_minimal_config_takes_every_default);
    tcase_add_test(tc, test_full_config_sets_every_key);
    tcase_add_test(tc, test_amqp_url_lists_the_nodes_of_a_cluster_in_order);
    tcase_add_test(tc, test_amqps_without_a_tls_section_verifies_against_the_system_store);
    tcase_add_test(tc, test_tls_files_are_checked_at_load_and_blamed_at_their_key);
    tcase_add_test(tc, test_metrics_token_file_is_read_at_load_and_must_be_a_bearer_token);
    tcase_add_test(tc, test_restart_backoff_defaults_to_200ms_up_to_30s);
    tcase_add_test(tc, test_batch_raises_an_unset_prefetch_to_two_batches);
    tcase_add_test(tc, test_batch_defaults_to_16_within_the_prefetch_window);
    tcase_add_test(tc, test_batch_max_and_the_prefetch_it_may_grow_to);
    tcase_add_test(tc, test_quorum_queue_takes_max_priority_up_to_31);
    tcase_add_test(tc, test_restart_section_sets_the_backoff);
    tcase_add_test(tc, test_lock_ttl_defaults_to_lock_section_even_when_it_comes_later);
    tcase_add_test(tc, test_null_sections_keep_their_defaults);
    tcase_add_test(tc, test_queue_is_found_by_name);
    tcase_add_test(tc, test_free_accepts_null);
    tcase_add_test(tc, test_example_config_loads);
    tcase_add_test(tc, test_metrics_listen_takes_host_and_port);
    tcase_add_test(tc, test_metrics_listen_refuses_what_cannot_be_an_address);
    suite_add_tcase(s, tc);

    tc = tcase_create("handler");
    tcase_add_test(tc, test_relative_handler_is_resolved_against_config_directory);
    tcase_add_test(tc, test_absolute_handler_is_kept_as_written);
    tcase_add_test(tc, test_handler_config_is_reemitted_as_yaml);
    tcase_add_test(tc, test_absent_handler_config_is_null);
    tcase_add_test(tc, test_aliases_in_handler_config_are_not_expanded);
    suite_add_tcase(s, tc);

    tc = tcase_create("secrets");
    tcase_add_test(tc, test_url_password_is_used_and_empty_vhost_means_default);
    tcase_add_test(tc, test_conninfo_password_moves_out_of_conninfo);
    tcase_add_test(tc, test_password_env_is_read_at_load);
    tcase_add_test(tc, test_empty_password_env_is_refused);
    tcase_add_test(tc, test_password_file_loses_exactly_one_trailing_newline);
    tcase_add_test(tc, test_empty_password_file_is_refused);
    tcase_add_test(tc, test_unreadable_password_file_is_reported_at_its_key);
    tcase_add_loop_test(tc, test_each_password_form_is_left_out_of_the_error,
                        0, sizeof(secret_cases) / sizeof(secret_cases[0]));
    tcase_add_test(tc, test_password_file_with_a_nul_byte_is_refused_without_showing_it);
    tcase_add_test(tc, test_password_file_that_is_a_fifo_is_refused_without_blocking);
    tcase_add_test(tc, test_config_file_that_is_a_fifo_is_refused_without_blocking);
    tcase_add_test(tc, test_tls_file_that_is_a_fifo_is_refused_without_blocking);
    tcase_add_test(tc, test_relative_password_file_follows_config_directory);
    suite_add_tcase(s, tc);

    tc = tcase_create("units");
    tcase_add_test(tc, test_retention_takes_years_or_forever);
    tcase_add_test(tc, test_duration_accepts_each_unit);
    tcase_add_test(tc, test_redis_sentinels_take_a_list_of_host_port_and_a_master_name);
    tcase_add_test(tc, test_rate_limit_takes_a_rate_or_a_mapping);
    tcase_add_test(tc, test_rate_limit_refuses_a_bad_rate_at_its_position);
    tcase_add_test(tc, test_concurrency_defaults_to_one_and_refuses_out_of_range_at_its_position);
    tcase_add_test(tc, test_lanes_refuse_one_and_above_32_and_a_bad_tenant_header_at_their_position);
    tcase_add_test(tc, test_redis_sentinels_refuse_what_cannot_name_a_master);
    tcase_add_test(tc, test_duration_rejects_malformed_text);
    tcase_add_test(tc, test_duration_detects_overflow);
    tcase_add_test(tc, test_size_accepts_each_unit);
    tcase_add_test(tc, test_size_rejects_malformed_text);
    tcase_add_test(tc, test_size_detects_overflow);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return h_run_suite(config_suite());
}
