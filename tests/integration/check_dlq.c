/* check_dlq.c - sekalictl dlq on real dead letters of every reason, kept in
 * sekali.dead_letters: list and show leave them as they were; replay runs
 * each job once more, exactly once, refuses what would be malformed again
 * and what completed meanwhile; purge removes exactly what it selects;
 * every action leaves an audit row; every --json output parses; import
 * moves what a broker's <queue>.dead holds into the table, in its order.
 * Jobs fail through tests/plugins/flaky.c until the test creates
 * <dir>/release. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define FLAKY "tests/plugins/flaky.so"

static long long audits(struct h_run *r, const char *action, const char *where)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali.dlq_audit WHERE queue = '%s' AND "
                             "action = '%s' AND %s", r->queue, action, where);
}

/* Runs `sekalictl -c CONFIG dlq ARGS...` as h_sekalictl_as() does. */
static int ctl_as(struct h_run *r, const char *binary, const char *const *env, char **out,
                  const char *const *args)
{
    const char *argv[32] = { "dlq" };
    size_t n = 1;
    for (; *args != NULL && n < 31; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    return h_sekalictl_as(r, binary, env, out, argv);
}

#define CTL(r, out, ...) ctl_as((r), "sekalictl", NULL, (out), (const char *const[]){ __VA_ARGS__, NULL })

/* Asserts that dir/ctl.out is one JSON document for which the Python
 * expression `cond` (over the document d) holds. */
static void json_holds(struct h_run *r, const char *cond)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "python3 -c 'import json,sys; d = json.load(open(sys.argv[1], "
             "encoding=\"utf-8\")); sys.exit(0 if (%s) else 1)' %s/ctl.out", cond, r->dir);
    ck_assert_msg(system(cmd) == 0, "JSON output should parse and satisfy %s", cond);
}

/* The number of letters `dlq list --json` reports, or -1. */
static int listed(struct h_run *r)
{
    char *out;
    int rc = CTL(r, &out, "list", r->queue, "--json");
    const char *at = strstr(out, "\"selected\":");
    int n = rc == 0 && at != NULL ? atoi(at + strlen("\"selected\":")) : -1;
    free(out);
    return n;
}

/* Before sekalid starts: a copy of `key` that the broker itself
 * dead-letters (rejected without requeue: sekali's fallback when it cannot
 * publish a dead letter with its reasons), so it carries x-death only. */
static void broker_rejects(struct h_run *r, const char *message_id, const char *key,
                           const char *body)
{
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
    h_publish(r->b, r->queue, "test", message_id, key, NULL, body);
    amqp_message_t msg;
    uint64_t tag;
    ck_assert_int_eq(sk_broker_peek(r->b, r->queue, &msg, &tag, NULL), SK_OK);
    amqp_destroy_message(&msg);
    ck_assert_int_eq(sk_broker_reject(r->b, tag, false, NULL), SK_OK);
    H_WAIT(h_queue_depth(r->b, r->dead) == 1, 10000, "the rejected copy should be in %s",
           r->dead);
}

/* Starts sekalid with flaky.so (failing until released), one relay, fast
 * retries and max_crashes 1; without locks, whose
 * holder's death would send the redelivery through a delay queue first. */
static void start(struct h_run *r)
{
    char queue_yaml[1500];
    snprintf(queue_yaml, sizeof(queue_yaml),
             H_FAST_RETRIES "    job_types: [test]\n    max_crashes: 1\n"
             "    dead_letter_mirror: false\n"
             "    lock: false\n    config:\n      marker_dir: %s\n", r->dir);
    h_run_start(r, &(struct h_run_opts){ .handler = FLAKY, .workers = 1,
                                         .queue_yaml = queue_yaml, .top_yaml = H_RELAY });
}

/* Dead letters of every reason: rejected by the broker (k-rejected),
 * failed (k-fail), retries exhausted (k-retry), crashed (k-crash: its
 * handler aborts the worker, then past max_crashes), malformed without a
 * message id, and
 * malformed by an unknown type (key m-refund). */
