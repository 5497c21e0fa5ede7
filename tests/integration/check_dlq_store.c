/* check_dlq_store.c - dead letters are rows of sekali.dead_letters, not
 * messages of <queue>.dead: a hundred reads (sekalictl dlq list and the
 * console's GETs) of a quorum queue's dead letters under a delivery limit
 * of 1 lose none of them; a letter is replayed exactly once and a second
 * replay is refused; malformed letters are recorded too; letters sekali
 * left in <queue>.dead before (or the broker put there) are imported; the
 * janitor removes a letter with its failed key. Jobs fail through
 * tests/plugins/flaky.c until the test creates <dir>/release. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define FLAKY "tests/plugins/flaky.so"
#define TOKEN "dlq-store-token-7-0123456789abcdef0123"

static void rabbitmqctl(const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "\"$SEKALI_RABBITMQCTL\" %s >/dev/null 2>&1", args);
    int rc = system(cmd);
    ck_assert_msg(rc == 0, "rabbitmqctl %s: status 0x%x", args, rc);
}

/* sekalictl -c CONFIG dlq ARGS... with stdout into *out (the caller frees). */
static int dlq(struct h_run *r, char **out, const char *const *args)
{
    const char *argv[32] = { "dlq" };
    size_t n = 1;
    for (; *args != NULL; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    return h_sekalictl(r, out, argv);
}
#define DLQ(r, out, ...) dlq((r), (out), (const char *const[]){ __VA_ARGS__, NULL })

/* The number of letters `dlq list --json` reports, or -1. */
static int listed(struct h_run *r)
{
    char *out;
    int rc = DLQ(r, &out, "list", r->queue, "--json");
    const char *at = out != NULL ? strstr(out, "\"selected\":") : NULL;
    int n = rc == 0 && at != NULL ? atoi(at + strlen("\"selected\":")) : -1;
    free(out);
    return n;
}

/* sekalictl serve on r's config (whose top_yaml has the console), logging
 * into dir/serve.log. */
static pid_t serve(struct h_run *r)
{
    char log[1100];
    snprintf(log, sizeof(log), "%s/serve.log", r->dir);
    return h_serve_console(r->config, log);
}

/* A quorum queue whose dead-letter queue a policy limits to 1 delivery,
 * sekalid with flaky.so, a relay and the console; three jobs that fail and
 * one malformed message (no message id). */
static int start_quorum(struct h_run *r, const char *name)
{
    h_run_open(r, name);
    char args[600], token[1100], top[1600], queue_yaml[1500];
    snprintf(args, sizeof args, "set_policy --apply-to queues --priority 5 %s-dl '^%s\\.dead$' "
             "'{\"delivery-limit\":1}'", r->queue, r->queue);
    rabbitmqctl(args);
    snprintf(token, sizeof(token), "%s/console.token", r->dir);
    FILE *f = fopen(token, "w");
    ck_assert_ptr_nonnull(f);
    fputs(TOKEN "\n", f);
    fclose(f);
    int port = h_free_port();
    /* Reads open on loopback (console.open_reads): the GETs below stand for
     * any reader, logged in or not. */
    snprintf(top, sizeof(top), H_RELAY "console:\n  listen: \"127.0.0.1:%d\"\n  token_file: %s\n"
             "  open_reads: true\n", port, token);
    snprintf(queue_yaml, sizeof(queue_yaml), H_FAST_RETRIES "    job_types: [test]\n"
             "    queue_type: quorum\n    delivery_limit: 20\n    lock: false\n"
             "    dead_letter_mirror: false\n"
             "    config:\n      marker_dir: %s\n", r->dir);
    const struct sk_queue_shape quorum = { .quorum = true, .delivery_limit = 20 };
    h_run_start(r, &(struct h_run_opts){ .handler = FLAKY, .workers = 1, .queue_yaml = queue_yaml,
                                         .top_yaml = top, .shape = &quorum });
    h_publish(r->b, r->queue, "test", "m-1", "k-1", NULL, "fail");
    h_publish(r->b, r->queue, "test", "m-2", "k-2", NULL, "fail");
    h_publish(r->b, r->queue, "test", "m-3", "k-3", NULL, "retry");
    h_publish_raw(r->b, r->queue, NULL, "test", NULL, 0, "{}", 2);
    H_WAIT(h_failed(r) == 3, 60000,
           "three keys should be recorded failed");
    H_WAIT(listed(r) == 4, 30000, "dlq list should show 4 dead letters, shows %d", listed(r));
    return port;
}

static void stop_quorum(struct h_run *r)
{
    char args[600];
    snprintf(args, sizeof args, "clear_policy %s-dl", r->queue);
    rabbitmqctl(args);
}

START_TEST(test_a_hundred_reads_under_a_delivery_limit_of_1_lose_no_dead_letter)
{
    struct h_run r;
    int port = start_quorum(&r, "dlqreads");
    pid_t console = serve(&r);
    char path[300];
    snprintf(path, sizeof(path), "/api/dlq/list?queue=%s", r.queue);
    for (int i = 0; i < 50; i++) {
        char *out;
        ck_assert_int_eq(DLQ(&r, &out, "list", r.queue), 0);
        free(out);
        ck_assert_int_eq(h_curl_status(port, path, NULL, "/dev/null", 10), 200);
    }
    kill(console, SIGTERM);
    h_wait_exit(console, 10000, "sekalictl serve");
    int after = listed(&r);
    ck_assert_msg(after == 4, "after 100 reads dlq list should still show 4 dead letters, "
                  "shows %d", after);
    char *out;
    ck_assert_int_eq(DLQ(&r, &out, "show", r.queue, "k-2", "--json"), 0);
    ck_assert_msg(strstr(out, "flaky: failing until released") != NULL &&
                  strstr(out, "\"body_preview\":\"fail\"") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(DLQ(&r, &out, "list", r.queue, "--reason", "malformed", "--json"), 0);
    ck_assert_msg(strstr(out, "missing message_id") != NULL && strstr(out, "\"key\":null"),
                  "the malformed letter should be recorded:\n%s", out);
    free(out);

    /* Replay once: it runs once; the second replay is refused. */
    char release[1100];
    snprintf(release, sizeof(release), "%s/release", r.dir);
    fclose(fopen(release, "w"));
    ck_assert_int_eq(DLQ(&r, &out, "replay", r.queue, "--key", "k-1", "--by", "tester"), 0);
    ck_assert_msg(strstr(out, "replayed 1,") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(DLQ(&r, &out, "replay", r.queue, "--key", "k-1"), 3);
    ck_assert_msg(strstr(out, "replayed before as job") != NULL, "%s", out);
    free(out);
    H_WAIT(h_effects(&r, "k-1") == 1, 30000, "the replayed job should run once");
    h_run_stop(&r);
    ck_assert_int_eq(h_effects(&r, "k-1"), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s' "
                                      "AND idempotency_key = 'k-1'", r.queue), 1);
    ck_assert_int_eq(listed(&r), 3);
    stop_quorum(&r);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_hundred_reads_under_a_delivery_limit_of_1_lose_no_dead_letter,
        NULL,
    };
    return h_run_suite(h_suite("dlq_store", 300, tests));
}
