/* check_ctl.c - sekalictl status and trace against a running sekalid, and
 * the command lines of both programs: status reports what the broker,
 * PostgreSQL and sekalid's /metrics hold and exits non-zero once sekalid is
 * gone; trace tells a key's story in time order, dead letter included;
 * --help, --version and bad options exit as GNU programs do. Every --json
 * output is parsed by python3. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

/* Runs build/<binary> with args (NULL-terminated) and no stdin; stdout goes
 * to dir/out.txt and stderr to dir/err.txt, which *out and *err get (the
 * caller frees; err may be NULL). Returns the exit code. */
static int run(const char *dir, const char *binary, char **out, char **err,
               const char *const *args)
{
    char out_path[1100], err_path[1100];
    snprintf(out_path, sizeof(out_path), "%s/out.txt", dir);
    snprintf(err_path, sizeof(err_path), "%s/err.txt", dir);
    struct h_spawn sp = { .binary = binary, .args = args, .out = out_path, .err = err_path };
    int code = h_spawn(&sp, 60000, out, err);
    ck_assert_ptr_nonnull(*out);
    ck_assert(err == NULL || *err != NULL);
    return code;
}

#define RUN(dir, binary, out, err, ...) \
    run((dir), (binary), (out), (err), (const char *const[]){ __VA_ARGS__, NULL })
#define CTL(r, out, ...) RUN((r)->dir, "sekalictl", (out), NULL, "-c", (r)->config, __VA_ARGS__)

/* Asserts that dir/out.txt is one JSON document for which the Python
 * expression `cond` (over the document d) holds. */
static bool json_ok(const char *dir, const char *cond)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "python3 -c 'import json,sys; d = json.load(open(sys.argv[1], "
             "encoding=\"utf-8\")); sys.exit(0 if (%s) else 1)' %s/out.txt", cond, dir);
    return system(cmd) == 0;
}

static void json_holds(const char *dir, const char *cond)
{
    ck_assert_msg(json_ok(dir, cond), "JSON output should parse and satisfy %s", cond);
}

static void assert_has(const char *text, const char *needle)
{
    ck_assert_msg(strstr(text, needle) != NULL, "expected \"%s\" in:\n%s", needle, text);
}

/* sekalid with `workers` workers of effect.so, one relay and, when
 * metrics, the metrics endpoint and a janitor. */
static void start(struct h_run *r, const char *name, int workers, bool metrics)
{
    h_run_open(r, name);
    char top[512];
    if (metrics)
        snprintf(top, sizeof(top), H_RELAY "metrics:\n  listen: 127.0.0.1:%d\n"
                                            "janitor:\n  interval: 1h\n", h_free_port());
    else
        snprintf(top, sizeof(top), H_RELAY "janitor:\n  interval: 0s\n");
    h_run_start(r, &(struct h_run_opts){ .workers = workers, .queue_yaml = H_FAST_RETRIES,
                                         .top_yaml = top });
}

