/* check_metrics.c - the Prometheus endpoint, scraped with curl from a real
 * sekalid on real servers: after a known workload every counter must equal
 * what happened, promtool must accept the text as it is, the supervisor
 * must count the workers it restarts, a port that is taken must stop
 * sekalid with exit 2 before any worker starts, and sekalid(8)'s METRICS
 * must list exactly the families a scrape shows. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

struct run {
    struct h_run h;
    char         scrape[1024];  /* the last scrape's file */
    int          port;          /* of the metrics endpoint */
};

/* A listening socket on a loopback port the kernel chose; *port gets it. */
static int listen_anywhere(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 1) == 0 &&
                  getsockname(fd, (struct sockaddr *)&a, &len) == 0, "%s", strerror(errno));
    *port = ntohs(a.sin_port);
    return fd;
}

/* extra: more top-level YAML (sections other than metrics and janitor), or NULL. */
static void start_with(struct run *r, const char *name, int workers, const char *extra)
{
    h_run_open(&r->h, name);
    /* Free now; the small race with another process taking it would fail
     * this test loudly (exit 2), never quietly. */
    close(listen_anywhere(&r->port));
    char top[512];
    /* No janitor: the tests count the supervisor's children. */
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 0s\n%s",
             r->port, extra != NULL ? extra : "");
    snprintf(r->scrape, sizeof(r->scrape), "%s/metrics.txt", r->h.dir);
    h_run_start(&r->h, &(struct h_run_opts){ .workers = workers, .queue_yaml = H_FAST_RETRIES,
                                             .top_yaml = top });
}

static void start(struct run *r, const char *name, int workers)
{
    start_with(r, name, workers, NULL);
}

/* GET path; returns the HTTP status, 0 if none. The body goes to
 * dir/response.txt, leaving the last scrape in place to read. */
static int get(struct run *r, const char *path)
{
    char file[1100];
    snprintf(file, sizeof(file), "%s/response.txt", r->h.dir);
    return h_curl_status(r->port, path, NULL, file, 10);
}

/* Scrapes /metrics as Prometheus would (curl -f: an HTTP error fails) and
 * returns the text; the caller frees it. */
static char *scrape(struct run *r)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "curl -sf --max-time 10 -o %s http://127.0.0.1:%d/metrics",
             r->scrape, r->port);
    int rc = system(cmd);
    ck_assert_msg(rc == 0, "curl %s: status 0x%x", cmd, rc);
    char *text = h_read_file(r->scrape);
    ck_assert_ptr_nonnull(text);
    return text;
}

/* The value of one series (name and labels, as rendered), or -1 if absent. */
static double value(const char *text, const char *series)
{
    size_t len = strlen(series);
    for (const char *p = text; (p = strstr(p, series)) != NULL; p += len)
        if ((p == text || p[-1] == '\n') && p[len] == ' ')
            return strtod(p + len + 1, NULL);
    return -1;
}

/* One (queue, job type) series of a counter: name{queue="...",job_type="..."}. */
static double typed(const struct run *r, const char *text, const char *name,
                    const char *job_type, const char *more_labels)
{
    char series[512];
    snprintf(series, sizeof(series), "%s{queue=\"%s\",job_type=\"%s\"%s}", name, r->h.queue,
             job_type, more_labels != NULL ? more_labels : "");
    return value(text, series);
}

static double of_queue(const char *text, const char *name, const char *queue)
{
    char series[512];
    snprintf(series, sizeof(series), "%s{queue=\"%s\"}", name, queue);
    return value(text, series);
}

static double per_queue(const struct run *r, const char *text, const char *name)
{
    return of_queue(text, name, r->h.queue);
}

static double dead(const struct run *r, const char *text, const char *job_type,
                   const char *reason)
{
    char labels[64];
    snprintf(labels, sizeof(labels), ",reason=\"%s\"", reason);
    return typed(r, text, "sekali_dead_letters_total", job_type, labels);
}

/* promtool must accept the scrape with nothing to say, lint included; and,
 * which promtool does not check, no series may appear twice. */
static void expect_valid_exposition(struct run *r, const char *text)
{
    char cmd[2048], out[1024];
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", r->scrape);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    ck_assert_msg(status == 0 && n == 0, "promtool check metrics (exit 0x%x) on %s: %s", status,
                  r->scrape, out);

    char *copy = strdup(text);
    ck_assert_ptr_nonnull(copy);
    size_t lines = 0;
    char **series = calloc(strlen(text) / 2 + 1, sizeof(*series));
    ck_assert_ptr_nonnull(series);
    for (char *line = strtok(copy, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        *strrchr(line, ' ') = '\0';
        for (size_t i = 0; i < lines; i++)
            ck_assert_msg(strcmp(series[i], line) != 0, "series %s appears twice", line);
        series[lines++] = line;
    }
    ck_assert_uint_gt(lines, 0);
    free(series);
    free(copy);
}

/* Ends a test on its last scrape: valid as a whole, then a clean stop. */
static void finish(struct run *r, char *last_scrape)
{
    expect_valid_exposition(r, last_scrape);
    free(last_scrape);
    h_stop_sekalid(r->h.sekalid, r->h.dir);
    h_run_close(&r->h);
}

