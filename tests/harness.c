/* harness.c - shared plumbing of the integration and fault suites. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "harness.h"

static const char *build_dir;
static const char *amqp_url;
static const char *pg_conninfo;
static const char *scratch;
static int redis_port;
static int slowdown = 1;
static struct sk_amqp_conf amqp_conf;

static const char *require_env(const char *name)
{
    const char *v = getenv(name);
    ck_assert_msg(v != NULL && v[0] != '\0',
                  "%s is not set: run the suites through tests/run.sh, which reads "
                  "tests/servers.sh env", name);
    return v;
}

void h_init(void)
{
    build_dir = require_env("SEKALI_BUILD");
    amqp_url = require_env("SEKALI_AMQP_URL");
    pg_conninfo = require_env("SEKALI_PG_CONNINFO");
    scratch = require_env("SEKALI_SCRATCH");
    redis_port = atoi(require_env("SEKALI_REDIS_PORT"));
    if (getenv("SEKALI_VALGRIND") != NULL)
        slowdown = 20;
    else if (strstr(build_dir, "asan") != NULL)
        slowdown = 3;

    static char url_copy[512];
    snprintf(url_copy, sizeof(url_copy), "%s", amqp_url);
    struct amqp_connection_info info;
    ck_assert_int_eq(amqp_parse_url(url_copy, &info), AMQP_STATUS_OK);
    amqp_conf = (struct sk_amqp_conf){
        .nodes = { { .host = info.host, .port = info.port } }, .n_nodes = 1,
        .vhost = info.vhost, .user = info.user,
        .password = info.password, .heartbeat_ms = 0, .connect_timeout_ms = 5000,
    };
}

const char *h_build_dir(void) { return build_dir; }
const char *h_amqp_url(void) { return amqp_url; }
const char *h_pg_conninfo(void) { return pg_conninfo; }
int h_redis_port(void) { return redis_port; }
int h_ms(int ms) { return ms * slowdown; }

int64_t h_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void h_nap(void)
{
    struct timespec t = { .tv_sec = 0, .tv_nsec = 20 * 1000000L };
    nanosleep(&t, NULL);
}

char *h_tmpdir(const char *name)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/tests/%s.XXXXXX", scratch, name) > 0);
    char parent[1024];
    snprintf(parent, sizeof(parent), "%s/tests", scratch);
    mkdir(parent, 0755);
    ck_assert_msg(mkdtemp(path) != NULL, "mkdtemp(%s): %s", path, strerror(errno));
    return path;
}

int h_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
                  getsockname(fd, (struct sockaddr *)&a, &len) == 0, "bind: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

void h_unique_name(char *out, size_t size, const char *prefix)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    snprintf(out, size, "%s-%ld-%ld-%ld", prefix, (long)getpid(), (long)t.tv_sec,
             t.tv_nsec / 1000);
}

PGconn *h_pg(void)
{
    PGconn *pg = PQconnectdb(pg_conninfo);
    ck_assert_msg(PQstatus(pg) == CONNECTION_OK, "PostgreSQL: %s", PQerrorMessage(pg));
    return pg;
}

void h_pg_exec(PGconn *pg, const char *sql)
{
    PGresult *res = PQexec(pg, sql);
    ExecStatusType status = PQresultStatus(res);
    ck_assert_msg(status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK, "%s: %s", sql,
                  PQresultErrorMessage(res));
    PQclear(res);
}

long long h_pg_count(PGconn *pg, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    PGresult *res = PQexec(pg, sql);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1, "%s: %s",
                  sql, PQresultErrorMessage(res));
    long long n = PQgetisnull(res, 0, 0) ? 0 : atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return n;
}

const char *h_enqueue(PGconn *pg, const char *queue, const char *key, const char *dedupe,
                      const char *run_at)
{
    return h_enqueue_body(pg, queue, "ok", key, dedupe, run_at);
}

const char *h_enqueue_body(PGconn *pg, const char *queue, const char *body, const char *key,
                           const char *dedupe, const char *run_at)
{
    static _Thread_local char id[128];  /* producers call it from several threads */
    const char *values[] = { queue, body, key, dedupe, run_at };
    PGresult *res = PQexecParams(pg, "SELECT sekali.enqueue($1, 'test', $2::bytea, $3, $4, "
                                     "NULL, coalesce($5::timestamptz, now()))",
                                 5, NULL, values, NULL, NULL, 0);
    ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "sekali.enqueue: %s",
                  PQresultErrorMessage(res));
    snprintf(id, sizeof(id), "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return id;
}

char *h_write_config(const char *dir, const char *queue, const char *handler, int workers,
                     const char *extra_queue_yaml)
{
    return h_write_config_top(dir, queue, handler, workers, extra_queue_yaml, NULL);
}

