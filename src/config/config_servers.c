/* config_servers.c - the schema of the servers sekali talks to and listens
 * on: amqp (URLs, one per cluster node, and the login), redis (with its
 * sentinels), postgres (conninfo), their tls: sections, and the metrics
 * and console endpoints (listen addresses and bearer tokens).
 *
 * What only these sections can judge is said here, at the key's line: a
 * password given twice, tls: settings on a clear-text URL, sentinels
 * without a master name, a key file that cannot be read. The grammars of
 * the values themselves belong to the adapters (broker_url.c,
 * pg_conninfo.c, tls.c); messages never quote a URL or a conninfo, which
 * may hold a password. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

#include "config_walk.h"

#include "pg_conninfo.h"

static int amqp_url(struct loader *L, yaml_node_t *v, void *base);
static int amqp_node(struct loader *L, yaml_node_t *v, const char *label,
                     struct sk_amqp_conf *a);
static int tls_section(struct loader *L, yaml_node_t *v, const char *label,
                       struct sk_tls_conf *tls);
static int amqp_tls(struct loader *L, yaml_node_t *v, void *base);
static int pg_conninfo(struct loader *L, yaml_node_t *v, void *base);
static int metrics_listen(struct loader *L, yaml_node_t *v, void *base);
static int metrics_token(struct loader *L, yaml_node_t *v, void *base);
static int console_listen(struct loader *L, yaml_node_t *v, void *base);
static int console_token(struct loader *L, yaml_node_t *v, void *base);
static int console_operators(struct loader *L, yaml_node_t *v, void *base);
static int redis_tls(struct loader *L, yaml_node_t *v, void *base);
static int sentinel_password_env(struct loader *L, yaml_node_t *v, void *base);
static int sentinel_password_file(struct loader *L, yaml_node_t *v, void *base);
static int sentinel_password(struct loader *L, yaml_node_t *v, enum type t, char **dst);
static int redis_sentinels(struct loader *L, yaml_node_t *v, void *base);

static const char *const amqp_auths[] = { "plain", "external", NULL };  /* config.h's order */

/* The same keys for every server's tls: section. */
static const struct key tls_keys[] = {
    PATH("ca_file",     sk_tls_conf, ca_file, false),
    PATH("cert_file",   sk_tls_conf, cert_file, false),
    PATH("key_file",    sk_tls_conf, key_file, false),
    STR("server_name",  sk_tls_conf, server_name),
    BOOL("verify",      sk_tls_conf, verify),
    END
};

const struct key sk_conf_amqp_keys[] = {
    CUSTOM("url", amqp_url, true),
    PASSWORD(sk_amqp_conf),
    DURATION("heartbeat",       sk_amqp_conf, heartbeat_ms,       0, HOUR),
    DURATION("connect_timeout", sk_amqp_conf, connect_timeout_ms, 1, HOUR),
    DURATION("consumer_timeout", sk_amqp_conf, consumer_timeout_ms, 0, 7 * DAY),
    CUSTOM_SECTION("tls", amqp_tls, tls_keys, false),
    ENUM("auth_mechanism", sk_amqp_conf, auth, amqp_auths),
    END
};

const struct key sk_conf_redis_keys[] = {
    STR("host",         sk_redis_conf, host),
    INT("port",         sk_redis_conf, port, 1, 65535),
    INT("db",           sk_redis_conf, db, 0, 15),
    PASSWORD(sk_redis_conf),
    DURATION("timeout", sk_redis_conf, timeout_ms, 1, HOUR),
    CUSTOM("sentinels", redis_sentinels, false),
    STR("master_name",  sk_redis_conf, master_name),
    STR("username",     sk_redis_conf, username),
    CUSTOM_SECTION("tls", redis_tls, tls_keys, false),
    STR("sentinel_username", sk_redis_conf, sentinel_username),
    CUSTOM("sentinel_password_env", sentinel_password_env, false),
    CUSTOM("sentinel_password_file", sentinel_password_file, false),
    END
};