/* The workload: 20 unique jobs, then 5 copies of 5 of them, 2 jobs that ask
 * for a retry once, 1 that fails (of another type) and 2 messages without a
 * message_id. The copies go out only once the originals completed, so each
 * is a duplicate at its claim and none races its original for the lock. */
START_TEST(test_counters_equal_what_happened)
{
    struct run r;
    start(&r, "metrics", 2);
    char id[64];
    for (int i = 0; i < 20; i++) {
        snprintf(id, sizeof(id), "job-%d", i);
        h_publish(r.h.b, r.h.queue, "test", id, NULL, NULL, "ok");
    }
    h_publish(r.h.b, r.h.queue, "test", "retry-1", NULL, NULL, "retry");
    h_publish(r.h.b, r.h.queue, "test", "retry-2", NULL, NULL, "retry");
    h_publish(r.h.b, r.h.queue, "audit", "fail-1", NULL, NULL, "fail");
    h_publish_raw(r.h.b, r.h.queue, NULL, "test", NULL, 0, "{}", 2);
    h_publish_raw(r.h.b, r.h.queue, NULL, "test", NULL, 0, "{}", 2);
    H_WAIT(h_effects(&r.h, NULL) == 22, 30000, "20 jobs and 2 retried ones should commit");
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "copy-%d", i);
        char key[64];
        snprintf(key, sizeof(key), "job-%d", i);
        h_publish(r.h.b, r.h.queue, "test", id, key, NULL, "ok");
    }
    H_WAIT(h_duplicates(&r.h) == 5, 30000,
           "the 5 copies should be suppressed as duplicates");
    H_WAIT(h_queue_depth(r.h.b, r.h.dead) == 3, 30000, "expected 3 dead letters, have %u",
           h_queue_depth(r.h.b, r.h.dead));

    /* A counter moves just after the fact it counts (the commit, the
     * confirm), so wait until the last ones caught up, then compare all. */
    char *text = NULL;
    H_WAIT((free(text), text = scrape(&r),
            typed(&r, text, "sekali_deliveries_total", "test", NULL) == 29 &&
            typed(&r, text, "sekali_completions_total", "test", NULL) == 22 &&
            dead(&r, text, "", "malformed") == 2 && dead(&r, text, "audit", "failed") == 1),
           20000, "the counters should reach the workload's totals; last scrape in %s",
           r.scrape);
    ck_assert_int_eq(h_queue_depth(r.h.b, r.h.queue), 0);

    static const struct { const char *type, *name; double want; } expect[] = {
        { "test", "sekali_deliveries_total", 29 },      /* 20 + 5 copies + 2 x 2 attempts */
        { "test", "sekali_redeliveries_total", 2 },     /* the retries' second attempts */
        { "test", "sekali_completions_total", 22 },
        { "test", "sekali_duplicates_total", 5 },
        { "test", "sekali_retries_total", 2 },
        { "test", "sekali_lock_busy_total", 0 },
        { "test", "sekali_locks_lost_total", 0 },
        { "test", "sekali_fenced_out_total", 0 },
        { "test", "sekali_occ_conflicts_total", 0 },
        { "test", "sekali_batch_deferred_total", 0 },  /* no handler is slow */
        { "test", "sekali_job_duration_seconds_count", 22 },
        { "audit", "sekali_deliveries_total", 1 },
        { "audit", "sekali_executions_total", 1 },
        { "audit", "sekali_completions_total", 0 },
        { "audit", "sekali_retries_total", 0 },
        { "audit", "sekali_job_duration_seconds_count", 0 },
        { "", "sekali_deliveries_total", 2 },          /* malformed: their type is not trusted */
        { "", "sekali_executions_total", 0 },
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(expect); i++) {
        double got = typed(&r, text, expect[i].name, expect[i].type, NULL);
        ck_assert_msg(got == expect[i].want, "%s{job_type=\"%s\"} should be %g, is %g (see %s)",
                      expect[i].name, expect[i].type, expect[i].want, got, r.scrape);
    }
    /* 20 + 2 x 2 handler calls, and in a batch (sekali's default) the runs
     * that a failing batch-mate rolled back, unseen, and that ran again: at
     * most batch - 1 for each of the 3 failing deliveries (the two retries'
     * first attempts and the failure), none at batch 1. */
    int batch = h_test_batch() > 0 ? h_test_batch() : 4;  /* 4: the harness's window */
    double reruns = typed(&r, text, "sekali_batch_reruns_total", "test", NULL);
    ck_assert_msg(reruns >= 0 && reruns <= 3 * (batch - 1), "%g batch reruns at batch %d (see %s)",
                  reruns, batch, r.scrape);
    ck_assert_msg(typed(&r, text, "sekali_executions_total", "test", NULL) == 24 + reruns,
                  "sekali_executions_total{job_type=\"test\"} should be 24 + %g reruns (see %s)",
                  reruns, r.scrape);
    ck_assert(dead(&r, text, "test", "malformed") == 0);
    ck_assert(dead(&r, text, "test", "failed") == 0);
    ck_assert(dead(&r, text, "test", "retries_exhausted") == 0);
    ck_assert(dead(&r, text, "audit", "failed") == 1);
    ck_assert(dead(&r, text, "audit", "retries_exhausted") == 0);
    ck_assert(dead(&r, text, "", "malformed") == 2);
    ck_assert(typed(&r, text, "sekali_job_duration_seconds_bucket", "test",
                    ",le=\"+Inf\"") == 22);
    ck_assert(typed(&r, text, "sekali_job_duration_seconds_sum", "test", NULL) > 0);
    /* Every key ran alone (the copies came after their originals were
     * done), so at batch 1 no lock was ever refused: not a moment of
     * waiting counted. In a batch a retried job's lock is held until its
     * batch-mates are done, and its copy, back after 10 ms, may wait for it
     * on the other worker, briefly: never as long as busy_wait (lock_busy
     * is 0 above). */
    double waited = typed(&r, text, "sekali_lock_wait_seconds_total", "test", NULL);
    ck_assert_msg(h_test_batch() == 1 ? waited == 0 : waited >= 0 && waited < 0.5,
                  "%g s of lock waits (see %s)", waited, r.scrape);
    ck_assert(per_queue(&r, text, "sekali_workers_up") == 2);
    ck_assert(per_queue(&r, text, "sekali_worker_restarts_total") == 0);
    ck_assert(per_queue(&r, text, "sekali_lock_ttl_seconds") == 30);
    ck_assert(per_queue(&r, text, "sekali_job_timeout_seconds") == 0);
    expect_valid_exposition(&r, text);
    free(text);

    ck_assert_int_eq(get(&r, "/"), 404);
    ck_assert_int_eq(get(&r, "/metrics/extra"), 404);
    h_stop_sekalid(r.h.sekalid, r.h.dir);
    h_run_close(&r.h);
}
END_TEST