int h_test_batch(void)
{
    const char *batch = getenv("SEKALI_TEST_BATCH");
    return batch != NULL && atoi(batch) >= 1 ? atoi(batch) : 0;
}

bool h_test_tls(void)
{
    const char *tls = getenv("SEKALI_TEST_TLS");
    if (tls == NULL || strcmp(tls, "1") != 0)
        return false;
    ck_assert_msg(getenv("SEKALI_TLS_DIR") != NULL && getenv("SEKALI_AMQP_TLS_PORT") != NULL &&
                  getenv("SEKALI_REDIS_TLS_PORT") != NULL,
                  "SEKALI_TEST_TLS=1 needs the TLS listeners: start the servers with "
                  "SEKALI_TLS=1 tests/servers.sh start");
    return true;
}

/* The connection lines of the amqp:, redis: and postgres: sections. With
 * SEKALI_TEST_TLS=1 every link is TLS, as check_tls configures it: amqps://
 * to RabbitMQ's TLS port with the test CA and the client certificate,
 * Redis's tls-port as the ACL user sekali_acl (its password in a file in
 * dir), PostgreSQL as sekali_tls, a role pg_hba.conf admits over hostssl
 * only, with sslmode=verify-full. The plain lines otherwise. */
static void links_yaml(const char *dir, char *amqp, size_t amqp_size, char *redis,
                       size_t redis_size, char *postgres, size_t postgres_size)
{
    if (!h_test_tls()) {
        snprintf(amqp, amqp_size, "  url: \"%s\"\n", amqp_url);
        snprintf(redis, redis_size, "  host: 127.0.0.1\n  port: %d\n", redis_port);
        snprintf(postgres, postgres_size, "  conninfo: \"%s\"\n", pg_conninfo);
        return;
    }
    const char *d = getenv("SEKALI_TLS_DIR");
    char pw[1100];
    snprintf(pw, sizeof(pw), "%s/redis.password", dir);
    FILE *f = fopen(pw, "w");
    ck_assert_msg(f != NULL, "fopen(%s): %s", pw, strerror(errno));
    fputs("aclpass\n", f);  /* sekali_acl's password in servers.sh's redis.conf */
    ck_assert_int_eq(fclose(f), 0);
    snprintf(amqp, amqp_size,
             "  url: \"amqps://sekali:sekali@127.0.0.1:%s/%%2f\"\n"
             "  tls:\n"
             "    ca_file: %s/ca.crt\n"
             "    cert_file: %s/client.crt\n"
             "    key_file: %s/client.key\n",
             getenv("SEKALI_AMQP_TLS_PORT"), d, d, d);
    snprintf(redis, redis_size,
             "  host: 127.0.0.1\n"
             "  port: %s\n"
             "  username: sekali_acl\n"
             "  password_file: %s\n"
             "  tls:\n"
             "    ca_file: %s/ca.crt\n",
             getenv("SEKALI_REDIS_TLS_PORT"), pw, d);
    snprintf(postgres, postgres_size,
             "  conninfo: \"host=127.0.0.1 port=%s dbname=sekali user=sekali_tls "
             "password=sekali sslmode=verify-full sslrootcert=%s/ca.crt\"\n",
             getenv("SEKALI_PG_PORT"), d);
}

char *h_write_config_top(const char *dir, const char *queue, const char *handler, int workers,
                         const char *extra_queue_yaml, const char *extra_top_yaml)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/sekali.yaml", dir) > 0);
    /* Unset, SEKALI_TEST_BATCH leaves the batch to sekali's default (as
     * many deliveries a transaction as the window of 4 holds); N reruns a
     * suite with every transactional queue at batch N (and a window of 2N),
     * 1 with one job per transaction. */
    int batch = h_test_batch();
    if (extra_queue_yaml != NULL && (strstr(extra_queue_yaml, "mode: external") != NULL ||
                                     strstr(extra_queue_yaml, "batch:") != NULL))
        batch = 0;
    char queue_shape[64] = "    prefetch: 4\n";
    /* A test that sizes its own window (a batch larger than 4) says so. */
    if (extra_queue_yaml != NULL && strstr(extra_queue_yaml, "prefetch:") != NULL)
        queue_shape[0] = '\0';
    else if (batch > 0)
        snprintf(queue_shape, sizeof(queue_shape), "    prefetch: %d\n    batch: %d\n",
                 batch > 1 ? 2 * batch : 4, batch);
    /* Most suites look at a dead letter's copy in <queue>.dead: they get
     * the mirror (sekali.dead_letters is the record either way). A test
     * that means the default says dead_letter_mirror itself. */
    const char *mirror = extra_queue_yaml != NULL &&
        strstr(extra_queue_yaml, "dead_letter_mirror:") != NULL ? "" : "    dead_letter_mirror: true\n";
    char amqp[2048], redis[2048], postgres[1024];
    links_yaml(dir, amqp, sizeof(amqp), redis, sizeof(redis), postgres, sizeof(postgres));
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "fopen(%s): %s", path, strerror(errno));
    fprintf(f,
            "amqp:\n"
            "%s"
            "  heartbeat: 30s\n"
            "redis:\n"
            "%s"
            "postgres:\n"
            "%s"
            "lock:\n"
            "  ttl: 30s\n"
            "  busy_wait: 500ms\n"
            "log:\n"
            "  level: info\n"
            "  format: json\n"
            "shutdown_timeout: 20s\n"
            "%s"
            "queues:\n"
            "  - name: %s\n"
            "    handler: %s/%s\n"
            "    workers: %d\n"
            "%s"
            "%s"
            "%s",
            amqp, redis, postgres, extra_top_yaml != NULL ? extra_top_yaml : "",
            queue, build_dir, handler, workers, queue_shape, mirror,
            extra_queue_yaml != NULL ? extra_queue_yaml : "");
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

