/* check_broker_url.c - amqp.url's grammar (broker_url.c) and tls.c's
 * checks of certificate and key files, without YAML: what a node list may
 * and may not say, and that no message quotes a URL (it may hold a
 * password). The files are tests/data/tls/ (see its README); run from the
 * repository root. */
#include "broker.h"
#include "suite.h"
#include "tls.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TLSDATA "tests/data/tls/"

static void conf_free(struct sk_amqp_conf *a)
{
    for (size_t i = 0; i < a->n_nodes; i++)
        free(a->nodes[i].host);
    free(a->user);
    free(a->password);
    free(a->vhost);
}

/* Adds each URL in turn; returns the first failure's message, or NULL. */
static const char *add_all(struct sk_amqp_conf *a, const char *const *urls, size_t n)
{
    static struct sk_err err;
    char label[32];
    bool wrote;

    for (size_t i = 0; i < n; i++) {
        snprintf(label, sizeof(label), "url[%zu]", i);
        memset(&err, 0, sizeof(err));
        if (sk_broker_url_add(a, label, urls[i], &wrote, &err) != SK_OK)
            return err.msg;
    }
    return NULL;
}

START_TEST(test_amqps_turns_tls_on_with_its_default_port)
{
    struct sk_amqp_conf a = { 0 };
    const char *urls[] = { "amqps://worker:s3cret@mq1.example/jobs", "amqps://mq2.example:5999" };

    ck_assert_ptr_null(add_all(&a, urls, 2));
    ck_assert(a.tls.enabled);
    ck_assert_uint_eq(a.n_nodes, 2);
    ck_assert_str_eq(a.nodes[0].host, "mq1.example");
    ck_assert_int_eq(a.nodes[0].port, 5671);
    ck_assert_int_eq(a.nodes[1].port, 5999);
    ck_assert_str_eq(a.user, "worker");
    ck_assert_str_eq(a.password, "s3cret");
    ck_assert(a.password_in_url);
    ck_assert_str_eq(a.vhost, "jobs");
    conf_free(&a);
}
END_TEST

START_TEST(test_plain_amqp_leaves_tls_off_and_an_empty_vhost_means_the_default)
{
    struct sk_amqp_conf a = { 0 };
    const char *urls[] = { "amqp://127.0.0.1/" };

    ck_assert_ptr_null(add_all(&a, urls, 1));
    ck_assert(!a.tls.enabled);
    ck_assert_int_eq(a.nodes[0].port, 5672);
    ck_assert_str_eq(a.vhost, "/");
    ck_assert_str_eq(a.user, "guest");
    ck_assert(!a.password_in_url);
    conf_free(&a);
}
END_TEST

START_TEST(test_a_node_in_clear_text_among_tls_nodes_is_refused)
{
    struct sk_amqp_conf a = { 0 };
    const char *urls[] = { "amqps://mq1.example/", "amqp://mq2.example/" };
    const char *back[] = { "amqp://mq1.example/", "amqps://mq2.example/" };

    ck_assert_str_eq(add_all(&a, urls, 2), "url[1]: amqp:// where url[0] is amqps://: a "
                     "cluster's nodes all speak TLS or none does");
    conf_free(&a);
    memset(&a, 0, sizeof(a));
    ck_assert_str_eq(add_all(&a, back, 2), "url[1]: amqps:// where url[0] is amqp://: a "
                     "cluster's nodes all speak TLS or none does");
    conf_free(&a);
}
END_TEST

START_TEST(test_later_nodes_may_repeat_credentials_but_not_change_them)
{
    struct sk_amqp_conf a = { 0 };
    const char *same[] = { "amqp://w:pw@mq1/v", "amqp://w:pw@mq2/v", "amqp://mq3" };
    const char *other_pw[] = { "amqp://w:pw@mq1/v", "amqp://w:Sup3rS3cret@mq2/v" };
    const char *twice[] = { "amqp://mq1", "amqp://mq2", "amqp://mq1:5672" };

    ck_assert_ptr_null(add_all(&a, same, 3));
    conf_free(&a);
    memset(&a, 0, sizeof(a));
    const char *msg = add_all(&a, other_pw, 2);
    ck_assert_str_eq(msg, "url[1]: its password differs from url[0]'s: a cluster's nodes "
                     "share users and vhosts; write them in the first URL");
    conf_free(&a);
    memset(&a, 0, sizeof(a));
    ck_assert_str_eq(add_all(&a, twice, 3), "url[2]: the same node as url[0]");
    conf_free(&a);
}
END_TEST