static void every_reason(struct h_run *r, const char *name)
{
    h_run_open(r, name);
    broker_rejects(r, "m-rejected", "k-rejected", "ok");
    start(r);
    h_publish(r->b, r->queue, "test", "m-fail", "k-fail", NULL, "fail");
    h_publish(r->b, r->queue, "test", "m-retry", "k-retry", NULL, "retry");
    h_publish(r->b, r->queue, "test", "m-crash", "k-crash", NULL, "crash");
    /* The malformed ones only once the crashes are over: prefetched beside
     * m-crash they would die with its worker and come back, recorded with
     * a second attempt. */
    H_WAIT(listed(r) == 3, 60000, "expected the 3 letters of k-fail, k-retry and k-crash, "
           "have %d", listed(r));
    h_publish_raw(r->b, r->queue, NULL, "test", NULL, 0, "{}", 2);
    h_publish_raw(r->b, r->queue, "m-refund", "refund", NULL, 0, "{}", 2);
    H_WAIT(listed(r) == 5, 60000, "expected 5 dead letters recorded, have %d", listed(r));
    /* The broker's own copy is in <queue>.dead: import takes it. */
    char *out;
    ck_assert_int_eq(CTL(r, &out, "import", r->queue), 0);
    ck_assert_msg(strstr(out, "imported 1 of the 1 letters") != NULL, "%s", out);
    free(out);
    ck_assert_uint_eq(h_queue_depth(r->b, r->dead), 0);
    ck_assert_int_eq(listed(r), 6);
}

START_TEST(test_list_and_show_report_every_reason_and_leave_the_letters_as_they_were)
{
    struct h_run r;
    every_reason(&r, "dlqlist");
    char *first, *second, *out;
    ck_assert_int_eq(CTL(&r, &first, "list", r.queue), 0);
    static const char *const rows[] = {
        "k-rejected | rejected | ", "k-fail | failed | 1 | failed | ",
        "k-retry | retries_exhausted | 3 | failed | ", "k-crash | crashed | 2 | failed | ",
        "(no key) | malformed | 1 | - | ", "6 dead letters of ",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(rows); i++)
        ck_assert_msg(strstr(first, rows[i]) != NULL, "list should show \"%s\":\n%s", rows[i],
                      first);
    ck_assert_msg(strstr(first, ", 4 replayable") != NULL, "%s", first);
    ck_assert_msg(strstr(first, "unknown job type") != NULL, "%s", first);
    /* Nothing changed by reading. */
    ck_assert_int_eq(CTL(&r, &second, "list", r.queue), 0);
    ck_assert_str_eq(first, second);

    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--json"), 0);
    json_holds(&r, "len(d[\"dead_letters\"]) == 6 and d[\"summary\"][\"replayable\"] == 4 and "
                   "sorted(x[\"reason\"] for x in d[\"dead_letters\"]) == [\"crashed\", "
                   "\"failed\", \"malformed\", \"malformed\", \"rejected\", "
                   "\"retries_exhausted\"] and [x[\"recorded_by\"] for x in d[\"dead_letters\"]"
                   " if x[\"key\"] == \"k-rejected\"] == [\"broker\"] and "
                   "all(x[\"host\"] for x in d[\"dead_letters\"] if x[\"recorded_by\"] == "
                   "\"sekali\")");
    free(out);

    ck_assert_int_eq(CTL(&r, &out, "show", r.queue, "k-fail"), 0);
    static const char *const lines[] = {
        "reason:         failed", "recorded by:    sekali", "flaky: failing until released",
        "key in PostgreSQL: failed", "body (4 bytes): fail", "replayable:     yes",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(lines); i++)
        ck_assert_msg(strstr(out, lines[i]) != NULL, "show should say \"%s\":\n%s", lines[i], out);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "show", r.queue, "k-crash", "--json"), 0);
    json_holds(&r, "d[\"dead_letters\"][0][\"reason\"] == \"crashed\" and "
                   "d[\"dead_letters\"][0][\"crashes\"] == 1 and "
                   "d[\"dead_letters\"][0][\"body_preview\"] == \"crash\"");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "show", r.queue, "k-rejected", "--json"), 0);
    json_holds(&r, "d[\"dead_letters\"][0][\"headers\"][\"x-death\"][0][\"reason\"] == "
                   "\"rejected\" and d[\"dead_letters\"][0][\"key_status\"] == \"absent\"");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "show", r.queue, "no-such-key"), 4);
    free(out);

    ck_assert_int_eq(listed(&r), 6);
    ck_assert_uint_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_stop(&r);
    free(first);
    free(second);
    h_run_close(&r);
}
END_TEST

