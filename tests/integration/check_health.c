/* check_health.c - /livez and /readyz on the metrics listener, asked with
 * curl of a real sekalid on real servers, one test per state: ready, not
 * ready while the workers cannot consume (RabbitMQ refuses them their
 * queue), ready again; not ready after a reload whose new workers cannot
 * consume, although the old ones did; unanswered while the supervisor's
 * loop is held (the fault build's hold_supervisor), live again once let
 * go. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

struct run {
    struct h_run h;
    int          port;        /* of the metrics endpoint */
    char         body[1024];  /* the last answer's body */
    char         hold[1100];  /* dir/hold: the supervisor is held while it exists */
};

/* GET path with curl, sending header unless it is NULL; returns the HTTP
 * status (0 if none), the body in r->body. */
static int get_with(struct run *r, const char *path, const char *header)
{
    char file[1100];
    snprintf(file, sizeof(file), "%s/response.txt", r->h.dir);
    int status = h_curl_status(r->port, path, header, file, 10);
    char *text = h_read_file(file);
    snprintf(r->body, sizeof(r->body), "%s", text != NULL ? text : "");
    free(text);
    return status;
}

static int get(struct run *r, const char *path)
{
    return get_with(r, path, NULL);
}

/* The answer to path is status with exactly this body. */
static bool answers(struct run *r, const char *path, int status, const char *body)
{
    return get(r, path) == status && strcmp(r->body, body) == 0;
}

static void rabbitmqctl(const char *args)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "\"$SEKALI_RABBITMQCTL\" %s >/dev/null 2>&1", args);
    int rc = system(cmd);
    ck_assert_msg(rc == 0, "rabbitmqctl %s: status 0x%x", args, rc);
}

/* The test user may, or may not, read (consume) from any queue. Publishing
 * and declaring stay allowed. */
static void allow_consuming(bool allow)
{
    char args[256];
    snprintf(args, sizeof(args), "set_permissions -p / \"$SEKALI_AMQP_USER\" '.*' '.*' '%s'",
             allow ? ".*" : "^$");
    rabbitmqctl(args);
}

/* held: runs the fault build, whose supervisor loop stops while r->hold
 * exists. */
static void start(struct run *r, const char *name, bool held)
{
    allow_consuming(true);  /* whatever a failed test before left */
    h_run_open(&r->h, name);
    r->port = h_free_port();
    snprintf(r->hold, sizeof(r->hold), "%s/hold", r->h.dir);
    char top[256], hold_env[1200];
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\n", r->port);
    snprintf(hold_env, sizeof(hold_env), "SEKALI_HOLD_FILE=%s", r->hold);
    const char *env[] = { "SEKALI_FAULTS=hold_supervisor", hold_env, NULL };
    h_run_start(&r->h, &(struct h_run_opts){ .binary = held ? "fault/sekalid" : NULL,
                                             .workers = 2, .top_yaml = top,
                                             .env = held ? env : NULL });
}

/* The queue's consumers as RabbitMQ counts them, asked with rabbitmqctl:
 * the test's own connection may not be allowed to look. */
static int consumers(const char *queue)
{
    FILE *p = popen("\"$SEKALI_RABBITMQCTL\" -q list_queues -p / name consumers 2>/dev/null", "r");
    ck_assert_ptr_nonnull(p);
    char line[512];
    int n = -1;
    size_t len = strlen(queue);
    while (fgets(line, sizeof(line), p) != NULL)
        if (strncmp(line, queue, len) == 0 && line[len] == '\t')
            n = atoi(line + len + 1);
    pclose(p);
    return n;
}

static void expect_ready(struct run *r, const char *why)
{
    char want[256];
    snprintf(want, sizeof(want), "ready: %s: 2/2 workers consuming\n", r->h.queue);
    H_WAIT(answers(r, "/readyz", 200, want), 30000, "%s: /readyz should answer 200 \"%s\", "
           "answered \"%s\"", why, want, r->body);
}

static void finish(struct run *r)
{
    h_run_stop(&r->h);
    h_run_close(&r->h);
}

START_TEST(test_readyz_and_livez_answer_200_while_every_worker_consumes)
{
    struct run r;
    start(&r, "health-ready", false);
    ck_assert_uint_eq(h_consumers(r.h.b, r.h.queue), 2);
    expect_ready(&r, "both workers consume");
    ck_assert_msg(answers(&r, "/livez", 200, "live\n"), "/livez: \"%s\"", r.body);
    /* /metrics is as it was, and other paths still say where to look. */
    ck_assert_int_eq(get(&r, "/metrics"), 200);
    ck_assert_ptr_nonnull(strstr(r.body, "sekali_"));
    ck_assert_int_eq(get(&r, "/health"), 404);
    finish(&r);
}
END_TEST

/* RabbitMQ refusing the queue to the workers (read permission taken, their
 * connections closed) keeps them from consuming for as long as it lasts. */
