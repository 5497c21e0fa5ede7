/* check_console_pool.c - the console's reads share a few PostgreSQL
 * sessions and AMQP connections (src/ctl/ctl_pool.c): reads in a row reuse
 * them, reads at once open at most console.pool (2 here), a session the server
 * ended is replaced without failing a read, and idle ones close. Sessions
 * are counted in pg_stat_activity by the pool's application_name, AMQP
 * connections in the kernel's table of TCP connections (the local ports of
 * those established to the broker's port: no other client of this server
 * set runs meanwhile); the console runs with console.open_reads (loopback),
 * so a read is one plain GET. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define SMALL     2   /* the burst's console.pool: the setting decides */
#define SESSIONS  "application_name = 'sekalictl serve'"

struct console {
    char  *dir, *config, queue[128], log[1100];
    int    port;
    pid_t  pid;
};

/* A console on a loopback port with open reads; pool > 0 writes
 * console.pool. */
static void start_pool(struct console *c, const char *name, int pool)
{
    h_init();
    c->dir = h_tmpdir(name);
    h_unique_name(c->queue, sizeof(c->queue), name);
    c->port = h_free_port();
    char top[200], size[32] = "";
    if (pool > 0)
        snprintf(size, sizeof(size), "  pool: %d\n", pool);
    snprintf(top, sizeof(top), "console:\n  listen: \"127.0.0.1:%d\"\n  open_reads: true\n%s",
             c->port, size);
    c->config = h_write_config_top(c->dir, c->queue, H_EFFECT, 1, NULL, top);
    snprintf(c->log, sizeof(c->log), "%s/serve.log", c->dir);
    PGconn *pg = h_pg();
    H_WAIT(h_pg_count(pg, "SELECT count(*) FROM pg_stat_activity WHERE " SESSIONS) == 0, 10000,
           "an earlier test's console sessions should be gone");
    PQfinish(pg);
    c->pid = h_serve_console(c->config, c->log);
}

static void start(struct console *c, const char *name)
{
    start_pool(c, name, 0);
}

static long long n_sessions(PGconn *pg);
static bool no_amqp(void);

/* Stops the console (and closes pg, the test's own session): it exits 0
 * and leaves no session of its pool behind. */
static void stop(struct console *c, PGconn *pg)
{
    ck_assert_int_eq(kill(c->pid, SIGTERM), 0);
    int st = h_wait_exit(c->pid, 10000, "sekalictl serve");
    ck_assert_msg(WIFEXITED(st) && !WEXITSTATUS(st), "serve should exit 0 on SIGTERM (see %s)",
                  c->log);
    H_WAIT(n_sessions(pg) == 0 && no_amqp(), 10000,
           "the console's sessions and AMQP connections should end with it");
    PQfinish(pg);
    free(c->dir);
    free(c->config);
}

/* The console's sessions, as "pid pid ..." in pid order. */
static char *sessions(PGconn *pg)
{
    PGresult *res = PQexec(pg, "SELECT coalesce(string_agg(pid::text, ' ' ORDER BY pid), '') "
                               "FROM pg_stat_activity WHERE " SESSIONS);
    ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
    char *s = strdup(PQgetvalue(res, 0, 0));
    PQclear(res);
    return s;
}

static long long n_sessions(PGconn *pg)
{
    return h_pg_count(pg, "SELECT count(*) FROM pg_stat_activity WHERE " SESSIONS);
}

/* The local ports of the TCP connections established to the broker, as
 * " port port ..." in the kernel's order, which stays while they do. */
static char *amqp_conns(void)
{
    const char *url = h_amqp_url(), *at = strrchr(url, '@');
    const char *colon = strchr(at != NULL ? at : url, ':');
    ck_assert_ptr_nonnull(colon);
    int broker = atoi(colon + 1);
    size_t len = 0;
    char *ports = NULL;
    FILE *out = open_memstream(&ports, &len);
    static const char *const tables[] = { "/proc/net/tcp", "/proc/net/tcp6" };
    for (size_t t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        char line[512];
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            unsigned local, remote, state;
            if (sscanf(line, " %*d: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%x %x", &local, &remote,
                       &state) == 3 && (int)remote == broker && state == 1)
                fprintf(out, " %u", local);
        }
        if (f != NULL)
            fclose(f);
    }
    fclose(out);
    return ports;
}

static bool no_amqp(void)
{
    char *ports = amqp_conns();
    bool none = ports[0] == '\0';
    free(ports);
    return none;
}

/* A status read that reached PostgreSQL and the broker. */
static void read_status(struct console *c)
{
    char *body;
    int status = h_http_get(c->port, "/api/status", &body);
    ck_assert_msg(status == 200 && strstr(body, "\"postgresql_error\":null") != NULL &&
                  strstr(body, "\"broker_error\":null") != NULL,
                  "a status read should reach PostgreSQL and RabbitMQ: %d %s (see %s)", status,
                  body, c->log);
    free(body);
}

