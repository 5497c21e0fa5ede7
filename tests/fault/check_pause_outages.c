/* check_pause_outages.c - a pause holds through the servers' outages.
 *
 * A paused worker runs no job, so nothing of the job pipeline reconnects
 * its links for it: a broker connection that closes must come back still
 * paused (the new consumer is cancelled before it takes a delivery), and
 * a PostgreSQL restart must not leave it deaf to the resume. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void ctl_ok(struct h_run *r, const char *command)
{
    char *out = NULL;
    int rc = h_sekalictl(r, &out, (const char *const[]){ command, r->queue, NULL });
    ck_assert_msg(rc == 0, "sekalictl %s exited %d: %s", command, rc, out);
    free(out);
}

static void publish_jobs(struct h_run *r, int n)
{
    for (int i = 0; i < n; i++) {
        char id[64];
        snprintf(id, sizeof(id), "k%d", i);
        h_publish(r->b, r->queue, "test", id, id, NULL, "ok");
    }
}

/* The lines of the log that are not a JSON object: 0 unless something
 * (libpq's default notice printer, for one) wrote to stderr raw. */
static int raw_lines(const char *log)
{
    char *text = h_read_file(log);
    int raw = 0;
    for (char *line = text; line != NULL && *line != '\0';) {
        char *end = strchr(line, '\n');
        if (*line != '{' && line != end)
            raw++;
        line = end != NULL ? end + 1 : NULL;
    }
    free(text);
    return raw;
}

START_TEST(test_a_paused_queue_stays_paused_when_its_broker_connections_close)
{
    struct h_run r = { 0 };
    h_servers("start");
    h_run_open(&r, "pause_amqp");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2 });
    ctl_ok(&r, "pause");
    publish_jobs(&r, 10);
    sk_broker_close(r.b);
    ck_assert_int_eq(system("\"$SEKALI_RABBITMQCTL\" close_all_connections test "
                            ">/dev/null 2>&1"), 0);
    r.b = h_broker();
    /* Each worker lost its connection, subscribed anew, read the row and
     * cancelled the new consumer: a second `paused` each. */
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_OUTAGE_BEGIN, SK_SERVER_RABBITMQ) >= 2,
           30000, "both workers should lose their connections");
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_PAUSED, NULL) == 4, 30000,
           "both workers should pause again after reconnecting: %d paused events",
           h_count_events(r.log, "worker", SK_EVENT_PAUSED, NULL));
    ck_assert_uint_eq(h_consumers(r.b, r.queue), 0);
    ck_assert_uint_eq(h_queue_depth(r.b, r.queue), 10);
    ck_assert_int_eq(h_effects(&r, NULL), 0);

    ctl_ok(&r, "resume");
    H_WAIT(h_effects(&r, NULL) == 10, 30000, "after resume 10 jobs should run, %lld did",
           h_effects(&r, NULL));
    h_run_stop(&r);
    h_expect_once(&r, 10, 0);
    h_run_close(&r);
}
END_TEST

START_TEST(test_a_queue_paused_across_a_postgresql_restart_still_resumes)
{
    struct h_run r = { 0 };
    h_servers("start");
    h_run_open(&r, "pause_pg");
    h_run_start(&r, &(struct h_run_opts){ .workers = 2 });
    ctl_ok(&r, "pause");
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_PAUSED, NULL) == 2, 10000,
           "both workers should pause");
    PQfinish(r.pg);
    h_servers("restart-postgres");
    r.pg = h_pg();
    publish_jobs(&r, 10);
    /* The workers' LISTEN went with their old sessions: the resume is
     * found by their own reconnect and poll. */
    ctl_ok(&r, "resume");
    H_WAIT(h_effects(&r, NULL) == 10, 30000, "after resume 10 jobs should run, %lld did",
           h_effects(&r, NULL));
    /* One worker can run all ten while the other is still in its
     * reconnect backoff: the second resume is awaited, not assumed. */
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_RESUMED, NULL) == 2, 30000,
           "both workers should resume: %d resumed events",
           h_count_events(r.log, "worker", SK_EVENT_RESUMED, NULL));
    h_run_stop(&r);
    h_expect_once(&r, 10, 0);
    /* The shutting-down server told each idle session why it closed it:
     * that reached the log as a JSON line, not raw text. */
    ck_assert_int_ge(h_count_lines(r.log, "\"msg\":\"PostgreSQL FATAL: terminating connection"),
                     1);
    ck_assert_int_eq(raw_lines(r.log), 0);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_a_paused_queue_stays_paused_when_its_broker_connections_close,
        test_a_queue_paused_across_a_postgresql_restart_still_resumes,
        NULL,
    };
    return h_run_suite(h_suite("pause_outages", 240, tests));
}
