/* bench_loop.c - the hand-written loop, end to end: what a team would write
 * for this one job without sekali, as the baseline that tests/bench/run.sh
 * holds sekali's jobs/s and CPU per job against (issue 25's "minimal
 * hand-written C consume-lock-commit-ack loop").
 *
 *   bench_loop [ANYTHING ...]     (run by bench_sekalid in sekalid's place)
 *
 * Settings come from the environment, since bench_sekalid passes sekalid's
 * arguments (-c CONF), which this ignores: SEKALI_AMQP_URL,
 * SEKALI_REDIS_PORT (on 127.0.0.1), SEKALI_PG_CONNINFO (as tests/servers.sh
 * exports them), BENCH_LOOP_QUEUE, BENCH_LOOP_WORKERS and
 * BENCH_LOOP_PREFETCH [10, sekali's prefetch at batch 1].
 *
 * Forks one process per worker, like sekalid; each keeps one connection to
 * each server and, per delivery of the queue's jobs (tests/bench/bench_amqp.c
 * publishes them, message_id the key, the body the publish time):
 *   1. SET NX PX on the key's lock in Redis (a busy lock: the delivery goes
 *      back to the queue);
 *   2. BEGIN; INSERT the key into sekali_bench.loop_keys ON CONFLICT DO
 *      NOTHING (the idempotency proof: a redelivery inserts nothing); if it
 *      was new, the effect, the same INSERT into sekali_bench.jobs as
 *      tests/bench/bench_handler.c's; COMMIT (synchronous_commit on, as
 *      sekali raises it);
 *   3. basic.ack;
 *   4. the lock released by compare-and-delete (a plain DEL could free
 *      another owner's lock after ours expired).
 * Each step is its own round trip, as such a loop is usually written: no
 * retries, delay queues, dead letters, fences, leases, heartbeats, metrics
 * or cancel checks. That is what sekali costs over it.
 *
 * SIGTERM (bench_sekalid's stop): each worker finishes the job in hand and
 * exits; the parent waits for them and exits 0. A failure exits 1, saying
 * why on stderr. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "amqp_lib.h"
#include <hiredis.h>
#include <libpq-fe.h>

#define LOCK_TTL_MS "30000"
#define UNLOCK_LUA  "if redis.call('get', KEYS[1]) == ARGV[1] then " \
                    "return redis.call('del', KEYS[1]) else return 0 end"

static volatile sig_atomic_t stopping;

static void on_term(int sig)
{
    (void)sig;
    stopping = 1;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench_loop[%d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        die("%s is not set", name);
    return v;
}

static void amqp_ok(amqp_connection_state_t conn, const char *what)
{
    amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
    if (r.reply_type != AMQP_RESPONSE_NORMAL)
        die("%s failed (reply type %d)", what, (int)r.reply_type);
}

static amqp_connection_state_t consume(const char *url, const char *queue, int prefetch)
{
    char *copy = strdup(url);
    struct amqp_connection_info info;
    if (copy == NULL || amqp_parse_url(copy, &info) != AMQP_STATUS_OK)
        die("cannot parse SEKALI_AMQP_URL");
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *socket = amqp_tcp_socket_new(conn);
    if (socket == NULL || amqp_socket_open(socket, info.host, info.port) != AMQP_STATUS_OK)
        die("cannot connect to RabbitMQ at %s:%d", info.host, info.port);
    amqp_rpc_reply_t login = amqp_login(conn, info.vhost, 0, 131072, 30,
                                        AMQP_SASL_METHOD_PLAIN, info.user, info.password);
    if (login.reply_type != AMQP_RESPONSE_NORMAL)
        die("RabbitMQ login failed");
    amqp_channel_open(conn, 1);
    amqp_ok(conn, "channel.open");
    amqp_basic_qos(conn, 1, 0, (uint16_t)prefetch, 0);
    amqp_ok(conn, "basic.qos");
    amqp_basic_consume(conn, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    amqp_ok(conn, "basic.consume");
    free(copy);
    return conn;
}

static void prepare(PGconn *pg, const char *name, const char *sql, int n_params)
{
    PGresult *res = PQprepare(pg, name, sql, n_params, NULL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        die("PQprepare %s: %s", name, PQresultErrorMessage(res));
    PQclear(res);
}

static PGconn *connect_pg(const char *conninfo)
{
    PGconn *pg = PQconnectdb(conninfo);
    if (PQstatus(pg) != CONNECTION_OK)
        die("PostgreSQL: %s", PQerrorMessage(pg));
    PGresult *res = PQexec(pg, "SET synchronous_commit = on");
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        die("SET synchronous_commit: %s", PQresultErrorMessage(res));
    PQclear(res);
    prepare(pg, "begin", "BEGIN", 0);
    prepare(pg, "key", "INSERT INTO sekali_bench.loop_keys (queue, key) VALUES ($1, $2) "
                       "ON CONFLICT DO NOTHING", 2);
    prepare(pg, "effect", "INSERT INTO sekali_bench.jobs (queue, key, published_us, committed) "
                          "VALUES ($1, $2, $3, clock_timestamp())", 3);
    prepare(pg, "commit", "COMMIT", 0);
    return pg;
}

/* One prepared statement; returns the rows it affected. */
static long run(PGconn *pg, const char *name, int n, const char *const *values)
{
    PGresult *res = PQexecPrepared(pg, name, n, values, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        die("%s: %s", name, PQresultErrorMessage(res));
    long rows = atol(PQcmdTuples(res));
    PQclear(res);
    return rows;
}

static void reply_ok(redisReply *r, const char *what)
{
    if (r == NULL || r->type == REDIS_REPLY_ERROR)
        die("redis %s failed: %s", what, r != NULL ? r->str : "no reply");
}

/* One delivery, the four steps of the file's comment. */
static void handle(amqp_connection_state_t conn, redisContext *redis, PGconn *pg,
                   const char *queue, const amqp_envelope_t *env)
{
    char key[256], published[24] = "0", lock[400], token[64];
    const amqp_basic_properties_t *p = &env->message.properties;
    if (!(p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) || p->message_id.len >= sizeof(key))
        die("a delivery without a usable message_id");
    memcpy(key, p->message_id.bytes, p->message_id.len);
    key[p->message_id.len] = '\0';
    const amqp_bytes_t *body = &env->message.body;
    if (body->len > 0 && body->len < sizeof(published)) {
        memcpy(published, body->bytes, body->len);
        published[body->len] = '\0';
    }
    snprintf(lock, sizeof(lock), "loop:lock:%s:%s", queue, key);
    snprintf(token, sizeof(token), "%d-%" PRIu64, (int)getpid(), env->delivery_tag);

    redisReply *r = redisCommand(redis, "SET %s %s NX PX " LOCK_TTL_MS, lock, token);
    reply_ok(r, "SET NX");
    bool locked = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!locked) {
        amqp_basic_reject(conn, 1, env->delivery_tag, 1);
        return;
    }
    const char *kv[] = { queue, key, published };
    run(pg, "begin", 0, NULL);
    if (run(pg, "key", 2, kv) == 1)
        run(pg, "effect", 3, kv);
    run(pg, "commit", 0, NULL);
    if (amqp_basic_ack(conn, 1, env->delivery_tag, 0) != AMQP_STATUS_OK)
        die("basic.ack failed");
    r = redisCommand(redis, "EVAL %s 1 %s %s", UNLOCK_LUA, lock, token);
    reply_ok(r, "unlock");
    freeReplyObject(r);
}

