/* check_log.c - structured log lines: fields, escaping, journal detection. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "log.h"
#include "suite.h"

/* Points stderr at a fresh temp file; returns its path (static buffer). */
static const char *capture_stderr(void)
{
    static char path[] = "/tmp/check_log.XXXXXX";
    strcpy(path, "/tmp/check_log.XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
    close(fd);
    return path;
}

static char *slurp(const char *path)
{
    static char buf[8192];
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(path);
    return buf;
}

START_TEST(test_json_job_line_carries_every_field)
{
    const char *path = capture_stderr();
    unsetenv("JOURNAL_STREAM");
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_JSON, "worker");
    struct sk_log_job job = {
        .queue = "invoices", .job_id = "m-1", .idempotency_key = "order \"7\"",
        .resource_key = "account-7", .lock_owner = "ab12", .fence = 3, .delivery_attempt = 2,
        .trace_id = "4bf92f3577b34da6a3ce929d0e0e4736", .span_id = "00f067aa0ba902b7",
    };
    sk_log_job(SK_LOG_INFO, &job, "completed");
    const char *line = slurp(path);
    static const char *const expected[] = {
        "\"level\":\"info\"", "\"role\":\"worker\"", "\"msg\":\"completed\"",
        "\"queue\":\"invoices\"", "\"job_id\":\"m-1\"",
        "\"idempotency_key\":\"order \\\"7\\\"\"", "\"resource_key\":\"account-7\"",
        "\"lock_owner\":\"ab12\"", "\"fence\":3", "\"delivery_attempt\":2",
        "\"trace_id\":\"4bf92f3577b34da6a3ce929d0e0e4736\"", "\"span_id\":\"00f067aa0ba902b7\"",
    };
    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++)
        ck_assert_msg(strstr(line, expected[i]) != NULL, "missing %s in %s", expected[i], line);
    ck_assert_int_eq(line[0], '{');
    ck_assert_int_eq(line[strlen(line) - 2], '}');
    ck_assert_int_eq(line[strlen(line) - 1], '\n');
}
END_TEST

/* The event name and server are fields of their own, in both formats, so
 * that a test or a script finds the line without reading its prose; a
 * message that quotes a field cannot pass for one. */
START_TEST(test_an_event_line_carries_its_name_and_server_as_fields)
{
    const char *path = capture_stderr();
    unsetenv("JOURNAL_STREAM");
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_JSON, "worker");
    struct sk_log_job job = { .queue = "q", .idempotency_key = "k-1" };
    sk_log_event(SK_LOG_WARN, SK_EVENT_OUTAGE_BEGIN, SK_SERVER_POSTGRES, &job,
                 "gone: \"event\":\"outage_end\" %d", 7);
    sk_log_event(SK_LOG_INFO, SK_EVENT_READY, NULL, NULL, "%s", "ready");
    const char *json = slurp(path);
    static const char *const expected[] = {
        "\"msg\":\"gone: \\\"event\\\":\\\"outage_end\\\" 7\"",
        ",\"event\":\"outage_begin\",\"server\":\"postgres\",\"queue\":\"q\"",
        "\"idempotency_key\":\"k-1\"", "\"msg\":\"ready\",\"event\":\"ready\"}",
    };
    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++)
        ck_assert_msg(strstr(json, expected[i]) != NULL, "missing %s in %s", expected[i], json);
    ck_assert_msg(strstr(json, ",\"event\":\"outage_end\"") == NULL, "%s", json);
    ck_assert_msg(strstr(json, "\"ready\",\"server\"") == NULL, "no server: %s", json);

    path = capture_stderr();
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_TEXT, "worker");
    sk_log_event(SK_LOG_INFO, SK_EVENT_OUTAGE_END, SK_SERVER_REDIS, NULL, "back");
    const char *text = slurp(path);
    ck_assert_msg(strstr(text, "] \"back\" event=outage_end server=redis\n") != NULL, "%s", text);
}
END_TEST

