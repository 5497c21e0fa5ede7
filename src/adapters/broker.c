/* broker.c - one RabbitMQ connection through librabbitmq: which node of
 * amqp.url to connect to, the login and the channel, closing, keepalive,
 * and the reading of librabbitmq's RPC replies that every broker file uses.
 *
 * librabbitmq is synchronous: heartbeats are only answered while we are
 * inside one of its calls, and a consumer's connection can carry unrelated
 * frames (channel.close, basic.return) between deliveries. The broker files
 * hide both: sk_broker_keepalive() here beats for a connection nobody is
 * using, broker_consume.c reads the stray frames and turns a closed channel
 * into SK_ERR, and broker_publish.c waits for confirms frame by frame.
 *
 * broker.h is one module in six files, cut by what a caller does with the
 * connection, so that each reads on its own: this one makes and ends it,
 * broker_queue.c declares and probes queues, broker_consume.c takes and
 * settles deliveries, broker_scan.c reads a queue without consuming it
 * (sekalictl's dead letters), broker_publish.c publishes with confirms, and
 * broker_wire.c does the connection-free AMQP arithmetic. broker_conn.h is
 * what they share, and only they include it. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp_lib.h"

#include "broker.h"
#include "broker_conn.h"
#include "clock.h"

static int open_node(struct sk_broker **out, const struct sk_amqp_conf *conf, size_t index,
                     struct sk_err *err);
static void append(char *buf, size_t size, const char *s);
static int connect_node(struct sk_broker *b, const struct sk_amqp_conf *conf,
                        const struct sk_amqp_node *node, struct sk_err *err);
static int tls_socket(struct sk_broker *b, const struct sk_amqp_conf *conf,
                      const struct sk_amqp_node *node, amqp_socket_t **out, struct sk_err *err);
static int tls_failed(struct sk_broker *b, int rc, struct sk_err *err);
static int log_in(struct sk_broker *b, const struct sk_amqp_conf *conf,
                  const struct sk_amqp_node *node, struct sk_err *err);
static int heartbeat_seconds(const struct sk_amqp_conf *conf);

/* The node this thread connects to first: the one its last connection
 * was made to, until a connection to it breaks; then the node after it, so
 * that the node that just failed is tried last and a reconnect does not
 * spend connect_timeout on a host that is down before it reaches a live one.
 * In order rather than shuffled: every process starts on the node the
 * operator listed first, stays where it works, and logs read predictably;
 * a cluster spreads the queues' leaders, not sekali. Thread-local because
 * each thread owns its connections (the supervisor's children are
 * single-threaded; sekalictl opens one at a time). */
static _Thread_local size_t next_node;

int sk_broker_open(struct sk_broker **out, const struct sk_amqp_conf *conf, struct sk_err *err)
{
    size_t n = conf->n_nodes;
    char tried[sizeof(err->msg)] = "";
    int rc = SK_ERR;
    bool transient = false;

    size_t first = next_node;  /* sk_broker_close() of a failed attempt may move next_node */

    sk_assert(n > 0);
    /* Every node in turn until one takes the login. A refused login ends
     * the search: the nodes of a cluster share users, so the next one would
     * refuse too, and a wrong password must exit at start (exit 2). */
    for (size_t k = 0; k < n; k++) {
        struct sk_err one = { 0 };
        size_t i = (first + k) % n;
        rc = open_node(out, conf, i, &one);
        if (rc == SK_OK) {
            next_node = i;
            return SK_OK;
        }
        if (n == 1 || one.code == SK_AUTH) {
            if (err != NULL)
                *err = one;
            return rc;
        }
        transient = transient || rc == SK_AGAIN;
        append(tried, sizeof(tried), tried[0] != '\0' ? "; " : "");
        append(tried, sizeof(tried), one.msg);
    }
    next_node = first + 1;
    /* One node down is the case to back off from and retry, whatever the
     * others said. */
    return sk_err_set(err, transient ? SK_AGAIN : rc, "no RabbitMQ node took the connection: %s",
                      tried);
}

/* Appends s to the string in buf, cut to fit. */
static void append(char *buf, size_t size, const char *s)
{
    size_t used = strlen(buf), room = size - used - 1, len = strlen(s);
    if (len > room)
        len = room;
    memcpy(buf + used, s, len);
    buf[used + len] = '\0';
}

