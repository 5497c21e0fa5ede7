/* check_sql_handler.c - the stock SQL handler (handlers/sql.c) on real
 * servers: a PL/pgSQL function run as the job, each effect once; every
 * SQLSTATE mapping; a failing job in a batch; a function deployed after
 * sekalid started; hostile bodies; and the configuration checks of
 * `sekalid -t`, positions included. The killed-worker case is in
 * tests/fault/check_sql_crash.c. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "text.h"

#define SQL_HANDLER "handlers/sql.so"
#define FAST_RETRY  "    retry:\n      max_attempts: 3\n      initial: 10ms\n      max: 20ms\n"
#define BOOK        "SELECT sekali_sqlh.book(:body::jsonb, :idempotency_key, :queue, :attempt::int)"

/* The business side: one function, whose behaviour the body chooses, and
 * the rows it writes. No unique key on bookings: a job run twice shows. */
static void create_schema(PGconn *pg)
{
    h_pg_exec(pg, "CREATE SCHEMA IF NOT EXISTS sekali_sqlh");
    h_pg_exec(pg, "CREATE TABLE IF NOT EXISTS sekali_sqlh.bookings (queue text NOT NULL, "
                  "key text NOT NULL, amount bigint, attempt int, backend int)");
    h_pg_exec(pg, "CREATE TABLE IF NOT EXISTS sekali_sqlh.taken (v text PRIMARY KEY)");
    h_pg_exec(pg,
        "CREATE OR REPLACE FUNCTION sekali_sqlh.book(body jsonb, key text, q text, attempt int) "
        "RETURNS text LANGUAGE plpgsql AS $fn$\n"
        "BEGIN\n"
        "  CASE coalesce(body->>'do', '')\n"
        "  WHEN 'transient' THEN\n"
        "    IF attempt = 1 THEN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001';\n"
        "    END IF;\n"
        "  WHEN 'retry' THEN\n"
        "    IF attempt = 1 THEN RAISE EXCEPTION 'stock not in yet' USING ERRCODE = 'SKRTY';\n"
        "    END IF;\n"
        "  WHEN 'fail' THEN\n"
        "    RAISE EXCEPTION 'card declined' USING ERRCODE = 'SKFAL', DETAIL = 'issuer said no';\n"
        "  WHEN 'unique' THEN\n"
        "    INSERT INTO sekali_sqlh.taken VALUES (q || ':taken');\n"
        "  WHEN 'sleep_once' THEN\n"
        "    IF nextval(body->>'seq') = 1 THEN PERFORM pg_sleep(8); END IF;\n"
        "  ELSE NULL;\n"
        "  END CASE;\n"
        "  INSERT INTO sekali_sqlh.bookings VALUES (q, key, (body->>'amount')::bigint, attempt,\n"
        "                                           pg_backend_pid());\n"
        "  RETURN 'booked ' || key;\n"
        "END $fn$");
}

static long long bookings(const struct h_run *r, const char *key)
{
    if (key == NULL)
        return h_pg_count(r->pg, "SELECT count(*) FROM sekali_sqlh.bookings WHERE queue = '%s'",
                          r->queue);
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali_sqlh.bookings WHERE queue = '%s' AND "
                             "key = '%s'", r->queue, key);
}

/* 1 when key failed with an error matching the LIKE pattern. */
static long long failed_with(const struct h_run *r, const char *key, const char *like)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                             "AND key = '%s' AND status = 'failed' AND error LIKE '%s'",
                      r->queue, key, like);
}

static char *config_for(const struct h_run *r, const char *statement_yaml, const char *extra)
{
    char *yaml = NULL;
    ck_assert(asprintf(&yaml, "%s    config:\n      statement: %s\n", extra != NULL ? extra : "",
                       statement_yaml) > 0);
    (void)r;
    return yaml;
}

