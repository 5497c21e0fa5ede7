/* check_console.c - the operator's console (sekalictl serve) in a real
 * browser: Debian's chromium, driven over the DevTools protocol by
 * puppeteer-core (tests/browser/console.cjs), against real servers, a real
 * sekalid and real dead letters.
 *
 * This suite sets the scene and judges the outcome in PostgreSQL:
 *   - 40 jobs that failed while a "payment service" was down (flaky.so,
 *     reason failed) and 3 that exhausted their retries; then the service
 *     comes back (the release file), so a replay runs them;
 *   - hostile letters in the same queue, with sekali's own headers (so they
 *     are shown as sekali's record, errors and all): <script>, an
 *     attribute break-out with <img onerror>, </textarea>, javascript:
 *     URLs, invalid UTF-8, NULs, a 1 MB body;
 *   - 100,000 dead letters in a second queue;
 * then starts the console and runs the browser script, which logs in,
 * click-replays the group of 40, purges with a dry run, searches a key,
 * visits every page with the hostile data, tries the refused requests and
 * takes the screenshots (artefacts: $SEKALI_BUILD/artifacts/console); it
 * pauses and resumes the first queue by clicking (the pause row in
 * PostgreSQL, no consumer at the broker, then consumers again), reads the
 * schedules page (a configured schedule ticking every 5 s, and a hostile
 * row written straight into sekali.schedules) and tries pauses that must
 * be refused. Last,
 * each of the 40 jobs must have run exactly once, and the audit must name
 * the operator.
 *
 * puppeteer-core is not packaged by Debian: this suite, like
 * check_node_producer, installs it from the npm registry into
 * $SEKALI_SCRATCH/npm-browser once, with its browser download turned off
 * (the browser is Debian's). */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define FLAKY       "tests/plugins/flaky.so"
#define PUPPETEER   "puppeteer-core@23"
#define CHROMIUM    "/usr/bin/chromium"
#define TOKEN       "browser-test-token-7f3a9c-0123456789abcdef"
/* An operator of console.operators, whose name is as hostile as a name
 * can be written in YAML: the page must show it as text. */
#define OP_TOKEN    "browser-operator-token-5d2b8e-0123456789abcdef"
#define OP_NAME     "<img src=x onerror=alert(15)>\"dora&amp;"
#define PAYMENTS    40
#define RETRIES     3
#define BIG         100000
#define MEGABYTE    (1024 * 1024)
#define SCHEDULE    "ledger-sync"

/* The directory holding node_modules/puppeteer-core, installed if need be. */
static char *puppeteer(void)
{
    const char *scratch = getenv("SEKALI_SCRATCH");
    ck_assert_ptr_nonnull(scratch);
    char *dir = NULL, *marker = NULL;
    ck_assert(asprintf(&dir, "%s/npm-browser", scratch) > 0);
    ck_assert(asprintf(&marker, "%s/node_modules/puppeteer-core/package.json", dir) > 0);
    if (access(marker, R_OK) != 0) {
        mkdir(dir, 0755);
        char cmd[2048];
        snprintf(cmd, sizeof(cmd), "PUPPETEER_SKIP_DOWNLOAD=1 timeout 300 npm install "
                 "--prefix '%s' --no-save --no-audit --no-fund --loglevel=error " PUPPETEER
                 " >'%s/npm.log' 2>&1", dir, dir);
        int status = system(cmd);
        ck_assert_msg(status == 0 && access(marker, R_OK) == 0,
                      "cannot install " PUPPETEER " from the npm registry: see %s/npm.log", dir);
    }
    free(marker);
    return dir;
}

/* A dead letter as sekali writes one (x-sekali-* headers, its AMQP user as
 * user_id, which RabbitMQ checks against our login), so the console shows
 * its error as the error; extra headers may hold any bytes. */
struct letter {
    const char *key;
    size_t      key_len;    /* 0: strlen(key) */
    const char *error;
    const void *body;
    size_t      body_len;   /* 0: strlen(body) */
    const char *note;       /* an extra header x-note, or NULL */
    size_t      note_len;
};

static amqp_table_entry_t entry(const char *name, const void *bytes, size_t len)
{
    amqp_table_entry_t e = { .key = amqp_cstring_bytes(name) };
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = (amqp_bytes_t){ .len = len, .bytes = (void *)bytes };
    return e;
}