void h_config_replace(const char *path, const char *from, const char *to)
{
    char *text = h_read_file(path);
    ck_assert_msg(text != NULL, "cannot read %s", path);
    char *at = strstr(text, from);
    ck_assert_msg(at != NULL, "%s has no \"%s\"", path, from);
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "fopen(%s): %s", path, strerror(errno));
    fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    ck_assert_int_eq(fclose(f), 0);
    free(text);
}

pid_t h_start_sekalid(const char *binary, const char *config, const char *dir,
                      const char *const *extra_env)
{
    char exe[1024], log[1024], vg_log[1024];
    snprintf(exe, sizeof(exe), "%s/%s", build_dir, binary);
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    snprintf(vg_log, sizeof(vg_log), "--log-file=%s/valgrind.%%p.log", dir);

    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0)
            _exit(120);
        dup2(fd, STDERR_FILENO);
        dup2(fd, STDOUT_FILENO);
        for (const char *const *e = extra_env; e != NULL && *e != NULL; e++)
            putenv((char *)*e);
        /* Sanitizer reports go to files that h_stop_sekalid() looks for: a
         * worker that aborts on one is restarted, and its report would
         * otherwise vanish in the log of a test that still passes. */
        char asan[1200], ubsan[1200];
        snprintf(asan, sizeof(asan),
                 "detect_leaks=1:abort_on_error=1:verify_asan_link_order=0:log_path=%s/asan", dir);
        snprintf(ubsan, sizeof(ubsan), "print_stacktrace=1:log_path=%s/ubsan", dir);
        setenv("ASAN_OPTIONS", asan, 1);
        setenv("UBSAN_OPTIONS", ubsan, 1);
        if (getenv("SEKALI_VALGRIND") != NULL) {
            execlp("valgrind", "valgrind", "-q", "--leak-check=full",
                   "--errors-for-leak-kinds=definite", "--show-leak-kinds=definite",
                   vg_log, exe, "-c", config, (char *)NULL);
        } else {
            execl(exe, exe, "-c", config, (char *)NULL);
        }
        _exit(127);
    }
    return pid;
}

void h_servers(const char *command)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "tests/servers.sh %s >/dev/null 2>&1", command);
    ck_assert_msg(system(cmd) == 0, "tests/servers.sh %s failed", command);
}

pid_t h_wait_marked_deaths(const struct h_run *r, const char *point, int n, int timeout_ms)
{
    H_WAIT(h_count_lines(r->mark, point) == n, timeout_ms,
           "failpoint %s should have killed %d workers (mark has %d)", point, n,
           h_count_lines(r->mark, point));
    char *marks = h_read_file(r->mark);
    ck_assert_ptr_nonnull(marks);
    pid_t victim = 0;
    for (const char *p = marks; *p != '\0'; p = strchr(p, '\n') + 1) {
        victim = (pid_t)atol(p);
        H_WAIT(h_process_gone(victim), 10000, "worker %ld should be dead", (long)victim);
    }
    free(marks);
    return victim;
}

void h_expect_dead_reason(struct h_run *r, const char *reason)
{
    amqp_message_t msg;
    ck_assert_msg(h_get(r->b, r->dead, &msg), "%s should hold a dead letter", r->dead);
    char text[64];
    ck_assert_str_eq(h_header_text(&msg, "x-sekali-reason", text, sizeof(text)), reason);
    amqp_destroy_message(&msg);
}

int h_wait_exit(pid_t pid, int timeout_ms, const char *what)
{
    int64_t deadline = h_now_ms() + h_ms(timeout_ms);
    for (;;) {
        int status;
        pid_t got = waitpid(pid, &status, WNOHANG);
        ck_assert_int_ge(got, 0);
        if (got == pid)
            return status;
        if (h_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            ck_abort_msg("%s: process %ld did not exit within %d ms", what, (long)pid,
                         h_ms(timeout_ms));
        }
        h_nap();
    }
}

