/* check_tls.c - sekalid and sekalictl over TLS, against the TLS listeners
 * of tests/servers.sh (SEKALI_TLS=1): RabbitMQ on its amqps:// port, which
 * requires a client certificate, and PostgreSQL as sekali_tls, a role
 * pg_hba.conf admits over hostssl only, with sslmode=verify-full.
 *
 * The pipeline, the outbox relay, a reply and sekalictl run once each over
 * TLS, and the servers' own view of the connections proves none of them
 * was clear text. Each way TLS can fail (a CA we do not trust, a name the
 * certificate does not carry, an expired certificate, no client
 * certificate) is a clear message naming the server and the cause, while
 * the worker keeps retrying and nothing is dead-lettered; once the fault
 * is fixed the jobs run, once. Redis is reached on its tls-port as an ACL
 * user that may run only sekali's commands on sekali:* keys; a password
 * changed under it and a user lacking a command hold the jobs back until
 * fixed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *tls_dir(void)
{
    return getenv("SEKALI_TLS_DIR");
}

static int tls_port(void)
{
    return atoi(getenv("SEKALI_AMQP_TLS_PORT"));
}

/* The amqp: section's url line and tls: block, as a test wants them. */
struct tls_opts {
    int         port;         /* 0: RabbitMQ's TLS port */
    const char *ca_file;      /* NULL: the test CA */
    bool        no_cert;      /* leave the client certificate out */
    const char *server_name;  /* NULL: none (the host, 127.0.0.1, is checked) */
    bool        external;     /* log in with the certificate, no password */
    const char *top_yaml;
    const char *redis_user;   /* NULL: sekali_acl */
    const char *queue_yaml;
};

static void redis_admin(const char *args);

/* Writes r's config for TLS on all three links and declares its queue. */
static void write_tls_config(struct h_run *r, const struct tls_opts *o)
{
    const char *d = tls_dir();
    char from[700], to[2400];

    r->config = h_write_config_top(r->dir, r->queue, H_EFFECT, 2, o->queue_yaml, o->top_yaml);
    snprintf(from, sizeof(from), "url: \"%s\"", h_amqp_url());
    char ca[700];
    if (o->ca_file != NULL)
        snprintf(ca, sizeof(ca), "%s", o->ca_file);
    else
        snprintf(ca, sizeof(ca), "%s/ca.crt", d);
    int n = snprintf(to, sizeof(to), "url: \"amqps://%s127.0.0.1:%d/%%2f\"\n%s  tls:\n"
                     "    ca_file: %s\n", o->external ? "" : "sekali:sekali@",
                     o->port != 0 ? o->port : tls_port(),
                     o->external ? "  auth_mechanism: external\n" : "", ca);
    if (!o->no_cert)
        n += snprintf(to + n, sizeof(to) - (size_t)n, "    cert_file: %s/client.crt\n"
                      "    key_file: %s/client.key\n", d, d);
    snprintf(to + n, sizeof(to) - (size_t)n, "    server_name: %s",
             o->server_name != NULL ? o->server_name : "127.0.0.1");
    h_config_replace(r->config, from, to);

    snprintf(from, sizeof(from), "conninfo: \"%s\"", h_pg_conninfo());
    snprintf(to, sizeof(to), "conninfo: \"host=127.0.0.1 port=%s dbname=sekali user=sekali_tls "
             "password=sekali sslmode=verify-full sslrootcert=%s/ca.crt\"",
             getenv("SEKALI_PG_PORT"), d);
    h_config_replace(r->config, from, to);

    char pw[1100];
    /* Whatever a failed test before left. */
    redis_admin("ACL SETUSER sekali_acl resetpass '>aclpass'");
    redis_admin("ACL SETUSER sekali_noset -set");
    snprintf(pw, sizeof(pw), "%s/redis.password", r->dir);
    FILE *f = fopen(pw, "w");
    ck_assert_ptr_nonnull(f);
    fputs("aclpass\n", f);
    ck_assert_int_eq(fclose(f), 0);
    snprintf(from, sizeof(from), "  port: %d\n", h_redis_port());
    snprintf(to, sizeof(to), "  port: %s\n  username: %s\n  password_file: %s\n  tls:\n"
             "    ca_file: %s/ca.crt\n", getenv("SEKALI_REDIS_TLS_PORT"),
             o->redis_user != NULL ? o->redis_user : "sekali_acl", pw, d);
    h_config_replace(r->config, from, to);
    ck_assert_int_eq(sk_broker_declare(r->b, r->queue, NULL, NULL), SK_OK);
}