const struct key sk_conf_postgres_keys[] = {
    CUSTOM("conninfo", pg_conninfo, true),
    PASSWORD(sk_postgres_conf),
    DURATION("lock_timeout", sk_postgres_conf, lock_timeout_ms, 1, HOUR),
    DURATION("idle_in_transaction_timeout", sk_postgres_conf, idle_in_transaction_timeout_ms,
             0, DAY),
    END
};

const struct key sk_conf_metrics_keys[] = {
    CUSTOM("listen", metrics_listen, false),
    CUSTOM("token_file", metrics_token, false),
    END
};

/* console.listen and token_file are parsed as metrics' are: the same
 * address rules, the same token characters, read at load. */
const struct key sk_conf_console_keys[] = {
    CUSTOM("listen", console_listen, false),
    CUSTOM("token_file", console_token, false),
    CUSTOM("operators", console_operators, false),
    PATH("tls_cert_file", sk_console_conf, tls_cert_file, false),
    PATH("tls_key_file",  sk_console_conf, tls_key_file, false),
    DURATION("session",   sk_console_conf, session_ms, MIN, DAY),
    BOOL("open_reads",    sk_console_conf, open_reads),
    INT("pool",           sk_console_conf, pool, 1, 16),
    END
};

/* amqp.url: amqp[s]://[user[:password]@]host[:port]/[vhost], or a sequence of
 * such URLs, one per node of a RabbitMQ cluster (a list rather than one
 * comma-separated string: each entry gets its own line:column in errors,
 * and a password may hold a comma). */
static int amqp_url(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_amqp_conf *a = base;
    char label[32];
    int rc;

    if (v->type == YAML_SCALAR_NODE)
        return amqp_node(L, v, "url", a);
    if (v->type != YAML_SEQUENCE_NODE)
        return sk_walk_fail(L, v, "url: expected an amqp:// URL or a list of them, got %s",
                            sk_walk_kind(v));
    size_t n = sk_walk_items(v);
    if (n == 0)
        return sk_walk_fail(L, v, "url: the list of nodes is empty");
    if (n > SK_AMQP_MAX_NODES)
        return sk_walk_fail(L, v, "url: %zu nodes listed, at most %d", n, SK_AMQP_MAX_NODES);
    for (size_t i = 0; i < n; i++) {
        snprintf(label, sizeof(label), "url[%zu]", i);
        yaml_node_t *item = sk_walk_item(L, v, i);
        if ((rc = amqp_node(L, item, label, a)) != SK_OK)
            return rc;
    }
    return SK_OK;
}

/* One node's URL: broker_url.c reads it; the password in url[0] must be
 * the only one given. Messages leave the URL out: it may hold a password. */
static int amqp_node(struct loader *L, yaml_node_t *v, const char *label,
                     struct sk_amqp_conf *a)
{
    bool first = a->n_nodes == 0, wrote_password;
    struct sk_err e;
    const char *s = NULL;
    int rc;

    if ((rc = sk_walk_scalar(L, v, label, "a scalar", &s)) != SK_OK)
        return rc;
    if (sk_broker_url_add(a, label, s, &wrote_password, &e) != SK_OK)
        return sk_walk_fail(L, v, "%s", e.msg);
    if (first && wrote_password)
        return sk_walk_claim_secret(L, v, "the password in url");
    return SK_OK;
}

/* The amqp section, plus what its table cannot say: tls: settings need an
 * amqps:// URL (they would otherwise be silently unused, and the link in
 * clear text), and EXTERNAL needs the certificate it logs in with. */
int sk_conf_amqp_section(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_amqp_conf *a = &((struct sk_conf *)base)->amqp;
    yaml_node_t *at;
    int rc;

    if ((rc = sk_walk_map(L, v, "amqp", sk_conf_amqp_keys, a)) != SK_OK)
        return rc;
    if ((at = sk_walk_lookup(L, v, "tls")) != NULL && !a->tls.enabled)
        return sk_walk_fail(L, at, "amqp.tls needs amqps:// URLs: with amqp:// the link would be "
                            "clear text");
    if (a->auth == SK_AMQP_AUTH_EXTERNAL && a->tls.cert_file == NULL)
        return sk_walk_fail(L, sk_walk_lookup(L, v, "auth_mechanism"),
                            "auth_mechanism external logs in with a client certificate: "
                            "give amqp.tls.cert_file and key_file");
    return SK_OK;
}