START_TEST(test_readyz_says_503_and_why_while_no_worker_can_consume_then_200_again)
{
    struct run r;
    start(&r, "health-refused", false);
    expect_ready(&r, "at start");

    allow_consuming(false);
    sk_broker_close(r.h.b);
    rabbitmqctl("close_all_connections health-test");
    H_WAIT(h_count_events(r.h.log, "worker", SK_EVENT_OUTAGE_BEGIN, SK_SERVER_RABBITMQ) >= 2,
           30000, "both workers should lose their connection");
    char want[256];
    snprintf(want, sizeof(want), "not ready: %s: 0/2 workers consuming\n", r.h.queue);
    H_WAIT(answers(&r, "/readyz", 503, want), 30000, "/readyz should answer 503 \"%s\", "
           "answered \"%s\"", want, r.body);
    /* RabbitMQ agrees: nobody consumes the queue. */
    ck_assert_int_eq(consumers(r.h.queue), 0);
    ck_assert_msg(answers(&r, "/livez", 200, "live\n"), "not ready is still live: \"%s\"",
                  r.body);

    allow_consuming(true);
    r.h.b = h_broker();
    expect_ready(&r, "once RabbitMQ lets the workers consume again");
    ck_assert_int_eq(consumers(r.h.queue), 2);
    finish(&r);
}
END_TEST

/* The new generation's workers cannot start to consume: readiness follows
 * the new generation, while the old one serves on until the new one
 * consumes (a reload never leaves the queue without consumers). */
START_TEST(test_readyz_says_503_after_a_reload_until_the_new_workers_consume)
{
    struct run r;
    start(&r, "health-reload", false);
    expect_ready(&r, "at start");

    allow_consuming(false);
    ck_assert_int_eq(consumers(r.h.queue), 2);  /* the old workers' channels stay open */
    ck_assert_int_eq(kill(r.h.sekalid, SIGHUP), 0);
    H_WAIT(h_count_events(r.h.log, "supervisor", SK_EVENT_RELOADED, NULL) == 1, 30000,
           "the reload should be logged");
    H_WAIT(h_count_lines(r.h.log, "ACCESS_REFUSED") >= 1, 30000,
           "the new workers should be refused their queue (see %s)", r.h.log);
    char want[256];
    snprintf(want, sizeof(want), "not ready: %s: 0/2 workers consuming\n", r.h.queue);
    H_WAIT(answers(&r, "/readyz", 503, want), 30000, "/readyz should answer 503 \"%s\", "
           "answered \"%s\"", want, r.body);
    ck_assert_int_eq(consumers(r.h.queue), 2);
    ck_assert_int_eq(h_count_event_where(r.h.log, SK_EVENT_GENERATION_RETIRED, "reason",
                                         "reload", NULL), 0);

    allow_consuming(true);
    expect_ready(&r, "once the new generation consumes");
    H_WAIT(h_count_event_where(r.h.log, SK_EVENT_GENERATION_RETIRED, "reason", "reload",
                               NULL) == 1, 30000,
           "the old generation should be retired once the new one consumes");
    H_WAIT(consumers(r.h.queue) == 2, 30000, "only the new generation's 2 workers should "
           "consume, %d do", consumers(r.h.queue));
    finish(&r);
}
END_TEST

/* The endpoint is the supervisor's own loop: held (the fault build's
 * hold_supervisor), it answers nothing, not even /metrics, so a probe's
 * timeout sees it; let go, it answers the requests that waited. */
