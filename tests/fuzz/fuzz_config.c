/* fuzz_config.c - libFuzzer harness for the configuration loader.
 *
 * The input is a whole sekali.yaml. sk_conf_load() reads a file, so each
 * input is written to a scratch directory that also holds a password file
 * (relative password_file paths resolve against the config's directory) and
 * the environment variables the test fixtures name are set: the paths where
 * a secret is found get fuzzed too, not only the ones where it is missing.
 * A load must either return a snapshot whose invariants hold or fail with a
 * message that names the file; ASan's leak check at exit covers the error
 * paths' cleanup. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void write_file(const char *path, const void *data, size_t size);
static void cleanup(void);
static void check_snapshot(const struct sk_conf *c);

#define EXPECT(cond, ...)                                                \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "fuzz_config: " __VA_ARGS__);                \
            fputc('\n', stderr);                                         \
            abort();                                                     \
        }                                                                \
    } while (0)

static char dir[4096], conf_path[4200], secret_path[4200];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *tmp = getenv("TMPDIR");

    (void)argc;
    (void)argv;
    snprintf(dir, sizeof(dir), "%s/sekali-fuzz-config.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "fuzz_config: mkdtemp %s: %s\n", dir, strerror(errno));
        exit(1);
    }
    atexit(cleanup);
    snprintf(conf_path, sizeof(conf_path), "%s/sekali.yaml", dir);
    snprintf(secret_path, sizeof(secret_path), "%s/password", dir);
    write_file(secret_path, "s3cret\n", 7);
    setenv("SEKALI_TEST_AMQP_PASSWORD", "amqp-secret", 1);
    setenv("SEKALI_TEST_REDIS_PASSWORD", "redis-secret", 1);
    setenv("SEKALI_TEST_PG_PASSWORD", "pg-secret", 1);
    unsetenv("SEKALI_TEST_SURELY_UNSET");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sk_err err = { 0 };
    struct sk_conf *c = NULL;

    write_file(conf_path, data, size);
    if (sk_conf_load(conf_path, &c, &err) != SK_OK) {
        EXPECT(c == NULL, "a failed load returned a snapshot");
        EXPECT(strncmp(err.msg, conf_path, strlen(conf_path)) == 0,
               "error does not name the file: \"%s\"", err.msg);
        return 0;
    }
    check_snapshot(c);
    sk_conf_free(c);
    return 0;
}

/* What the rest of the daemon relies on without checking again. */
static void check_snapshot(const struct sk_conf *c)
{
    EXPECT(c->amqp.nodes[0].host != NULL && c->amqp.password != NULL, "amqp without host or password");
    EXPECT(c->postgres.conninfo != NULL, "postgres without conninfo");
    EXPECT(c->n_queues >= 1 && c->queues != NULL, "no queues");
    for (size_t i = 0; i < c->n_queues; i++) {
        const struct sk_queue_conf *q = &c->queues[i];
        EXPECT(q->name != NULL && q->name[0] != '\0', "queue %zu without a name", i);
        EXPECT(q->handler != NULL && q->handler[0] == '/', "queue %s: handler not absolute",
               q->name);
        EXPECT(sk_conf_queue(c, q->name) == q, "queue %s is not found by name (duplicate?)",
               q->name);
        EXPECT(q->lock_ttl_ms != 0, "queue %s: lock_ttl left 0", q->name);
        EXPECT(q->workers >= 1 && q->prefetch >= 1 && q->max_body >= 1,
               "queue %s: a bound was not applied", q->name);
        for (size_t j = 0; j < q->n_job_types; j++)
            EXPECT(q->job_types[j] != NULL, "queue %s: job type %zu is NULL", q->name, j);
    }
    if (c->metrics.listen_host != NULL)
        EXPECT(c->metrics.listen_port >= 1 && c->metrics.listen_port <= 65535,
               "metrics port %d", c->metrics.listen_port);
}

static void write_file(const char *path, const void *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const char *p = data;

    if (fd < 0) {
        fprintf(stderr, "fuzz_config: open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "fuzz_config: write %s: %s\n", path, strerror(errno));
            exit(1);
        }
        p += n;
        size -= (size_t)n;
    }
    close(fd);
}

static void cleanup(void)
{
    unlink(conf_path);
    unlink(secret_path);
    rmdir(dir);
}