void h_stop_sekalid(pid_t pid, const char *dir)
{
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    int status = h_wait_exit(pid, 30000, "sekalid after SIGTERM");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "sekalid should exit 0 after SIGTERM, got status 0x%x (see %s/sekalid.log)",
                  status, dir);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "ls %s/asan.* %s/ubsan.* >/dev/null 2>&1", dir, dir);
    ck_assert_msg(system(cmd) != 0, "a sanitizer reported errors: see %s/asan.* or ubsan.*", dir);
    if (getenv("SEKALI_VALGRIND") != NULL) {
        snprintf(cmd, sizeof(cmd), "cat %s/valgrind.*.log 2>/dev/null | grep -q .", dir);
        ck_assert_msg(system(cmd) != 0, "valgrind reported errors: see %s/valgrind.*.log",
                      dir);
    }
}

struct sk_broker *h_broker(void)
{
    struct sk_broker *b = NULL;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_open(&b, &amqp_conf, &err) == SK_OK, "broker: %s", err.msg);
    ck_assert_msg(sk_broker_confirm_select(b, &err) == SK_OK, "confirm.select: %s", err.msg);
    return b;
}

void h_publish(struct sk_broker *b, const char *queue, const char *type, const char *message_id,
               const char *idempotency_key, const char *resource_key, const char *body)
{
    struct sk_message msg = {
        .message_id = message_id, .type = type, .content_type = "text/plain",
        .idempotency_key = idempotency_key, .resource_key = resource_key,
        .body = body, .body_len = strlen(body),
    };
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_publish(b, queue, &msg, &err) == SK_OK, "publish to %s: %s", queue,
                  err.msg);
}

uint32_t h_queue_depth(struct sk_broker *b, const char *queue)
{
    uint32_t messages = 0;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_queue_depth(b, queue, &messages, NULL, &err) == SK_OK,
                  "queue depth of %s: %s", queue, err.msg);
    return messages;
}

long long h_in_flight(const char *queue)
{
    char cmd[600], line[1024], delay[300];
    snprintf(cmd, sizeof(cmd), "\"%s\" -q list_queues name messages 2>&1",
             require_env("SEKALI_RABBITMQCTL"));
    snprintf(delay, sizeof(delay), "%s.delay.", queue);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    long long n = 0;
    bool seen = false;
    while (fgets(line, sizeof(line), p) != NULL) {
        char *tab = strchr(line, '\t');
        if (tab == NULL)
            continue;
        *tab = '\0';
        if (strcmp(line, queue) == 0 || strncmp(line, delay, strlen(delay)) == 0) {
            n += strtoll(tab + 1, NULL, 10);
            seen = true;
        }
    }
    int status = pclose(p);
    ck_assert_msg(status == 0 && seen, "rabbitmqctl list_queues failed or lists no %s", queue);
    return n;
}

uint32_t h_consumers(struct sk_broker *b, const char *queue)
{
    uint32_t consumers = 0;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_queue_depth(b, queue, NULL, &consumers, &err) == SK_OK,
                  "consumers of %s: %s", queue, err.msg);
    return consumers;
}

char *h_doc_block(const char *path, const char *lang)
{
    char *readme = h_read_file(path);
    ck_assert_msg(readme != NULL, "%s not found: run from the repository root", path);
    char fence[32];
    snprintf(fence, sizeof(fence), "```%s\n", lang);
    char *start = strstr(readme, fence);
    char *end = start != NULL ? strstr(start + strlen(fence), "\n```") : NULL;
    char *block = NULL;
    if (end != NULL)
        block = strndup(start + strlen(fence), (size_t)(end - start) - strlen(fence) + 1);
    free(readme);
    return block;
}

/* All of in, NUL-terminated; the caller frees it. */
static char *read_all(FILE *in)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(mem);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), in)) > 0)
        fwrite(chunk, 1, n, mem);
    fclose(mem);
    return buf;
}

char *h_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    char *buf = read_all(f);
    fclose(f);
    return buf;
}

int h_count_lines(const char *path, const char *needle)
{
    char *text = h_read_file(path);
    if (text == NULL)
        return 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n"))
        n += strstr(line, needle) != NULL;
    free(text);
    return n;
}

/* A field's key and value, quoted and after a comma, can only be the field
 * itself: a message that quotes one has its quotes escaped. */
int h_count_events(const char *path, const char *role, const char *event, const char *server)
{
    char want_role[128], want_event[128], want_server[128];
    snprintf(want_role, sizeof(want_role), ",\"role\":\"%s\"", role != NULL ? role : "");
    snprintf(want_event, sizeof(want_event), ",\"event\":\"%s\"", event);
    snprintf(want_server, sizeof(want_server), ",\"server\":\"%s\"",
             server != NULL ? server : "");
    char *text = h_read_file(path);
    if (text == NULL)
        return 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n"))
        n += strstr(line, want_event) != NULL &&
             (role == NULL || strstr(line, want_role) != NULL) &&
             (server == NULL || strstr(line, want_server) != NULL);
    free(text);
    return n;
}

