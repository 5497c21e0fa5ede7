/* harness.h - what the integration and fault suites share: the servers that
 * tests/servers.sh started, sekalid as a child process, and bounded waits.
 *
 * Nothing here fakes a server. Every wait polls a real observable (a row
 * count, a queue depth, a file, a process) and fails the test with a message
 * when its deadline passes; under valgrind or ASan deadlines stretch.
 *
 * The one header the suites include. Its definitions are in one file per
 * responsibility, tests/harness_*.c (tests/README.md lists them); what
 * those files share with each other only is in harness_private.h. */
#ifndef SK_HARNESS_H
#define SK_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <check.h>
#include <libpq-fe.h>

#include "broker.h"
#include "config.h"
#include "log.h"    /* SK_EVENT_* and SK_SERVER_*, for h_count_events() */
#include "suite.h"

/* harness_env.c: the environment, time and names. */

/* Reads the SEKALI_* settings exported by tests/run.sh; aborts the test
 * with a pointer to tests/servers.sh if they are missing. */
void h_init(void);

const char *h_build_dir(void);
const char *h_amqp_url(void);
const char *h_pg_conninfo(void);
int         h_redis_port(void);

/* Timeouts are written for a plain build; this factor stretches them under
 * valgrind and sanitizers. */
int h_ms(int ms);

/* Polls `cond` every 20 ms until true, or fails the test after timeout_ms
 * with the message, which should say what was expected and what was seen. */
#define H_WAIT(cond, timeout_ms, ...)                                          \
    do {                                                                       \
        int64_t h_deadline_ = h_now_ms() + h_ms(timeout_ms);                   \
        while (!(cond)) {                                                      \
            if (h_now_ms() > h_deadline_)                                      \
                ck_abort_msg(__VA_ARGS__);                                     \
            h_nap();                                                           \
        }                                                                      \
    } while (0)

int64_t h_now_ms(void);
void    h_nap(void);

/* A fresh directory for one test's files; the caller frees the string. */
char *h_tmpdir(const char *name);

/* A queue name unique to this run, so tests never see each other's jobs. */
void h_unique_name(char *out, size_t size, const char *prefix);

/* A loopback TCP port that was free a moment ago (bound to port 0, then
 * closed), for a listener the test starts: sekalid's metrics, Prometheus. */
int h_free_port(void);

/* The batch every transactional queue's config asks for: SEKALI_TEST_BATCH,
 * so that a suite can be rerun at batch 1 or N; 0 when unset: no batch key,
 * sekali's default (batching up to the harness's prefetch of 4). */
int h_test_batch(void);

/* SEKALI_TEST_TLS=1 reruns a suite over TLS: every config the harness
 * writes reaches the three servers over TLS (the listeners of
 * SEKALI_TLS=1 tests/servers.sh start), and h_run_start()/h_run_stop()
 * assert from the servers' side that sekalid's connections are TLS. */
bool h_test_tls(void);

/* "LD_PRELOAD=<libfaketime>" into buf, for h_start_sekalid()'s extra_env
 * next to FAKETIME=+10m: SEKALI_FAKETIME if set, else where the libfaketime
 * package puts it (Debian: /usr/lib/<multiarch>/faketime/). Fails the test
 * when it is not installed. */
void h_faketime_preload(char *buf, size_t size);

/* harness_run.c: one test's sekalid. */

/* One test's sekalid on a queue of its own, with the connections the test
 * checks it through. Fields are for the test to read; a test that restarts
 * a server may replace pg or b with a new connection (h_pg(), h_broker()). */
struct h_run {
    char              queue[128];  /* unique to this run: keys never collide */
    char              dead[160];   /* <queue>.dead */
    char             *dir;         /* the test's files: config, logs, marks */
    char              log[1024];   /* dir/sekalid.log */
    char              mark[1024];  /* dir/failpoint.mark: written where a failpoint fired */
    char             *config;      /* dir/sekali.yaml, once written */
    PGconn           *pg;
    struct sk_broker *b;
    pid_t             sekalid;
};

/* How h_run_start() configures and starts sekalid. Zeroed fields take the
 * defaults, so callers name only what their test is about. */