/* One node: connect, log in, open the channel. */
static int open_node(struct sk_broker **out, const struct sk_amqp_conf *conf, size_t index,
                     struct sk_err *err)
{
    const struct sk_amqp_node *node = &conf->nodes[index];
    struct sk_broker *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(broker)");
    b->next_publish_tag = 1;
    b->node = index;
    if (strlen(conf->user) < sizeof(b->user))
        memcpy(b->user, conf->user, strlen(conf->user) + 1);

    int rc = connect_node(b, conf, node, err);
    if (rc == SK_OK)
        rc = log_in(b, conf, node, err);
    if (rc == SK_OK) {
        char what[300];
        amqp_channel_open(b->conn, SK_BROKER_CHANNEL);
        snprintf(what, sizeof(what), "amqp_channel_open(%s:%d)", node->host, node->port);
        rc = sk_broker_rpc_check(b, amqp_get_rpc_reply(b->conn), what, err);
    }
    if (rc != SK_OK) {
        sk_broker_close(b);
        return rc;
    }
    *out = b;
    return SK_OK;
}

static int connect_node(struct sk_broker *b, const struct sk_amqp_conf *conf,
                        const struct sk_amqp_node *node, struct sk_err *err)
{
    b->conn = amqp_new_connection();
    if (b->conn == NULL)
        return sk_err_set(err, SK_ERR, "amqp_new_connection failed");
    /* Until logged in there is nothing to close politely. */
    b->broken = true;
    amqp_socket_t *socket = NULL;
    int rc = conf->tls.enabled ? tls_socket(b, conf, node, &socket, err) : SK_OK;
    if (rc != SK_OK)
        return rc;
    if (socket == NULL && (socket = amqp_tcp_socket_new(b->conn)) == NULL)
        return sk_err_set(err, SK_ERR, "amqp_tcp_socket_new failed");
    struct timeval timeout = sk_broker_timeval(conf->connect_timeout_ms);
    int status = amqp_socket_open_noblock(socket, node->host, node->port, &timeout);
    if (status != AMQP_STATUS_OK) {
        sk_err_set(err, SK_AGAIN, "amqp connect to %s:%d failed: %s", node->host, node->port,
                   amqp_error_string2(status));
        return tls_failed(b, SK_AGAIN, err);
    }
    /* Bound the login and every later RPC, so a wedged broker turns into an
     * error we can back off from instead of a hung worker. */
    amqp_set_handshake_timeout(b->conn, &timeout);
    amqp_set_rpc_timeout(b->conn, &timeout);
    return SK_OK;
}

/* An amqps:// connection: librabbitmq's OpenSSL socket, its context set up
 * by tls.c (trust, client certificate, verification inside the handshake,
 * the name to check, SNI). librabbitmq's own checks stay off: its peer
 * check runs only after the handshake and its name check reads a DNS name
 * where we may connect to an IP address. The files are read here, for
 * each connection, so a reload or a reconnect picks up rotated ones. */