START_TEST(test_function_runs_once_per_key_when_each_job_comes_three_times)
{
    struct h_run r;
    h_run_open(&r, "sqlonce");
    create_schema(r.pg);
    char *yaml = config_for(&r, "\"" BOOK "\"", NULL);
    h_run_start(&r, &(struct h_run_opts){ .handler = SQL_HANDLER, .workers = 3,
                                          .queue_yaml = yaml });
    enum { N = 30 };
    for (int copy = 0; copy < 3; copy++)
        for (int i = 0; i < N; i++) {
            char id[160], key[160], body[128];
            snprintf(id, sizeof(id), "%s-%d-%d", r.queue, i, copy);
            snprintf(key, sizeof(key), "k-%d", i);
            snprintf(body, sizeof(body), "{\"amount\": %d}", i);
            h_publish(r.b, r.queue, "book", id, key, NULL, body);
        }
    H_WAIT(h_completed(&r) == N && h_duplicates(&r) == 2 * N, 60000,
           "%d keys should complete and absorb %d duplicates: %lld completed, %lld duplicates",
           N, 2 * N, h_completed(&r), h_duplicates(&r));
    h_run_stop(&r);
    ck_assert_int_eq(bookings(&r, NULL), N);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(DISTINCT key) FROM sekali_sqlh.bookings "
                                      "WHERE queue = '%s'", r.queue), N);
    /* The function's answer is the job's saved result. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND convert_from(result, 'UTF8') = "
                                      "'booked k-7'", r.queue), 1);
    free(yaml);
    h_run_close(&r);
}
END_TEST

START_TEST(test_sqlstates_decide_retry_or_dead_letter_and_hostile_bodies_leave_the_worker_alive)
{
    struct h_run r;
    h_run_open(&r, "sqlstate");
    create_schema(r.pg);
    char sql[512];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali_sqlh.taken VALUES ('%s:taken')", r.queue);
    h_pg_exec(r.pg, sql);
    char *yaml = config_for(&r, "\"" BOOK "\"", FAST_RETRY "    max_body: 2MiB\n");
    h_run_start(&r, &(struct h_run_opts){ .handler = SQL_HANDLER, .workers = 1,
                                          .queue_yaml = yaml });
    pid_t worker = h_worker_pid(r.sekalid, 0);
    ck_assert_msg(worker > 0, "sekalid should have a worker");

    h_publish(r.b, r.queue, "book", "m-transient", "transient", NULL, "{\"do\": \"transient\"}");
    h_publish(r.b, r.queue, "book", "m-retry", "retry", NULL, "{\"do\": \"retry\"}");
    h_publish(r.b, r.queue, "book", "m-fail", "fail", NULL, "{\"do\": \"fail\"}");
    h_publish(r.b, r.queue, "book", "m-unique", "unique", NULL, "{\"do\": \"unique\"}");
    h_publish(r.b, r.queue, "book", "m-badjson", "badjson", NULL, "{\"do\": not json");
    static const char nul[] = "{\"do\": \"x\"}\0{\"evil\": 1}";
    h_publish_raw(r.b, r.queue, "m-nul", "book", (const struct sk_header[]){
                      { .key = "x-idempotency-key", .text = "nul" } }, 1, nul, sizeof(nul) - 1);
    size_t huge_len = 1024 * 1024;
    char *huge = malloc(huge_len + 1);
    ck_assert_ptr_nonnull(huge);
    memset(huge, 'x', huge_len);
    huge[0] = '{';
    huge[huge_len] = '\0';
    h_publish(r.b, r.queue, "book", "m-huge", "huge", NULL, huge);
    h_publish(r.b, r.queue, "book", "m-ok", "ok", NULL, "{\"amount\": 5}");

    H_WAIT(h_completed(&r) == 3 && h_failed(&r) == 5, 60000,
           "3 jobs should complete and 5 fail: %lld completed, %lld failed", h_completed(&r),
           h_failed(&r));
    /* Transient class 40 and the function's own SKRTY: retried, then done. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_sqlh.bookings WHERE queue = "
                                      "'%s' AND key IN ('transient', 'retry') AND attempt = 2",
                                r.queue), 2);
    ck_assert_int_eq(bookings(&r, NULL), 3);
    /* Everything else fails at once, with SQLSTATE, message and detail. */
    ck_assert_int_eq(failed_with(&r, "fail", "%SQLSTATE SKFAL: card declined (detail: issuer "
                                             "said no)%"), 1);
    ck_assert_int_eq(failed_with(&r, "unique", "%SQLSTATE 23505: duplicate key value%"), 1);
    ck_assert_int_eq(failed_with(&r, "badjson", "%SQLSTATE 22P02: invalid input syntax for "
                                                "type json%"), 1);
    ck_assert_int_eq(failed_with(&r, "nul", "%NUL byte at offset 11%"), 1);
    ck_assert_int_eq(failed_with(&r, "huge", "%SQLSTATE 22P02%"), 1);
    /* A hostile body's error is bounded, not the body echoed back. */
    ck_assert_int_lt(h_pg_count(r.pg, "SELECT length(error) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'huge'", r.queue), 600);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT max(attempts) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND status = 'failed'", r.queue), 1);

    H_WAIT(h_queue_depth(r.b, r.dead) == 5, 20000, "5 dead letters expected, %u in %s",
           h_queue_depth(r.b, r.dead), r.dead);
    int with_sqlstate = 0;
    for (int i = 0; i < 5; i++) {
        amqp_message_t msg;
        ck_assert(h_get(r.b, r.dead, &msg));
        char error[1024];
        h_header_text(&msg, "x-sekali-error", error, sizeof(error));
        with_sqlstate += strstr(error, "SQLSTATE") != NULL;
        amqp_destroy_message(&msg);
    }
    ck_assert_int_eq(with_sqlstate, 4);  /* all but the NUL body, refused before the server */

    ck_assert_msg(!h_process_gone(worker), "worker %ld should have survived the hostile bodies",
                  (long)worker);
    ck_assert_int_eq(h_worker_pid(r.sekalid, 0), worker);
    h_run_stop(&r);
    free(huge);
    free(yaml);
    h_run_close(&r);
}
END_TEST