START_TEST(test_status_reports_what_broker_database_and_sekalid_hold_and_fails_once_stopped)
{
    struct h_run r;
    start(&r, "ctlstatus", 2, true);
    /* Two dead letters, a key stuck processing for a minute, a failed key
     * and an outbox row the broker refused: each must show. */
    h_publish(r.b, r.dead, "test", "d1", "dead-1", NULL, "ok");
    h_publish(r.b, r.dead, "test", "d2", "dead-2", NULL, "ok");
    char sql[2048];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.idempotency_keys (queue, key, status, fence, attempts, "
             "created_at) VALUES ('%s', 'stuck', 'processing', 1, 1, now() - interval '60 s'), "
             "('%s', 'gone', 'failed', 1, 1, now());"
             "INSERT INTO sekali.outbox (job_id, queue, job_type, body, idempotency_key, "
             "publish_error) VALUES (gen_random_uuid()::text, '%s', 'test', 'x', 'refused', "
             "'unroutable: test');"
             "SELECT sekali.dlq_record('%s', k, k, 'test', NULL, 'failed', 'x', NULL, 'ok', 2, "
             "'{}', NULL, 1, NULL, NULL, NULL) FROM unnest(ARRAY['dead-1', 'dead-2']) k",
             r.queue, r.queue, r.queue, r.queue);
    h_pg_exec(r.pg, sql);
    H_WAIT(h_queue_depth(r.b, r.dead) == 2, 10000, "two dead letters expected in %s", r.dead);
    /* The schema tests/run.sh applied is complete: nothing left to apply. */
    char *migrated;
    ck_assert_int_eq(CTL(&r, &migrated, "migrate", "--sql-dir", "sql", "--json"), 0);
    json_holds(r.dir, "d[\"plan\"] == [] and d[\"applied\"] == [] and d[\"migrations\"] >= 9");
    free(migrated);

    char *out = NULL;
    /* The janitor's first round runs at start: wait for it through status. */
    H_WAIT((free(out), CTL(&r, &out, "status", "--json"),
            json_ok(r.dir, "d[\"janitor\"][\"last_round\"] is not None")),
           30000, "the janitor's first round should show in status:\n%s", out);
    free(out);
    int code = CTL(&r, &out, "status");
    ck_assert_msg(code == 0, "status should exit 0 with sekalid running, got %d:\n%s", code, out);
    assert_has(out, "sekalid: running (metrics endpoint 127.0.0.1:");
    assert_has(out, "2 configured, 2 up, 2 consuming");
    assert_has(out, "0 ready, unacked unknown");
    assert_has(out, "2 in the ");  /* the .dead mirror, from the broker */
    assert_has(out, "1 processing (oldest first claimed ");
    assert_has(out, "1 failed, 2 dead letters");
    assert_has(out, "0 pending, lag 0.0s, 1 refused by the broker");
    assert_has(out, "outbox relays (1): last round ");
    free(out);

    ck_assert_int_eq(CTL(&r, &out, "status", "--json"), 0);
    json_holds(r.dir, "d[\"sekalid\"][\"running\"] is True and d[\"exit_code\"] == 0 and "
                      "len(d[\"queues\"]) == 1 and d[\"queues\"][0][\"workers_up\"] == 2 and "
                      "d[\"queues\"][0][\"consumers\"] == 2 and d[\"queues\"][0][\"ready\"] == 0 "
                      "and d[\"queues\"][0][\"dead\"] == 2 and d[\"queues\"][0][\"delayed\"] == 0 "
                      "and d[\"queues\"][0][\"unacked\"] is None and "
                      "d[\"queues\"][0][\"processing\"] == 1 and d[\"queues\"][0][\"failed\"] == 1 "
                      "and d[\"queues\"][0][\"oldest_processing_seconds\"] >= 59 and "
                      "d[\"queues\"][0][\"outbox_pending\"] == 0 and "
                      "d[\"queues\"][0][\"outbox_refused\"] == 1 and "
                      "d[\"queues\"][0][\"outbox_lag_seconds\"] == 0 and "
                      "d[\"queues\"][0][\"healthy\"] is True and "
                      "d[\"relays\"][\"last_round_age_seconds\"] < 60 and "
                      "d[\"janitor\"][\"last_round\"] is not None");
    free(out);

    /* A job waiting for a relay shows as pending with its lag. */
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.outbox WHERE queue = '%s'", r.queue);
    h_pg_exec(r.pg, sql);
    h_stop_sekalid(r.sekalid, r.dir);
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'ok', 'waiting', NULL, "
             "NULL, now() - interval '30 s')", r.queue);
    h_pg_exec(r.pg, sql);
    code = CTL(&r, &out, "status");
    ck_assert_msg(code == 5, "status should exit 5 once sekalid stopped, got %d:\n%s", code, out);
    assert_has(out, "sekalid: NOT RUNNING");
    assert_has(out, ": no consumer");
    assert_has(out, "1 pending, lag 3");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "status", "--json"), 5);
    json_holds(r.dir, "d[\"sekalid\"][\"running\"] is False and d[\"exit_code\"] == 5 and "
                      "d[\"queues\"][0][\"consumers\"] == 0 and "
                      "d[\"queues\"][0][\"problem\"] == \"no consumer\" and "
                      "d[\"queues\"][0][\"outbox_pending\"] == 1 and "
                      "d[\"queues\"][0][\"outbox_lag_seconds\"] >= 30 and "
                      "d[\"queues\"][0][\"workers_up\"] is None");
    free(out);
    h_run_close(&r);
}
END_TEST