static int amqp_tls(struct loader *L, yaml_node_t *v, void *base)
{
    return tls_section(L, v, "amqp.tls", &((struct sk_amqp_conf *)base)->tls);
}

/* A tls: section (amqp.tls, redis.tls): its keys, then its files, read now
 * so that a missing or wrong-permission key fails `sekalid -t` and a
 * reload, at the section's position, instead of every connection. */
static int tls_section(struct loader *L, yaml_node_t *v, const char *label,
                       struct sk_tls_conf *tls)
{
    struct sk_err e;
    yaml_node_t *at;
    int rc;

    if ((rc = sk_walk_map(L, v, label, tls_keys, tls)) != SK_OK)
        return rc;
    if (sk_tls_check_files(tls, label, &e) == SK_OK)
        return SK_OK;
    /* Blame the key the message names. */
    static const char *const keys[] = { "key_file", "cert_file", "ca_file" };
    for (size_t i = 0; i < SK_ARRAY_LEN(keys); i++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "%s.%s:", label, keys[i]);
        if (strncmp(e.msg, prefix, strlen(prefix)) == 0 && v->type == YAML_MAPPING_NODE &&
            (at = sk_walk_lookup(L, v, keys[i])) != NULL)
            return sk_walk_fail(L, at, "%s", e.msg);
    }
    return sk_walk_fail(L, v, "%s", e.msg);
}

/* libpq validates the string (pg_conninfo.c). A password inside it moves
 * to postgres.password, so that conninfo can be logged. */
static int pg_conninfo(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_postgres_conf *p = base;
    char why[400], *conninfo = NULL, *pw = NULL;
    const char *s;
    int rc;

    if ((rc = sk_walk_scalar(L, v, "conninfo", "a scalar", &s)) != SK_OK)
        return rc;
    if (sk_pg_conninfo_split(s, &conninfo, &pw, why, sizeof(why)) != SK_OK)
        return sk_walk_fail(L, v, "conninfo: %s", why);
    rc = SK_OK;
    if (pw != NULL && (rc = sk_walk_claim_secret(L, v, "the password in conninfo")) == SK_OK)
        rc = sk_walk_store(L, v, &p->password, pw);
    if (rc == SK_OK) {
        free(p->conninfo);
        p->conninfo = conninfo;
        conninfo = NULL;
    }
    if (pw != NULL)
        explicit_bzero(pw, strlen(pw));
    free(pw);
    free(conninfo);
    return rc;
}

/* host:port, checked now so that a typo fails `sekalid -t`; whether the
 * address can be bound is only known when the supervisor starts. An empty
 * or null value leaves the endpoint off. */
static int metrics_listen(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_metrics_conf *m = base;
    struct sk_err e;
    const char *s;
    char *host;
    int rc, port;

    if (sk_walk_is_null(v))
        return SK_OK;
    if ((rc = sk_walk_scalar(L, v, "listen", "a scalar", &s)) != SK_OK)
        return rc;
    if (*s == '\0')
        return SK_OK;
    if (sk_conf_value_parse_listen("listen", s, &host, &port, &e) != SK_OK)
        return sk_walk_fail(L, v, "%s", e.msg);
    free(m->listen_host);
    m->listen_host = host;
    m->listen_port = port;
    return SK_OK;
}

/* metrics.token_file: a bearer token that /metrics, /livez and /readyz
 * then require (they show queue names and rates). Read at load, so a
 * reload rotates it. It goes into an HTTP header, so only RFC 6750's
 * token characters; the message never shows it. */
static int bearer_token(struct loader *L, yaml_node_t *v, char **dst)
{
    static const struct key k = { .name = "token_file", .type = T_PASSWORD_FILE };
    static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=";
    int rc;

    if ((rc = sk_walk_password(L, &k, v, dst)) != SK_OK)
        return rc;
    if (strlen(*dst) > 512 || (*dst)[strspn(*dst, ok)] != '\0')
        return sk_walk_fail(L, v, "token_file: the token must be at most 512 characters of "
                            "A-Z a-z 0-9 - . _ ~ + / = (a bearer token, RFC 6750)");
    return SK_OK;
}

