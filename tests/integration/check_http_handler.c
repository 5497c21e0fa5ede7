/* check_http_handler.c - the stock HTTP handler (handlers/http.c) against a
 * real HTTP server (tests/http_server.c): the request it sends, each
 * outcome (2xx, 429 with Retry-After, 500, 400, a dropped connection, a
 * timeout), secrets kept out of every log line and error, `sekalid -t`'s
 * refusals, and the lease: a worker killed after the server got its request,
 * and one frozen past its lease. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "harness.h"
#include "http_server.h"

#define HTTP_HANDLER "handlers/http.so"
#define FILE_SECRET  "Bearer s3cr3t-token-4471"
#define ENV_SECRET   "envsecret-7781"

static const char *const secret_env[] = { "SK_TEST_HTTP_TOKEN=" ENV_SECRET, NULL };

/* The queue's YAML: external mode, a short lease, fast retries, and the
 * handler's config pointing at the server, with one secret from a file
 * and one from the environment. */
static char *queue_yaml(struct h_run *r, struct hs *s, const char *lease, const char *timeout,
                        const char *extra)
{
    char token[1200];
    snprintf(token, sizeof(token), "%s/payments.token", r->dir);
    FILE *f = fopen(token, "w");
    ck_assert_ptr_nonnull(f);
    fputs(FILE_SECRET "\n", f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(chmod(token, 0600), 0);
    char *yaml = NULL;
    ck_assert(asprintf(&yaml,
        "    mode: external\n    lease: %s\n"
        "    retry:\n      max_attempts: 4\n      initial: 10ms\n      max: 5s\n%s"
        "    config:\n"
        "      url: \"http://127.0.0.1:%d/charge\"\n"
        "      timeout: %s\n"
        "      headers:\n"
        "        Authorization: {file: %s}\n"
        "        X-From-Env: {env: SK_TEST_HTTP_TOKEN}\n"
        "        X-Api-Version: \"2\"\n",
        lease, extra != NULL ? extra : "", hs_port(s), timeout, token) > 0);
    return yaml;
}

/* No secret anywhere an operator looks: the log, the keys' errors, the
 * saved results. */
static void expect_no_secret(struct h_run *r)
{
    ck_assert_int_eq(h_count_lines(r->log, "s3cr3t"), 0);
    ck_assert_int_eq(h_count_lines(r->log, ENV_SECRET), 0);
    ck_assert_int_eq(h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                       "queue = '%s' AND (error LIKE '%%s3cr3t%%' OR error LIKE "
                                       "'%%" ENV_SECRET "%%' OR convert_from(result, 'UTF8') "
                                       "LIKE '%%s3cr3t%%')", r->queue), 0);
}

START_TEST(test_job_is_posted_with_its_keys_and_secrets_and_the_response_is_its_result)
{
    struct h_run r;
    h_run_open(&r, "httpok");
    struct hs *s = hs_start();
    char *yaml = queue_yaml(&r, s, "5s", "2s", NULL);
    h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 1,
                                          .queue_yaml = yaml, .env = secret_env });
    h_publish(r.b, r.queue, "charge", "job-ok-1", "pay-1", NULL, "ok");
    h_publish(r.b, r.queue, "charge", "job-ok-2", "pay-2", NULL, "ok");
    H_WAIT(h_completed(&r) == 2, 20000, "both jobs should complete: %lld did", h_completed(&r));
    h_run_stop(&r);

    struct hs_request q;
    ck_assert(hs_get(s, "pay-1", 0, &q));
    ck_assert_str_eq(q.job_id, "job-ok-1");
    ck_assert_str_eq(q.job_type, "charge");
    ck_assert_str_eq(q.body, "ok");
    ck_assert_str_eq(q.content_type, "text/plain");
    ck_assert_str_eq(q.authorization, FILE_SECRET);
    ck_assert_str_eq(q.from_env, ENV_SECRET);
    ck_assert_int_eq(q.attempt, 1);
    ck_assert_int_ge(q.fence, 1);
    ck_assert_int_eq(hs_count(s, "pay-1"), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'pay-1' AND convert_from(result, "
                                      "'UTF8') = 'done pay-1 fence=%lld'", r.queue,
                                (long long)q.fence), 1);
    expect_no_secret(&r);
    free(yaml);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