/* Redis's own view: clients logged in as user, and how many of them came
 * in on the tls-port (CLIENT LIST's laddr), asked as the default user on
 * the plain port. */
static void redis_clients(const char *user, int *all, int *on_tls)
{
    char cmd[300], line[2048], want_user[80], want_port[40];
    snprintf(cmd, sizeof(cmd), "redis-cli -p %d CLIENT LIST", h_redis_port());
    snprintf(want_user, sizeof(want_user), " user=%s ", user);
    snprintf(want_port, sizeof(want_port), "laddr=127.0.0.1:%s ", getenv("SEKALI_REDIS_TLS_PORT"));
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    *all = *on_tls = 0;
    while (fgets(line, sizeof(line), p) != NULL) {
        if (strstr(line, want_user) == NULL)
            continue;
        (*all)++;
        *on_tls += strstr(line, want_port) != NULL;
    }
    pclose(p);
}

static void redis_admin(const char *args)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "redis-cli -p %d %s >/dev/null", h_redis_port(), args);
    ck_assert_msg(system(cmd) == 0, "redis-cli %s failed", args);
}

/* Lines of `rabbitmqctl list_connections <columns>` that contain every
 * word of the space-separated want. */
static int connections(const char *columns, const char *want)
{
    char cmd[600], line[1024];
    snprintf(cmd, sizeof(cmd), "%s -q list_connections %s 2>&1", getenv("SEKALI_RABBITMQCTL"),
             columns);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int count = 0;
    while (fgets(line, sizeof(line), p) != NULL) {
        char words[200], *save = NULL;
        snprintf(words, sizeof(words), "%s", want);
        bool all = true;
        for (char *w = strtok_r(words, " ", &save); w != NULL; w = strtok_r(NULL, " ", &save))
            all = all && strstr(line, w) != NULL;
        count += all;
    }
    pclose(p);
    return count;
}

static int run_ctl(struct h_run *r, const char *command, char **out)
{
    char cmd[2400], path[1100];
    snprintf(path, sizeof(path), "%s/ctl.txt", r->dir);
    snprintf(cmd, sizeof(cmd), "%s/sekalictl -c %s %s >%s 2>&1 </dev/null", h_build_dir(),
             r->config, command, path);
    int status = system(cmd);
    *out = h_read_file(path);
    ck_assert_ptr_nonnull(*out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

START_TEST(test_jobs_the_relay_replies_and_sekalictl_all_go_over_tls_once)
{
    struct h_run r;
    h_run_open(&r, "tls-pipeline");
    write_tls_config(&r, &(struct tls_opts){ .top_yaml = H_RELAY });
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_consumers(r.b, r.queue) == 2, 30000, "both workers should consume over TLS, "
           "have %u (see %s)", h_consumers(r.b, r.queue), r.log);

    char replies[160];
    snprintf(replies, sizeof(replies), "%s.replies", r.queue);
    ck_assert_int_eq(sk_broker_declare(r.b, replies, NULL, NULL), SK_OK);
    for (int i = 0; i < 10; i++) {
        char key[32];
        snprintf(key, sizeof(key), "k-outbox-%d", i);
        h_enqueue(r.pg, r.queue, key, NULL, NULL);  /* published by the relay */
    }
    struct sk_message ask = { .message_id = "ask-1", .type = "test", .idempotency_key = "k-ask",
                              .reply_to = replies, .correlation_id = "c-1", .body = "ok",
                              .body_len = 2 };
    struct sk_err err = { 0 };
    ck_assert_msg(sk_broker_publish(r.b, r.queue, &ask, &err) == SK_OK, "%s", err.msg);
    H_WAIT(h_effects(&r, NULL) == 11, 30000, "11 jobs should run, %lld did",
           h_effects(&r, NULL));
    H_WAIT(h_queue_depth(r.b, replies) == 1, 20000, "the reply should arrive");

    /* The servers' view: sekalid's connections (two workers, the relay)
     * are all on the TLS port, TLS and with our client certificate; the
     * only clear-text one is this test's own. */
    char port[32];
    snprintf(port, sizeof(port), "%d true CN=sekali", tls_port());
    ck_assert_int_ge(connections("port ssl peer_cert_subject", port), 3);
    ck_assert_int_eq(connections("ssl", "false"), 1);
    ck_assert_int_ge(h_pg_count(r.pg, "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity "
                                      "a USING (pid) WHERE a.usename = 'sekali_tls' AND s.ssl"), 2);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity "
                                      "a USING (pid) WHERE a.usename = 'sekali_tls' AND NOT s.ssl"),
                     0);
    int all, on_tls;
    redis_clients("sekali_acl", &all, &on_tls);
    ck_assert_msg(all >= 2 && on_tls == all, "every Redis client of sekalid should be "
                  "sekali_acl on the tls-port: %d of %d are", on_tls, all);

    char *out;
    ck_assert_int_eq(run_ctl(&r, "status", &out), 0);
    ck_assert_msg(strstr(out, "2 consuming") != NULL && strstr(out, "broker:") == NULL &&
                  strstr(out, "postgresql:") == NULL,
                  "sekalictl status over TLS should see both workers:\n%s", out);
    free(out);
    /* sekali_acl may not run INFO: doctor asks ROLE instead, and neither
     * it nor sekalid's start checks call the master a replica. */
    run_ctl(&r, "doctor", &out);
    ck_assert_msg(strstr(out, "pass redis.role") != NULL, "doctor over TLS as sekali_acl:\n%s",
                  out);
    free(out);
    ck_assert_int_eq(h_count_events(r.log, NULL, "doctor_failed", NULL), 0);

    h_run_stop(&r);
    h_expect_once(&r, 11, 0);
    ck_assert_int_eq(h_count_lines(r.log, "TLS"), 0);
    h_run_close(&r);
}
END_TEST