static int tls_socket(struct sk_broker *b, const struct sk_amqp_conf *conf,
                      const struct sk_amqp_node *node, amqp_socket_t **out, struct sk_err *err)
{
    amqp_socket_t *socket = amqp_ssl_socket_new(b->conn);
    if (socket == NULL)
        return sk_err_set(err, SK_ERR, "amqp_ssl_socket_new failed");
    amqp_ssl_socket_set_verify_peer(socket, 0);
    amqp_ssl_socket_set_verify_hostname(socket, 0);
    if ((b->tls = calloc(1, sizeof(*b->tls))) == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(tls state)");
    struct sk_err e = { 0 };
    SSL_CTX *ctx = amqp_ssl_socket_get_context(socket);
    /* A file gone since the load: the operator's to fix, meanwhile retried. */
    if (sk_tls_prepare(ctx, &conf->tls, node->host, b->tls, &e) != SK_OK)
        return sk_err_set(err, SK_AGAIN, "amqp connect to %s:%d: %s", node->host, node->port,
                          e.msg);
    *out = socket;
    return SK_OK;
}

/* Adds TLS's own explanation, if it has one, to the message in err: "a
 * SSL error occurred" tells nobody which certificate to fix. A TLS
 * failure is an outage (SK_AGAIN, backed off and retried), never a
 * reason to try clear text. */
static int tls_failed(struct sk_broker *b, int rc, struct sk_err *err)
{
    char why[200];

    if (b->tls == NULL || !sk_tls_explain(b->tls, why, sizeof(why)))
        return rc;
    if (err != NULL) {
        size_t used = strlen(err->msg);
        snprintf(err->msg + used, sizeof(err->msg) - used, ": %s", why);
    }
    return SK_AGAIN;
}

/* The version the broker gives in connection.start's server-properties:
 * what it does with a declaration's arguments depends on it. */
static void read_version(struct sk_broker *b)
{
    b->version[0] = '\0';
    const amqp_table_t *props = amqp_get_server_properties(b->conn);
    for (int i = 0; props != NULL && i < props->num_entries; i++) {
        const amqp_table_entry_t *e = &props->entries[i];
        if (e->key.len == 7 && memcmp(e->key.bytes, "version", 7) == 0 &&
            (e->value.kind == AMQP_FIELD_KIND_UTF8 || e->value.kind == AMQP_FIELD_KIND_BYTES)) {
            amqp_bytes_t v = e->value.value.bytes;
            size_t n = v.len < sizeof(b->version) - 1 ? v.len : sizeof(b->version) - 1;
            memcpy(b->version, v.bytes, n);
            b->version[n] = '\0';
        }
    }
}

const char *sk_broker_version(const struct sk_broker *b) { return b->version; }

int sk_broker_major(const struct sk_broker *b)
{
    return b->version[0] >= '0' && b->version[0] <= '9' ? atoi(b->version) : 0;
}

bool sk_broker_quorum_priorities(const struct sk_broker *b)
{
    int major = sk_broker_major(b);
    if (major == 0)
        return true;
    const char *dot = strchr(b->version, '.');
    int minor = dot != NULL ? atoi(dot + 1) : 0;
    return major > 4 || (major == 4 && minor >= 3);
}

static int log_in(struct sk_broker *b, const struct sk_amqp_conf *conf,
                  const struct sk_amqp_node *node, struct sk_err *err)
{
    char what[300];
    amqp_rpc_reply_t reply;

    snprintf(what, sizeof(what), "amqp_login(%s:%d)", node->host, node->port);
    /* EXTERNAL's identity is the certificate's and RabbitMQ ignores the
     * response; librabbitmq fails on an empty one, so it gets the user. */
    if (conf->auth == SK_AMQP_AUTH_EXTERNAL)
        reply = amqp_login(b->conn, conf->vhost, 0, AMQP_DEFAULT_FRAME_SIZE,
                           heartbeat_seconds(conf), AMQP_SASL_METHOD_EXTERNAL, conf->user);
    else
        reply = amqp_login(b->conn, conf->vhost, 0, AMQP_DEFAULT_FRAME_SIZE,
                           heartbeat_seconds(conf), AMQP_SASL_METHOD_PLAIN, conf->user,
                           conf->password != NULL ? conf->password : "");
    int rc = sk_broker_rpc_check(b, reply, what, err);
    b->broken = rc != SK_OK;
    if (rc == SK_OK) {
        b->frame_max = amqp_get_frame_max(b->conn);
        read_version(b);
        return SK_OK;
    }
    /* In TLS 1.3 the server judges our certificate after the handshake:
     * its refusal arrives as the first read's error. */
    if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
        return tls_failed(b, rc, err);
    /* 403 ACCESS_REFUSED: wrong user or password (librabbitmq asks for
     * authentication_failure_close, so RabbitMQ says so instead of
     * dropping the socket); 530 NOT_ALLOWED: no access to the vhost. */
    if (reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        uint16_t code = ((amqp_connection_close_t *)reply.reply.decoded)->reply_code;
        if (code == AMQP_ACCESS_REFUSED || code == AMQP_NOT_ALLOWED)
            return sk_err_mark_auth(err, SK_ERR);
    }
    return rc;
}

void sk_broker_close(struct sk_broker *b)
{
    if (b == NULL)
        return;
    if (b->conn != NULL) {
        /* Closing politely makes the broker requeue our unacked deliveries
         * at once. A broken connection is only destroyed (see broken in
         * broker_conn.h): closing its socket requeues them as well. Acks
         * still pending are the consumer's to send first
         * (sk_broker_close_consumer()). */
        bool lost = b->broken;
        if (!lost) {
            amqp_channel_close(b->conn, SK_BROKER_CHANNEL, AMQP_REPLY_SUCCESS);
            amqp_rpc_reply_t r = amqp_connection_close(b->conn, AMQP_REPLY_SUCCESS);
            lost = r.reply_type != AMQP_RESPONSE_NORMAL;
        }
        amqp_destroy_connection(b->conn);
        /* A connection that failed, or could not even be closed, was lost:
         * its node is tried last next time (see next_node). */
        if (lost && next_node == b->node)
            next_node = b->node + 1;
    }
    free(b->tls);  /* after the connection: its SSL_CTX points to it */
    free(b);
}

int sk_broker_lost(struct sk_broker *b, int status, const char *what, struct sk_err *err)
{
    b->broken = true;
    return sk_err_set(err, SK_AGAIN, "%s: %s", what, amqp_error_string2(status));
}

int sk_broker_read_large_frames(struct sk_broker *b, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    if (b->large_frames)
        return SK_OK;
    /* Tuning again only moves librabbitmq's own limit (and the size of its
     * send buffer); the broker keeps the frame_max it agreed to, which is
     * what sk_broker_publish*() check against (b->frame_max). */
    int status = amqp_tune_connection(b->conn, amqp_get_channel_max(b->conn),
                                      SK_BROKER_READ_FRAME_MAX, amqp_get_heartbeat(b->conn));
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "amqp_tune_connection(read frames up to 1 MiB)", err);
    b->large_frames = true;
    return SK_OK;
}