/* The pids of pid's children (the workers), from /proc; returns how many. */
static int children(pid_t pid, pid_t *out, int max)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/task/%ld/children", (long)pid, (long)pid);
    char *text = h_read_file(path);
    int n = 0;
    for (char *tok = text != NULL ? strtok(text, " \n") : NULL; tok != NULL && n < max;
         tok = strtok(NULL, " \n"))
        out[n++] = (pid_t)atol(tok);
    free(text);
    return n;
}

/* Whether process pid has a descriptor on the socket with this inode. */
static bool holds_socket(pid_t pid, unsigned long inode)
{
    char dir[64], link[512], want[64];
    snprintf(dir, sizeof(dir), "/proc/%ld/fd", (long)pid);
    snprintf(want, sizeof(want), "socket:[%lu]", inode);
    DIR *d = opendir(dir);
    if (d == NULL)
        return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d)) != NULL;) {
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        found = n > 0 && (link[n] = '\0', strcmp(link, want) == 0);
    }
    closedir(d);
    return found;
}

/* The inode of the socket listening on 127.0.0.1:port, from /proc/net/tcp. */
static unsigned long listening_inode(int port)
{
    char *text = h_read_file("/proc/net/tcp");
    ck_assert_ptr_nonnull(text);
    char want[32];
    snprintf(want, sizeof(want), "0100007F:%04X", port);
    unsigned long inode = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char local[64], remote[64];
        unsigned state;
        unsigned long node;
        /* sl local remote st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, " %*s %63s %63s %x %*s %*s %*s %*s %*s %lu", local, remote, &state,
                   &node) == 4 && strcmp(local, want) == 0 && state == 0x0A)
            inode = node;
    }
    free(text);
    return inode;
}

/* The supervisor counts a worker it starts again; the workers never keep
 * the listening socket that fork() handed them. */
START_TEST(test_restarted_worker_is_counted_and_only_the_supervisor_listens)
{
    struct run r;
    start(&r, "metrics-restart", 2);
    pid_t workers[8];
    ck_assert_int_eq(children(r.h.sekalid, workers, 8), 2);
    unsigned long inode = listening_inode(r.port);
    ck_assert_msg(inode != 0, "nothing listens on 127.0.0.1:%d", r.port);
    ck_assert_msg(holds_socket(r.h.sekalid, inode), "the supervisor should hold the socket");
    for (int i = 0; i < 2; i++)
        ck_assert_msg(!holds_socket(workers[i], inode),
                      "worker %ld still holds the metrics socket", (long)workers[i]);

    ck_assert_int_eq(kill(workers[0], SIGKILL), 0);
    char *text = NULL;
    H_WAIT((free(text), text = scrape(&r),
            per_queue(&r, text, "sekali_worker_restarts_total") == 1 &&
            per_queue(&r, text, "sekali_workers_up") == 2),
           20000, "the killed worker should be restarted and counted; last scrape in %s",
           r.scrape);
    finish(&r, text);
}
END_TEST

/* After a reload the endpoint serves the new generation: its workers, and
 * counters that start again from zero, as after a restart. */
START_TEST(test_reload_keeps_the_endpoint_and_serves_the_new_generation)
{
    struct run r;
    start(&r, "metrics-reload", 2);
    char *text = scrape(&r);
    ck_assert(per_queue(&r, text, "sekali_workers_up") == 2);
    free(text);
    char *config = h_read_file(r.h.config);
    char *workers = strstr(config, "workers: 2");
    ck_assert_ptr_nonnull(workers);
    workers[9] = '3';
    FILE *f = fopen(r.h.config, "w");
    fputs(config, f);
    fclose(f);
    free(config);
    ck_assert_int_eq(kill(r.h.sekalid, SIGHUP), 0);
    text = NULL;
    H_WAIT((free(text), text = scrape(&r), per_queue(&r, text, "sekali_workers_up") == 3),
           20000, "after the reload the endpoint should show 3 workers; last scrape in %s",
           r.scrape);
    ck_assert(per_queue(&r, text, "sekali_worker_restarts_total") == 0);
    finish(&r, text);
}
END_TEST

/* The relay's figures: publishes counted per target queue, a row the broker
 * cannot route counted as such and as a failed row, and a due row the relay
 * cannot take (another transaction holds it) showing as pending with a lag
 * that grows until it is published, then drops to 0. */
START_TEST(test_outbox_publishes_refusals_and_lag_are_measured)
{
    struct run r;
    start_with(&r, "metrics-outbox", 1, "outbox:\n  relays: 1\n  poll_interval: 100ms\n");
    char missing[160];
    snprintf(missing, sizeof(missing), "%s-missing", r.h.queue);
    char key[32];
    h_pg_exec(r.h.pg, "BEGIN");
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "k-%d", i);
        h_enqueue(r.h.pg, r.h.queue, key, NULL, NULL);
    }
    h_enqueue(r.h.pg, missing, "k-missing", NULL, NULL);
    h_pg_exec(r.h.pg, "COMMIT");
    char *text = NULL;
    H_WAIT((free(text), text = scrape(&r),
            per_queue(&r, text, "sekali_outbox_published_total") == 10 &&
            of_queue(text, "sekali_outbox_unroutable_total", missing) == 1 &&
            of_queue(text, "sekali_outbox_failed_rows", missing) == 1),
           20000, "10 publishes and 1 refusal should be counted; last scrape in %s", r.scrape);
    ck_assert(of_queue(text, "sekali_outbox_published_total", missing) == 0);
    ck_assert(per_queue(&r, text, "sekali_outbox_unroutable_total") == 0);
    ck_assert(of_queue(text, "sekali_outbox_pending", missing) == 0);
    ck_assert(of_queue(text, "sekali_outbox_lag_seconds", missing) == 0);

    /* A row due in a moment, locked by this test before it is due: the
     * relay's SKIP LOCKED passes it by, so it waits, and lags. On a loaded
     * machine the relay can take the row before this test locks it; then
     * it tries again with a row due later, counting what the relay took. */
    PGconn *holder = h_pg();
    char held_id[128], held_key[32];
    int taken = 0;
    for (int due_ms = 300;; due_ms *= 2) {
        ck_assert_msg(due_ms <= 20000, "the relay took every row before it could be locked");
        snprintf(held_key, sizeof(held_key), "k-held-%d", due_ms);
        char due[80];
        snprintf(due, sizeof(due), "SELECT now() + interval '%d milliseconds'", due_ms);
        PGresult *res = PQexec(r.h.pg, due);
        char run_at[64];
        snprintf(run_at, sizeof(run_at), "%s", PQgetvalue(res, 0, 0));
        PQclear(res);
        snprintf(held_id, sizeof(held_id), "%s",
                 h_enqueue(r.h.pg, r.h.queue, held_key, NULL, run_at));
        h_pg_exec(holder, "BEGIN");
        if (h_pg_count(holder, "SELECT count(*) FROM (SELECT 1 FROM sekali.outbox "
                               "WHERE job_id = '%s' AND published_at IS NULL "
                               "FOR UPDATE) AS held", held_id) == 1)
            break;
        h_pg_exec(holder, "ROLLBACK");
        taken++;
    }
    H_WAIT((free(text), text = scrape(&r),
            per_queue(&r, text, "sekali_outbox_pending") == 1 &&
            per_queue(&r, text, "sekali_outbox_lag_seconds") >= 2),
           20000, "the held row should show as pending and lagging; last scrape in %s",
           r.scrape);
    ck_assert_int_eq(h_effects(&r.h, held_key), 0);
    h_pg_exec(holder, "COMMIT");
    PQfinish(holder);
    H_WAIT(h_effects(&r.h, held_key) == 1, 20000,
           "the released row should be published and run");
    H_WAIT((free(text), text = scrape(&r),
            per_queue(&r, text, "sekali_outbox_published_total") == 11 + taken &&
            per_queue(&r, text, "sekali_outbox_pending") == 0 &&
            per_queue(&r, text, "sekali_outbox_lag_seconds") == 0),
           20000, "the lag should be gone once the row is published; last scrape in %s",
           r.scrape);
    finish(&r, text);
}
END_TEST