START_TEST(test_the_client_certificate_logs_in_with_external)
{
    struct h_run r;
    h_run_open(&r, "tls-external");
    write_tls_config(&r, &(struct tls_opts){ .external = true, .server_name = "localhost" });
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_consumers(r.b, r.queue) == 2, 30000, "both workers should log in with their "
           "certificate (see %s)", r.log);
    ck_assert_int_ge(connections("auth_mechanism user ssl", "EXTERNAL sekali true"), 2);
    h_publish(r.b, r.queue, "test", "ext-1", "k-ext", NULL, "ok");
    H_WAIT(h_effects(&r, "k-ext") == 1, 20000, "the job should run");
    h_run_stop(&r);
    h_expect_once(&r, 1, 0);
    h_run_close(&r);
}
END_TEST

static bool listening(int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* A TLS endpoint that presents an expired certificate (signed by the test
 * CA, valid in 2020): openssl s_server, since RabbitMQ has one certificate
 * and we cannot expire it. Returns its pid; *port is where it listens. */
static pid_t expired_server(int *port)
{
    char accept[16], cert[600], key[600];
    *port = h_free_port();
    snprintf(accept, sizeof(accept), "%d", *port);
    snprintf(cert, sizeof(cert), "%s/expired.crt", tls_dir());
    snprintf(key, sizeof(key), "%s/expired.key", tls_dir());
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL || freopen("/dev/null", "w", stderr) == NULL ||
            freopen("/dev/null", "r", stdin) == NULL)
            _exit(126);
        execlp("openssl", "openssl", "s_server", "-quiet", "-accept", accept, "-cert", cert,
               "-key", key, (char *)NULL);
        _exit(127);
    }
    /* Listening before sekalid starts: the worker logs its outage's first
     * cause, and that must be the certificate, not a refused connection. */
    H_WAIT(listening(*port), 10000, "openssl s_server should listen on %d", *port);
    return pid;
}

/* Redis: the ACL user's password changed under a running sekalid (its
 * connections killed, as a rotation would), then the new password put in
 * the password file and a reload; and a user lacking SET, then granted
 * it, without a reload. Either way the jobs wait, whatever on_redis_down
 * says (a refusal is a configuration error, not an outage), and run once
 * when fixed. */
