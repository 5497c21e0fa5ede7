/* harness_config.c - the sekalid configs the harness writes: one queue on
 * the test servers, over plain links or (SEKALI_TEST_TLS=1) TLS ones, with
 * the queue settings the reruns choose (SEKALI_TEST_BATCH). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_private.h"

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
        snprintf(amqp, amqp_size, "  url: \"%s\"\n", h_amqp_url());
        snprintf(redis, redis_size, "  host: 127.0.0.1\n  port: %d\n", h_redis_port());
        snprintf(postgres, postgres_size, "  conninfo: \"%s\"\n", h_pg_conninfo());
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

/* The queue lines the harness adds before the test's own (extra, or NULL):
 * its window and batch, and the dead letter mirror. */
static void queue_lines(const char *extra, char *out, size_t size)
{
    /* Unset, SEKALI_TEST_BATCH leaves the batch to sekali's default (as
     * many deliveries a transaction as the window of 4 holds); N reruns a
     * suite with every transactional queue at batch N (and a window of 2N),
     * 1 with one job per transaction. */
    int batch = h_test_batch();
    if (extra != NULL && (strstr(extra, "mode: external") != NULL ||
                          strstr(extra, "batch:") != NULL))
        batch = 0;
    char queue_shape[64] = "    prefetch: 4\n";
    /* A test that sizes its own window (a batch larger than 4), or lets
     * sekali grow it (batch_max), says so. */
    if (extra != NULL && (strstr(extra, "prefetch:") != NULL || strstr(extra, "batch_max:") != NULL))
        queue_shape[0] = '\0';
    else if (batch > 0)
        snprintf(queue_shape, sizeof(queue_shape), "    prefetch: %d\n    batch: %d\n",
                 batch > 1 ? 2 * batch : 4, batch);
    /* Most suites look at a dead letter's copy in <queue>.dead: they get
     * the mirror (sekali.dead_letters is the record either way). A test
     * that means the default says dead_letter_mirror itself. */
    const char *mirror = extra != NULL &&
        strstr(extra, "dead_letter_mirror:") != NULL ? "" : "    dead_letter_mirror: true\n";
    snprintf(out, size, "%s%s", queue_shape, mirror);
}

char *h_write_config(const char *dir, const char *queue, const char *handler, int workers,
                     const char *extra_queue_yaml)
{
    return h_write_config_top(dir, queue, handler, workers, extra_queue_yaml, NULL);
}

char *h_write_config_top(const char *dir, const char *queue, const char *handler, int workers,
                         const char *extra_queue_yaml, const char *extra_top_yaml)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/sekali.yaml", dir) > 0);
    char amqp[2048], redis[2048], postgres[1024], queue_yaml[128];
    links_yaml(dir, amqp, sizeof(amqp), redis, sizeof(redis), postgres, sizeof(postgres));
    queue_lines(extra_queue_yaml, queue_yaml, sizeof(queue_yaml));
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
            "%s",
            amqp, redis, postgres, extra_top_yaml != NULL ? extra_top_yaml : "",
            queue, h_build_dir(), handler, workers, queue_yaml,
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