START_TEST(test_replay_runs_each_failed_job_exactly_once_and_refuses_malformed_ones)
{
    struct h_run r;
    every_reason(&r, "dlqreplay");
    char release[1100];
    snprintf(release, sizeof(release), "%s/release", r.dir);
    fclose(fopen(release, "w"));

    char *out;
    ck_assert_int_eq(CTL(&r, &out, "replay", r.queue, "--all", "--by", "tester", "--json"), 3);
    json_holds(&r, "d[\"summary\"][\"replayed\"] == 4 and d[\"summary\"][\"refused\"] == 2 and "
                   "all(\"malformed\" in x[\"detail\"] for x in d[\"results\"] "
                   "if x[\"outcome\"] == \"refused\") and d[\"exit_code\"] == 3");
    free(out);
    static const char *const keys[] = { "k-rejected", "k-fail", "k-retry", "k-crash" };
    for (size_t i = 0; i < SK_ARRAY_LEN(keys); i++)
        H_WAIT(h_effects(&r, keys[i]) == 1, 30000, "replayed %s should run once", keys[i]);
    ck_assert_int_eq(listed(&r), 2);
    ck_assert_int_eq(audits(&r, "replay", "actor = 'tester' AND letter_id IS NOT NULL"), 4);
    ck_assert_int_eq(audits(&r, "replay", "key = 'k-fail' AND old_status = 'failed' AND "
                                          "error = 'flaky: failing until released'"), 1);
    ck_assert_int_eq(audits(&r, "replay", "key = 'k-crash' AND old_crashes = 1"), 1);
    ck_assert_int_eq(audits(&r, "replay", "key = 'k-rejected' AND old_status = 'absent'"), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.job_crashes WHERE queue = "
                                      "'%s'", r.queue), 0);

    /* Again: only the malformed ones are left, and refused again. */
    ck_assert_int_eq(CTL(&r, &out, "replay", r.queue, "--all"), 3);
    ck_assert_msg(strstr(out, "replayed 0, already replayed (removed) 0, refused 2") != NULL,
                  "%s", out);
    ck_assert_msg(strstr(out, "missing message_id") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--reason", "malformed"), 0);
    ck_assert_msg(strstr(out, "purged 2 of 2 selected") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(listed(&r), 0);
    ck_assert_int_eq(audits(&r, "purge", "letter_id IS NOT NULL"), 2);

    h_run_stop(&r);
    for (size_t i = 0; i < SK_ARRAY_LEN(keys); i++)
        ck_assert_int_eq(h_effects(&r, keys[i]), 1);
    ck_assert_int_eq(h_completed(&r), 4);
    h_run_close(&r);
}
END_TEST

/* A letter whose key completed meanwhile (another copy of the job ran):
 * its replay is refused, it is no longer replayable, and its purge keeps
 * the key as it is. */
START_TEST(test_replay_of_a_key_that_completed_meanwhile_is_refused)
{
    struct h_run r;
    h_run_open(&r, "dlqdone");
    start(&r);
    h_publish(r.b, r.queue, "test", "m-2", "k-done", NULL, "fail");
    H_WAIT(listed(&r) == 1, 30000, "k-done should be dead-lettered");
    h_run_stop(&r);
    h_pg_exec(r.pg, "UPDATE sekali.idempotency_keys SET status = 'completed', "
                    "completed_at = now() WHERE key = 'k-done'");
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "replay", r.queue, "--key", "k-done", "--json"), 3);
    json_holds(&r, "d[\"results\"][0][\"outcome\"] == \"refused\" and "
                   "d[\"results\"][0][\"detail\"].startswith(\"completed meanwhile\")");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--json"), 0);
    json_holds(&r, "d[\"dead_letters\"][0][\"replayable\"] == False");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--key", "k-done"), 0);
    free(out);
    ck_assert_int_eq(listed(&r), 0);
    ck_assert_int_eq(audits(&r, "purge", "key = 'k-done' AND old_status = 'completed'"), 1);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--key", "k-done"), 4);
    free(out);
    h_run_close(&r);
}
END_TEST