START_TEST(test_a_redis_password_changed_under_sekalid_holds_jobs_until_fixed)
{
    struct h_run r;
    h_run_open(&r, "tls-redis-pass");
    write_tls_config(&r, &(struct tls_opts){ .server_name = "localhost",
                                             .queue_yaml = "    on_redis_down: wait\n" });
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_consumers(r.b, r.queue) == 2, 30000, "both workers should consume (see %s)", r.log);
    h_publish(r.b, r.queue, "test", "before", "k-before", NULL, "ok");
    H_WAIT(h_effects(&r, "k-before") == 1, 20000, "the first job should run");

    redis_admin("ACL SETUSER sekali_acl resetpass '>rotated'");
    redis_admin("CLIENT KILL USER sekali_acl");
    for (int i = 0; i < 3; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    H_WAIT(h_count_lines(r.log, "redis AUTH as sekali_acl at 127.0.0.1") >= 1 &&
           h_count_lines(r.log, "WRONGPASS") >= 1, 30000,
           "the log should say Redis refused the ACL user (see %s)", r.log);
    ck_assert_int_eq(h_count_lines(r.log, "rotated"), 0);
    ck_assert_int_eq(h_count_lines(r.log, "aclpass"), 0);
    ck_assert_int_eq(h_effects(&r, NULL), 1);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);

    char pw[1100];
    snprintf(pw, sizeof(pw), "%s/redis.password", r.dir);
    FILE *f = fopen(pw, "w");
    ck_assert_ptr_nonnull(f);
    fputs("rotated\n", f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
    H_WAIT(h_effects(&r, NULL) == 4, 40000, "the jobs should run once the password is fixed, "
           "%lld did (see %s)", h_effects(&r, NULL), r.log);
    h_run_stop(&r);
    redis_admin("ACL SETUSER sekali_acl resetpass '>aclpass'");
    h_expect_once(&r, 4, 0);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

START_TEST(test_an_acl_user_lacking_a_command_holds_jobs_until_granted)
{
    struct h_run r;
    h_run_open(&r, "tls-redis-acl");
    write_tls_config(&r, &(struct tls_opts){ .redis_user = "sekali_noset",
                                             .queue_yaml = "    on_redis_down: proceed\n" });
    for (int i = 0; i < 3; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    H_WAIT(h_count_lines(r.log, "NOPERM") >= 1, 30000, "the log should say the ACL user may not "
           "run SET (see %s)", r.log);
    ck_assert_int_ge(h_count_lines(r.log, "redis SET NX PX failed: NOPERM"), 1);
    ck_assert_int_eq(kill(r.sekalid, 0), 0);
    ck_assert_int_eq(h_effects(&r, NULL), 0);  /* not even with on_redis_down: proceed */
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    redis_admin("ACL SETUSER sekali_noset +set");
    H_WAIT(h_effects(&r, NULL) == 3, 40000, "the jobs should run once SET is granted, %lld did "
           "(see %s)", h_effects(&r, NULL), r.log);
    h_run_stop(&r);
    redis_admin("ACL SETUSER sekali_noset -set");
    h_expect_once(&r, 3, 0);
    h_run_close(&r);
}
END_TEST

enum fix { FIX_CA_FILE, FIX_RELOAD_NAME, FIX_RELOAD_CERT, FIX_RELOAD_PORT };

struct failure {
    const char *name;
    const char *message;   /* what the worker's log must say */
    enum fix    fix;
};

static const struct failure failures[] = {
    { "tls-wrong-ca", "amqp connect to 127.0.0.1:%d failed: SSL handshake failed: TLS: the "
      "server's certificate is not signed by a CA we trust (tls.ca_file)", FIX_CA_FILE },
    { "tls-wrong-name", "amqp connect to 127.0.0.1:%d failed: SSL handshake failed: TLS: host "
      "name mismatch: the server's certificate does not name mq.wrong.example "
      "(tls.server_name)", FIX_RELOAD_NAME },
    { "tls-no-cert", "amqp_login(127.0.0.1:%d): a SSL error occurred: TLS: the server "
      "requires a client certificate (tls.cert_file, tls.key_file)", FIX_RELOAD_CERT },
    { "tls-expired", "amqp connect to 127.0.0.1:%d failed: SSL handshake failed: TLS: the "
      "server's certificate has expired", FIX_RELOAD_PORT },
};

/* Each failure: jobs wait in the queue while the worker says why and
 * retries; nothing is dead-lettered; the fix (a file put in place, or a
 * config change and SIGHUP) lets every job run once. */
START_TEST(test_each_tls_failure_is_named_retried_and_recovers_once_fixed)
{
    const struct failure *f = &failures[_i];
    struct h_run r;
    h_run_open(&r, f->name);
    char ca[1100], real_ca[600], cmd[2400];
    snprintf(ca, sizeof(ca), "%s/ca.crt", r.dir);
    snprintf(real_ca, sizeof(real_ca), "%s/ca.crt", tls_dir());
    snprintf(cmd, sizeof(cmd), "cp %s/other-ca.crt %s", tls_dir(), ca);
    if (f->fix == FIX_CA_FILE)
        ck_assert_int_eq(system(cmd), 0);
    int port = tls_port();
    pid_t s_server = 0;
    if (f->fix == FIX_RELOAD_PORT)
        s_server = expired_server(&port);
    write_tls_config(&r, &(struct tls_opts){
        .port = port, .ca_file = f->fix == FIX_CA_FILE ? ca : NULL,
        .no_cert = f->fix == FIX_RELOAD_CERT,
        .server_name = f->fix == FIX_RELOAD_NAME ? "mq.wrong.example" : "localhost" });
    for (int i = 0; i < 3; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);

    char message[400];
    snprintf(message, sizeof(message), f->message, port);
    H_WAIT(h_count_lines(r.log, message) >= 1, 30000, "the log should say \"%s\" (see %s)",
           message, r.log);
    /* Still there, still retrying, nothing run, nothing dead-lettered. */
    ck_assert_int_eq(kill(r.sekalid, 0), 0);
    ck_assert_int_eq(h_count_lines(r.log, "BEGIN PRIVATE KEY"), 0);
    ck_assert_int_eq(h_effects(&r, NULL), 0);
    ck_assert_int_eq(h_queue_depth(r.b, r.queue), 3);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);

    switch (f->fix) {
    case FIX_CA_FILE:  /* no reload: each attempt reads the file again */
        snprintf(cmd, sizeof(cmd), "cp %s %s", real_ca, ca);
        ck_assert_int_eq(system(cmd), 0);
        break;
    case FIX_RELOAD_NAME:
        h_config_replace(r.config, "server_name: mq.wrong.example", "server_name: localhost");
        ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
        break;
    case FIX_RELOAD_CERT: {
        char with[1400];
        snprintf(with, sizeof(with), "    cert_file: %s/client.crt\n    key_file: %s/client.key\n"
                 "    server_name:", tls_dir(), tls_dir());
        h_config_replace(r.config, "    server_name:", with);
        ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
        break;
    }
    case FIX_RELOAD_PORT: {
        char from[64], to[64];
        snprintf(from, sizeof(from), "127.0.0.1:%d/", port);
        snprintf(to, sizeof(to), "127.0.0.1:%d/", tls_port());
        h_config_replace(r.config, from, to);
        ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
        break;
    }
    }
    H_WAIT(h_effects(&r, NULL) == 3, 40000, "the 3 jobs should run once the fault is fixed, "
           "%lld did (see %s)", h_effects(&r, NULL), r.log);
    if (s_server > 0) {
        kill(s_server, SIGTERM);
        waitpid(s_server, NULL, 0);
    }
    h_run_stop(&r);
    h_expect_once(&r, 3, 0);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    h_run_close(&r);
}
END_TEST

/* Redis's TLS set-up gone wrong, with the default on_redis_down: proceed.
 * Each is a configuration error, not an outage: the jobs are held (never
 * run without their locks, never dead-lettered), the log names the cause
 * with the event link_refused, and once it is fixed they run, once. */
enum redis_fault { REDIS_WRONG_CA, REDIS_WRONG_NAME, REDIS_EXPIRED, REDIS_CLEAR_TO_TLS };

struct redis_failure {
    const char      *name;
    const char      *message;  /* in the worker's log; %d is the port */
    enum redis_fault fault;
};

static const struct redis_failure redis_failures[] = {
    { "tls-redis-ca", "redis connect to 127.0.0.1:%d failed: TLS: the server's certificate is "
      "not signed by a CA we trust (tls.ca_file)", REDIS_WRONG_CA },
    { "tls-redis-name", "redis connect to 127.0.0.1:%d failed: TLS: host name mismatch: the "
      "server's certificate does not name redis.wrong.example", REDIS_WRONG_NAME },
    { "tls-redis-expired", "redis connect to 127.0.0.1:%d failed: TLS: the server's "
      "certificate has expired", REDIS_EXPIRED },
    { "tls-redis-clear", "redis at 127.0.0.1:%d closed the connection at a clear-text PING, "
      "unanswered: this port seems to speak TLS", REDIS_CLEAR_TO_TLS },
};

/* The redis: lines write_tls_config() wrote, and r's password file. */
static void redis_block(const struct h_run *r, char *out, size_t size)
{
    snprintf(out, size, "  port: %s\n  username: sekali_acl\n  password_file: %s/redis.password\n"
             "  tls:\n    ca_file: %s/ca.crt\n", getenv("SEKALI_REDIS_TLS_PORT"), r->dir,
             tls_dir());
}

START_TEST(test_each_redis_tls_failure_holds_jobs_whatever_on_redis_down_says)
{
    const struct redis_failure *f = &redis_failures[_i];
    struct h_run r;
    h_run_open(&r, f->name);
    write_tls_config(&r, &(struct tls_opts){ .server_name = "localhost",
                                             .queue_yaml = "    on_redis_down: proceed\n" });
    char good[2000], bad[2100], cmd[2400], ca[1100];
    redis_block(&r, good, sizeof(good));
    int port = atoi(getenv("SEKALI_REDIS_TLS_PORT"));
    pid_t s_server = 0;
    snprintf(ca, sizeof(ca), "%s/redis-ca.crt", r.dir);
    switch (f->fault) {
    case REDIS_WRONG_CA:  /* fixed by the file, with no reload */
        snprintf(cmd, sizeof(cmd), "cp %s/other-ca.crt %s", tls_dir(), ca);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(bad, sizeof(bad), "  port: %d\n  username: sekali_acl\n  password_file: "
                 "%s/redis.password\n  tls:\n    ca_file: %s\n", port, r.dir, ca);
        break;
    case REDIS_WRONG_NAME:
        snprintf(bad, sizeof(bad), "%s    server_name: redis.wrong.example\n", good);
        break;
    case REDIS_EXPIRED:
        s_server = expired_server(&port);
        snprintf(bad, sizeof(bad), "  port: %d\n  username: sekali_acl\n  password_file: "
                 "%s/redis.password\n  tls:\n    ca_file: %s/ca.crt\n", port, r.dir, tls_dir());
        break;
    case REDIS_CLEAR_TO_TLS:
        snprintf(bad, sizeof(bad), "  port: %d\n  username: sekali_acl\n  password_file: "
                 "%s/redis.password\n", port, r.dir);
        break;
    }
    h_config_replace(r.config, good, bad);
    for (int i = 0; i < 3; i++) {
        char id[32], key[32];
        snprintf(id, sizeof(id), "m-%d", i);
        snprintf(key, sizeof(key), "k-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "ok");
    }
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);

    char message[400];
    snprintf(message, sizeof(message), f->message, port);
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_LINK_REFUSED, SK_SERVER_REDIS) >= 1 &&
           h_count_lines(r.log, message) >= 1, 30000, "the worker should refuse the link "
           "(event link_refused) and say \"%s\" (see %s)", message, r.log);
    /* Held, not run without locks; named as a setting, never as an outage. */
    ck_assert_int_eq(kill(r.sekalid, 0), 0);
    ck_assert_int_eq(h_effects(&r, NULL), 0);
    ck_assert_int_eq(h_queue_depth(r.b, r.dead), 0);
    ck_assert_int_eq(h_count_events(r.log, "worker", SK_EVENT_OUTAGE_BEGIN, SK_SERVER_REDIS), 0);

    if (f->fault == REDIS_WRONG_CA) {
        snprintf(cmd, sizeof(cmd), "cp %s/ca.crt %s", tls_dir(), ca);
        ck_assert_int_eq(system(cmd), 0);
    } else {
        h_config_replace(r.config, bad, good);
        ck_assert_int_eq(kill(r.sekalid, SIGHUP), 0);
    }
    H_WAIT(h_effects(&r, NULL) == 3, 40000, "the 3 jobs should run once the fault is fixed, "
           "%lld did (see %s)", h_effects(&r, NULL), r.log);
    if (s_server > 0) {
        kill(s_server, SIGTERM);
        waitpid(s_server, NULL, 0);
    }
    h_run_stop(&r);
    h_expect_once(&r, 3, 0);
    ck_assert_int_eq(h_count_lines(r.log, "aclpass"), 0);
    h_run_close(&r);
}
END_TEST