static void dead_letter(struct h_run *r, const char *queue, const char *dead,
                        const struct letter *l, const char *id)
{
    amqp_table_entry_t h[8];
    int n = 0;
    size_t key_len = l->key_len ? l->key_len : strlen(l->key);
    h[n++] = entry("x-idempotency-key", l->key, key_len);
    h[n++] = entry("x-sekali-reason", "failed", 6);
    h[n++] = entry("x-sekali-queue", queue, strlen(queue));
    h[n++] = entry("x-sekali-error", l->error, strlen(l->error));
    h[n++] = entry("x-sekali-first-failure", "2026-12-01T09:00:00Z", 20);
    h[n++] = entry("x-sekali-last-failure", "2026-12-01T09:05:00Z", 20);
    if (l->note != NULL)
        h[n++] = entry("x-note", l->note, l->note_len ? l->note_len : strlen(l->note));
    amqp_envelope_t env;
    memset(&env, 0, sizeof(env));
    amqp_basic_properties_t *p = &env.message.properties;
    p->_flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_USER_ID_FLAG |
                AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
    p->message_id = amqp_cstring_bytes(id);
    p->type = amqp_cstring_bytes("test");
    p->user_id = amqp_cstring_bytes(getenv("SEKALI_AMQP_USER") ? getenv("SEKALI_AMQP_USER")
                                                                : "sekali");
    p->content_type = amqp_cstring_bytes("text/plain");
    p->headers = (amqp_table_t){ .num_entries = n, .entries = h };
    env.message.body.bytes = (void *)l->body;
    env.message.body.len = l->body_len ? l->body_len : strlen(l->body);
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_republish(r->b, dead, &env, NULL, 0, &err) == SK_OK,
                  "publish to %s: %s", dead, err.msg);
}