/* Two replays of one letter at once: the letter's row lock lets one
 * through and the other finds it gone; the job is enqueued once. */
START_TEST(test_two_replays_of_one_letter_at_once_enqueue_it_once)
{
    struct h_run r;
    h_run_open(&r, "dlqrace");
    start(&r);
    h_publish(r.b, r.queue, "test", "m-race", "k-race", NULL, "fail");
    H_WAIT(listed(&r) == 1, 30000, "k-race should be dead-lettered");
    h_run_stop(&r);
    char cmd[4000];
    snprintf(cmd, sizeof(cmd), "cd '%s' && (for i in 1 2 3 4; do '%s/sekalictl' -c '%s' dlq "
             "replay %s --key k-race > replay.$i 2>&1 & done; wait)", r.dir, h_build_dir(),
             r.config, r.queue);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND idempotency_key = 'k-race'", r.queue), 1);
    ck_assert_int_eq(audits(&r, "replay", "key = 'k-race'"), 1);
    ck_assert_int_eq(listed(&r), 0);
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "replay", r.queue, "--key", "k-race"), 3);
    ck_assert_msg(strstr(out, "replayed before as job") != NULL, "%s", out);
    free(out);
    h_run_close(&r);
}
END_TEST

/* Purge takes exactly what its selector names; failed keys stay failed,
 * and a key full of characters JSON must escape comes back intact. */
START_TEST(test_purge_removes_exactly_the_selected_dead_letters)
{
    struct h_run r;
    h_run_open(&r, "dlqpurge");
    start(&r);
    static const char odd[] = "k-\"odd\"\\key\n\t\xc3\xa9";
    h_publish(r.b, r.queue, "test", "m-a", "k-a", NULL, "fail");
    h_publish(r.b, r.queue, "test", "m-b", "k-b", NULL, "retry");
    h_publish(r.b, r.queue, "test", "m-odd", odd, NULL, "fail");
    h_publish(r.b, r.queue, "test", "m-c", "k-c", NULL, "fail");
    H_WAIT(listed(&r) == 4, 30000, "expected 4 dead letters, have %d", listed(&r));
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--json"), 0);
    json_holds(&r, "\"k-\\\"odd\\\"\\\\key\\n\\t\\u00e9\" in [x[\"key\"] for x in "
                   "d[\"dead_letters\"]]");
    free(out);

    /* The reason's spelling with a space and capitals still selects. */
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--reason", "Retries exhausted"), 0);
    free(out);
    ck_assert_int_eq(listed(&r), 3);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--key", "k-a", "--json"), 0);
    json_holds(&r, "d[\"summary\"][\"purged\"] == 1 and d[\"results\"][0][\"key\"] == \"k-a\"");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue), 0);
    ck_assert_msg(strstr(out, "k-a |") == NULL && strstr(out, "k-b |") == NULL &&
                  strstr(out, "k-c | failed") != NULL && strstr(out, "odd") != NULL &&
                  strstr(out, "2 dead letters") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(audits(&r, "purge", "key IN ('k-a', 'k-b') AND old_status = 'failed'"), 2);
    ck_assert_int_eq(h_failed(&r), 4);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--all"), 0);
    free(out);
    ck_assert_int_eq(listed(&r), 0);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

START_TEST(test_bad_usage_exits_2_and_production_sekalictl_has_no_failpoints)
{
    struct h_run r;
    h_run_open(&r, "dlqusage");
    r.config = h_write_config(r.dir, r.queue, FLAKY, 1, NULL);
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "replay", r.queue), 2);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--all", "--key", "k"), 2);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "frobnicate", r.queue), 2);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--after", "3", "--offset", "2"), 2);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "import", r.queue, "--all"), 2);
    free(out);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "grep -q SEKALI_FAILPOINT %s/sekalictl", h_build_dir());
    ck_assert_msg(system(cmd) != 0, "build/sekalictl must not contain failpoints");
    h_run_close(&r);
}
END_TEST