/* The case: the server's error quotes the body, the handler cuts
 * it at 400 bytes inside an é, and PostgreSQL refused the cut text in
 * sekali.fail() (SQLSTATE 22021). The worker handed the message back, it
 * came straight back, about twice a second, for ever, and the good job
 * behind it (prefetch 1) never ran. Now the host makes the text valid
 * (the cut character becomes U+FFFD): the job fails once, is recorded and
 * dead-lettered, and the next one runs. */
START_TEST(test_error_cut_inside_a_character_is_recorded_and_the_job_behind_it_runs)
{
    struct h_run r;
    h_run_open(&r, "sqlcut");
    char *yaml = config_for(&r, "\"SELECT :body::int\"", "    prefetch: 1\n" FAST_RETRY);
    h_run_start(&r, &(struct h_run_opts){ .handler = SQL_HANDLER, .workers = 1,
                                          .queue_yaml = yaml });
    char body[400];
    memset(body, 'x', 359);
    body[359] = '\0';
    for (int i = 0; i < 20; i++)
        strcat(body, "\xc3\xa9");
    h_publish(r.b, r.queue, "cast", "m-cut", "cut", NULL, body);
    h_publish(r.b, r.queue, "cast", "m-good", "good", NULL, "42");

    H_WAIT(h_completed(&r) == 1 && h_failed(&r) == 1, 30000,
           "the job behind should complete and the cut one fail: %lld completed, %lld failed, "
           "%d hand-backs of an unrecorded failure", h_completed(&r), h_failed(&r),
           h_count_outcomes(r.log, "handed_back", "failure_not_recorded"));
    ck_assert_int_eq(failed_with(&r, "cut", "%SQLSTATE 22P02: invalid input syntax for type "
                                            "integer: \"xxx%"), 1);
    /* The handler's 400 bytes end in the first é's first byte: that one
     * is replaced, the text before it kept. */
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'cut' AND "
                                      "right(error, 2) = U&'x\\FFFD'", r.queue), 1);
    H_WAIT(h_queue_depth(r.b, r.dead) == 1, 20000, "1 dead letter expected, %u in %s",
           h_queue_depth(r.b, r.dead), r.dead);
    amqp_message_t msg;
    ck_assert(h_get(r.b, r.dead, &msg));
    char error[1024];
    h_header_text(&msg, "x-sekali-error", error, sizeof(error));
    ck_assert_msg(sk_text_valid(error, strlen(error)), "x-sekali-error is not UTF-8: %s", error);
    ck_assert_msg(strstr(error, "SQLSTATE 22P02") != NULL, "x-sekali-error: %s", error);
    amqp_destroy_message(&msg);
    h_run_stop(&r);
    ck_assert_int_eq(h_count_outcomes(r.log, "handed_back", "failure_not_recorded"), 0);
    free(yaml);
    h_run_close(&r);
}
END_TEST