static pid_t start_console(struct h_run *r)
{
    char exe[1100], log[1100];
    snprintf(exe, sizeof(exe), "%s/sekalictl", h_build_dir());
    snprintf(log, sizeof(log), "%s/serve.log", r->dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(127);
        execl(exe, exe, "-c", r->config, "serve", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static bool console_up(const char *dir)
{
    char path[1100];
    snprintf(path, sizeof(path), "%s/serve.log", dir);
    char *text = h_read_file(path);
    bool up = text != NULL && strstr(text, "sekalictl: console on") != NULL;
    free(text);
    return up;
}

START_TEST(test_the_console_in_a_browser_replays_once_purges_and_keeps_hostile_data_as_text)
{
    ck_assert_msg(access(CHROMIUM, X_OK) == 0, CHROMIUM " is missing: apt-get install chromium "
                  "(tools/install-deps.sh installs it)");
    char *modules = puppeteer();
    struct h_run r;
    h_run_open(&r, "console");
    char big[200], token_file[1100];
    snprintf(big, sizeof(big), "%s-big", r.queue);
    snprintf(token_file, sizeof(token_file), "%s/console.token", r.dir);
    FILE *t = fopen(token_file, "w");
    ck_assert_ptr_nonnull(t);
    fputs(TOKEN "\n", t);
    ck_assert_int_eq(fclose(t), 0);
    char op_token_file[1100];
    snprintf(op_token_file, sizeof(op_token_file), "%s/console.dora.token", r.dir);
    t = fopen(op_token_file, "w");
    ck_assert_ptr_nonnull(t);
    fputs(OP_TOKEN "\n", t);
    ck_assert_int_eq(fclose(t), 0);
    ck_assert_int_eq(chmod(op_token_file, 0600), 0);
    int metrics = h_free_port(), console = h_free_port();

    char top[4000], queue_yaml[2000];
    /* A schedule on the second queue: its jobs succeed (any body but
     * fail/retry/crash), so they change no count the script compares. */
    snprintf(top, sizeof(top), H_RELAY "metrics:\n  listen: \"127.0.0.1:%d\"\n"
             "console:\n  listen: \"127.0.0.1:%d\"\n  token_file: %s\n  session: 10m\n"
             "  operators:\n    - name: '" OP_NAME "'\n      token_file: %s\n"
             "schedules:\n  - name: " SCHEDULE "\n    every: 5s\n    queue: %s\n"
             "    job_type: test\n    body: ok\n",
             metrics, console, token_file, op_token_file, big);
    snprintf(queue_yaml, sizeof(queue_yaml),
             H_FAST_RETRIES "    job_types: [test]\n    lock: false\n    config:\n"
             "      marker_dir: %s\n"
             "  - name: %s\n    handler: %s/" FLAKY "\n    workers: 1\n    job_types: [test]\n"
             "    lock: false\n    config:\n      marker_dir: %s\n",
             r.dir, big, h_build_dir(), r.dir);
    h_run_start(&r, &(struct h_run_opts){ .handler = FLAKY, .workers = 2,
                                          .queue_yaml = queue_yaml, .top_yaml = top });

    /* The payment service is down: 40 jobs fail, 3 exhaust their retries. */
    char key[64], id[64];
    for (int i = 1; i <= PAYMENTS; i++) {
        snprintf(key, sizeof(key), "pay-%d", i);
        snprintf(id, sizeof(id), "m-pay-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "fail");
    }
    for (int i = 1; i <= RETRIES; i++) {
        snprintf(key, sizeof(key), "retry-%d", i);
        snprintf(id, sizeof(id), "m-retry-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "retry");
    }
    H_WAIT(h_queue_depth(r.b, r.dead) == PAYMENTS + RETRIES, 120000,
           "expected %d dead letters in %s, have %u", PAYMENTS + RETRIES, r.dead,
           h_queue_depth(r.b, r.dead));

    /* The hostile ones, and errors that differ only in figures. */
    char *mb = malloc(MEGABYTE + 1);
    ck_assert_ptr_nonnull(mb);
    memset(mb, 'A', MEGABYTE);
    memcpy(mb, "<script>alert('mb')</script>", 28);
    memcpy(mb + MEGABYTE - 29, "</pre><script>alert(9)</script>", 29);
    mb[MEGABYTE] = '\0';
    static const char nul_body[] = "before\0<script>alert('nul')</script>\0after";
    const struct letter hostile[] = {
        { .key = "<script>alert(1)</script>", .error = "<script>alert(2)</script>",
          .body = "<script>alert(3)</script>" },
        { .key = "\"><img src=x onerror=alert(4)>", .error = "'\"><img src=x onerror=alert(5)>",
          .body = "\"><svg onload=alert(6)>", .note = "\"><img src=x onerror=alert(7)>" },
        { .key = "</textarea><script>alert(8)</script>", .error = "</textarea></pre></td>",
          .body = "</textarea></pre><script>alert(10)</script>" },
        { .key = "javascript:alert(11)", .error = "see javascript:alert(12)",
          .body = "javascript:alert(13)", .note = "javascript:alert(14)" },
        { .key = "bad-utf8-\xff\xfe-\xc3\x28", .error = "its key is not UTF-8",
          .body = "x" },
        { .key = "bad-utf8-elsewhere", .error = "bytes \xff\xfe in the error",
          .body = "\xc3\x28\xa0\xa1 body", .note = "\xed\xa0\x80 surrogate" },
        { .key = "nul-key", .error = "the body and x-note hold NULs", .body = nul_body,
          .body_len = sizeof(nul_body) - 1, .note = "a\0b", .note_len = 3 },
        { .key = "megabyte", .error = "a 1 MB body", .body = mb, .body_len = MEGABYTE },
        { .key = "gw-1", .error = "payment gateway 503 for order 1001 (req 8c1f2e9a-77aa-4b1c)",
          .body = "x" },
        { .key = "gw-2", .error = "payment gateway 503 for order 1002 (req 9d2e3f0b-88bb-5c2d)",
          .body = "x" },
        { .key = "gw-3", .error = "payment gateway 502 for order 1077 (req 0e3f4a1c-99cc-6d3e)",
          .body = "x" },
    };
    size_t n_hostile = sizeof(hostile) / sizeof(hostile[0]);
    for (size_t i = 0; i < n_hostile; i++) {
        snprintf(id, sizeof(id), "m-hostile-%zu", i);
        dead_letter(&r, r.queue, r.dead, &hostile[i], id);
    }
    free(mb);
    H_WAIT(h_queue_depth(r.b, r.dead) == PAYMENTS + RETRIES + n_hostile, 30000,
           "the hostile letters should be in %s", r.dead);

    /* The service is back: a replayed job now succeeds. */
    char release[1100];
    snprintf(release, sizeof(release), "%s/release", r.dir);
    t = fopen(release, "w");
    ck_assert_ptr_nonnull(t);
    fclose(t);

    /* The hostile letters went into <queue>.dead as a broker or an older
     * sekali would have left them: import them into sekali.dead_letters
     * (the mirror's copies of the failed jobs are removed as duplicates). */
    char *imported;
    ck_assert_int_eq(h_sekalictl(&r, &imported, (const char *const[]){ "dlq", "import",
                                                                        r.queue, NULL }), 0);
    free(imported);
    ck_assert_uint_eq(h_queue_depth(r.b, r.dead), 0);

    /* 100,000 dead letters in the second queue, as workers record them. */
    int64_t t0 = h_now_ms();
    char sql[2000];
    snprintf(sql, sizeof(sql),
             "INSERT INTO sekali.dead_letters (queue, key, job_id, job_type, reason, error, "
             "body, body_size) SELECT '%s', 'big-' || i, 'm-big-' || i, 'test', 'failed', "
             "CASE i %% 4 WHEN 0 THEN format('timeout after %%s ms talking to shard %%s', "
             "3000 + i %% 7, i %% 16) WHEN 1 THEN format('connection refused by 10.0.%%s.%%s:5432', "
             "3000 + i %% 7, i %% 16) WHEN 2 THEN format('HTTP %%s from the ledger for invoice %%s', "
             "3000 + i %% 7, i %% 16) ELSE format('card declined: code %%s, attempt %%s', "
             "3000 + i %% 7, i %% 16) END, '{}', 2 FROM generate_series(0, %d) i",
             big, BIG - 1);
    h_pg_exec(r.pg, sql);
    printf("recorded %d dead letters in %lld ms\n", BIG, (long long)(h_now_ms() - t0));

    pid_t serve = start_console(&r);
    H_WAIT(console_up(r.dir), 20000, "sekalictl serve should listen (see %s/serve.log)", r.dir);

    char artifacts[1100], script[PATH_MAX];
    snprintf(artifacts, sizeof(artifacts), "%s/artifacts/console", h_build_dir());
    char cmd[6000];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", artifacts);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_ptr_nonnull(realpath("tests/browser/console.cjs", script));
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && NODE_PATH='%s/node_modules' CONSOLE_URL='http://127.0.0.1:%d' "
             "CONSOLE_TOKEN='" TOKEN "' OPERATOR_TOKEN='" OP_TOKEN "' QUEUE='%s' BIG_QUEUE='%s' PG='%s' ARTIFACTS='%s' "
             "CHROMIUM='" CHROMIUM "' PAYMENTS=%d BIG=%d SCHEDULE='" SCHEDULE "' "
             "timeout 900 node '%s' "
             ">'%s/browser.log' 2>&1",
             r.dir, modules, console, r.queue, big, h_pg_conninfo(), artifacts, PAYMENTS, BIG,
             script, r.dir);
    int status = system(cmd);
    char log[1100];
    snprintf(log, sizeof(log), "%s/browser.log", r.dir);
    char *out = h_read_file(log);
    printf("%s", out != NULL ? out : "(no browser log)\n");
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s/browser.log'", log, artifacts);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the browser script failed (status %d):\n%s", status, out ? out : "");
    free(out);

    /* Judged here as well as in the script: each replayed job ran once. */
    for (int i = 1; i <= PAYMENTS; i++) {
        snprintf(key, sizeof(key), "pay-%d", i);
        ck_assert_int_eq(h_effects(&r, key), 1);
    }
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dlq_audit WHERE queue = "
                                      "'%s' AND action = 'replay' AND actor = 'alice'", r.queue),
                     PAYMENTS);

    kill(serve, SIGTERM);
    int st = h_wait_exit(serve, 20000, "sekalictl serve");
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "serve should exit 0 on SIGTERM");
    h_stop_sekalid(r.sekalid, r.dir);
    r.sekalid = -1;
    h_run_close(&r);
    free(modules);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_the_console_in_a_browser_replays_once_purges_and_keeps_hostile_data_as_text,
        NULL,
    };
    return h_run_suite(h_suite("console", 1500, tests));
}