START_TEST(test_status_without_metrics_judges_by_consumers_and_flags_a_queue_without_one)
{
    struct h_run r;
    start(&r, "ctlnometrics", 1, false);
    char *out;
    int code = CTL(&r, &out, "status");
    ck_assert_msg(code == 0, "status should exit 0, got %d:\n%s", code, out);
    assert_has(out, "sekalid: running (judged by the queues' consumers: metrics disabled)");
    assert_has(out, "up unknown (metrics disabled), 1 consuming");
    assert_has(out, "outbox relays (1): last round unknown (metrics disabled)");
    free(out);
    /* A second configured queue that nobody consumes: not healthy. */
    char other[200];
    snprintf(other, sizeof(other), "%s-idle", r.queue);
    ck_assert_int_eq(sk_broker_declare(r.b, other, NULL, NULL), SK_OK);
    char from[300], to[2000];
    snprintf(from, sizeof(from), "  - name: %s\n", r.queue);
    snprintf(to, sizeof(to), "  - name: %s\n    handler: %s/%s\n  - name: %s\n", other,
             h_build_dir(), H_EFFECT, r.queue);
    h_config_replace(r.config, from, to);
    code = CTL(&r, &out, "status", "--json");
    ck_assert_msg(code == 5, "a queue without consumer should make status exit 5, got %d:\n%s",
                  code, out);
    json_holds(r.dir, "d[\"sekalid\"][\"running\"] is True and "
                      "[q[\"problem\"] for q in d[\"queues\"]] == [\"no consumer\", None]");
    free(out);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* Indexes of the events named in `names` (in that order) in the JSON
 * trace must grow, and so must their times. */
static void events_in_order(const char *dir, const char *names)
{
    char cond[1024];
    snprintf(cond, sizeof(cond),
             "[e[\"event\"] for e in d[\"events\"] if e[\"event\"] in %s] == %s and "
             "[e[\"time\"] for e in d[\"events\"]] == sorted(e[\"time\"] for e in d[\"events\"])",
             names, names);
    json_holds(dir, cond);
}

START_TEST(test_trace_tells_an_outbox_job_its_run_and_its_duplicate_in_time_order)
{
    struct h_run r;
    start(&r, "ctltrace", 1, false);
    /* Keys are unique to the run: trace looks in every queue of the database. */
    char key[200];
    snprintf(key, sizeof(key), "story-%s", r.queue);
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "enqueue", r.queue, "test", "--key", key, "--json", "ok"), 0);
    json_holds(r.dir, "len(d[\"job_id\"]) == 36");
    free(out);
    H_WAIT(h_effects(&r, key) == 1, 30000, "the job should run once");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                            "AND key = '%s' AND status = 'completed'", r.queue, key) == 1,
           30000, "the key should be completed");
    h_publish(r.b, r.queue, "test", "m-again", key, NULL, "ok");
    H_WAIT(h_pg_count(r.pg, "SELECT duplicates FROM sekali.idempotency_keys WHERE queue = '%s' "
                            "AND key = '%s'", r.queue, key) == 1,
           30000, "the second delivery should be counted as a duplicate");

    ck_assert_int_eq(CTL(&r, &out, "trace", key, "--json"), 0);
    events_in_order(r.dir, "[\"enqueued\", \"published\", \"claimed\", \"completed\", "
                           "\"duplicates\"]");
    json_holds(r.dir, "d[\"key\"].startswith(\"story-\") and d[\"dead_letters\"] == 0 and "
                      "any(\"1 duplicate delivery\" in e[\"detail\"] for e in d[\"events\"]) "
                      "and d[\"journal\"] != \"\"");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "trace", key, "--queue", r.queue), 0);
    const char *order[] = { " enqueued ", " published ", " claimed ", " completed ",
                            " duplicates ", "journal: " };
    const char *at = out;
    for (size_t i = 0; i < SK_ARRAY_LEN(order); i++) {
        const char *next = strstr(at, order[i]);
        ck_assert_msg(next != NULL, "\"%s\" should come next in:\n%s", order[i], out);
        at = next;
    }
    free(out);
    /* Another queue knows nothing of it; an unknown key is "nothing". */
    ck_assert_int_eq(CTL(&r, &out, "trace", key, "--queue", "no-such-queue"), 4);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "trace", "k-never"), 4);
    assert_has(out, "nothing known of key k-never");
    free(out);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_trace_of_a_failed_key_shows_its_dead_letter_and_leaves_it_there)
{
    struct h_run r;
    start(&r, "ctldead", 1, false);
    char key[200];
    snprintf(key, sizeof(key), "fail-%s", r.queue);
    h_publish(r.b, r.queue, "test", "m-fail", key, NULL, "fail");
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE queue = '%s'",
                      r.queue) == 1, 30000, "the failed job should be a dead letter");
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "trace", key), 0);
    assert_has(out, " key       claimed ");
    assert_has(out, " key       failed ");
    assert_has(out, "dead-lettered    dead letter ");
    assert_has(out, "reason failed after 1 attempt(s)");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "trace", key, "--json"), 0);
    events_in_order(r.dir, "[\"claimed\", \"failed\", \"dead-lettered\"]");
    json_holds(r.dir, "d[\"dead_letters\"] == 1 and d[\"exit_code\"] == 0");
    free(out);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE queue = "
                                      "'%s'", r.queue), 1);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_help_version_and_bad_options_exit_as_gnu_programs_do)
{
    h_init();
    char *dir = h_tmpdir("ctlusage");
    char *out, *err;
    ck_assert_int_eq(RUN(dir, "sekalid", &out, &err, "--help"), 0);
    assert_has(out, "--config FILE");
    ck_assert_str_eq(err, "");
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalid", &out, &err, "--version"), 0);
    assert_has(out, "sekalid 0.1.0");
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalid", &out, &err, "--bogus"), 2);
    assert_has(err, "usage: sekalid");
    ck_assert_str_eq(out, "");
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalid", &out, &err, "--test", "--config", "/nonexistent.yaml"),
                     2);
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalid", &out, &err, "stray-operand"), 2);
    free(out), free(err);

    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "--help"), 0);
    assert_has(out, "status [--json]");
    assert_has(out, "trace KEY [--queue QUEUE] [--json]");
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "--version"), 0);
    assert_has(out, "sekalictl 0.1.0");
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "--bogus"), 2);
    assert_has(err, "usage: sekalictl");
    ck_assert_str_eq(out, "");
    free(out), free(err);
    /* Help needs no configuration file. */
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "-c", "/nonexistent.yaml", "help",
                         "trace"), 0);
    assert_has(out, "usage: sekalictl [-c FILE] trace KEY");
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "--config", "/nonexistent.yaml",
                         "status", "--help"), 0);
    assert_has(out, "Exits 0 when healthy");
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "help", "frobnicate"), 2);
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "frobnicate"), 2);
    free(out), free(err);

    /* Bad options of a command, with a configuration that loads. */
    char *config = h_write_config(dir, "ctlusage", H_EFFECT, 1, NULL);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "-c", config, "status", "--bogus"), 2);
    assert_has(err, "usage: sekalictl status");
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "-c", config, "trace"), 2);
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "-c", config, "trace", "a", "b"), 2);
    free(out), free(err);
    ck_assert_int_eq(RUN(dir, "sekalictl", &out, &err, "-c", config, "migrate", "--bogus"), 2);
    free(out), free(err);
    free(config);
    free(dir);
}
END_TEST