START_TEST(test_status_codes_and_transport_errors_retry_or_fail_and_no_secret_leaks)
{
    struct h_run r;
    h_run_open(&r, "httpcodes");
    struct hs *s = hs_start();
    char *yaml = queue_yaml(&r, s, "10s", "1s", NULL);
    h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 2,
                                          .queue_yaml = yaml, .env = secret_env });
    h_publish(r.b, r.queue, "charge", "m429", "k429", NULL, "429");
    h_publish(r.b, r.queue, "charge", "m500", "k500", NULL, "500");
    h_publish(r.b, r.queue, "charge", "mdrop", "kdrop", NULL, "drop");
    h_publish(r.b, r.queue, "charge", "mslow", "kslow", NULL, "slow");
    h_publish(r.b, r.queue, "charge", "m400", "k400", NULL, "400");
    H_WAIT(h_completed(&r) == 4 && h_failed(&r) == 1, 60000,
           "4 jobs should complete after a retry and 1 fail: %lld completed, %lld failed",
           h_completed(&r), h_failed(&r));
    h_run_stop(&r);

    /* Each retried case was sent again by sekali, with the same key and
     * the next attempt. (libcurl itself resends once on a fresh connection
     * when a reused one dies before any answer: the drop may be seen twice
     * on attempt 1.) */
    const char *retried[] = { "k429", "k500", "kdrop", "kslow" };
    for (size_t i = 0; i < 4; i++) {
        size_t n = hs_count(s, retried[i]);
        struct hs_request first, last;
        ck_assert_msg(n >= 2 && hs_get(s, retried[i], 0, &first) &&
                      hs_get(s, retried[i], n - 1, &last),
                      "%s should have been sent again, was sent %zu times", retried[i], n);
        ck_assert_msg(last.attempt == first.attempt + 1, "%s: attempts %d then %d",
                      retried[i], first.attempt, last.attempt);
    }
    /* Retry-After: 1 is honoured: the second try waits at least that. */
    struct hs_request a, b;
    ck_assert(hs_get(s, "k429", 0, &a) && hs_get(s, "k429", 1, &b));
    ck_assert_msg(b.at_ms - a.at_ms >= 950, "the retry after a 429 with Retry-After: 1 came "
                  "after %lld ms", (long long)(b.at_ms - a.at_ms));
    /* Each retry's log line gives its cause. */
    ck_assert_int_ge(h_count_outcomes(r.log, "retry", NULL), 3);
    ck_assert_int_ge(h_count_lines(r.log, "ms: HTTP 500: oops"), 1);
    ck_assert_int_ge(h_count_lines(r.log, "ms: HTTP 429"), 1);
    /* A 400 is final: sent once, dead-lettered with the status and an
     * excerpt from which the echoed secret is blanked. */
    ck_assert_int_eq(hs_count(s, "k400"), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'k400' AND error LIKE "
                                      "'HTTP 400: bad request: ****%%'", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'k400' AND attempts = 1",
                                r.queue), 1);
    expect_no_secret(&r);
    free(yaml);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* A service that repeats the token in its own words (a 401 naming the
 * bare token, its base64, the header URL-encoded) or echoes the request's
 * headers in a 2xx: no form of a secret reaches the error, the dead letter
 * or the result that a producer's reply_to gets. */
