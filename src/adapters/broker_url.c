/* broker_url.c - amqp.url: one AMQP URL per node of a RabbitMQ cluster,
 * read into struct sk_amqp_conf (broker.h).
 *
 * Here rather than in the config loader because the URL's grammar and what a list
 * of nodes must agree on are the broker's knowledge, as conninfo's is
 * libpq's: config_servers.c walks the YAML, hands each URL's text here and puts
 * the node's file:line:column in front of the message. librabbitmq's
 * amqp_parse_url() does the splitting and the percent-decoding. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#include "broker.h"

/* Which of a URL's optional parts were written: a field written in the URL
 * points into the parsed copy; the library's default does not. */
struct written {
    bool user, password, vhost;
};

static int first_node(struct sk_amqp_conf *a, const struct amqp_connection_info *ci,
                      const char *vhost, struct written w, struct sk_err *err);
static int other_node(const struct sk_amqp_conf *a, const char *label,
                      const struct amqp_connection_info *ci, const char *vhost,
                      struct written w, struct sk_err *err);
static int replace(char **dst, const char *s, struct sk_err *err);

int sk_broker_url_add(struct sk_amqp_conf *a, const char *label, const char *url,
                      bool *wrote_password, struct sk_err *err)
{
    struct amqp_connection_info ci;
    size_t len = strlen(url);
    char *copy = strdup(url);  /* amqp_parse_url() writes into its argument */
    int rc;

    *wrote_password = false;
    if (copy == NULL)
        return sk_err_set(err, SK_ERR, "out of memory");
    if (a->n_nodes >= SK_AMQP_MAX_NODES) {
        rc = sk_err_set(err, SK_ERR, "%s: more than %d nodes", label, SK_AMQP_MAX_NODES);
        goto done;
    }
    amqp_default_connection_info(&ci);
    if (amqp_parse_url(copy, &ci) != AMQP_STATUS_OK || *ci.host == '\0' || ci.port < 1) {
        rc = sk_err_set(err, SK_ERR, "%s: invalid AMQP URL: expected "
                        "amqp[s]://[user[:password]@]host[:port]/[vhost]", label);
        goto done;
    }
#define WRITTEN(p) ((uintptr_t)(p) >= (uintptr_t)copy && (uintptr_t)(p) <= (uintptr_t)copy + len)
    struct written w = { .user = WRITTEN(ci.user), .password = WRITTEN(ci.password),
                         .vhost = WRITTEN(ci.vhost) };
#undef WRITTEN
    /* "amqp://host/" parses to an empty vhost, which no broker has:
     * whoever writes it means the default one. */
    const char *vhost = *ci.vhost ? ci.vhost : "/";
    size_t i = a->n_nodes;
    rc = i == 0 ? first_node(a, &ci, vhost, w, err) : other_node(a, label, &ci, vhost, w, err);
    if (rc == SK_OK && (rc = replace(&a->nodes[i].host, ci.host, err)) == SK_OK) {
        a->nodes[i].port = ci.port;
        a->n_nodes = i + 1;
        *wrote_password = w.password;
    }
done:
    explicit_bzero(copy, len);
    free(copy);
    return rc;
}

/* url[0] sets the user, password, vhost and TLS of the whole cluster. */
static int first_node(struct sk_amqp_conf *a, const struct amqp_connection_info *ci,
                      const char *vhost, struct written w, struct sk_err *err)
{
    int rc;

    if ((w.password && (rc = replace(&a->password, ci->password, err)) != SK_OK) ||
        (rc = replace(&a->user, ci->user, err)) != SK_OK ||
        (rc = replace(&a->vhost, vhost, err)) != SK_OK)
        return rc;
    a->password_in_url = w.password;
    a->tls.enabled = ci->ssl;
    return SK_OK;
}

/* Another node may repeat url[0]'s credentials, not change them, speaks
 * TLS if url[0] does (a node in clear text would be a downgrade waiting for
 * the first failover), and must be another node. */
static int other_node(const struct sk_amqp_conf *a, const char *label,
                      const struct amqp_connection_info *ci, const char *vhost,
                      struct written w, struct sk_err *err)
{
    const char *differs = NULL;

    if (w.user && strcmp(ci->user, a->user) != 0)
        differs = "user";
    else if (w.password && (!a->password_in_url || strcmp(ci->password, a->password) != 0))
        differs = "password";
    else if (w.vhost && strcmp(vhost, a->vhost) != 0)
        differs = "vhost";
    if (differs != NULL)
        return sk_err_set(err, SK_ERR, "%s: its %s differs from url[0]'s: a cluster's nodes "
                          "share users and vhosts; write them in the first URL", label, differs);
    if ((bool)ci->ssl != a->tls.enabled)
        return sk_err_set(err, SK_ERR, "%s: %s:// where url[0] is %s://: a cluster's nodes "
                          "all speak TLS or none does", label, ci->ssl ? "amqps" : "amqp",
                          a->tls.enabled ? "amqps" : "amqp");
    for (size_t j = 0; j < a->n_nodes; j++) {
        if (a->nodes[j].port == ci->port && strcmp(a->nodes[j].host, ci->host) == 0)
            return sk_err_set(err, SK_ERR, "%s: the same node as url[%zu]", label, j);
    }
    return SK_OK;
}

/* Wipes the old string: it may be a password. */
static int replace(char **dst, const char *s, struct sk_err *err)
{
    char *copy = strdup(s);

    if (copy == NULL)
        return sk_err_set(err, SK_ERR, "out of memory");
    if (*dst != NULL) {
        explicit_bzero(*dst, strlen(*dst));
        free(*dst);
    }
    *dst = copy;
    return SK_OK;
}
