/* harness.h - what the integration and fault suites share: the servers that
 * tests/servers.sh started, sekalid as a child process, and bounded waits.
 *
 * Nothing here fakes a server. Every wait polls a real observable (a row
 * count, a queue depth, a file, a process) and fails the test with a message
 * when its deadline passes; under valgrind or ASan deadlines stretch. */
#ifndef SK_HARNESS_H
#define SK_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <check.h>
#include <libpq-fe.h>

#include "broker.h"
#include "config.h"

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

/* A fresh directory for one test's files; the caller frees the string. */
char *h_tmpdir(const char *name);

/* A queue name unique to this run, so tests never see each other's jobs. */
void h_unique_name(char *out, size_t size, const char *prefix);

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

/* Publishing on a confirm-mode connection of its own. */
struct sk_broker *h_broker(void);
void h_publish(struct sk_broker *b, const char *queue, const char *type, const char *message_id,
               const char *idempotency_key, const char *resource_key, const char *body);
uint32_t h_queue_depth(struct sk_broker *b, const char *queue);

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

/* The pid in the name of a dir/stall.<pid> file that the test handler
 * writes when it stalls (tests/plugins/effect.c), or 0 if there is none. */
pid_t h_stalled_pid(const char *dir);

/* True once pid no longer exists (killed and reaped by its parent). */
bool h_process_gone(pid_t pid);

/* Runs the suite with check's defaults (fork mode on) and returns the exit
 * status for main(): failure if any test failed. */
int h_run_suite(Suite *s);

/* Whether key exists in the test Redis (a lock being held, say). */
bool h_redis_exists(const char *key);

/* Reads the whole file, or NULL if missing; the caller frees. */
char *h_read_file(const char *path);

/* Number of lines of path containing needle. */
int h_count_lines(const char *path, const char *needle);

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

#endif