/* The server's ends of the loopback connections to port that have a
 * descriptor (in the accept queue, a connection has none: inode 0), from
 * /proc/net/tcp: all of them (held), or only those the endpoint serves,
 * not having begun to close them (ESTABLISHED, or CLOSE_WAIT once the
 * client closed; one it cut is shutdown(), FIN_WAIT1 or later, until
 * libmicrohttpd closes it). A sample is exact only while sekalid is
 * stopped: the kernel walks the table a bucket at a time, over several
 * read()s, so a connection closed and the one accepted in its place
 * meanwhile may both be counted (a loaded ASan run saw 20 at 16). */
static int server_ends(int port, bool served_only)
{
    char *text = h_read_file("/proc/net/tcp");
    ck_assert_ptr_nonnull(text);
    char want[32];
    snprintf(want, sizeof(want), "0100007F:%04X", port);
    int n = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char local[64];
        unsigned state;
        unsigned long inode;
        if (sscanf(line, " %*s %63s %*s %x %*s %*s %*s %*s %*s %lu", local, &state,
                   &inode) == 3 && strcmp(local, want) == 0 && state != 0x0A && inode != 0 &&
            (!served_only || state == 0x01 || state == 0x08))
            n++;
    }
    free(text);
    return n;
}

static int held_connections(int port)
{
    return server_ends(port, false);
}