/* An event's own fields come after the job's, escaped like them; an empty
 * or NULL value is left out, so a test can tell "no such field" apart. */
START_TEST(test_an_event_line_carries_its_own_fields_after_the_jobs)
{
    const char *path = capture_stderr();
    unsetenv("JOURNAL_STREAM");
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_JSON, "supervisor");
    const struct sk_log_field fields[] = {
        { "signal", "9" }, { "job_caused", NULL }, { "restart_ms", "" }, { "why", "a \"b\"" },
    };
    sk_log_event_fields(SK_LOG_WARN, SK_EVENT_WORKER_DIED, NULL,
                        &(struct sk_log_job){ .queue = "q" }, fields, 4, "died");
    const char *json = slurp(path);
    ck_assert_msg(strstr(json, ",\"event\":\"worker_died\",\"queue\":\"q\",\"signal\":\"9\","
                               "\"why\":\"a \\\"b\\\"\"}") != NULL, "%s", json);
    ck_assert_msg(strstr(json, "job_caused") == NULL && strstr(json, "restart_ms") == NULL,
                  "%s", json);

    path = capture_stderr();
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_TEXT, "supervisor");
    sk_log_event_fields(SK_LOG_WARN, SK_EVENT_WORKER_DIED, NULL, NULL, fields, 1, "died");
    const char *text = slurp(path);
    ck_assert_msg(strstr(text, "] \"died\" event=worker_died signal=9\n") != NULL, "%s", text);
}
END_TEST

START_TEST(test_lines_below_the_level_are_dropped)
{
    const char *path = capture_stderr();
    sk_log_init(SK_LOG_WARN, SK_LOG_FORMAT_TEXT, "worker");
    sk_log_info("quiet");
    sk_log_warn("loud");
    const char *text = slurp(path);
    ck_assert_ptr_null(strstr(text, "quiet"));
    ck_assert_ptr_nonnull(strstr(text, "loud"));
}
END_TEST

START_TEST(test_journal_stream_is_recognised_only_for_our_stderr)
{
    const char *path = capture_stderr();
    struct stat st;
    ck_assert_int_eq(fstat(STDERR_FILENO, &st), 0);
    char stream[64];
    snprintf(stream, sizeof(stream), "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", stream, 1);
    ck_assert(sk_log_stderr_is_journal());
    /* Inherited by a process whose stderr was redirected elsewhere. */
    snprintf(stream, sizeof(stream), "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + 1);
    setenv("JOURNAL_STREAM", stream, 1);
    ck_assert(!sk_log_stderr_is_journal());
    unsetenv("JOURNAL_STREAM");
    ck_assert(!sk_log_stderr_is_journal());
    unlink(path);
}
END_TEST

/* A key is the producer's: a newline in it must not start a line of its
 * own that a reader (or a log shipper) would take for sekali's. */
START_TEST(test_text_line_escapes_control_characters_in_keys_and_message)
{
    const char *path = capture_stderr();
    unsetenv("JOURNAL_STREAM");
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_TEXT, "worker");
    struct sk_log_job job = {
        .queue = "q", .job_id = "m-1",
        .idempotency_key = "k\n2026-01-01T00:00:00.000Z error worker[1] forged\r\x1b[2J",
        .resource_key = "a b=c",
    };
    sk_log_job(SK_LOG_INFO, &job, "claimed %s", "x\ny\tz");
    const char *text = slurp(path);
    ck_assert_msg(strchr(text, '\n') == text + strlen(text) - 1, "more than one line: %s", text);
    ck_assert_ptr_null(strchr(text, '\r'));
    ck_assert_ptr_null(strchr(text, '\x1b'));
    ck_assert_msg(strstr(text, "claimed x\\ny\\tz") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "idempotency_key=\"k\\n2026-01-01T00:00:00.000Z error "
                               "worker[1] forged\\r\\x1b[2J\"") != NULL, "%s", text);
    /* A space or '=' in a value would forge a field: such values are quoted. */
    ck_assert_msg(strstr(text, "resource_key=\"a b=c\"") != NULL, "%s", text);
    ck_assert_msg(strstr(text, " job_id=m-1") != NULL, "%s", text);
}
END_TEST