START_TEST(test_every_form_of_a_secret_a_response_echoes_is_blanked)
{
    struct h_run r;
    h_run_open(&r, "httpecho");
    struct hs *s = hs_start();
    char *yaml = queue_yaml(&r, s, "10s", "2s", NULL);
    h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 1,
                                          .queue_yaml = yaml, .env = secret_env });
    h_publish(r.b, r.queue, "charge", "m401", "k401", NULL, "401");
    h_publish(r.b, r.queue, "charge", "mecho", "kecho", NULL, "echo");
    H_WAIT(h_completed(&r) == 1 && h_failed(&r) == 1, 20000,
           "the echo should complete and the 401 fail: %lld completed, %lld failed",
           h_completed(&r), h_failed(&r));
    h_run_stop(&r);
    static const char *const forms[] = {
        "s3cr3t", "czNjcjN0LXRva2VuLTQ0NzE", "QmVhcmVyIHMzY3IzdC10b2tlbi00NDcx",
        "Bearer%20", ENV_SECRET, "ZW52c2VjcmV0LTc3ODE",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(forms); i++) {
        ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                          "queue = '%s' AND (coalesce(error, '') LIKE '%%%s%%' OR "
                                          "coalesce(convert_from(result, 'UTF8'), '') LIKE "
                                          "'%%%s%%')", r.queue, forms[i], forms[i]), 0);
        ck_assert_int_eq(h_count_lines(r.log, forms[i]), 0);
    }
    /* Blanked in place: the rest of what the service said is kept. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'k401' AND error LIKE "
                                      "'HTTP 401: invalid token ****%%(base64 ****%%'", r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'kecho' AND convert_from(result, "
                                      "'UTF8') LIKE '{\"headers\":{\"Authorization\":\"****%%'",
                                r.queue), 1);
    free(yaml);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* The worker dies after the server got its request, before any outcome
 * was recorded: once the lease runs out, the job is sent again with the
 * same Idempotency-Key and a higher fence, and completes once. */
START_TEST(test_worker_killed_after_the_request_arrived_resends_same_key_higher_fence)
{
    struct h_run r;
    h_run_open(&r, "httpkill");
    struct hs *s = hs_start();
    char *yaml = queue_yaml(&r, s, "2s", "1500ms", "    lock_ttl: 2s\n");
    h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 1,
                                          .queue_yaml = yaml, .env = secret_env });
    pid_t victim = h_worker_pid(r.sekalid, 0);
    ck_assert(victim > 0);
    h_publish(r.b, r.queue, "charge", "m-kill", "pay-kill", NULL, "hang");
    H_WAIT(hs_count(s, "pay-kill") == 1, 20000, "the request never reached the server");
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead", (long)victim);
    H_WAIT(h_completed(&r) == 1, 60000, "the job should be sent again and complete");
    h_run_stop(&r);

    struct hs_request first, second;
    ck_assert(hs_get(s, "pay-kill", 0, &first) && hs_get(s, "pay-kill", 1, &second));
    ck_assert_int_eq(hs_count(s, "pay-kill"), 2);
    ck_assert_str_eq(second.key, first.key);
    ck_assert_int_gt(second.fence, first.fence);
    free(yaml);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* A worker frozen (SIGSTOP) while its request hangs loses its lease; the
 * other worker takes the job over with a higher fence and completes it.
 * Thawed, the first worker's outcome changes nothing: the result stays the
 * takeover's, and the job is not sent again. */