static int served_connections(int port)
{
    return server_ends(port, true);
}

/* How many connections wait in the accept queue of the socket listening on
 * port (a listening socket's rx_queue), or -1 if none listens. */
static int accept_queue(int port)
{
    char *text = h_read_file("/proc/net/tcp");
    ck_assert_ptr_nonnull(text);
    char want[32];
    snprintf(want, sizeof(want), "0100007F:%04X", port);
    int n = -1;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char local[64];
        unsigned state, rx;
        if (sscanf(line, " %*s %63s %*s %x %*x:%x", local, &state, &rx) == 3 &&
            strcmp(local, want) == 0 && state == 0x0A)
            n = (int)rx;
    }
    free(text);
    return n;
}

/* The state letter of a process (R, S, T...), from /proc; '?' if gone. */
static char process_state(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    char *text = h_read_file(path);
    char *paren = text != NULL ? strrchr(text, ')') : NULL;
    char state = paren != NULL && paren[1] == ' ' ? paren[2] : '?';
    free(text);
    return state;
}

/* Opens n connections to the endpoint that never send a request, as idle
 * scrapers or a port scan would. The connects do not block: past the
 * server's backlog the kernel holds them, and the test must go on. */
static void open_idle(int port, int *fds, int n)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        ck_assert_msg(fds[i] >= 0, "socket: %s", strerror(errno));
        int rc = connect(fds[i], (struct sockaddr *)&a, sizeof(a));
        ck_assert_msg(rc == 0 || errno == EINPROGRESS, "connect to port %d: %s", port,
                      strerror(errno));
    }
}

/* Whether the server closed its end of fd (end of file or a reset). */
static bool closed_by_server(int fd)
{
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static int count_closed_by_server(const int *fds, int n)
{
    int closed = 0;
    for (int i = 0; i < n; i++)
        closed += closed_by_server(fds[i]);
    return closed;
}

/* A scrape must be answered within a second (stretched under sanitizers). */
static void expect_prompt_scrape(struct run *r, const char *after)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "curl -sf --max-time %.3f -o %s http://127.0.0.1:%d/metrics",
             h_ms(1000) / 1000.0, r->scrape, r->port);
    int64_t start = h_now_ms();
    int rc = system(cmd);
    ck_assert_msg(rc == 0, "after %s, /metrics did not answer within %d ms (curl status 0x%x, "
                  "%lld ms): the endpoint is wedged", after, h_ms(1000), rc,
                  (long long)(h_now_ms() - start));
    char *text = h_read_file(r->scrape);
    ck_assert_ptr_nonnull(text);
    ck_assert(per_queue(r, text, "sekali_workers_up") == 1);
    free(text);
}

/* Fills the endpoint's connection limit (16) with n idle connections, the
 * rest waiting in the accept queue, then closes them all from the client's
 * side at once; the endpoint must answer the next scrape at once, then do the same
 * again (libmicrohttpd takes its listening socket out of its epoll set at
 * the limit, and it must be put back every time). */