START_TEST(test_failing_job_in_a_batch_of_16_leaves_its_batch_mates_committed)
{
    struct h_run r;
    h_run_open(&r, "sqlbatch");
    create_schema(r.pg);
    char sql[512];
    snprintf(sql, sizeof(sql), "INSERT INTO sekali_sqlh.taken VALUES ('%s:taken')", r.queue);
    h_pg_exec(r.pg, sql);
    char *yaml = config_for(&r, "\"" BOOK "\"",
                            "    batch: 16\n    prefetch: 32\n    batch_wait: 1s\n");
    h_run_start(&r, &(struct h_run_opts){ .handler = SQL_HANDLER, .workers = 1,
                                          .queue_yaml = yaml });
    for (int i = 0; i < 16; i++) {
        char id[160], key[32];
        snprintf(id, sizeof(id), "%s-%d", r.queue, i);
        snprintf(key, sizeof(key), "b-%d", i);
        h_publish(r.b, r.queue, "book", id, key, NULL, i == 7 ? "{\"do\": \"unique\"}"
                                                              : "{\"amount\": 1}");
    }
    H_WAIT(h_completed(&r) == 15 && h_failed(&r) == 1, 30000,
           "15 batch-mates should commit and 1 fail: %lld completed, %lld failed",
           h_completed(&r), h_failed(&r));
    h_run_stop(&r);
    ck_assert_int_eq(bookings(&r, NULL), 15);
    ck_assert_int_eq(bookings(&r, "b-7"), 0);
    ck_assert_int_eq(failed_with(&r, "b-7", "%SQLSTATE 23505%"), 1);
    free(yaml);
    h_run_close(&r);
}
END_TEST

/* sekalid's /readyz on port: the HTTP status, and the body in body. */
static int readyz(const struct h_run *r, int port, char *body, size_t size)
{
    char file[1100];
    snprintf(file, sizeof(file), "%s/readyz.txt", r->dir);
    int status = h_curl_status(port, "/readyz", NULL, file, 10);
    char *text = h_read_file(file);
    snprintf(body, size, "%s", text != NULL ? text : "");
    free(text);
    return status;
}

/* Deploy-order mistake: sekalid is up before the function. The worker
 * subscribes to nothing and holds none of the queue's messages (another
 * host's workers could take them), says why (queue, SQLSTATE, position),
 * asks again with backoff; /readyz answers 503 with the reason, `sekalictl
 * status` is unhealthy and says why, doctor fails; once the function
 * exists every job runs, none dead-lettered, and all is well again. */
START_TEST(test_missing_function_holds_jobs_until_it_is_created)
{
    struct h_run r;
    h_run_open(&r, "sqllater");
    create_schema(r.pg);
    char statement[512], *yaml = NULL, top[128];
    snprintf(statement, sizeof(statement),
             "'SELECT sekali_sqlh.\"later_%s\"(:body::jsonb, :idempotency_key)'", r.queue);
    for (char *c = statement; *c != '\0'; c++)
        if (*c == '-')
            *c = '_';
    yaml = config_for(&r, statement, NULL);
    int port = h_metrics_top(top, sizeof(top));
    ck_assert_int_eq(sk_broker_declare(r.b, r.queue, NULL, NULL), SK_OK);
    for (int i = 0; i < 5; i++) {
        char id[160], key[32];
        snprintf(id, sizeof(id), "%s-%d", r.queue, i);
        snprintf(key, sizeof(key), "l-%d", i);
        h_publish(r.b, r.queue, "book", id, key, NULL, "{\"amount\": 2}");
    }
    h_run_start(&r, &(struct h_run_opts){ .handler = SQL_HANDLER, .workers = 1,
                                          .queue_yaml = yaml, .top_yaml = top, .held = true });
    /* Twice: the second is the backoff's retry, not the first refusal. */
    H_WAIT(h_count_lines(r.log, "the handler is not ready, taking no jobs") >= 2, 20000,
           "the worker should refuse jobs twice while the function is missing (see %s)", r.log);
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_HANDLER_NOT_READY, NULL), 1);
    ck_assert_int_ge(h_count_lines(r.log, r.queue), 2);
    ck_assert_int_ge(h_count_lines(r.log, "SQLSTATE 42883"), 2);
    ck_assert_int_ge(h_count_lines(r.log, "at character 8 of the statement"), 1);
    ck_assert_int_eq(h_completed(&r) + h_failed(&r), 0);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    /* Not held by the worker: all five ready in the queue, no consumer. */
    ck_assert_int_eq(h_queue_depth(r.b, r.queue), 5);
    ck_assert_int_eq(h_consumers(r.b, r.queue), 0);

    char body[1200], want[300];
    snprintf(want, sizeof(want), "%s: the handler cannot run (1/1 workers hold no job): "
             "preparing the statement failed: SQLSTATE 42883", r.queue);
    H_WAIT(readyz(&r, port, body, sizeof(body)) == 503 && strstr(body, want) != NULL, 20000,
           "/readyz should answer 503 with \"%s\", answered \"%s\"", want, body);
    char *out = NULL;
    int rc = h_sekalictl(&r, &out, (const char *const[]){ "status", NULL });
    snprintf(want, sizeof(want), "the handler cannot run (1/1 workers hold no job): preparing "
             "the statement failed: SQLSTATE 42883");
    ck_assert_msg(rc == 5 && strstr(out, want) != NULL, "sekalictl status should exit 5 saying "
                  "\"%s\"; exit %d, said:\n%s", want, rc, out);
    free(out);
    rc = h_sekalictl(&r, &out, (const char *const[]){ "doctor", NULL });
    ck_assert_msg(rc != 0 && strstr(out, "queue.handler") != NULL &&
                  strstr(out, "cannot run the handler") != NULL,
                  "sekalictl doctor should fail queue.handler; exit %d, said:\n%s", rc, out);
    free(out);

    char fn[1024];
    snprintf(fn, sizeof(fn),
             "CREATE FUNCTION sekali_sqlh.\"later_%s\"(body jsonb, key text) RETURNS text "
             "LANGUAGE sql AS $$ INSERT INTO sekali_sqlh.bookings (queue, key, amount) "
             "VALUES ('%s', key, (body->>'amount')::bigint) RETURNING 'ok' $$", r.queue,
             r.queue);
    for (char *c = fn + strlen("CREATE FUNCTION sekali_sqlh.\"later_"); *c != '"'; c++)
        if (*c == '-')
            *c = '_';
    h_pg_exec(r.pg, fn);
    H_WAIT(h_completed(&r) == 5, 60000, "the 5 held jobs should run once the function exists: "
           "%lld completed", h_completed(&r));
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_HANDLER_READY, NULL), 1);
    H_WAIT(readyz(&r, port, body, sizeof(body)) == 200, 20000,
           "/readyz should answer 200 again, answered \"%s\"", body);
    rc = h_sekalictl(&r, &out, (const char *const[]){ "status", NULL });
    ck_assert_msg(rc == 0, "sekalictl status should be healthy again; exit %d, said:\n%s", rc,
                  out);
    free(out);
    h_run_stop(&r);
    ck_assert_int_eq(bookings(&r, NULL), 5);
    ck_assert_int_eq(h_failed(&r), 0);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    free(yaml);
    h_run_close(&r);
}
END_TEST