/* What the console builds on: groups, selectors that combine, pages by
 * offset and by id, and dry runs, none of which may change a letter or
 * write an audit row. */
START_TEST(test_groups_pages_and_dry_runs_select_without_changing_anything)
{
    struct h_run r;
    every_reason(&r, "dlqgroups");
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "groups", r.queue, "--json"), 0);
    json_holds(&r, "sum(g[\"count\"] for g in d[\"groups\"]) == 6 and d[\"summary\"][\"selected\"]"
                   " == 6 and [g[\"count\"] for g in d[\"groups\"] if g[\"reason\"] == \"failed\" "
                   "and g[\"fingerprint\"] == \"flaky: failing until released\"] == [1] and "
                   "d[\"groups\"][0][\"count\"] >= d[\"groups\"][-1][\"count\"]");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "groups", r.queue), 0);
    ck_assert_msg(strstr(out, "COUNT | REPLAYABLE | REASON") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--offset", "1", "--limit", "2", "--json"), 0);
    json_holds(&r, "len(d[\"dead_letters\"]) == 2 and d[\"summary\"][\"more\"] and "
                   "d[\"summary\"][\"offset\"] == 1");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--offset", "4", "--limit", "10", "--json"), 0);
    json_holds(&r, "len(d[\"dead_letters\"]) == 2 and not d[\"summary\"][\"more\"]");
    free(out);
    /* Keyset pages: the next page starts after the last id of this one. */
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--limit", "4", "--json"), 0);
    json_holds(&r, "d[\"summary\"][\"next_after\"] == d[\"dead_letters\"][3][\"id\"]");
    char after[32];
    const char *at = strstr(out, "\"next_after\":");
    ck_assert_ptr_nonnull(at);
    snprintf(after, sizeof(after), "%ld", atol(at + strlen("\"next_after\":")));
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--after", after, "--limit", "4", "--json"), 0);
    json_holds(&r, "len(d[\"dead_letters\"]) == 2 and not d[\"summary\"][\"more\"] and "
                   "d[\"summary\"][\"next_after\"] == 0");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--reason", "malformed", "--json"), 0);
    json_holds(&r, "len(d[\"dead_letters\"]) == 2");
    free(out);

    ck_assert_int_eq(CTL(&r, &out, "replay", r.queue, "--reason", "failed", "--fingerprint",
                         "flaky: failing until released", "--dry-run", "--json"), 0);
    json_holds(&r, "[x[\"outcome\"] for x in d[\"results\"]] == [\"would_replay\"] and "
                   "d[\"dry_run\"] and d[\"summary\"][\"replayed\"] == 1");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "replay", r.queue, "--key", "k-fail", "--key", "k-retry",
                         "--dry-run", "--json"), 0);
    json_holds(&r, "d[\"summary\"][\"selected\"] == 2");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--all", "--dry-run", "--json"), 0);
    json_holds(&r, "d[\"summary\"][\"purged\"] == 6 and d[\"summary\"][\"selected\"] == 6");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--all", "--reason", "failed"), 2);
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "groups", r.queue, "--limit", "2"), 2);
    free(out);
    ck_assert_int_eq(listed(&r), 6);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dlq_audit WHERE queue = '%s'",
                                r.queue), 0);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