/* A message echoes text from elsewhere (a key, an error): unquoted, a
 * message like `failed queue=other job_id=x` would add fields to the line. */
START_TEST(test_text_line_quotes_the_message)
{
    const char *path = capture_stderr();
    unsetenv("JOURNAL_STREAM");
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_TEXT, "worker");
    sk_log_info("failed: %s", "boom queue=other job_id=forged \"x");
    const char *text = slurp(path);
    ck_assert_msg(strstr(text, "] \"failed: boom queue=other job_id=forged \\\"x\"\n") != NULL,
                  "%s", text);
}
END_TEST

/* JSON text is copied in runs between the characters that need escaping:
 * each escape lands where its character was, and the message of a bare
 * "%s" line (taken without vsnprintf) is escaped like any other. */
START_TEST(test_json_line_escapes_each_special_character_in_place)
{
    const char *path = capture_stderr();
    unsetenv("JOURNAL_STREAM");
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_JSON, "worker");
    struct sk_log_job job = { .idempotency_key = "a\"b\\c\x01" "d\"", .fence = 1234567890123 };
    sk_log_job(SK_LOG_INFO, &job, "%s", "done\nnext");
    const char *line = slurp(path);
    ck_assert_msg(strstr(line, "\"msg\":\"done\\u000anext\"") != NULL, "%s", line);
    ck_assert_msg(strstr(line, "\"idempotency_key\":\"a\\\"b\\\\c\\u0001d\\\"\"") != NULL,
                  "%s", line);
    ck_assert_msg(strstr(line, "\"fence\":1234567890123") != NULL, "%s", line);
    /* The stamp is UTC to the millisecond, of this very second or the last. */
    int year, mon, day, hour, min, sec, ms;
    char z;
    ck_assert_int_eq(sscanf(line, "{\"ts\":\"%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &year, &mon, &day,
                            &hour, &min, &sec, &ms, &z), 8);
    ck_assert_int_eq(z, 'Z');
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    ck_assert_int_eq(year, tm.tm_year + 1900);
    ck_assert_int_eq(day, tm.tm_mday);
}
END_TEST

/* The pid is kept, not asked for per line: a forked child must still show
 * its own, even before it calls sk_log_init(). */
START_TEST(test_a_forked_child_logs_its_own_pid)
{
    const char *path = capture_stderr();
    unsetenv("JOURNAL_STREAM");
    sk_log_init(SK_LOG_INFO, SK_LOG_FORMAT_JSON, "supervisor");
    sk_log_info("parent");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        sk_log_info("child");
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    const char *text = slurp(path);
    char expected[64];
    snprintf(expected, sizeof(expected), "\"pid\":%d,\"msg\":\"child\"", (int)pid);
    ck_assert_msg(strstr(text, expected) != NULL, "no %s in %s", expected, text);
    snprintf(expected, sizeof(expected), "\"pid\":%d,\"msg\":\"parent\"", (int)getpid());
    ck_assert_msg(strstr(text, expected) != NULL, "no %s in %s", expected, text);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_json_job_line_carries_every_field,
        test_an_event_line_carries_its_name_and_server_as_fields,
        test_an_event_line_carries_its_own_fields_after_the_jobs,
        test_lines_below_the_level_are_dropped,
        test_journal_stream_is_recognised_only_for_our_stderr,
        test_text_line_escapes_control_characters_in_keys_and_message,
        test_text_line_quotes_the_message,
        test_json_line_escapes_each_special_character_in_place,
        test_a_forked_child_logs_its_own_pid,
        NULL,
    };
    return h_run_suite(h_suite("log", 0, tests));
}