START_TEST(test_worker_frozen_past_its_lease_has_its_late_outcome_fenced_out)
{
    struct h_run r;
    h_run_open(&r, "httpfreeze");
    struct hs *s = hs_start();
    char *yaml = queue_yaml(&r, s, "2s", "1500ms", "    lock_ttl: 2s\n    prefetch: 1\n");
    h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 2,
                                          .queue_yaml = yaml, .env = secret_env,
                                          .heartbeat = "1s" });
    h_publish(r.b, r.queue, "charge", "m-freeze", "pay-freeze", NULL, "hang");
    H_WAIT(hs_count(s, "pay-freeze") == 1, 20000, "the request never reached the server");
    /* The worker holding it, by the claim's owner (host:pid). */
    pid_t frozen = (pid_t)h_pg_count(r.pg, "SELECT split_part(owner, ':', 2)::bigint FROM "
                                           "sekali.idempotency_keys WHERE queue = '%s' AND "
                                           "key = 'pay-freeze'", r.queue);
    pid_t one = h_worker_pid(r.sekalid, 0), two = h_worker_pid(r.sekalid, one);
    ck_assert_msg(frozen == one || frozen == two, "the claim's owner %ld is neither worker "
                  "(%ld, %ld)", (long)frozen, (long)one, (long)two);
    ck_assert_int_eq(kill(frozen, SIGSTOP), 0);
    H_WAIT(h_completed(&r) == 1, 60000, "the other worker should take the job over");
    struct hs_request first, second;
    ck_assert(hs_get(s, "pay-freeze", 0, &first) && hs_get(s, "pay-freeze", 1, &second));
    ck_assert_int_gt(second.fence, first.fence);
    /* The late answer waits in the frozen worker's socket. */
    hs_release(s);
    struct timespec settle = { .tv_nsec = 200 * 1000 * 1000 };
    nanosleep(&settle, NULL);
    ck_assert_int_eq(kill(frozen, SIGCONT), 0);
    /* Thawed, its call has timed out (the timeout is below the lease, so a
     * call never outlives it): its retry copy is a duplicate now, and
     * nothing is sent a third time. */
    H_WAIT(h_duplicates(&r) >= 1, 30000,
           "the thawed worker's late outcome should come to nothing (see %s)", r.log);
    h_run_stop(&r);
    ck_assert_int_eq(hs_count(s, "pay-freeze"), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'pay-freeze' AND status = "
                                      "'completed' AND convert_from(result, 'UTF8') = "
                                      "'done pay-freeze fence=%lld'", r.queue,
                                (long long)second.fence), 1);
    free(yaml);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* The service answers 500 with a body whose 200-byte excerpt ends inside
 * an é. The failure on the last attempt could not be recorded (the cut
 * text refused by finish_lease(), SQLSTATE 22021), the message went back,
 * and at each lease's end another worker took the job over and POSTed it
 * again, past max_attempts, for ever (12 POSTs against max_attempts 3 in
 * the issue). Now it is POSTed max_attempts times, recorded failed with the
 * cut character replaced, and dead-lettered. */
START_TEST(test_error_cut_inside_a_character_ends_the_job_after_max_attempts_posts)
{
    struct h_run r;
    h_run_open(&r, "httpcut");
    struct hs *s = hs_start();
    char *yaml = queue_yaml(&r, s, "2s", "1s", "    prefetch: 1\n");
    h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 2,
                                          .queue_yaml = yaml, .env = secret_env });
    h_publish(r.b, r.queue, "charge", "m-cut", "pay-cut", NULL, "cut");
    h_publish(r.b, r.queue, "charge", "m-next", "pay-next", NULL, "ok");
    H_WAIT(h_failed(&r) == 1 && h_completed(&r) == 1, 30000,
           "the cut job should fail after 4 POSTs and the next complete: %lld failed, "
           "%lld completed, %zu POSTs of the cut job", h_failed(&r), h_completed(&r),
           hs_count(s, "pay-cut"));
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "1 dead letter expected, %u in %s",
           h_queue_depth(r.b, r.dead), r.dead);
    h_run_stop(&r);
    ck_assert_int_eq(hs_count(s, "pay-cut"), 4);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'pay-cut' AND error LIKE "
                                      "'HTTP 500: x%%' AND right(error, 2) = U&'\\00E9\\FFFD'",
                                r.queue), 1);
    ck_assert_int_eq(h_count_outcomes(r.log, "handed_back", "failure_not_recorded"), 0);
    free(yaml);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* The last failure cannot be recorded for a while (a condition that
 * passes: here a trigger cancels the statement, SQLSTATE 57014), so the
 * message goes back and the key stays leased. Each copy that took the
 * lease over used to POST the job again, at the same attempt, every lease
 * period. Now the key's claims, counted by PostgreSQL, stop it at
 * max_attempts (with max_crashes 0): later copies only try to record the
 * failure again, which succeeds once the condition is gone. */