/* Letters a quorum <queue>.dead held before the upgrade (published there
 * directly here, 1,500 of them, over two of the scan's windows): import
 * takes every one, in the queue's order, and leaves the queue empty; the
 * table then answers pages, groups and purges without the broker. */
#define QUORUM_LETTERS 1500
START_TEST(test_import_moves_every_letter_of_a_quorum_dead_letter_queue_in_order)
{
    struct h_run r;
    h_run_open(&r, "dlqimport");
    r.config = h_write_config(r.dir, r.queue, FLAKY, 1, "    queue_type: quorum\n"
                              "    delivery_limit: 20\n    dead_letter_mirror: false\n");
    const struct sk_queue_shape quorum = { .quorum = true, .delivery_limit = 20 };
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, &quorum, NULL), SK_OK);
    for (int i = 0; i < QUORUM_LETTERS; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "m-%04d", i);
        snprintf(key, sizeof(key), "k-%04d", i);
        h_publish(r.b, r.dead, "test", id, key, NULL, "fail");
    }
    H_WAIT(h_queue_depth(r.b, r.dead) == QUORUM_LETTERS, 20000,
           "the quorum dead-letter queue should hold %d letters, has %u", QUORUM_LETTERS,
           h_queue_depth(r.b, r.dead));
    char *out;
    ck_assert_int_eq(CTL(&r, &out, "import", r.queue, "--dry-run", "--json"), 0);
    json_holds(&r, "d[\"summary\"][\"imported\"] == 1500");
    free(out);
    ck_assert_int_eq(listed(&r), 0);
    H_WAIT(h_queue_depth(r.b, r.dead) == QUORUM_LETTERS, 20000, "a dry run keeps every letter");
    ck_assert_int_eq(CTL(&r, &out, "import", r.queue, "--json"), 0);
    json_holds(&r, "d[\"summary\"][\"imported\"] == 1500 and all(x[\"outcome\"] == \"imported\" "
                   "for x in d[\"results\"])");
    free(out);
    H_WAIT(h_queue_depth(r.b, r.dead) == 0, 20000, "imported letters leave the queue");
    for (int scan = 0; scan < 3; scan++) {
        ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--json"), 0);
        json_holds(&r, "[x[\"key\"] for x in d[\"dead_letters\"]] == [\"k-%04d\" % i for i "
                       "in range(1500)] and all(x[\"recorded_by\"] == \"unknown\" for x in "
                       "d[\"dead_letters\"])");
        free(out);
    }
    ck_assert_int_eq(CTL(&r, &out, "list", r.queue, "--offset", "1200", "--limit", "10",
                         "--json"), 0);
    json_holds(&r, "[x[\"key\"] for x in d[\"dead_letters\"]] == [\"k-%04d\" % i for i in "
                   "range(1200, 1210)] and d[\"summary\"][\"more\"]");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "purge", r.queue, "--key", "k-0005", "--key", "k-1499",
                         "--json"), 0);
    json_holds(&r, "d[\"summary\"][\"purged\"] == 2");
    free(out);
    ck_assert_int_eq(CTL(&r, &out, "groups", r.queue, "--json"), 0);
    json_holds(&r, "sum(g[\"count\"] for g in d[\"groups\"]) == 1498");
    free(out);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_list_and_show_report_every_reason_and_leave_the_letters_as_they_were,
        test_replay_runs_each_failed_job_exactly_once_and_refuses_malformed_ones,
        test_replay_of_a_key_that_completed_meanwhile_is_refused,
        test_two_replays_of_one_letter_at_once_enqueue_it_once,
        test_purge_removes_exactly_the_selected_dead_letters,
        test_bad_usage_exits_2_and_production_sekalictl_has_no_failpoints,
        test_groups_pages_and_dry_runs_select_without_changing_anything,
        test_import_moves_every_letter_of_a_quorum_dead_letter_queue_in_order,
        NULL,
    };
    Suite *s = suite_create("dlq");
    h_tcase(s, "dlq", 600, tests);
    return h_run_suite(s);
}