/* :headers is the message's headers as JSON, escaped whatever they hold;
 * the other parameters are the job's fields, all bound as text. */
START_TEST(test_headers_and_job_fields_reach_the_statement_as_text)
{
    struct h_run r;
    h_run_open(&r, "sqlfields");
    char *yaml = config_for(&r, "\"SELECT (:headers::jsonb)->>'x-tenant' || '|' || "
                            "((:headers::jsonb)->>'x-count') || '|' || :job_type || '|' || "
                            ":job_id || '|' || :attempt || '|' || :fence || '|' || :resource_key\"",
                            NULL);
    h_run_start(&r, &(struct h_run_opts){ .handler = SQL_HANDLER, .workers = 1,
                                          .queue_yaml = yaml });
    const struct sk_header headers[] = {
        { .key = "x-idempotency-key", .text = "fields-1" },
        { .key = "x-resource-key", .text = "res-1" },
        { .key = "x-tenant", .text = "ac\"me'\xff" },
        { .key = "x-count", .number = 42 },
    };
    h_publish_raw(r.b, r.queue, "m-fields", "book", headers, 4, "{}", 2);
    H_WAIT(h_completed(&r) == 1, 20000, "the job should complete");
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'fields-1' AND "
                                      "convert_from(result, 'UTF8') = 'ac\"me''' || "
                                      "U&'\\FFFD' || '|42|book|m-fields|1|1|res-1'", r.queue), 1);
    free(yaml);
    h_run_close(&r);
}
END_TEST

/* Runs `sekalid -t -c config` (with SEKALI_HANDLER_DIR=handler_dir if not
 * NULL); returns its exit status, and its output in out. */