static int metrics_token(struct loader *L, yaml_node_t *v, void *base)
{
    return bearer_token(L, v, &((struct sk_metrics_conf *)base)->token);
}

/* The console's section: its first member is read exactly as the metrics
 * section is. */
static int console_listen(struct loader *L, yaml_node_t *v, void *base)
{
    return metrics_listen(L, v, &((struct sk_console_conf *)base)->http);
}

/* A login token short enough to guess is refused here, at start, rather
 * than found out by whoever guesses it. */
#define CONSOLE_TOKEN_MIN 32
#define OPERATORS_MAX     64
#define OPERATOR_NAME_MAX 64   /* console_auth.c's OPERATOR_MAX */

static int console_secret(struct loader *L, yaml_node_t *v, char **dst)
{
    int rc = bearer_token(L, v, dst);
    if (rc != SK_OK)
        return rc;
    if (strlen(*dst) < CONSOLE_TOKEN_MIN)
        return sk_walk_fail(L, v, "token_file: the console's token must be at least %d "
                            "characters (make one with: openssl rand -hex 32)",
                            CONSOLE_TOKEN_MIN);
    return SK_OK;
}

static int console_token(struct loader *L, yaml_node_t *v, void *base)
{
    return console_secret(L, v, &((struct sk_console_conf *)base)->http.token);
}

/* An operator's name goes into the audit, the log and the page: UTF-8,
 * no control characters, so that it reads as it was written. */
static int operator_name(struct loader *L, yaml_node_t *v, void *base)
{
    const char *s;
    int rc = sk_walk_scalar(L, v, "name", "a scalar", &s);
    if (rc != SK_OK)
        return rc;
    size_t len = strlen(s);
    bool plain = len > 0 && len <= OPERATOR_NAME_MAX && sk_text_valid(s, len);
    for (size_t i = 0; plain && i < len; i++)
        plain = (unsigned char)s[i] >= 0x20 && s[i] != 0x7f;
    if (!plain)
        return sk_walk_fail(L, v, "name: 1 to %d bytes of UTF-8 without control characters",
                            OPERATOR_NAME_MAX);
    return sk_walk_store(L, v, &((struct sk_console_operator *)base)->name, s);
}

static int operator_token(struct loader *L, yaml_node_t *v, void *base)
{
    return console_secret(L, v, &((struct sk_console_operator *)base)->token);
}

static const struct key operator_keys[] = {
    CUSTOM("name", operator_name, true),
    CUSTOM("token_file", operator_token, true),
    END
};

/* console.operators: [{name, token_file}, ...], a token per operator, so
 * that the audit names who did a thing rather than whom they said they
 * were. Two names or two tokens alike would make a login ambiguous. */
static int console_operators(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_console_conf *c = base;
    char label[32];
    int rc;

    if (sk_walk_is_null(v))
        return SK_OK;
    if (v->type != YAML_SEQUENCE_NODE)
        return sk_walk_fail(L, v, "operators: expected a sequence of {name, token_file}, "
                            "got %s", sk_walk_kind(v));
    size_t n = sk_walk_items(v);
    if (n > OPERATORS_MAX)
        return sk_walk_fail(L, v, "operators: %zu listed, at most %d", n, OPERATORS_MAX);
    if (n > 0 && (c->operators = calloc(n, sizeof(*c->operators))) == NULL)
        return sk_walk_fail(L, v, "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = sk_walk_item(L, v, i);
        snprintf(label, sizeof(label), "operators[%zu]", i);
        c->n_operators = i + 1;  /* what sk_conf_free() frees, even if this item fails */
        if ((rc = sk_walk_map(L, item, label, operator_keys, &c->operators[i])) != SK_OK)
            return rc;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(c->operators[j].name, c->operators[i].name) == 0)
                return sk_walk_fail(L, item, "%s: the name \"%s\" is given twice", label,
                                    c->operators[i].name);
            if (strcmp(c->operators[j].token, c->operators[i].token) == 0)
                return sk_walk_fail(L, item, "%s: the same token as operators[%zu]: each "
                                    "operator needs a token of their own", label, j);
        }
    }
    return SK_OK;
}