START_TEST(test_reads_in_a_row_reuse_the_pooled_sessions)
{
    struct console c;
    start(&c, "poolrow");
    PGconn *pg = h_pg();
    read_status(&c);
    char *first = sessions(pg), *broker = amqp_conns();
    ck_assert_msg(first[0] != '\0', "the first read's session should stay open for the next");
    ck_assert_msg(broker[0] != '\0', "the first read's AMQP connection should stay open");
    char path[300];
    snprintf(path, sizeof(path), "/api/dlq/list?queue=%s", c.queue);
    for (int i = 0; i < 20; i++) {
        read_status(&c);
        ck_assert_int_eq(h_http_get(c.port, path, NULL), 200);
    }
    char *after = sessions(pg), *broker_after = amqp_conns();
    ck_assert_msg(strcmp(first, after) == 0, "40 reads in a row should open no session: "
                  "before them [%s], after [%s]", first, after);
    ck_assert_msg(strcmp(broker, broker_after) == 0, "20 status reads in a row should open no "
                  "AMQP connection: before them [%s], after [%s]", broker, broker_after);
    free(first);
    free(after);
    free(broker);
    free(broker_after);
    stop(&c, pg);
}
END_TEST

struct reader {
    int  port, reads, failed;
    int *finished;
};

static void *reader(void *arg)
{
    struct reader *r = arg;
    for (int i = 0; i < r->reads; i++) {
        char *body;
        if (h_http_get(r->port, "/api/status", &body) != 200 ||
            strstr(body, "\"postgresql_error\":null") == NULL)
            r->failed++;
        free(body);
    }
    __atomic_add_fetch(r->finished, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

START_TEST(test_reads_at_once_open_at_most_the_pool_size)
{
    struct console c;
    start_pool(&c, "poolburst", SMALL);
    PGconn *pg = h_pg();
    enum { THREADS = 12 };
    pthread_t t[THREADS];
    struct reader r[THREADS];
    int finished = 0;
    for (int i = 0; i < THREADS; i++) {
        r[i] = (struct reader){ .port = c.port, .reads = 5, .finished = &finished };
        ck_assert_int_eq(pthread_create(&t[i], NULL, reader, &r[i]), 0);
    }
    /* Counted while the reads run, by both names: the pool's and the one a
     * report dials with when no pool runs. */
    long long most = 0, most_amqp = 0;
    while (__atomic_load_n(&finished, __ATOMIC_SEQ_CST) < THREADS) {
        long long n = h_pg_count(pg, "SELECT count(*) FROM pg_stat_activity WHERE "
                                     "application_name IN ('sekalictl serve', 'sekalictl')");
        most = n > most ? n : most;
        char *ports = amqp_conns();
        n = 0;
        for (const char *p = ports; (p = strchr(p, ' ')) != NULL; p++)
            n++;
        most_amqp = n > most_amqp ? n : most_amqp;
        free(ports);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    int failed = 0;
    for (int i = 0; i < THREADS; i++)
        failed += r[i].failed;
    ck_assert_msg(failed == 0, "%d of 60 reads at once failed (see %s)", failed, c.log);
    ck_assert_msg(most <= SMALL, "60 reads from 12 clients at once held %lld PostgreSQL "
                  "sessions at a time; console.pool allows %d", most, SMALL);
    ck_assert_msg(most_amqp <= SMALL, "60 reads from 12 clients at once held %lld AMQP "
                  "connections at a time; console.pool allows %d", most_amqp, SMALL);
    ck_assert_int_le(n_sessions(pg), SMALL);
    stop(&c, pg);
}
END_TEST

START_TEST(test_a_read_after_the_servers_ended_the_connections_succeeds)
{
    struct console c;
    start(&c, "poolkill");
    PGconn *pg = h_pg();
    read_status(&c);
    char *before = sessions(pg);
    ck_assert_msg(before[0] != '\0', "the read's session should stay open");
    ck_assert_int_ge(h_pg_count(pg, "SELECT count(pg_terminate_backend(pid)) FROM "
                                    "pg_stat_activity WHERE " SESSIONS), 1);
    H_WAIT(n_sessions(pg) == 0, 10000, "the terminated sessions should end");
    char *broker = amqp_conns();
    ck_assert_msg(broker[0] != '\0', "the read's AMQP connection should stay open");
    ck_assert_int_eq(system("\"$SEKALI_RABBITMQCTL\" close_all_connections test "
                            ">/dev/null 2>&1"), 0);
    H_WAIT(no_amqp(), 10000, "the broker should close the console's connection");
    free(broker);
    read_status(&c);
    char *after = sessions(pg);
    ck_assert_msg(after[0] != '\0' && strcmp(before, after) != 0,
                  "a new session should replace the ended one: [%s] then [%s]", before, after);
    free(before);
    free(after);
    read_status(&c);
    stop(&c, pg);
}
END_TEST

START_TEST(test_idle_sessions_are_closed)
{
    struct console c;
    start(&c, "poolidle");
    PGconn *pg = h_pg();
    read_status(&c);
    ck_assert_int_ge(n_sessions(pg), 1);
    char *broker = amqp_conns();
    ck_assert_msg(broker[0] != '\0', "the read's AMQP connection should stay open");
    free(broker);
    /* Half the harness's 30 s heartbeat. */
    H_WAIT(no_amqp(), 30000, "an idle AMQP connection should be closed after half a heartbeat");
    H_WAIT(n_sessions(pg) == 0, 45000, "an idle session should be closed after 30 s");
    read_status(&c);
    stop(&c, pg);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_reads_in_a_row_reuse_the_pooled_sessions,
        test_reads_at_once_open_at_most_the_pool_size,
        test_a_read_after_the_servers_ended_the_connections_succeeds,
        test_idle_sessions_are_closed,
        NULL,
    };
    return h_run_suite(h_suite("console_pool", 120, tests));
}