static int test_config(const char *config, const char *handler_dir, char *out, size_t size)
{
    char cmd[3 * PATH_MAX], build[PATH_MAX];
    ck_assert_ptr_nonnull(realpath(h_build_dir(), build));
    snprintf(cmd, sizeof(cmd), "%s%s %s/sekalid -t -c %s 2>&1",
             handler_dir != NULL ? "SEKALI_HANDLER_DIR=" : "",
             handler_dir != NULL ? handler_dir : "", build, config);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* "PATH:LINE:COL" of the first `needle` in the file, 1-based. */
static void position_of(const char *path, const char *needle, char *out, size_t size)
{
    char *text = h_read_file(path);
    ck_assert_ptr_nonnull(text);
    char *hit = strstr(text, needle);
    ck_assert_msg(hit != NULL, "%s not in %s", needle, path);
    int line = 1;
    char *line_start = text;
    for (char *c = text; c < hit; c++)
        if (*c == '\n') {
            line++;
            line_start = c + 1;
        }
    snprintf(out, size, "%s:%d:%d", path, line, (int)(hit - line_start) + 1);
    free(text);
}

START_TEST(test_sekalid_t_names_the_position_of_an_unknown_parameter)
{
    h_init();
    char *dir = h_tmpdir("sqlcheck");
    char out[8192], where[1200];
    /* Quoted strings, comments, dollar quotes and casts hold no parameter. */
    char *config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1,
        "    config:\n      statement: \"SELECT ':x', $q$ :y $q$, E'\\\\' :z', \\\"a:b\\\" /* :c "
        "/* :d */ */ -- :e\\n FROM t WHERE k = :idempotency_key::text AND :bogus\"\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 2);
    position_of(config, ":bogus", where, sizeof(where));
    char want[1400];
    snprintf(want, sizeof(want), "%s: statement: unknown parameter :bogus", where);
    ck_assert_msg(strstr(out, want) != NULL, "sekalid -t should say \"%s\", said:\n%s", want, out);
    free(config);

    /* In a literal block, the line and column inside the block. */
    config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1,
        "    config:\n      statement: |\n        SELECT app.f(:body::jsonb)\n"
        "          WHERE :nope IS NULL\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 2);
    position_of(config, ":nope", where, sizeof(where));
    snprintf(want, sizeof(want), "%s: statement: unknown parameter :nope", where);
    ck_assert_msg(strstr(out, want) != NULL, "sekalid -t should say \"%s\", said:\n%s", want, out);
    free(config);

    /* Two statements never prepare, whatever the database holds: said
     * offline, where the second starts; a trailing ';' and comments are
     * one statement still. */
    config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1,
        "    config:\n      statement: \"SELECT app.f(:body::jsonb); /* ; */ DELETE FROM t\"\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 2);
    position_of(config, "DELETE", where, sizeof(where));
    snprintf(want, sizeof(want), "%s: statement: a second statement", where);
    ck_assert_msg(strstr(out, want) != NULL, "sekalid -t should say \"%s\", said:\n%s", want, out);
    free(config);
    config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1,
        "    config:\n      statement: \"SELECT :job_id::text; -- one\\n;\"\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 0);
    free(config);

    config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1, "    config: {table: x}\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "`statement:` is missing") != NULL, "said:\n%s", out);
    free(config);

    config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1,
                            "    mode: external\n    config:\n      statement: \"SELECT 1\"\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "runs in `mode: transactional` only") != NULL, "said:\n%s", out);
    free(config);

    /* A statement that does not prepare against the database now is said,
     * with where and why, but passes: the function may come with a later
     * deploy step, and -t is the unit's ExecStartPre. */
    config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1,
        "    config:\n      statement: \"SELECT sekali_sqlh.not_deployed_yet(:body::jsonb)\"\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "queue sqlcheck: the handler is not ready against the database "
                              "now") != NULL && strstr(out, "SQLSTATE ") != NULL &&
                  strstr(out, "not_deployed_yet") != NULL &&
                  strstr(out, "test is successful") != NULL, "said:\n%s", out);
    free(config);
    config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1,
                            "    config:\n      statement: \"SELECT :job_id::text\"\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "not ready") == NULL && strstr(out, "not checked") == NULL,
                  "a statement that prepares is said nothing of:\n%s", out);
    free(config);

    config = h_write_config(dir, "sqlcheck", SQL_HANDLER, 1,
                            "    config:\n      statement: \"SELECT $1\"\n");
    ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "positional parameter $1") != NULL, "said:\n%s", out);
    free(config);
    free(dir);
}
END_TEST