START_TEST(test_a_failure_recorded_late_is_not_posted_again_past_max_attempts)
{
    struct h_run r;
    h_run_open(&r, "httplate");
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "CREATE FUNCTION sekali_test.\"late_%s\"() RETURNS trigger LANGUAGE plpgsql AS $$ "
             "BEGIN RAISE EXCEPTION 'not now' USING ERRCODE = '57014'; END $$", r.queue);
    h_pg_exec(r.pg, sql);
    snprintf(sql, sizeof(sql),
             "CREATE TRIGGER \"late_%s\" BEFORE UPDATE ON sekali.idempotency_keys FOR EACH ROW "
             "WHEN (NEW.queue = '%s' AND NEW.status = 'failed') "
             "EXECUTE FUNCTION sekali_test.\"late_%s\"()", r.queue, r.queue, r.queue);
    h_pg_exec(r.pg, sql);
    struct hs *s = hs_start();
    char *yaml = queue_yaml(&r, s, "2s", "1s", "    prefetch: 1\n    max_crashes: 0\n");
    h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 2,
                                          .queue_yaml = yaml, .env = secret_env });
    h_publish(r.b, r.queue, "charge", "m-late", "pay-late", NULL, "500always");
    /* The last attempt's failure refused, then two takeovers' too. */
    H_WAIT(h_count_outcomes(r.log, "handed_back", "failure_not_recorded") >= 3, 40000,
           "the failure should have been refused 3 times: %d so far, %zu POSTs",
           h_count_outcomes(r.log, "handed_back", "failure_not_recorded"),
           hs_count(s, "pay-late"));
    snprintf(sql, sizeof(sql), "DROP TRIGGER \"late_%s\" ON sekali.idempotency_keys", r.queue);
    h_pg_exec(r.pg, sql);
    snprintf(sql, sizeof(sql), "DROP FUNCTION sekali_test.\"late_%s\"()", r.queue);
    h_pg_exec(r.pg, sql);
    H_WAIT(h_failed(&r) == 1, 30000, "the job should be recorded failed");
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "1 dead letter expected, %u in %s",
           h_queue_depth(r.b, r.dead), r.dead);
    h_run_stop(&r);
    ck_assert_int_eq(hs_count(s, "pay-late"), 4);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'pay-late' AND error LIKE "
                                      "'%%past retry.max_attempts 4 and max_crashes 0%%'",
                                r.queue), 1);
    free(yaml);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

/* A test CA, a certificate for 127.0.0.1 signed by it, and a second CA
 * that signed nothing, in dir. */
static void make_certificates(const char *dir)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "cd %s && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && "
             "for ca in ca other_ca; do openssl req -x509 -newkey ec -pkeyopt "
             "ec_paramgen_curve:prime256v1 -nodes -keyout $ca.key -out $ca.pem -days 2 "
             "-subj /CN=sekali-test-$ca || exit 1; done && "
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout server.key -out server.csr -subj /CN=127.0.0.1 && "
             "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out server.pem -days 2 -extfile san.ext", dir);
    char quiet[8300];
    snprintf(quiet, sizeof(quiet), "( %s ) >%s/openssl.log 2>&1", cmd, dir);
    ck_assert_msg(system(quiet) == 0, "openssl failed: see %s/openssl.log", dir);
}

/* TLS verified against the configured CA: a server signed by it is
 * trusted; one that is not is refused with a clear error, retried, and
 * nothing is ever sent to it. */
START_TEST(test_tls_is_verified_against_ca_file_and_a_wrong_ca_is_refused)
{
    for (int wrong = 0; wrong <= 1; wrong++) {
        struct h_run r;
        h_run_open(&r, wrong ? "httptlsbad" : "httptls");
        make_certificates(r.dir);
        char cert[1200], key[1200];
        snprintf(cert, sizeof(cert), "%s/server.pem", r.dir);
        snprintf(key, sizeof(key), "%s/server.key", r.dir);
        struct hs *s = hs_start_tls(cert, key);
        char *yaml = NULL;
        ck_assert(asprintf(&yaml,
            "    mode: external\n    lease: 10s\n"
            "    retry:\n      max_attempts: 2\n      initial: 10ms\n      max: 20ms\n"
            "    config:\n      url: \"https://127.0.0.1:%d/charge\"\n      timeout: 5s\n"
            "      ca_file: %s/%s.pem\n", hs_port(s), r.dir, wrong ? "other_ca" : "ca") > 0);
        h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 1,
                                              .queue_yaml = yaml });
        h_publish(r.b, r.queue, "charge", "m-tls", "pay-tls", NULL, "ok");
        if (!wrong) {
            H_WAIT(h_completed(&r) == 1, 20000, "the job should complete over verified TLS");
            ck_assert_int_eq(hs_count(s, "pay-tls"), 1);
        } else {
            H_WAIT(h_failed(&r) == 1, 20000, "the job should fail after its 2 attempts");
            ck_assert_int_eq(hs_count(s, NULL), 0);
            ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys "
                                              "WHERE queue = '%s' AND key = 'pay-tls' AND "
                                              "attempts = 2 AND error LIKE 'POST failed: SSL "
                                              "certificate problem%%'", r.queue), 1);
        }
        h_run_stop(&r);
        free(yaml);
        hs_stop(s);
        h_run_close(&r);
    }
}
END_TEST