/* Whether line has the field key with value: a string ("key":"value") or a
 * number ("key":value, then ',' or '}'), after a comma as h_count_events()
 * relies on. */
static bool has_field(const char *line, const char *key, const char *value)
{
    char quoted[600], bare[600];
    snprintf(quoted, sizeof(quoted), ",\"%s\":\"%s\"", key, value);
    if (strstr(line, quoted) != NULL)
        return true;
    int n = snprintf(bare, sizeof(bare), ",\"%s\":%s", key, value);
    for (const char *p = line; (p = strstr(p, bare)) != NULL; p++)
        if (p[n] == ',' || p[n] == '}')
            return true;
    return false;
}

int h_count_event_where(const char *path, const char *event, ...)
{
    const char *pairs[2 * 8];
    size_t n = 0;
    va_list ap;
    va_start(ap, event);
    for (const char *key; (key = va_arg(ap, const char *)) != NULL;) {
        ck_assert_msg(n < sizeof(pairs) / sizeof(pairs[0]), "h_count_event_where: too many fields");
        pairs[n++] = key;
        pairs[n++] = va_arg(ap, const char *);
    }
    va_end(ap);
    char *text = h_read_file(path);
    if (text == NULL)
        return 0;
    int count = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        bool all = has_field(line, "event", event);
        for (size_t i = 0; all && i < n; i += 2)
            all = has_field(line, pairs[i], pairs[i + 1]);
        count += all;
    }
    free(text);
    return count;
}

int h_count_outcomes(const char *path, const char *outcome, const char *reason)
{
    return reason == NULL
        ? h_count_event_where(path, SK_EVENT_OUTCOME, "outcome", outcome, NULL)
        : h_count_event_where(path, SK_EVENT_OUTCOME, "outcome", outcome, "reason", reason,
                              NULL);
}

int h_count_deaths(const char *path, const char *key, const char *value)
{
    return h_count_event_where(path, SK_EVENT_WORKER_DIED, "role", "supervisor", key, value,
                               NULL);
}

void h_publish_raw(struct sk_broker *b, const char *queue, const char *message_id,
                   const char *type, const struct sk_header *headers, size_t n_headers,
                   const void *body, size_t body_len)
{
    amqp_envelope_t env;
    memset(&env, 0, sizeof(env));
    amqp_basic_properties_t *p = &env.message.properties;
    if (message_id != NULL) {
        p->_flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
        p->message_id = amqp_cstring_bytes(message_id);
    }
    if (type != NULL) {
        p->_flags |= AMQP_BASIC_TYPE_FLAG;
        p->type = amqp_cstring_bytes(type);
    }
    env.message.body.bytes = (void *)body;
    env.message.body.len = body_len;
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_republish(b, queue, &env, headers, n_headers, &err) == SK_OK,
                  "publish to %s: %s", queue, err.msg);
}

bool h_get(struct sk_broker *b, const char *queue, amqp_message_t *msg)
{
    struct sk_err err = { 0 };
    int rc = sk_broker_get(b, queue, msg, &err);
    ck_assert_msg(rc == SK_OK || rc == SK_BUSY, "basic.get from %s: %s", queue, err.msg);
    return rc == SK_OK;
}

static const amqp_field_value_t *header(const amqp_message_t *msg, const char *key)
{
    const amqp_basic_properties_t *p = &msg->properties;
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return NULL;
    for (int i = 0; i < p->headers.num_entries; i++)
        if (p->headers.entries[i].key.len == strlen(key) &&
            memcmp(p->headers.entries[i].key.bytes, key, strlen(key)) == 0)
            return &p->headers.entries[i].value;
    return NULL;
}

const char *h_header_text(const amqp_message_t *msg, const char *key, char *buf, size_t size)
{
    const amqp_field_value_t *v = header(msg, key);
    buf[0] = '\0';
    if (v != NULL && v->kind == AMQP_FIELD_KIND_UTF8)
        snprintf(buf, size, "%.*s", (int)v->value.bytes.len, (const char *)v->value.bytes.bytes);
    return buf;
}

int64_t h_header_int(const amqp_message_t *msg, const char *key)
{
    const amqp_field_value_t *v = header(msg, key);
    if (v == NULL)
        return -1;
    switch (v->kind) {
    case AMQP_FIELD_KIND_I64: return v->value.i64;
    case AMQP_FIELD_KIND_I32: return v->value.i32;
    case AMQP_FIELD_KIND_U32: return v->value.u32;
    case AMQP_FIELD_KIND_I16: return v->value.i16;
    case AMQP_FIELD_KIND_U8:  return v->value.u8;
    default: return -1;
    }
}