struct h_run_opts {
    const char                  *binary;      /* under the build dir; NULL: "sekalid" */
    const char                  *handler;     /* under the build dir; NULL: H_EFFECT */
    int                          workers;     /* of the queue: at least 1 */
    const char                  *queue_yaml;  /* as h_write_config_top()'s extra_queue_yaml */
    const char                  *top_yaml;    /* as its extra_top_yaml */
    const char                  *heartbeat;   /* amqp.heartbeat, e.g. "1s"; NULL: 30s */
    const char *const           *env;         /* NAME=VALUE list for sekalid, NULL-terminated */
    const struct sk_queue_shape *shape;       /* the queue's declared shape; NULL: classic */
    bool                         held;        /* its workers will not consume (a handler
                                               * that cannot run): no wait for them */
    bool                         markers;     /* queue_yaml gets the test handler's
                                               * marker_dir: r->dir (h_publish_stalled) */
};

/* h_init(), then names the run's queue after name, makes its directory and
 * opens a PostgreSQL connection and a publishing broker connection.
 * Nothing is declared or started yet: a test may set up tables or files in
 * r->dir first. Release with h_run_close(). */
void h_run_open(struct h_run *r, const char *name);

/* Writes the config, declares the queue, starts sekalid and waits until
 * every worker consumes. sekalid runs with SEKALI_FAILPOINT_MARK=r->mark,
 * so a fault test only arms its failpoint and can prove it fired. */
void h_run_start(struct h_run *r, const struct h_run_opts *o);

/* Stops sekalid cleanly (h_stop_sekalid()) and asserts the queue is empty:
 * after a clean stop anything unacked would be back in it. The connections
 * stay open for the test's last checks. */
void h_run_stop(struct h_run *r);

/* Closes the connections and frees what h_run_open() and h_run_start()
 * took; it does not stop sekalid. */
void h_run_close(struct h_run *r);

/* Publishes a test job (message_id, key, body: "stall" or "pay" make the
 * test handler stall, tests/plugins/effect.c) and waits until a worker's
 * handler stalls in it; returns that worker's pid. The queue's config must
 * set marker_dir to r->dir (h_run_opts.markers). */
pid_t h_publish_stalled(struct h_run *r, const char *message_id, const char *key,
                        const char *body);

/* Waits up to timeout_ms for the failpoint point to have fired n times
 * (n lines in r->mark), then for each process it marked to be gone.
 * Returns the last marked pid. */
pid_t h_wait_marked_deaths(const struct h_run *r, const char *point, int n, int timeout_ms);
/* Takes a dead letter from r->dead, which must hold one, and checks that
 * its x-sekali-reason is reason. */
void h_expect_dead_reason(struct h_run *r, const char *reason);

/* For h_expect_once()'s dups: the test does not know how many copies
 * became duplicates (a crash may or may not have left one). */
#define H_ANY_DUPS (-1)

/* The exactly-once verdict, once sekalid has stopped: `keys` effects on
 * `keys` distinct keys (none twice), `dups` duplicates (unless H_ANY_DUPS),
 * and r's queue empty. Fails the test naming the first count that is off. */
void h_expect_once(struct h_run *r, long long keys, long long dups);

/* harness_config.c: the configs the harness writes. */

/* The test handler (tests/plugins/effect.c), as h_write_config() takes it. */
#define H_EFFECT       "tests/plugins/effect.so"
/* Queue settings that retry at once and give up after the third attempt. */
#define H_FAST_RETRIES "    retry:\n      max_attempts: 3\n      initial: 10ms\n      max: 50ms\n"
/* One outbox relay that polls often, so scheduled jobs are not kept waiting. */
#define H_RELAY        "outbox:\n  relays: 1\n  poll_interval: 200ms\n"

/* Writes a sekalid config for one queue into dir and returns its path
 * (caller frees). handler is a path under the build dir, e.g.
 * "tests/plugins/effect.so". extra_queue_yaml is appended to the queue's
 * mapping (indented lines), or NULL. */
char *h_write_config(const char *dir, const char *queue, const char *handler, int workers,
                     const char *extra_queue_yaml);

/* As h_write_config(), with extra_top_yaml (whole top-level sections, e.g.
 * "metrics:\n  listen: ...\n") written before queues:, or NULL. */