/* A TLS port as any TLS server answers clear text: a fatal alert (unexpected
 * message), then the close. Records every byte it was sent into path. */
static pid_t tls_listener(int *port, const char *path)
{
    *port = h_free_port();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)*port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid > 0) {
        close(fd);
        return pid;
    }
    static const unsigned char alert[] = { 0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0a };
    for (;;) {
        int c = accept(fd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[4096];
        ssize_t n = read(c, buf, sizeof(buf));
        FILE *out = fopen(path, "a");
        if (out != NULL && n > 0)
            fwrite(buf, 1, (size_t)n, out);
        if (out != NULL)
            fclose(out);
        if (write(c, alert, sizeof(alert)) < 0) { /* the client went first */ }
        close(c);
    }
}

/* redis.tls left out for a port that speaks TLS: what sekali sends first
 * is a harmless PING, never AUTH with the password in clear, and the log
 * says the port speaks TLS. */
START_TEST(test_a_tls_port_spoken_to_in_clear_text_never_gets_the_password)
{
    struct h_run r;
    h_run_open(&r, "tls-redis-clear-alert");
    write_tls_config(&r, &(struct tls_opts){ .server_name = "localhost",
                                             .queue_yaml = "    on_redis_down: proceed\n" });
    char good[2000], bad[2000], heard[1100];
    redis_block(&r, good, sizeof(good));
    snprintf(heard, sizeof(heard), "%s/heard.bin", r.dir);
    int port;
    pid_t listener = tls_listener(&port, heard);
    snprintf(bad, sizeof(bad), "  port: %d\n  username: sekali_acl\n  password_file: "
             "%s/redis.password\n", port, r.dir);
    h_config_replace(r.config, good, bad);
    h_publish(r.b, r.queue, "test", "m-0", "k-0", NULL, "ok");
    r.sekalid = h_start_sekalid("sekalid", r.config, r.dir, NULL);
    char message[300];
    snprintf(message, sizeof(message), "redis at 127.0.0.1:%d answered a clear-text PING in "
             "TLS: this port seems to speak TLS", port);
    H_WAIT(h_count_events(r.log, "worker", SK_EVENT_LINK_REFUSED, SK_SERVER_REDIS) >= 1 &&
           h_count_lines(r.log, message) >= 1, 30000, "the worker should say \"%s\" (see %s)",
           message, r.log);
    ck_assert_int_eq(h_effects(&r, NULL), 0);
    h_run_stop(&r);
    kill(listener, SIGKILL);
    waitpid(listener, NULL, 0);
    char *bytes = h_read_file(heard);
    ck_assert_ptr_nonnull(bytes);
    ck_assert_msg(strstr(bytes, "PING") != NULL, "the listener should have heard a PING");
    ck_assert_msg(strstr(bytes, "AUTH") == NULL && strstr(bytes, "aclpass") == NULL,
                  "no credential may reach a TLS port in clear text; it heard:\n%s", bytes);
    free(bytes);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    if (tls_dir() == NULL || getenv("SEKALI_AMQP_TLS_PORT") == NULL ||
        getenv("SEKALI_REDIS_TLS_PORT") == NULL) {
        /* Servers started without SEKALI_TLS=1: `make check` starts them
         * with it and sets SEKALI_REQUIRE_TLS, so there this fails. */
        fprintf(stderr, "check_tls: the servers have no TLS listeners (start them with "
                "SEKALI_TLS=1 tests/servers.sh start)\n");
        return getenv("SEKALI_REQUIRE_TLS") != NULL ? EXIT_FAILURE : EXIT_SUCCESS;
    }
    Suite *s = suite_create("tls");
    const TTest *tests[] = {
        test_jobs_the_relay_replies_and_sekalictl_all_go_over_tls_once,
        test_the_client_certificate_logs_in_with_external,
        test_a_redis_password_changed_under_sekalid_holds_jobs_until_fixed,
        test_an_acl_user_lacking_a_command_holds_jobs_until_granted,
        test_a_tls_port_spoken_to_in_clear_text_never_gets_the_password,
        NULL,
    };
    TCase *tc = h_tcase(s, "tls", 120, tests);
    tcase_add_loop_test(tc, test_each_tls_failure_is_named_retried_and_recovers_once_fixed, 0,
                        (int)SK_ARRAY_LEN(failures));
    tcase_add_loop_test(tc, test_each_redis_tls_failure_holds_jobs_whatever_on_redis_down_says,
                        0, (int)SK_ARRAY_LEN(redis_failures));
    return h_run_suite(s);
}