bool h_redis_exists(const char *key)
{
    redisContext *redis = redisConnect("127.0.0.1", redis_port);
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect to port %d failed",
                  redis_port);
    redisReply *reply = redisCommand(redis, "EXISTS %s", key);
    bool exists = reply != NULL && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
    freeReplyObject(reply);
    redisFree(redis);
    return exists;
}

pid_t h_publish_stalled(struct h_run *r, const char *message_id, const char *key,
                        const char *body)
{
    h_publish(r->b, r->queue, "test", message_id, key, NULL, body);
    H_WAIT(h_stalled_pid(r->dir) != 0, 20000, "the handler never reached its stall point (%s)",
           message_id);
    return h_stalled_pid(r->dir);
}

pid_t h_stalled_pid(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    pid_t pid = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "stall.", 6) == 0)
            pid = (pid_t)atol(e->d_name + 6);
    closedir(d);
    return pid;
}

bool h_process_gone(pid_t pid)
{
    return kill(pid, 0) != 0 && errno == ESRCH;
}

/* Lines of `rabbitmqctl list_connections port ssl peer_cert_subject` that
 * are on the TLS port, TLS, with the client certificate (CN=sekali). */
static int amqp_tls_connections(void)
{
    char cmd[600], want[64], line[1024];
    snprintf(cmd, sizeof(cmd), "\"%s\" -q list_connections port ssl peer_cert_subject 2>&1",
             require_env("SEKALI_RABBITMQCTL"));
    snprintf(want, sizeof(want), "%s\ttrue\t", getenv("SEKALI_AMQP_TLS_PORT"));
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = 0;
    while (fgets(line, sizeof(line), p) != NULL)
        n += strncmp(line, want, strlen(want)) == 0 && strstr(line, "CN=sekali") != NULL;
    pclose(p);
    return n;
}

/* Redis's own view (CLIENT LIST, asked on the plain port): the clients
 * logged in as sekali_acl, and how many of them came in on the tls-port. */
static void redis_acl_clients(int *all, int *on_tls)
{
    char want_port[48];
    snprintf(want_port, sizeof(want_port), "laddr=127.0.0.1:%s ",
             getenv("SEKALI_REDIS_TLS_PORT"));
    redisContext *redis = redisConnect("127.0.0.1", redis_port);
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect to port %d failed",
                  redis_port);
    redisReply *reply = redisCommand(redis, "CLIENT LIST");
    ck_assert_msg(reply != NULL && reply->type == REDIS_REPLY_STRING, "redis CLIENT LIST failed");
    *all = *on_tls = 0;
    char *save = NULL;
    for (char *line = strtok_r(reply->str, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        if (strstr(line, " user=sekali_acl ") == NULL)
            continue;
        (*all)++;
        *on_tls += strstr(line, want_port) != NULL;
    }
    freeReplyObject(reply);
    redisFree(redis);
}

/* SEKALI_TEST_TLS=1: the servers' own view proves sekalid's links are TLS
 * (a config that silently fell back to clear text would pass every other
 * assertion). amqp_at_least, pg_at_least and redis_at_least are how many
 * connections RabbitMQ, PostgreSQL and Redis must show: the workers once
 * they consume (none on Redis for a queue with lock: false); at the end
 * RabbitMQ's consumers, and 0 for the others, as a worker may not have
 * met a restarted server again yet. None may be clear text, ever. */
static void expect_tls_links(struct h_run *r, int amqp_at_least, int pg_at_least,
                             int redis_at_least)
{
    if (!h_test_tls())
        return;
    if (amqp_at_least > 0) {
        int amqp = amqp_tls_connections();
        ck_assert_msg(amqp >= amqp_at_least, "RabbitMQ should list %d TLS connections with the "
                      "client certificate on port %s, has %d", amqp_at_least,
                      getenv("SEKALI_AMQP_TLS_PORT"), amqp);
    }
    long long pg_tls = h_pg_count(r->pg, "SELECT count(*) FROM pg_stat_ssl s JOIN "
                                         "pg_stat_activity a USING (pid) WHERE a.usename = "
                                         "'sekali_tls' AND s.ssl");
    long long pg_clear = h_pg_count(r->pg, "SELECT count(*) FROM pg_stat_ssl s JOIN "
                                           "pg_stat_activity a USING (pid) WHERE a.usename = "
                                           "'sekali_tls' AND NOT s.ssl");
    ck_assert_msg(pg_tls >= pg_at_least && pg_clear == 0, "PostgreSQL should list at least "
                  "%d sekali_tls backends, all TLS: %lld TLS, %lld clear", pg_at_least, pg_tls,
                  pg_clear);
    int all, on_tls;
    redis_acl_clients(&all, &on_tls);
    ck_assert_msg(all >= redis_at_least && on_tls == all, "Redis should list at least %d "
                  "sekali_acl clients, all on the tls-port: %d of %d are", redis_at_least,
                  on_tls, all);
}