START_TEST(test_livez_goes_unanswered_while_the_supervisor_loop_is_held_then_200_again)
{
    struct run r;
    start(&r, "health-held", true);
    expect_ready(&r, "at start");
    ck_assert_msg(answers(&r, "/livez", 200, "live\n"), "/livez: \"%s\"", r.body);

    FILE *f = fopen(r.hold, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    /* A held turn may have started before the file existed: the first
     * request can still be answered, the next waits behind the hold. */
    H_WAIT(get(&r, "/livez") == 0, 60000, "/livez should go unanswered once the loop is "
           "held, answered \"%s\"", r.body);
    ck_assert_msg(get(&r, "/metrics") == 0, "a held supervisor answered /metrics");

    ck_assert_int_eq(unlink(r.hold), 0);
    H_WAIT(answers(&r, "/livez", 200, "live\n"), 30000,
           "/livez should answer 200 once the loop turns again, answered \"%s\"", r.body);
    expect_ready(&r, "once the loop turns again");
    finish(&r);
}
END_TEST

/* A slow-client flood: FLOOD connections kept open, each sending its
 * request a byte every 400 ms and opened again when the server cuts it,
 * for FLOOD_MS; bounded, so the test ends whatever the server does. */
#define FLOOD    40
#define FLOOD_MS 6000

static void flood(int port)
{
    static const char request[] = "GET /livez HTTP/1.1\r\nHost: flood\r\nX-Slow: ";
    int fds[FLOOD];
    size_t sent[FLOOD];
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    for (int i = 0; i < FLOOD; i++)
        fds[i] = -1;
    int64_t end = h_now_ms() + FLOOD_MS;
    while (h_now_ms() < end) {
        for (int i = 0; i < FLOOD; i++) {
            if (fds[i] < 0) {
                fds[i] = socket(AF_INET, SOCK_STREAM, 0);
                if (fds[i] >= 0 && connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) != 0) {
                    close(fds[i]);
                    fds[i] = -1;
                }
                sent[i] = 0;
                continue;
            }
            char c = request[sent[i] % (sizeof(request) - 1)];
            if (send(fds[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
                close(fds[i]);
                fds[i] = -1;
            }
            sent[i]++;
        }
        usleep(400 * 1000);
    }
    _exit(0);
}

/* Sixteen slow clients used to hold all of the endpoint's connections for
 * as long as they liked, and those queued behind them kept it down after;
 * an orchestrator's probe, timing out, would restart a healthy sekalid. */
START_TEST(test_livez_answers_during_a_slow_client_flood)
{
    struct run r;
    start(&r, "health-flood", false);
    ck_assert_msg(answers(&r, "/livez", 200, "live\n"), "/livez: \"%s\"", r.body);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0)
        flood(r.port);
    usleep(1500 * 1000);  /* the flood holds every slot by now */
    int answered = 0;
    for (int i = 0; i < 5; i++)
        answered += h_curl_status(r.port, "/livez", NULL, "/dev/null", 2) == 200;
    kill(child, SIGKILL);
    h_wait_exit(child, 10000, "the flood");
    ck_assert_msg(answered == 5, "/livez should answer 200 within 2 s through the flood, "
                  "answered %d of 5", answered);
    finish(&r);
}
END_TEST

/* metrics.token_file: every path asks for the bearer token (401 without
 * it or with another), answers with it, and sekalictl status sends it. */
START_TEST(test_a_token_file_guards_every_path_and_sekalictl_status_sends_it)
{
    struct run r;
    allow_consuming(true);
    h_run_open(&r.h, "health-token");
    r.port = h_free_port();
    char token_file[1100], top[1400];
    snprintf(token_file, sizeof(token_file), "%s/metrics.token", r.h.dir);
    FILE *f = fopen(token_file, "w");
    ck_assert_ptr_nonnull(f);
    fputs("Zm9vYmFyLXNlY3JldC10b2tlbg==\n", f);
    ck_assert_int_eq(fclose(f), 0);
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\n  token_file: %s\n", r.port,
             token_file);
    h_run_start(&r.h, &(struct h_run_opts){ .workers = 2, .top_yaml = top });

    const char *paths[] = { "/metrics", "/livez", "/readyz" };
    for (size_t i = 0; i < SK_ARRAY_LEN(paths); i++) {
        ck_assert_int_eq(get(&r, paths[i]), 401);
        ck_assert_str_eq(r.body, "a bearer token is required (metrics.token_file)\n");
        ck_assert_int_eq(get_with(&r, paths[i], "Authorization: Bearer Zm9vYmFyLXNlY3JldC10b2tlbh=="),
                         401);
        ck_assert_int_eq(get_with(&r, paths[i], "Authorization: Bearer Zm9vYmFy"), 401);
    }
    const char *good = "Authorization: Bearer Zm9vYmFyLXNlY3JldC10b2tlbg==";
    ck_assert_int_eq(get_with(&r, "/metrics", good), 200);
    ck_assert_ptr_nonnull(strstr(r.body, "sekali_"));
    ck_assert_int_eq(get_with(&r, "/livez", good), 200);

    char cmd[2600], out_file[1100];
    snprintf(out_file, sizeof(out_file), "%s/status.txt", r.h.dir);
    snprintf(cmd, sizeof(cmd), "%s/sekalictl -c %s status >%s 2>&1", h_build_dir(), r.h.config,
             out_file);
    ck_assert_int_eq(system(cmd), 0);
    char *out = h_read_file(out_file);
    ck_assert_ptr_nonnull(out);
    ck_assert_msg(strstr(out, "answered") != NULL && strstr(out, "2 up") != NULL,
                  "sekalictl status should scrape with the token:\n%s", out);
    ck_assert_ptr_null(strstr(out, "Zm9vYmFy"));
    free(out);
    ck_assert_int_eq(h_count_lines(r.h.log, "Zm9vYmFy"), 0);
    finish(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_readyz_and_livez_answer_200_while_every_worker_consumes,
        test_readyz_says_503_and_why_while_no_worker_can_consume_then_200_again,
        test_readyz_says_503_after_a_reload_until_the_new_workers_consume,
        test_livez_goes_unanswered_while_the_supervisor_loop_is_held_then_200_again,
        test_livez_answers_during_a_slow_client_flood,
        test_a_token_file_guards_every_path_and_sekalictl_status_sends_it,
        NULL,
    };
    int rc = h_run_suite(h_suite("health", 300, tests));
    /* Whatever a failed test left behind: the next suites need to consume. */
    if (system("\"$SEKALI_RABBITMQCTL\" set_permissions -p / \"$SEKALI_AMQP_USER\" "
               "'.*' '.*' '.*' >/dev/null 2>&1") != 0)
        fprintf(stderr, "check_health: could not restore the test user's permissions\n");
    return rc;
}