/* `handler: sql` is sekali's own handler directory (here the build's). */
START_TEST(test_bare_handler_name_resolves_to_the_handler_directory)
{
    h_init();
    char *dir = h_tmpdir("sqlbare");
    char out[8192], build[PATH_MAX], handlers[PATH_MAX + 16], path[PATH_MAX + 32];
    ck_assert_ptr_nonnull(realpath(h_build_dir(), build));
    snprintf(handlers, sizeof(handlers), "%s/handlers", build);
    char *config = h_write_config(dir, "sqlbare", SQL_HANDLER, 1,
                                  "    config:\n      statement: \"" BOOK "\"\n");
    snprintf(path, sizeof(path), "%s/%s", h_build_dir(), SQL_HANDLER);
    h_config_replace(config, path, "sql");
    ck_assert_int_eq(h_count_lines(config, "handler: sql"), 1);
    ck_assert_msg(test_config(config, handlers, out, sizeof(out)) == 0, "said:\n%s", out);
    /* Elsewhere there is no sql.so: the bare name is not a relative path. */
    ck_assert_int_eq(test_config(config, dir, out, sizeof(out)), 2);
    snprintf(path, sizeof(path), "%s/sql.so", dir);
    ck_assert_msg(strstr(out, path) != NULL, "should name %s, said:\n%s", path, out);
    free(config);
    free(dir);
}
END_TEST

/* Rows are read one at a time, and a statement returning more than
 * max_rows fails its job with a reason that says so (its dead letter
 * too), its effect rolled back; a huge result is cut short, not loaded.
 * At max_rows the job runs. `sekalid -t` refuses a max_rows out of range. */
START_TEST(test_a_statement_returning_more_than_max_rows_fails_its_job_and_writes_nothing)
{
    struct h_run r;
    h_run_open(&r, "sqlrows");
    create_schema(r.pg);
    char *yaml = config_for(&r, "\"WITH b AS (INSERT INTO sekali_sqlh.bookings VALUES (:queue, "
                            ":idempotency_key, 0, 1, 0) RETURNING 1) SELECT g FROM b, "
                            "generate_series(1, :body::int) g\"\n      max_rows: 100", NULL);
    h_run_start(&r, &(struct h_run_opts){ .handler = SQL_HANDLER, .workers = 1,
                                          .queue_yaml = yaml });
    h_publish(r.b, r.queue, "book", "m-100", "rows-100", NULL, "100");
    h_publish(r.b, r.queue, "book", "m-101", "rows-101", NULL, "101");
    h_publish(r.b, r.queue, "book", "m-huge", "rows-huge", NULL, "2000000");
    H_WAIT(h_completed(&r) == 1 && h_failed(&r) == 2, 60000,
           "1 job should complete and 2 fail: %lld completed, %lld failed", h_completed(&r),
           h_failed(&r));
    h_run_stop(&r);
    ck_assert_int_eq(bookings(&r, "rows-100"), 1);
    ck_assert_int_eq(bookings(&r, "rows-101"), 0);
    ck_assert_int_eq(bookings(&r, "rows-huge"), 0);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'rows-100' AND "
                                      "convert_from(result, 'UTF8') = '1'", r.queue), 1);
    ck_assert_int_eq(failed_with(&r, "rows-101", "%more than 100 rows (max_rows)%"), 1);
    ck_assert_int_eq(failed_with(&r, "rows-huge", "%more than 100 rows (max_rows)%"), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.dead_letters WHERE queue = "
                                      "'%s' AND error LIKE '%%more than 100 rows (max_rows)%%'",
                                r.queue), 2);
    free(yaml);

    char *dir = h_tmpdir("sqlrowscheck"), out[8192];
    static const char *const bad[] = { "0", "-1", "ten", "100000001" };
    for (size_t i = 0; i < SK_ARRAY_LEN(bad); i++) {
        char queue_yaml[256];
        snprintf(queue_yaml, sizeof(queue_yaml), "    config:\n      statement: \"SELECT 1\"\n"
                 "      max_rows: %s\n", bad[i]);
        char *config = h_write_config(dir, "sqlrowscheck", SQL_HANDLER, 1, queue_yaml);
        ck_assert_int_eq(test_config(config, NULL, out, sizeof(out)), 2);
        ck_assert_msg(strstr(out, "`max_rows:` must be a whole number from 1 to 100000000") !=
                      NULL, "max_rows %s: said:\n%s", bad[i], out);
        free(config);
    }
    free(dir);
    h_run_close(&r);
}
END_TEST

/* The n-th (from 0) ```lang block of the file at path, or NULL; the
 * caller frees it. */
static char *doc_block(const char *path, const char *lang, int n)
{
    char *text = h_read_file(path), fence[32];
    ck_assert_msg(text != NULL, "%s not found: run from the repository root", path);
    snprintf(fence, sizeof(fence), "```%s\n", lang);
    char *start = NULL, *end = text;
    for (int i = 0; i <= n && end != NULL; i++) {
        start = strstr(end, fence);
        end = start != NULL ? strstr(start + strlen(fence), "\n```") : NULL;
        if (end != NULL && i < n)
            end += 4;
    }
    char *block = end != NULL ? strndup(start + strlen(fence),
                                        (size_t)(end + 1 - start) - strlen(fence)) : NULL;
    free(text);
    return block;
}