void h_run_open(struct h_run *r, const char *name)
{
    h_init();
    memset(r, 0, sizeof(*r));
    h_unique_name(r->queue, sizeof(r->queue), name);
    snprintf(r->dead, sizeof(r->dead), "%s.dead", r->queue);
    r->dir = h_tmpdir(name);
    snprintf(r->log, sizeof(r->log), "%s/sekalid.log", r->dir);
    snprintf(r->mark, sizeof(r->mark), "%s/failpoint.mark", r->dir);
    r->pg = h_pg();
    r->b = h_broker();
}

void h_run_start(struct h_run *r, const struct h_run_opts *o)
{
    ck_assert_msg(o->workers >= 1, "h_run_start: %d workers", o->workers);
    r->config = h_write_config_top(r->dir, r->queue, o->handler != NULL ? o->handler : H_EFFECT,
                                   o->workers, o->queue_yaml, o->top_yaml);
    if (o->heartbeat != NULL) {
        char line[64];
        snprintf(line, sizeof(line), "heartbeat: %s", o->heartbeat);
        h_config_replace(r->config, "heartbeat: 30s", line);
    }
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, o->shape, NULL), SK_OK);

    char mark_env[1100];
    snprintf(mark_env, sizeof(mark_env), "SEKALI_FAILPOINT_MARK=%s", r->mark);
    const char *env[16];
    size_t n = 0;
    for (const char *const *e = o->env; e != NULL && *e != NULL; e++) {
        ck_assert_uint_lt(n, SK_ARRAY_LEN(env) - 2);
        env[n++] = *e;
    }
    env[n++] = mark_env;
    env[n] = NULL;
    r->sekalid = h_start_sekalid(o->binary != NULL ? o->binary : "sekalid", r->config, r->dir,
                                 env);
    if (o->held)
        return;
    H_WAIT(h_consumers(r->b, r->queue) == (uint32_t)o->workers, 20000,
           "%d workers should consume %s, have %u", o->workers, r->queue,
           h_consumers(r->b, r->queue));
    bool locks = o->queue_yaml == NULL || strstr(o->queue_yaml, "lock: false") == NULL;
    expect_tls_links(r, o->workers, o->workers, locks ? o->workers : 0);
}

void h_run_stop(struct h_run *r)
{
    /* After an outage the reconnects were new handshakes: every consumer
     * RabbitMQ has for the queue must be one of sekalid's TLS connections. */
    expect_tls_links(r, h_test_tls() && r->b != NULL ? (int)h_consumers(r->b, r->queue) : 0, 0,
                     0);
    h_stop_sekalid(r->sekalid, r->dir);
    ck_assert_int_eq(h_queue_depth(r->b, r->queue), 0);
}

void h_run_close(struct h_run *r)
{
    sk_broker_close(r->b);
    PQfinish(r->pg);
    free(r->config);
    free(r->dir);
}

long long h_effects(const struct h_run *r, const char *key)
{
    if (key == NULL)
        return h_pg_count(r->pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s'",
                          r->queue);
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali_test.effects WHERE queue = '%s' "
                             "AND idempotency_key = '%s'", r->queue, key);
}

long long h_effect_keys(const struct h_run *r)
{
    return h_pg_count(r->pg, "SELECT count(DISTINCT idempotency_key) FROM sekali_test.effects "
                             "WHERE queue = '%s'", r->queue);
}

/* Keys of r's queue in that status. */
static long long keys_in(const struct h_run *r, const char *status)
{
    return h_pg_count(r->pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = '%s' "
                             "AND status = '%s'", r->queue, status);
}

long long h_completed(const struct h_run *r)
{
    return keys_in(r, "completed");
}

long long h_duplicates(const struct h_run *r)
{
    return h_pg_count(r->pg, "SELECT coalesce(sum(duplicates), 0) FROM sekali.idempotency_keys "
                             "WHERE queue = '%s'", r->queue);
}

long long h_failed(const struct h_run *r)
{
    return keys_in(r, "failed");
}

const char *h_key_status(const struct h_run *r, const char *key, char *buf, size_t size)
{
    PGresult *res = PQexecParams(r->pg, "SELECT status FROM sekali.idempotency_keys "
                                        "WHERE queue = $1 AND key = $2", 2, NULL,
                                 (const char *[]){ r->queue, key }, NULL, NULL, 0);
    snprintf(buf, size, "%s", PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "absent");
    PQclear(res);
    return buf;
}