static void idle_connections_closed_by_client(int n)
{
    struct run r;
    char name[64];
    snprintf(name, sizeof(name), "metrics-idle-%d", n);
    start(&r, name, 1);
    int *fds = calloc((size_t)n, sizeof(*fds));
    ck_assert_ptr_nonnull(fds);
    for (int round = 0; round < 2; round++) {
        open_idle(r.port, fds, n);
        /* Idle connections are cut after the 1 s header deadline, and at
         * the limit the longest-waiting one makes room for the next, so the
         * endpoint serves up to its 16 only for a moment; never more.
         * Counted once it has filled its slots or emptied its backlog, and
         * while it is stopped, so that the count is exact. */
        H_WAIT(held_connections(r.port) > 0, 10000, "the endpoint should take connections");
        H_WAIT(served_connections(r.port) >= 16 || accept_queue(r.port) == 0, 10000,
               "the endpoint should fill its slots or take every connection (serves %d, "
               "%d queued)", served_connections(r.port), accept_queue(r.port));
        /* All at once, as the endpoint sees them when it was busy: the
         * supervisor is stopped while the clients close. */
        ck_assert_int_eq(kill(r.h.sekalid, SIGSTOP), 0);
        H_WAIT(process_state(r.h.sekalid) == 'T', 5000, "sekalid should stop, is in state %c",
               process_state(r.h.sekalid));
        ck_assert_msg(served_connections(r.port) <= 16,
                      "the endpoint serves %d connections at once (%d held), above its 16",
                      served_connections(r.port), held_connections(r.port));
        for (int i = 0; i < n; i++)
            close(fds[i]);
        ck_assert_int_eq(kill(r.h.sekalid, SIGCONT), 0);
        /* Those it held it closes at once; before a scrape, the accept
         * queue must have room for it, or its SYN would wait for a retry. */
        H_WAIT(held_connections(r.port) == 0 && accept_queue(r.port) < 64, 10000,
               "the endpoint should close the %d connections closed by the client and take "
               "the queued ones (holds %d, %d queued)", n, held_connections(r.port),
               accept_queue(r.port));
        char after[128];
        snprintf(after, sizeof(after), "%d idle connections closed by the client (round %d)", n,
                 round + 1);
        expect_prompt_scrape(&r, after);
    }
    free(fds);
    finish(&r, scrape(&r));
}

START_TEST(test_16_idle_connections_closed_by_the_client_leave_metrics_answering)
{
    idle_connections_closed_by_client(16);
}
END_TEST

START_TEST(test_64_idle_connections_closed_by_the_client_leave_metrics_answering)
{
    idle_connections_closed_by_client(64);
}
END_TEST

START_TEST(test_200_idle_connections_closed_by_the_client_leave_metrics_answering)
{
    idle_connections_closed_by_client(200);
}
END_TEST

/* The same limit, this time left to the endpoint: a connection that sends
 * no request is cut at the 1 s header deadline (metrics_http.c), long
 * before libmicrohttpd's 10 s idle timeout, which a slow client could
 * otherwise stretch for ever (issue 21); a reload afterwards changes
 * nothing either way. */
START_TEST(test_16_idle_connections_timed_out_leave_metrics_answering)
{
    struct run r;
    start(&r, "metrics-idle-timeout", 1);
    int fds[16];
    open_idle(r.port, fds, 16);
    H_WAIT(held_connections(r.port) == 16, 10000,
           "the endpoint should hold its limit of 16 connections, holds %d",
           held_connections(r.port));
    int64_t opened = h_now_ms();
    H_WAIT(count_closed_by_server(fds, 16) == 16, 30000,
           "the endpoint should time out all 16 idle connections, closed %d",
           count_closed_by_server(fds, 16));
    ck_assert_msg(h_now_ms() - opened < 5000, "closed after %lld ms: the 1 s header deadline "
                  "should have cut them, not the 10 s idle timeout",
                  (long long)(h_now_ms() - opened));
    expect_prompt_scrape(&r, "16 idle connections timed out");
    for (int i = 0; i < 16; i++)
        close(fds[i]);
    ck_assert_int_eq(kill(r.h.sekalid, SIGHUP), 0);
    H_WAIT(h_count_events(r.h.log, "supervisor", SK_EVENT_RELOADED, NULL) == 1, 10000,
           "the reload should be logged");
    expect_prompt_scrape(&r, "a reload");
    finish(&r, scrape(&r));
}
END_TEST

