/* harness_servers.c - the servers seen from outside sekali's protocols:
 * tests/servers.sh for outages, rabbitmqctl for what RabbitMQ counts,
 * Redis keys and clients, and the servers' own proof that sekalid's links
 * are TLS when a suite reruns with SEKALI_TEST_TLS=1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_private.h"

void h_servers(const char *command)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "tests/servers.sh %s >/dev/null 2>&1", command);
    ck_assert_msg(system(cmd) == 0, "tests/servers.sh %s failed", command);
}

FILE *h_rabbitmqctl(const char *args)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "\"%s\" -q %s 2>&1", h_require_env("SEKALI_RABBITMQCTL"), args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    return p;
}

long long h_in_flight(const char *queue)
{
    char line[1024], delay[300];
    snprintf(delay, sizeof(delay), "%s.delay.", queue);
    FILE *p = h_rabbitmqctl("list_queues name messages");
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

int h_consumer_prefetch(const char *queue)
{
    FILE *p = h_rabbitmqctl("list_consumers queue_name prefetch_count");
    char line[1024];
    int prefetch = -1;
    size_t len = strlen(queue);
    while (fgets(line, sizeof(line), p) != NULL)
        if (strncmp(line, queue, len) == 0 && line[len] == '\t')
            prefetch = atoi(line + len + 1);
    int status = pclose(p);
    ck_assert_msg(status == 0, "rabbitmqctl list_consumers failed");
    return prefetch;
}

redisContext *h_redis_connect(void)
{
    redisContext *redis = redisConnect("127.0.0.1", h_redis_port());
    ck_assert_msg(redis != NULL && redis->err == 0, "redis connect to port %d failed",
                  h_redis_port());
    return redis;
}

bool h_redis_exists(const char *key)
{
    redisContext *redis = h_redis_connect();
    redisReply *reply = redisCommand(redis, "EXISTS %s", key);
    bool exists = reply != NULL && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
    freeReplyObject(reply);
    redisFree(redis);
    return exists;
}

/* Lines of `rabbitmqctl list_connections port ssl peer_cert_subject` that
 * are on the TLS port, TLS, with the client certificate (CN=sekali). */
static int amqp_tls_connections(void)
{
    char want[64], line[1024];
    snprintf(want, sizeof(want), "%s\ttrue\t", getenv("SEKALI_AMQP_TLS_PORT"));
    FILE *p = h_rabbitmqctl("list_connections port ssl peer_cert_subject");
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
    redisContext *redis = h_redis_connect();
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

/* The servers' own view proves sekalid's links are TLS (a config that
 * silently fell back to clear text would pass every other assertion).
 * amqp_at_least, pg_at_least and redis_at_least are how many connections
 * RabbitMQ, PostgreSQL and Redis must show: the workers once they consume
 * (none on Redis for a queue with lock: false); at the end RabbitMQ's
 * consumers, and 0 for the others, as a worker may not have met a
 * restarted server again yet. None may be clear text, ever. */
void h_expect_tls_links(struct h_run *r, int amqp_at_least, int pg_at_least,
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