int sk_broker_keepalive(struct sk_broker *b, struct sk_err *err)
{
    SK_BROKER_USABLE(b, err);
    int heartbeat_s = amqp_get_heartbeat(b->conn);
    int64_t now = sk_now_ms();
    if (heartbeat_s <= 0 || now - b->keepalive_ms < (int64_t)heartbeat_s * 1000 / 2)
        return SK_OK;
    amqp_frame_t frame = { .frame_type = AMQP_FRAME_HEARTBEAT, .channel = 0 };
    int status = amqp_send_frame(b->conn, &frame);
    if (status != AMQP_STATUS_OK)
        return sk_broker_lost(b, status, "sending an AMQP heartbeat", err);
    b->keepalive_ms = now;
    return SK_OK;
}

bool sk_broker_idle_ok(const struct sk_broker *b)
{
    if (b == NULL || b->broken || b->channel_closed || b->scanning || b->subscribed ||
        amqp_data_in_buffer(b->conn) || amqp_frames_enqueued(b->conn))
        return false;
    struct pollfd p = { .fd = amqp_get_sockfd(b->conn), .events = POLLIN };
    return p.fd >= 0 && poll(&p, 1, 0) == 0;
}

uint32_t sk_broker_keepalive_period_ms(const struct sk_amqp_conf *conf)
{
    return (uint32_t)heartbeat_seconds(conf) * 1000 / 4;
}

/* AMQP negotiates whole seconds; a configured fraction rounds up. */
static int heartbeat_seconds(const struct sk_amqp_conf *conf)
{
    return (int)((conf->heartbeat_ms + 999) / 1000);
}

int sk_broker_rpc_check(struct sk_broker *b, amqp_rpc_reply_t reply, const char *what,
                        struct sk_err *err)
{
    switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        return SK_OK;
    case AMQP_RESPONSE_NONE:
        b->broken = true;
        return sk_err_set(err, SK_AGAIN, "%s: missing RPC reply", what);
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        return sk_broker_lost(b, reply.library_error, what, err);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            /* The broker is gone from this connection: nothing to close. */
            b->broken = true;
            amqp_connection_close_t *m = reply.reply.decoded;
            return sk_err_set(err, SK_ERR, "%s: broker closed the connection: %u %.*s", what,
                              m->reply_code, (int)m->reply_text.len,
                              (const char *)m->reply_text.bytes);
        }
        if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            amqp_channel_close_t *m = reply.reply.decoded;
            return sk_err_set(err, SK_ERR, "%s: broker closed the channel: %u %.*s", what,
                              m->reply_code, (int)m->reply_text.len,
                              (const char *)m->reply_text.bytes);
        }
        return sk_err_set(err, SK_ERR, "%s: unexpected server method 0x%08x", what,
                          reply.reply.id);
    }
    return sk_err_set(err, SK_ERR, "%s: unknown reply type", what);
}