char *h_write_config_top(const char *dir, const char *queue, const char *handler, int workers,
                         const char *extra_queue_yaml, const char *extra_top_yaml);

/* Replaces the first `from` in the config file at path by `to` (e.g. the
 * amqp heartbeat the harness writes, "heartbeat: 30s"). */
void h_config_replace(const char *path, const char *from, const char *to);

/* harness_proc.c: sekalid, sekalictl and their children. */

/* Starts sekalid (binary relative to the build dir, e.g. "sekalid" or
 * "fault/sekalid") with stderr to dir/sekalid.log. extra_env is a
 * NULL-terminated list of NAME=VALUE, or NULL. */
pid_t h_start_sekalid(const char *binary, const char *config, const char *dir,
                      const char *const *extra_env);

/* Waits up to timeout_ms for pid to exit and returns its wait status, or
 * fails the test. */
int h_wait_exit(pid_t pid, int timeout_ms, const char *what);

/* SIGTERM, then asserts a clean exit 0 within the timeout; under valgrind,
 * also asserts that no process reported an error. */
void h_stop_sekalid(pid_t pid, const char *dir);

/* A program a suite runs and reads (h_spawn()): build/<binary> ("sekalictl",
 * "fault/sekalictl") with args after argv[0] (NULL-terminated, at most
 * H_SPAWN_ARGS) and env's NAME=VALUE (NULL-terminated, or NULL) added, its
 * stdin /dev/null. stdout goes to the file out and stderr to err (each
 * truncated; the same path: both in one file; NULL: the test's own). */
struct h_spawn {
    const char        *binary;
    const char *const *args;
    const char *const *env;
    const char        *out, *err;
};
enum { H_SPAWN_ARGS = 30, H_SPAWN_READ_MAX = 4 << 20 };

/* Starts it and returns its pid, for h_wait_exit() (or h_spawn_wait()). */
pid_t h_spawn_start(const struct h_spawn *sp);

/* Waits for pid, started by h_spawn_start(sp), up to timeout_ms (or fails
 * the test naming sp->binary and where its output is); then *out and *err,
 * each NULL or not asked for, get the first H_SPAWN_READ_MAX bytes of the
 * files sp->out and sp->err (the caller frees). Returns the exit code, or
 * 128 + the signal that ended it. */
int h_spawn_wait(const struct h_spawn *sp, pid_t pid, int timeout_ms, char **out, char **err);

/* Starts `sekalictl -c config serve`, its output into the file log, and
 * waits until its console listens; returns its pid (the test stops it). */
pid_t h_serve_console(const char *config, const char *log);

/* h_spawn_start() and h_spawn_wait() in one: runs it to its end. */
int h_spawn(const struct h_spawn *sp, int timeout_ms, char **out, char **err);

/* Runs `sekalictl -c r->config ARGS...` (args NULL-terminated, at most 28);
 * its stdout into *out (the caller frees; also in r->dir/ctl.out). Returns
 * its exit code, or 128 + the signal that ended it. */
int h_sekalictl(struct h_run *r, char **out, const char *const *args);

/* The same with the binary under the build dir ("fault/sekalictl") and a
 * NULL-terminated NAME=VALUE list added to its environment, or NULL. */
int h_sekalictl_as(struct h_run *r, const char *binary, const char *const *env, char **out,
                   const char *const *args);

/* The pid in the name of a dir/stall.<pid> file that the test handler
 * writes when it stalls (tests/plugins/effect.c), or 0 if there is none. */
pid_t h_stalled_pid(const char *dir);

/* The pids of parent's live children (sekalid's workers, relay and
 * janitor), up to max; returns how many. */
size_t h_children(pid_t parent, pid_t *out, size_t max);

/* A live worker child of sekalid (its comm is "sk-worker") other than not
 * (0 for any), or 0 if there is none. */
pid_t h_worker_pid(pid_t sekalid, pid_t not);

/* True once pid no longer exists (killed and reaped by its parent). */
bool h_process_gone(pid_t pid);

/* harness_pg.c: PostgreSQL, and what a run's jobs did there. */