START_TEST(test_enqueue_direct_publishes_past_the_outbox_and_the_job_runs_once)
{
    struct h_run r;
    start(&r, "ctldirect", 1, false);
    char key[200];
    snprintf(key, sizeof(key), "direct-%s", r.queue);
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "enqueue", r.queue, "test", "--direct", "--id", "direct-1",
                         "--key", key, "--json", "ok"), 0);
    json_holds(r.dir, "d[\"job_id\"] == \"direct-1\"");
    free(out);
    H_WAIT(h_effects(&r, key) == 1, 30000, "the job published with --direct should run");
    /* Straight to the broker: no outbox row was written for it. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = '%s' AND job_id = 'direct-1' AND "
                                      "status = 'completed'", r.queue, key), 1);
    /* A queue that exists nowhere: the mandatory publish comes back. */
    char missing[200];
    snprintf(missing, sizeof(missing), "%s-missing", r.queue);
    char *err;
    ck_assert_int_eq(RUN(r.dir, "sekalictl", &out, &err, "-c", r.config, "enqueue", missing,
                         "test", "--direct", "ok"), 1);
    ck_assert_msg(strstr(err, "enqueue to ") != NULL && strstr(err, "failed") != NULL,
                  "expected the failed publish to be reported; got:\n%s", err);
    free(out);
    free(err);
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, key), 1);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_status_reports_what_broker_database_and_sekalid_hold_and_fails_once_stopped,
        test_status_without_metrics_judges_by_consumers_and_flags_a_queue_without_one,
        test_trace_tells_an_outbox_job_its_run_and_its_duplicate_in_time_order,
        test_trace_of_a_failed_key_shows_its_dead_letter_and_leaves_it_there,
        test_help_version_and_bad_options_exit_as_gnu_programs_do,
        test_enqueue_direct_publishes_past_the_outbox_and_the_job_runs_once,
        NULL,
    };
    Suite *s = suite_create("ctl");
    h_tcase(s, "ctl", 300, tests);
    return h_run_suite(s);
}