static void worker(const char *queue, int prefetch)
{
    amqp_connection_state_t conn = consume(env("SEKALI_AMQP_URL"), queue, prefetch);
    struct timeval connect_timeout = { .tv_sec = 5 };
    redisContext *redis = redisConnectWithTimeout("127.0.0.1", atoi(env("SEKALI_REDIS_PORT")),
                                                  connect_timeout);
    if (redis == NULL || redis->err)
        die("cannot connect to Redis: %s", redis != NULL ? redis->errstr : "out of memory");
    PGconn *pg = connect_pg(env("SEKALI_PG_CONNINFO"));
    while (!stopping) {
        amqp_envelope_t envelope;
        struct timeval wait = { .tv_usec = 100 * 1000 };  /* to see SIGTERM */
        amqp_maybe_release_buffers(conn);
        amqp_rpc_reply_t r = amqp_consume_message(conn, &envelope, &wait, 0);
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_TIMEOUT)
            continue;
        if (r.reply_type != AMQP_RESPONSE_NORMAL)
            die("consuming %s failed", queue);
        handle(conn, redis, pg, queue, &envelope);
        amqp_destroy_envelope(&envelope);
    }
    PQfinish(pg);
    redisFree(redis);
    amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
}

int main(void)
{
    const char *queue = env("BENCH_LOOP_QUEUE");
    int workers = atoi(env("BENCH_LOOP_WORKERS"));
    const char *prefetch_env = getenv("BENCH_LOOP_PREFETCH");
    int prefetch = prefetch_env != NULL && *prefetch_env != '\0' ? atoi(prefetch_env) : 10;
    if (workers < 1 || prefetch < 1 || prefetch > 65535)
        die("BENCH_LOOP_WORKERS and BENCH_LOOP_PREFETCH must be positive");
    struct sigaction sa = { .sa_handler = on_term };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    pid_t *pids = calloc((size_t)workers, sizeof(*pids));
    if (pids == NULL)
        die("out of memory");
    for (int i = 0; i < workers; i++) {
        pids[i] = fork();
        if (pids[i] < 0)
            die("fork: %s", strerror(errno));
        if (pids[i] == 0) {
            /* A worker only polls the flag between deliveries: its calls
             * into the three clients are restarted, never cut short. */
            sa.sa_flags = SA_RESTART;
            sigaction(SIGTERM, &sa, NULL);
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            worker(queue, prefetch);
            _exit(0);
        }
    }
    int failed = 0;
    for (int left = workers; left > 0;) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0 && errno == EINTR) {
            if (stopping)
                for (int i = 0; i < workers; i++)
                    kill(pids[i], SIGTERM);
            continue;
        }
        if (pid < 0)
            die("waitpid: %s", strerror(errno));
        left--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed = 1;
    }
    free(pids);
    return failed;
}