static int count_markers(const char *dir, const char *prefix)
{
    int n = 0;
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* Optimistic concurrency (ABI 1.3's host->conflict()): two jobs add 1 to
 * one row with a version-guarded update, on a queue without the Redis lock
 * that would otherwise serialise them. Both read the same version before
 * either writes (each handler waits, between its read and its update, until
 * the test has seen both reads), so one update must find the row changed:
 * that job is retried with reason "conflict", re-reads, and lands. Both
 * additions count, none is lost, and the conflict is counted. */
START_TEST(test_two_jobs_racing_on_one_row_both_land_and_the_conflict_is_counted)
{
    struct run r;
    h_run_open(&r.h, "occ");
    close(listen_anywhere(&r.port));
    char top[256], queue_yaml[1200], row[160];
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\njanitor:\n  interval: 0s\n",
             r.port);
    snprintf(queue_yaml, sizeof(queue_yaml), "%s    lock: false\n    config:\n"
             "      marker_dir: %s\n", H_FAST_RETRIES, r.h.dir);
    snprintf(r.scrape, sizeof(r.scrape), "%s/metrics.txt", r.h.dir);
    snprintf(row, sizeof(row), "row-%s", r.h.queue);
    const char *values[] = { row };
    PQclear(PQexecParams(r.h.pg, "INSERT INTO sekali_test.occ_rows (name) VALUES ($1)", 1, NULL,
                         values, NULL, NULL, 0));
    h_run_start(&r.h, &(struct h_run_opts){ .workers = 2, .queue_yaml = queue_yaml,
                                            .top_yaml = top });
    char body[200];
    snprintf(body, sizeof(body), "occ:%s", row);
    h_publish(r.h.b, r.h.queue, "test", "occ-1", NULL, NULL, body);
    h_publish(r.h.b, r.h.queue, "test", "occ-2", NULL, NULL, body);

    /* The race, proven: both read version 0 and wait before writing. */
    H_WAIT(count_markers(r.h.dir, "occ.") == 2, 20000,
           "both jobs should have read the row (markers: %d)", count_markers(r.h.dir, "occ."));
    ck_assert_int_eq(h_pg_count(r.h.pg, "SELECT version FROM sekali_test.occ_rows WHERE name = "
                                        "'%s'", row), 0);
    char release[1100];
    snprintf(release, sizeof(release), "%s/release", r.h.dir);
    FILE *f = fopen(release, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);

    H_WAIT(h_pg_count(r.h.pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                      r.h.queue) == 2, 30000, "both jobs should commit");
    ck_assert_int_eq(h_pg_count(r.h.pg, "SELECT total FROM sekali_test.occ_rows WHERE name = "
                                        "'%s'", row), 2);
    ck_assert_int_eq(h_pg_count(r.h.pg, "SELECT version FROM sekali_test.occ_rows WHERE name = "
                                        "'%s'", row), 2);
    /* The loser ran a second attempt; the winner one. */
    ck_assert_int_eq(h_pg_count(r.h.pg, "SELECT max(attempt) FROM sekali_test.effects WHERE "
                                        "queue = '%s'", r.h.queue), 2);
    char *text = NULL;
    H_WAIT((free(text), text = scrape(&r),
            typed(&r, text, "sekali_completions_total", "test", NULL) == 2), 20000,
           "both completions should be counted; last scrape in %s", r.scrape);
    ck_assert_msg(typed(&r, text, "sekali_occ_conflicts_total", "test", NULL) == 1,
                  "one conflict should be counted (see %s)", r.scrape);
    ck_assert(typed(&r, text, "sekali_retries_total", "test", NULL) == 1);
    ck_assert_int_eq(h_count_outcomes(r.h.log, "retry", "conflict"), 1);
    finish(&r, text);
}
END_TEST

/* A port someone else listens on is a configuration problem: exit 2, a
 * message naming the address, and no worker started. */
START_TEST(test_taken_port_stops_sekalid_with_exit_2)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "metrics-taken");
    char *dir = h_tmpdir("metrics-taken");
    int port;
    int fd = listen_anywhere(&port);
    char top[128];
    snprintf(top, sizeof(top), "metrics: {listen: \"127.0.0.1:%d\"}\n", port);
    char *config = h_write_config_top(dir, queue, H_EFFECT, 1, NULL, top);

    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    int status = h_wait_exit(sekalid, 10000, "sekalid with a taken metrics port");
    close(fd);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 2,
                  "expected exit 2, got status 0x%x (see %s/sekalid.log)", status, dir);
    char log[1024], want[256];
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    snprintf(want, sizeof(want), "metrics.listen 127.0.0.1:%d: cannot listen there: bind: "
             "Address already in use", port);
    ck_assert_msg(h_count_lines(log, want) == 1, "%s should say \"%s\"", log, want);
    ck_assert_int_eq(h_count_events(log, "worker", SK_EVENT_STARTED, NULL), 0);
    free(config);
    free(dir);
}
END_TEST

/* "name type" per family of a text, one a line: from the scrape's "# TYPE"
 * lines, or from sekalid(8)'s ".It Va name Pq type" entries. */
static void families(const char *text, const char *marker, const char *between, char *out,
                     size_t size)
{
    out[0] = '\0';
    size_t len = 0;
    for (const char *p = text; (p = strstr(p, marker)) != NULL;) {
        p += strlen(marker);
        size_t n = strcspn(p, " \n");
        const char *type = p + n;
        if (strncmp(type, between, strlen(between)) != 0)
            continue;
        type += strlen(between);
        len += (size_t)snprintf(out + len, size - len, "%.*s %.*s\n", (int)n, p,
                                (int)strcspn(type, " \n"), type);
        ck_assert_uint_lt(len, size);
    }
}

/* Each line of a is a line of b. */
static void assert_lines_in(const char *a, const char *a_name, const char *b, const char *b_name)
{
    for (const char *line = a; *line != '\0';) {
        size_t n = strcspn(line, "\n");
        char want[256];
        snprintf(want, sizeof(want), "\n%.*s\n", (int)n, line);
        char *padded = NULL;
        ck_assert(asprintf(&padded, "\n%s", b) > 0);
        ck_assert_msg(strstr(padded, want) != NULL, "%s has \"%.*s\", %s does not", a_name,
                      (int)n, line, b_name);
        free(padded);
        line += n + (line[n] == '\n');
    }
}

/* Starts sekalid with metrics, a relay, the janitor, one worker and one
 * `every: 1s` schedule named after r's queue (its row in sekali.schedules
 * outlives the run), enqueueing into that queue. */