void h_expect_once(struct h_run *r, long long keys, long long dups)
{
    long long effects = h_effects(r, NULL), distinct = h_effect_keys(r);
    ck_assert_msg(effects == keys, "expected %lld effects on %s, have %lld", keys, r->queue,
                  effects);
    ck_assert_msg(distinct == keys, "expected %lld keys with an effect, have %lld (%lld "
                  "effects: some key ran twice)", keys, distinct, effects);
    if (dups != H_ANY_DUPS) {
        long long d = h_duplicates(r);
        ck_assert_msg(d == dups, "expected %lld duplicates, have %lld", dups, d);
    }
    /* A test that closed its broker connection before an outage. */
    if (r->b == NULL)
        r->b = h_broker();
    uint32_t depth = h_queue_depth(r->b, r->queue);
    ck_assert_msg(depth == 0, "%s should be empty, holds %u", r->queue, depth);
}

char *h_scrape(int port)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "curl -sf --max-time 10 http://127.0.0.1:%d/metrics", port);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char *text = read_all(p);
    if (pclose(p) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

double h_metric_value(const char *text, const char *series)
{
    size_t len = strlen(series);
    for (const char *p = text; (p = strstr(p, series)) != NULL; p += len)
        if ((p == text || p[-1] == '\n') && p[len] == ' ')
            return strtod(p + len + 1, NULL);
    return -1;
}

double h_metric(int port, const char *series_fmt, ...)
{
    char series[512];
    va_list ap;
    va_start(ap, series_fmt);
    vsnprintf(series, sizeof(series), series_fmt, ap);
    va_end(ap);
    char *text = h_scrape(port);
    if (text == NULL)
        return -1;
    double v = h_metric_value(text, series);
    free(text);
    return v;
}

size_t h_children(pid_t parent, pid_t *out, size_t max)
{
    size_t n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d != NULL && n < max && (e = readdir(d)) != NULL) {
        long pid = atol(e->d_name);
        if (pid <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "re");
        if (f == NULL)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        /* pid (comm) state ppid: comm may hold spaces, so after the last ')'. */
        const char *rp = strrchr(buf, ')');
        char state;
        long ppid;
        if (rp != NULL && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent &&
            state != 'Z')
            out[n++] = (pid_t)pid;
    }
    if (d != NULL)
        closedir(d);
    return n;
}

int h_sekalictl(struct h_run *r, char **out, const char *const *args)
{
    return h_sekalictl_as(r, "sekalictl", NULL, out, args);
}

int h_sekalictl_as(struct h_run *r, const char *binary, const char *const *env, char **out,
                   const char *const *args)
{
    char path[1100], exe[1100];
    snprintf(path, sizeof(path), "%s/ctl.out", r->dir);
    snprintf(exe, sizeof(exe), "%s/%s", h_build_dir(), binary);
    const char *argv[32] = { exe, "-c", r->config };
    size_t n = 3;
    for (; *args != NULL; args++) {
        ck_assert_msg(n < 31, "h_sekalictl_as: too many arguments");
        argv[n++] = *args;
    }
    argv[n] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0)
            _exit(127);
        for (; env != NULL && *env != NULL; env++)
            putenv((char *)*env);
        execv(exe, (char **)argv);
        _exit(127);
    }
    int status = h_wait_exit(pid, 60000, binary);
    *out = h_read_file(path);
    ck_assert_ptr_nonnull(*out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

char *h_header_filling(const char *message_id, const char *key, size_t frame)
{
    /* frame overhead 20, flags 2, message_id 1 + n, type 1 + 4, delivery
     * mode 1, headers length 4, entry: key 1 + n, kind 1, length 4 */
    size_t fixed = 20 + 2 + 1 + strlen(message_id) + 5 + 1 + 4 + 1 + strlen(key) + 1 + 4;
    ck_assert_uint_gt(frame, fixed);
    size_t len = frame - fixed;
    char *value = malloc(len + 1);
    ck_assert_ptr_nonnull(value);
    memset(value, 'h', len);
    value[len] = '\0';
    return value;
}

void h_faketime_preload(char *buf, size_t size)
{
    const char *lib = getenv("SEKALI_FAKETIME");
    glob_t g = { 0 };
    if (lib == NULL &&
        glob("/usr/lib/*/faketime/libfaketime.so.1", 0, NULL, &g) != 0 &&
        glob("/usr/lib/faketime/libfaketime.so.1", 0, NULL, &g) != 0 &&
        glob("/usr/local/lib/faketime/libfaketime.so.1", 0, NULL, &g) != 0)
        ck_abort_msg("libfaketime.so.1 not found under /usr/lib/*/faketime/: install "
                     "libfaketime, or set SEKALI_FAKETIME to its path");
    if (lib == NULL)
        lib = g.gl_pathv[0];
    ck_assert_msg(access(lib, R_OK) == 0, "%s is not readable", lib);
    snprintf(buf, size, "LD_PRELOAD=%s", lib);
    globfree(&g);
}