/* The redis section, plus the one rule its table cannot say: sentinels and
 * master_name come together (a sentinel watches masters by name, and a name
 * without sentinels to ask has no one to answer it). */
int sk_conf_redis_section(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_redis_conf *r = &((struct sk_conf *)base)->redis;
    int rc;

    if ((rc = sk_walk_map(L, v, "redis", sk_conf_redis_keys, r)) != SK_OK)
        return rc;
    if (r->n_sentinels > 0 && r->master_name == NULL)
        return sk_walk_fail(L, sk_walk_find(L, v, "sentinels"), "redis.sentinels needs "
                            "redis.master_name: the name the sentinels monitor the master by");
    if (r->n_sentinels == 0 && r->master_name != NULL)
        return sk_walk_fail(L, sk_walk_find(L, v, "master_name"), "redis.master_name needs "
                            "redis.sentinels: a list of host:port to ask for the master");
    return SK_OK;
}

/* redis.tls: present means TLS to the master and the sentinels (Redis
 * has no URL scheme here to say so). */
static int redis_tls(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_redis_conf *r = base;
    r->tls.enabled = true;
    return tls_section(L, v, "redis.tls", &r->tls);
}

/* The sentinels' password is a second secret in the section: it has its
 * own one-source rule, apart from the master's password. */
static int sentinel_password_env(struct loader *L, yaml_node_t *v, void *base)
{
    return sentinel_password(L, v, T_PASSWORD_ENV, &((struct sk_redis_conf *)base)->sentinel_password);
}

static int sentinel_password_file(struct loader *L, yaml_node_t *v, void *base)
{
    return sentinel_password(L, v, T_PASSWORD_FILE, &((struct sk_redis_conf *)base)->sentinel_password);
}

static int sentinel_password(struct loader *L, yaml_node_t *v, enum type t, char **dst)
{
    const struct key k = { .name = t == T_PASSWORD_ENV ? "sentinel_password_env"
                                                       : "sentinel_password_file", .type = t };
    if (*dst != NULL)
        return sk_walk_fail(L, v, "%s conflicts with the other sentinel_password_* key: give the "
                            "sentinels' password one way only", k.name);
    const char *saved = L->secret_from;
    L->secret_from = NULL;  /* not the master's password's source */
    int rc = sk_walk_password(L, &k, v, dst);
    L->secret_from = saved;
    return rc;
}

/* A sequence of host:port, checked now so that a typo fails `sekalid -t`;
 * whether a sentinel answers is only known when a worker connects. */
static int redis_sentinels(struct loader *L, yaml_node_t *v, void *base)
{
    struct sk_redis_conf *r = base;
    char label[32];
    struct sk_err e;
    const char *s;
    int rc;

    if (sk_walk_is_null(v))
        return SK_OK;
    if (v->type != YAML_SEQUENCE_NODE)
        return sk_walk_fail(L, v, "sentinels: expected a sequence of host:port, got %s",
                            sk_walk_kind(v));
    size_t n = sk_walk_items(v);
    if (n > 0 && (r->sentinels = calloc(n, sizeof(*r->sentinels))) == NULL)
        return sk_walk_fail(L, v, "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = sk_walk_item(L, v, i);
        snprintf(label, sizeof(label), "sentinels[%zu]", i);
        if ((rc = sk_walk_scalar(L, item, label, "host:port", &s)) != SK_OK)
            return rc;
        if (*s == ':')
            return sk_walk_fail(L, item, "%s: missing host in \"%.64s\"", label, s);
        if (sk_conf_value_parse_listen(label, s, &r->sentinels[i].host, &r->sentinels[i].port,
                                       &e) != SK_OK)
            return sk_walk_fail(L, item, "%s", e.msg);
        r->n_sentinels = i + 1;  /* what sk_conf_free() frees, even if a later item fails */
    }
    return SK_OK;
}