static void start_scheduled(struct run *r, const char *name)
{
    h_run_open(&r->h, name);
    close(listen_anywhere(&r->port));
    char top[1024];
    snprintf(top, sizeof(top),
             "metrics:\n  listen: 127.0.0.1:%d\n%s"
             "schedules:\n  - name: %s\n    every: 1s\n    queue: %s\n"
             "    job_type: test\n    body: ok\n",
             r->port, H_RELAY, r->h.queue, r->h.queue);
    snprintf(r->scrape, sizeof(r->scrape), "%s/metrics.txt", r->h.dir);
    h_run_start(&r->h, &(struct h_run_opts){ .workers = 1, .top_yaml = top });
}

/* sekalid(8)'s METRICS is the one reference of the families: with every
 * optional part on (a relay, the janitor, a schedule, a queue taking
 * locks), a real scrape has exactly the families the page lists, each of
 * its type. */
START_TEST(test_the_metrics_reference_equals_a_scrape)
{
    struct run r;
    start_scheduled(&r, "metrics-reference");
    h_publish(r.h.b, r.h.queue, "test", "ref-1", NULL, NULL, "ok");
    H_WAIT(h_effects(&r.h, "ref-1") == 1, 30000, "the job should commit");

    char *page = h_read_file("man/sekalid.8");
    ck_assert_msg(page != NULL, "man/sekalid.8 not found: run from the repository root");
    static char documented[8192], scraped[8192];
    families(page, "\n.It Va ", " Pq ", documented, sizeof(documented));
    char *text = NULL;
    H_WAIT((free(text), text = scrape(&r),
            strstr(text, "# TYPE sekali_janitor_last_round_timestamp_seconds ") != NULL &&
            strstr(text, "# TYPE sekali_relay_last_round_timestamp_seconds ") != NULL &&
            strstr(text, "# TYPE sekali_outbox_lag_seconds ") != NULL),
           20000, "the relay's and janitor's families should appear; last scrape in %s",
           r.scrape);
    families(text, "# TYPE ", " ", scraped, sizeof(scraped));
    ck_assert_msg(strlen(documented) > 200, "sekalid(8) lists too few metrics:\n%s", documented);
    assert_lines_in(scraped, "the scrape", documented, "sekalid(8)'s METRICS");
    assert_lines_in(documented, "sekalid(8)'s METRICS", scraped, "the scrape");
    free(page);
    finish(&r, text);
}
END_TEST

static double of_schedule(const struct run *r, const char *text, const char *name)
{
    char series[512];
    snprintf(series, sizeof(series), "%s{schedule=\"%s\"}", name, r->h.queue);
    return value(text, series);
}

/* A schedule's figures follow its row and its outbox rows: every tick the
 * one scheduler enqueued is counted, the last tick is the row's, the
 * scheduler's round is recent, and nothing failed or was dropped. */
START_TEST(test_a_schedule_counts_its_ticks_and_shows_its_last_one)
{
    struct run r;
    start_scheduled(&r, "metrics-schedule");
    H_WAIT(h_effects(&r.h, NULL) >= 3, 20000, "the schedule's first three ticks should run");

    /* Ticks keep coming once a second: compare a scrape with the tables
     * read right after it until no tick fell in between. */
    char *text = NULL;
    long long rows = -1, last = -1;
    H_WAIT((free(text), text = scrape(&r),
            rows = h_pg_count(r.h.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                              r.h.queue),
            last = h_pg_count(r.h.pg, "SELECT extract(epoch FROM last_tick)::int8 FROM "
                                      "sekali.schedules WHERE name = '%s'", r.h.queue),
            of_schedule(&r, text, "sekali_schedule_ticks_total") == (double)rows &&
            of_schedule(&r, text, "sekali_schedule_last_tick_timestamp_seconds") ==
                (double)last),
           20000, "the ticks counted should be the outbox's %lld rows and the last tick the "
           "row's %lld; last scrape in %s", rows, last, r.scrape);
    ck_assert_int_ge(rows, 3);
    ck_assert(of_schedule(&r, text, "sekali_schedule_failures_total") == 0);
    ck_assert(of_schedule(&r, text, "sekali_schedule_missed_total") == 0);
    double round = value(text, "sekali_scheduler_last_round_timestamp_seconds");
    double now = (double)time(NULL);
    ck_assert_msg(round > now - 10 && round <= now + 1,
                  "the scheduler's last round (%.3f) should be within seconds of now (%.0f)",
                  round, now);
    finish(&r, text);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_counters_equal_what_happened,
        test_two_jobs_racing_on_one_row_both_land_and_the_conflict_is_counted,
        test_restarted_worker_is_counted_and_only_the_supervisor_listens,
        test_reload_keeps_the_endpoint_and_serves_the_new_generation,
        test_taken_port_stops_sekalid_with_exit_2,
        test_outbox_publishes_refusals_and_lag_are_measured,
        test_the_metrics_reference_equals_a_scrape,
        test_a_schedule_counts_its_ticks_and_shows_its_last_one,
        test_16_idle_connections_closed_by_the_client_leave_metrics_answering,
        test_64_idle_connections_closed_by_the_client_leave_metrics_answering,
        test_200_idle_connections_closed_by_the_client_leave_metrics_answering,
        test_16_idle_connections_timed_out_leave_metrics_answering,
        NULL,
    };
    return h_run_suite(h_suite("metrics", 300, tests));
}