static int test_config(const char *config, char *out, size_t size)
{
    char cmd[3 * PATH_MAX], build[PATH_MAX];
    ck_assert_ptr_nonnull(realpath(h_build_dir(), build));
    /* timeout: a check that hangs (on a FIFO) fails here instead of
     * holding the suite until its own timeout. */
    snprintf(cmd, sizeof(cmd), "SK_TEST_HTTP_TOKEN=x timeout 15 %s/sekalid -t -c %s 2>&1", build,
             config);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

START_TEST(test_sekalid_t_refuses_transactional_mode_and_a_timeout_not_below_the_lease)
{
    h_init();
    char *dir = h_tmpdir("httpcheck");
    char out[8192];
    char *config = h_write_config(dir, "httpcheck", HTTP_HANDLER, 1,
                                  "    config:\n      url: \"http://127.0.0.1:1/x\"\n");
    ck_assert_int_eq(test_config(config, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "runs in `mode: external` only") != NULL, "said:\n%s", out);
    free(config);

    config = h_write_config(dir, "httpcheck", HTTP_HANDLER, 1,
                            "    mode: external\n    lease: 5s\n    config:\n"
                            "      url: \"http://127.0.0.1:1/x\"\n      timeout: 5s\n");
    ck_assert_int_eq(test_config(config, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "must be below the queue's lease (5000ms)") != NULL, "said:\n%s",
                  out);
    free(config);

    config = h_write_config(dir, "httpcheck", HTTP_HANDLER, 1,
                            "    mode: external\n    config:\n"
                            "      url: \"http://127.0.0.1:1/x\"\n"
                            "      headers: {Authorization: {file: /nonexistent/token}}\n");
    ck_assert_int_eq(test_config(config, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "cannot read /nonexistent/token") != NULL, "said:\n%s", out);
    free(config);

    /* A FIFO as a secret file or a TLS file: refused at once, not waited on. */
    char fifo[PATH_MAX], yaml[PATH_MAX + 256];
    snprintf(fifo, sizeof(fifo), "%s/token.fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    static const char *const uses[] = { "headers: {Authorization: {file: %s}}",
                                        "ca_file: %s" };
    for (size_t i = 0; i < SK_ARRAY_LEN(uses); i++) {
        char use[PATH_MAX + 64];
        snprintf(use, sizeof(use), uses[i], fifo);
        snprintf(yaml, sizeof(yaml), "    mode: external\n    config:\n"
                 "      url: \"https://127.0.0.1:1/x\"\n      %s\n", use);
        config = h_write_config(dir, "httpcheck", HTTP_HANDLER, 1, yaml);
        ck_assert_int_eq(test_config(config, out, sizeof(out)), 2);
        ck_assert_msg(strstr(out, "not a regular file (a FIFO, device or socket)") != NULL,
                      "said:\n%s", out);
        free(config);
    }
    unlink(fifo);

    config = h_write_config(dir, "httpcheck", HTTP_HANDLER, 1,
                            "    mode: external\n    config:\n"
                            "      url: \"http://127.0.0.1:1/x\"\n      timeout: 2s\n"
                            "      headers: {X-Key: {env: SK_TEST_HTTP_TOKEN}}\n");
    ck_assert_msg(test_config(config, out, sizeof(out)) == 0, "said:\n%s", out);
    free(config);
    free(dir);
}
END_TEST

/* A job enqueued through the outbox reaches the service with the content
 * type it was enqueued with: from sekali.enqueue(p_content_type), from
 * sekalictl enqueue --content-type (and its default, application/json),
 * and again when its dead letter is replayed. A job enqueued without one
 * goes as application/octet-stream, as before. */
START_TEST(test_a_job_keeps_its_content_type_through_the_outbox_and_a_replay)
{
    struct h_run r;
    h_run_open(&r, "httpctype");
    struct hs *s = hs_start();
    char *yaml = queue_yaml(&r, s, "5s", "2s", NULL);
    h_run_start(&r, &(struct h_run_opts){ .handler = HTTP_HANDLER, .workers = 1,
                                          .queue_yaml = yaml, .env = secret_env,
                                          .top_yaml = H_RELAY });
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "SELECT sekali.enqueue('%s', 'charge', 'ok', 'ct-json', "
             "p_content_type => 'application/json; charset=utf-8'), "
             "sekali.enqueue('%s', 'charge', 'ok', 'ct-none'), "
             "sekali.enqueue('%s', 'charge', '400', 'ct-xml', p_content_type => 'application/xml')",
             r.queue, r.queue, r.queue);
    h_pg_exec(r.pg, sql);
    const char *csv[] = { "enqueue", r.queue, "charge", "--key", "ct-csv", "--content-type",
                          "text/csv", "ok", NULL };
    const char *dflt[] = { "enqueue", r.queue, "charge", "--key", "ct-default", "ok", NULL };
    char *out = NULL;
    ck_assert_msg(h_sekalictl(&r, &out, csv) == 0, "enqueue said: %s", out);
    free(out);
    ck_assert_msg(h_sekalictl(&r, &out, dflt) == 0, "enqueue said: %s", out);
    free(out);
    H_WAIT(h_completed(&r) == 4 && h_failed(&r) == 1, 20000,
           "4 jobs should complete and 1 fail: %lld completed, %lld failed", h_completed(&r),
           h_failed(&r));
    static const struct { const char *key, *type; } want[] = {
        { "ct-json", "application/json; charset=utf-8" },
        { "ct-none", "application/octet-stream" },
        { "ct-xml", "application/xml" },
        { "ct-csv", "text/csv" },
        { "ct-default", "application/json" },
    };
    struct hs_request q;
    for (size_t i = 0; i < SK_ARRAY_LEN(want); i++) {
        ck_assert_msg(hs_get(s, want[i].key, 0, &q), "no request for %s", want[i].key);
        ck_assert_msg(strcmp(q.content_type, want[i].type) == 0,
                      "%s reached the service as \"%s\", not \"%s\"", want[i].key,
                      q.content_type, want[i].type);
    }

    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE queue = '%s' AND "
                            "key = 'ct-xml'", r.queue) == 1, 20000,
           "ct-xml should have its dead letter");
    const char *replay[] = { "dlq", "replay", r.queue, "--key", "ct-xml", NULL };
    ck_assert_msg(h_sekalictl(&r, &out, replay) == 0, "replay said: %s", out);
    free(out);
    H_WAIT(hs_count(s, "ct-xml") == 2, 20000, "the replayed ct-xml should reach the service");
    ck_assert(hs_get(s, "ct-xml", 1, &q));
    ck_assert_str_eq(q.content_type, "application/xml");
    H_WAIT(h_failed(&r) == 1 && h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE "
                                               "queue = '%s'", r.queue) == 1, 20000,
           "the replayed ct-xml should fail again");
    h_run_stop(&r);
    free(yaml);
    hs_stop(s);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_sekalid_t_refuses_transactional_mode_and_a_timeout_not_below_the_lease,
        test_job_is_posted_with_its_keys_and_secrets_and_the_response_is_its_result,
        test_status_codes_and_transport_errors_retry_or_fail_and_no_secret_leaks,
        test_every_form_of_a_secret_a_response_echoes_is_blanked,
        test_worker_killed_after_the_request_arrived_resends_same_key_higher_fence,
        test_worker_frozen_past_its_lease_has_its_late_outcome_fenced_out,
        test_tls_is_verified_against_ca_file_and_a_wrong_ca_is_refused,
        test_error_cut_inside_a_character_ends_the_job_after_max_attempts_posts,
        test_a_failure_recorded_late_is_not_posted_again_past_max_attempts,
        test_a_job_keeps_its_content_type_through_the_outbox_and_a_replay,
        NULL,
    };
    return h_run_suite(h_suite("http_handler", 150, tests));
}