/* PostgreSQL: a new connection (migrated schema and test tables ready). */
PGconn   *h_pg(void);
void      h_pg_exec(PGconn *pg, const char *sql);
long long h_pg_count(PGconn *pg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* sekali.enqueue(queue, 'test', 'ok', key, dedupe, NULL, run_at) on pg, in
 * whatever transaction pg is in; NULLs take the defaults (run_at: now).
 * Returns the job id, in a buffer the thread's next call overwrites. */
const char *h_enqueue(PGconn *pg, const char *queue, const char *key, const char *dedupe,
                      const char *run_at);
/* The same with another body (a behaviour of tests/plugins/effect.c). */
const char *h_enqueue_body(PGconn *pg, const char *queue, const char *body, const char *key,
                           const char *dedupe, const char *run_at);

/* What a run's jobs did, counted in PostgreSQL: the effects the test
 * handler (tests/plugins/effect.c) recorded in sekali_test.effects, and
 * sekali's idempotency keys, both on r's queue only. */

/* Effects recorded for key, or for the whole queue when key is NULL. */
long long h_effects(const struct h_run *r, const char *key);
/* Distinct idempotency keys that have an effect. */
long long h_effect_keys(const struct h_run *r);
/* Keys whose job completed (status 'completed'), archived ones too. */
long long h_completed(const struct h_run *r);
/* Duplicate deliveries absorbed, summed over the queue's keys. */
long long h_duplicates(const struct h_run *r);
/* Keys recorded failed (status 'failed'). */
long long h_failed(const struct h_run *r);
/* Keys of r's queue in sekali.finished_keys (sql/040): archived now. */
long long h_archived(const struct h_run *r);
/* Rows of r's queue that left sekali.finished_keys (sql/040): archived keys
 * a claim brought back (tests/data/effects.sql's trigger counts them). */
long long h_unarchived(const struct h_run *r);
/* The key's status in either table of keys (sql/040), or "absent", in buf. */
const char *h_key_status(const struct h_run *r, const char *key, char *buf, size_t size);

/* Puts n keys of r's queue, finished two hours ago, into the store, and
 * makes every DELETE of the queue's keys take at least slow_ms longer (a
 * slow database, on PostgreSQL's side) and write its start, end and rows
 * into sekali_test.key_purges (queue, started, ended, n): what a janitor
 * round over a backlog does, seen from the server. */
void h_pg_expired_backlog(const struct h_run *r, int n, int slow_ms);
/* Ends h_pg_expired_backlog()'s slowing of r's purges. */
void h_pg_expired_backlog_end(const struct h_run *r);

/* harness_broker.c: publishing to and reading the broker. */

/* Publishing on a confirm-mode connection of its own. */
struct sk_broker *h_broker(void);
void h_publish(struct sk_broker *b, const char *queue, const char *type, const char *message_id,
               const char *idempotency_key, const char *resource_key, const char *body);
uint32_t h_queue_depth(struct sk_broker *b, const char *queue);

/* Declares the durable queue name with exactly args (amqp_empty_table for
 * none), as another tool would, over a connection of its own: sk_broker
 * always adds sekali's arguments. */
void h_declare_as_foreign(const char *name, amqp_table_t args);

/* Publishes a message built field by field, for malformed input: absent
 * strings are left out, headers are added as given. */
void h_publish_raw(struct sk_broker *b, const char *queue, const char *message_id,
                   const char *type, const struct sk_header *headers, size_t n_headers,
                   const void *body, size_t body_len);

/* Takes one message from queue; false if it is empty. Free with
 * amqp_destroy_message(). */
bool h_get(struct sk_broker *b, const char *queue, amqp_message_t *msg);

/* A header of msg as text (into buf) or as a number; "" or -1 if absent. */
const char *h_header_text(const amqp_message_t *msg, const char *key, char *buf, size_t size);
int64_t     h_header_int(const amqp_message_t *msg, const char *key);
uint32_t h_consumers(struct sk_broker *b, const char *queue);

/* The frame size sekalid and the harness ask for, and RabbitMQ's default. */
#define H_FRAME_MAX 131072

/* A text header value that makes h_publish_raw()'s message (id, type
 * "test", one header named key) a header frame of exactly frame bytes.
 * The caller frees it. */
char *h_header_filling(const char *message_id, const char *key, size_t frame);

/* harness_servers.c: the servers seen from outside. */

/* Runs `tests/servers.sh COMMAND` (start, stop-redis, start-redis, ...)
 * quietly, failing the test if it fails: a fault test's server outage. */
void h_servers(const char *command);

/* The prefetch_count RabbitMQ has for queue's consumer (the last listed
 * when there are several), or -1 while it has none. */
int h_consumer_prefetch(const char *queue);
/* The messages of queue and of its delay queues (<queue>.delay.*), ready
 * or delivered and not yet acked, as RabbitMQ counts them (rabbitmqctl,
 * ~1 s): 0 once every copy is settled. Its dead letters do not count. */
long long h_in_flight(const char *queue);

/* Whether key exists in the test Redis (a lock being held, say). */
bool h_redis_exists(const char *key);

/* harness_logs.c: files, documents, log lines and events. */

/* Reads the whole file, or NULL if missing; the caller frees. */
char *h_read_file(const char *path);

/* The first ```lang fenced block of the document at path (README.md,
 * docs/guarantees.md: relative to the repository root, where tests run),
 * without its fences, or NULL; the caller frees. Tests run the documents'
 * examples exactly as written through it. */
char *h_doc_block(const char *path, const char *lang);

/* Number of lines of path containing needle. */
int h_count_lines(const char *path, const char *needle);

/* Number of sekalid's JSON log lines in path that carry the stable event
 * name `event` (SK_EVENT_*, log.h), written by a process of `role`
 * ("supervisor", "worker", "relay", "janitor") and concerning `server`
 * (SK_SERVER_*); NULL for either matches any. Match these rather than
 * prose, which may change. */
int h_count_events(const char *path, const char *role, const char *event, const char *server);

/* Number of sekalid's JSON log lines in path with the event name `event`
 * whose fields have the given values: a NULL-terminated list of key and
 * value pairs, e.g. h_count_event_where(r.log, SK_EVENT_WORKER_DIED,
 * "signal", "9", "queue", r.queue, NULL). Role, server, the job's fields
 * and the event's own (sekalid(8), LOGGING) are all fields; a number
 * matches as written ("3"). Values are compared as written in the log, so
 * give them without quotes or backslashes. */
int h_count_event_where(const char *path, const char *event, ...)
    __attribute__((sentinel));
/* The outcome lines of path (SK_EVENT_OUTCOME: what became of each
 * delivery) with that outcome and, unless NULL, that reason: ("dead",
 * "beyond_retention"), ("rescheduled", "lock_busy"), ("retry", NULL). */
int h_count_outcomes(const char *path, const char *outcome, const char *reason);
/* The supervisor's worker_died lines of path whose field key has value:
 * ("signal", "9"), ("job_caused", "yes"), ("restart_ms", "0"). */
int h_count_deaths(const char *path, const char *key, const char *value);

/* harness_metrics.c: sekalid's /metrics, and a plain GET. */

/* Writes into top (size bytes) the top-level YAML that opens sekalid's
 * /metrics on a free loopback port; returns that port. */
int h_metrics_top(char *top, size_t size);
/* GET path of 127.0.0.1:port with curl (at most max_s seconds), sending
 * header unless it is NULL, the body into the file body_path; the HTTP
 * status, or 0 if nothing answered in time (no listener yet, a held one). */
int h_curl_status(int port, const char *path, const char *header, const char *body_path,
                  int max_s);
/* The text of sekalid's /metrics on port, or NULL if nothing answered; the
 * caller frees it. */
char *h_scrape(int port);
/* The value of one series of a scrape, written as rendered, name and labels
 * ("sekali_workers_up{queue=\"q\"}"), or -1 if absent. */
double h_metric_value(const char *text, const char *series);
/* Scrapes port and returns the series (printf format), or -1 if absent or
 * nothing answered: a test can H_WAIT on it. */
double h_metric(int port, const char *series_fmt, ...) __attribute__((format(printf, 2, 3)));
/* GET path of a plain HTTP listener on 127.0.0.1:port, one connection
 * (Connection: close); the status (0: no HTTP answer), and the body into
 * *body (the caller frees) unless body is NULL. */
int h_http_get(int port, const char *path, char **body);

#endif