START_TEST(test_a_malformed_url_is_refused_without_quoting_it)
{
    struct sk_amqp_conf a = { 0 };
    const char *urls[] = { "amqps://user:Sup3rS3cret@host:port/vhost" };

    const char *msg = add_all(&a, urls, 1);
    ck_assert_str_eq(msg, "url[0]: invalid AMQP URL: expected "
                     "amqp[s]://[user[:password]@]host[:port]/[vhost]");
    ck_assert_ptr_null(strstr(msg, "Sup3r"));
    conf_free(&a);
}
END_TEST

/* A copy of tests/data/tls/<name> with mode, in a new temporary file. */
static void copy_with_mode(const char *name, mode_t mode, char *out)
{
    char src[128], buf[4096];
    snprintf(src, sizeof(src), TLSDATA "%s", name);
    FILE *in = fopen(src, "r");
    ck_assert_ptr_nonnull(in);
    size_t n = fread(buf, 1, sizeof(buf), in);
    fclose(in);
    strcpy(out, "/tmp/sk-tls-XXXXXX");
    int fd = mkstemp(out);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, buf, n), (ssize_t)n);
    ck_assert_int_eq(fchmod(fd, mode), 0);
    close(fd);
}

START_TEST(test_a_matching_client_certificate_and_private_key_pass)
{
    char key[64];
    copy_with_mode("client.key", 0600, key);
    struct sk_tls_conf t = { .enabled = true, .verify = true, .ca_file = TLSDATA "ca.crt",
                             .cert_file = TLSDATA "client.crt", .key_file = key };
    struct sk_err err = { 0 };

    int rc = sk_tls_check_files(&t, "amqp.tls", &err);
    unlink(key);
    ck_assert_msg(rc == SK_OK, "%s", err.msg);
}
END_TEST

START_TEST(test_a_key_open_to_others_is_refused_with_its_mode)
{
    char key[64], want[160];
    copy_with_mode("client.key", 0644, key);
    struct sk_tls_conf t = { .cert_file = TLSDATA "client.crt", .key_file = key };
    struct sk_err err = { 0 };

    int rc = sk_tls_check_files(&t, "amqp.tls", &err);
    unlink(key);
    ck_assert_int_eq(rc, SK_ERR);
    snprintf(want, sizeof(want), "amqp.tls.key_file: %s has mode 0644: a private key must not "
             "be open to others (chmod 600 or 640)", key);
    ck_assert_str_eq(err.msg, want);
}
END_TEST

START_TEST(test_a_key_of_another_certificate_is_refused)
{
    char key[64], want[200];
    copy_with_mode("other.key", 0600, key);
    struct sk_tls_conf t = { .cert_file = TLSDATA "client.crt", .key_file = key };
    struct sk_err err = { 0 };

    int rc = sk_tls_check_files(&t, "redis.tls", &err);
    unlink(key);
    ck_assert_int_eq(rc, SK_ERR);
    snprintf(want, sizeof(want), "redis.tls.key_file: %s is not the key of " TLSDATA
             "client.crt", key);
    ck_assert_str_eq(err.msg, want);
}
END_TEST

START_TEST(test_files_that_are_missing_or_not_pem_are_named)
{
    struct sk_tls_conf missing = { .ca_file = TLSDATA "no-such.crt" };
    struct sk_tls_conf garbage = { .ca_file = TLSDATA "garbage.pem" };
    struct sk_tls_conf half = { .cert_file = TLSDATA "client.crt" };
    struct sk_err err = { 0 };

    ck_assert_int_eq(sk_tls_check_files(&missing, "amqp.tls", &err), SK_ERR);
    ck_assert_str_eq(err.msg, "amqp.tls.ca_file: cannot open " TLSDATA "no-such.crt: No such "
                     "file or directory");
    ck_assert_int_eq(sk_tls_check_files(&garbage, "amqp.tls", &err), SK_ERR);
    ck_assert_msg(strncmp(err.msg, "amqp.tls.ca_file: OpenSSL cannot use " TLSDATA
                          "garbage.pem: ", 50) == 0, "%s", err.msg);
    ck_assert_int_eq(sk_tls_check_files(&half, "amqp.tls", &err), SK_ERR);
    ck_assert_str_eq(err.msg, "amqp.tls: cert_file and key_file go together: a client "
                     "certificate needs its key");
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_amqps_turns_tls_on_with_its_default_port,
        test_plain_amqp_leaves_tls_off_and_an_empty_vhost_means_the_default,
        test_a_node_in_clear_text_among_tls_nodes_is_refused,
        test_later_nodes_may_repeat_credentials_but_not_change_them,
        test_a_malformed_url_is_refused_without_quoting_it,
        test_a_matching_client_certificate_and_private_key_pass,
        test_a_key_open_to_others_is_refused_with_its_mode,
        test_a_key_of_another_certificate_is_refused,
        test_files_that_are_missing_or_not_pem_are_named,
        NULL,
    };
    return h_run_suite(h_suite("broker_url", 0, tests));
}