/* s with every `from` replaced by `to`; s is freed. */
static char *replaced(char *s, const char *from, const char *to)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    ck_assert_ptr_nonnull(f);
    const char *p = s;
    for (const char *hit; (hit = strstr(p, from)) != NULL; p = hit + strlen(from)) {
        fwrite(p, 1, (size_t)(hit - p), f);
        fputs(to, f);
    }
    fputs(p, f);
    fclose(f);
    free(s);
    return out;
}

/* docs/handlers.md's SQL handler example, run as written (its schema
 * `app` and queue `invoices` renamed for this run): the function and tables,
 * the statement of its YAML, and the application's transaction enqueueing
 * an order's job. The invoice is made once, with the function's result. */
START_TEST(test_the_sql_example_of_docs_handlers_md_runs_as_written)
{
    struct h_run r;
    h_run_open(&r, "sqldoc");
    char schema[64], app_dot[80], schema_line[96];
    snprintf(schema, sizeof(schema), "sk_doc_%ld", (long)getpid());
    snprintf(app_dot, sizeof(app_dot), "%s.", schema);
    snprintf(schema_line, sizeof(schema_line), "EXISTS %s;", schema);
    char drop[128];
    snprintf(drop, sizeof(drop), "DROP SCHEMA IF EXISTS %s CASCADE", schema);
    h_pg_exec(r.pg, drop);

    char *ddl = doc_block("docs/handlers.md", "sql", 0);
    ck_assert_msg(ddl != NULL, "docs/handlers.md has no ```sql block");
    ddl = replaced(replaced(ddl, "app.", app_dot), "EXISTS app;", schema_line);
    h_pg_exec(r.pg, ddl);
    char *yaml = doc_block("docs/handlers.md", "yaml", 0);
    ck_assert_msg(yaml != NULL, "docs/handlers.md has no ```yaml block");
    yaml = replaced(yaml, "app.", app_dot);
    char *statement = strstr(yaml, "statement: ");
    ck_assert_msg(statement != NULL, "the yaml block has no statement:\n%s", yaml);
    *strchr(statement, '\n') = '\0';
    char queue_yaml[1024];
    snprintf(queue_yaml, sizeof(queue_yaml), "    config:\n      %s\n", statement);
    h_run_start(&r, &(struct h_run_opts){ .handler = SQL_HANDLER, .workers = 1,
                                          .queue_yaml = queue_yaml, .top_yaml = H_RELAY });

    char *sql = doc_block("docs/handlers.md", "sql", 1);
    ck_assert_msg(sql != NULL, "docs/handlers.md has no second ```sql block");
    char quoted[160];
    snprintf(quoted, sizeof(quoted), "'%s'", r.queue);
    ck_assert_msg(strstr(sql, "'invoices'") != NULL, "the block enqueues to no 'invoices'");
    sql = replaced(replaced(sql, "app.", app_dot), "'invoices'", quoted);
    h_pg_exec(r.pg, sql);
    H_WAIT(h_completed(&r) == 1, 30000, "the example's job should complete");
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM %s.invoices WHERE order_id = 'A-7' "
                                      "AND amount_cents = 1250 AND job_key = 'invoice-A-7'",
                                schema), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'invoice-A-7' AND "
                                      "convert_from(result, 'UTF8') LIKE 'invoice %%'", r.queue),
                     1);
    h_pg_exec(r.pg, drop);
    free(sql);
    free(yaml);
    free(ddl);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_sekalid_t_names_the_position_of_an_unknown_parameter,
        test_bare_handler_name_resolves_to_the_handler_directory,
        test_function_runs_once_per_key_when_each_job_comes_three_times,
        test_sqlstates_decide_retry_or_dead_letter_and_hostile_bodies_leave_the_worker_alive,
        test_failing_job_in_a_batch_of_16_leaves_its_batch_mates_committed,
        test_missing_function_holds_jobs_until_it_is_created,
        test_headers_and_job_fields_reach_the_statement_as_text,
        test_error_cut_inside_a_character_is_recorded_and_the_job_behind_it_runs,
        test_a_statement_returning_more_than_max_rows_fails_its_job_and_writes_nothing,
        test_the_sql_example_of_docs_handlers_md_runs_as_written,
        NULL,
    };
    return h_run_suite(h_suite("sql_handler", 120, tests));
}
