/* tls.c - the TLS client side sekali's own connections share (see tls.h).
 *
 * librabbitmq (and, for Redis, our own OpenSSL stream) owns the SSL object
 * and the handshake; what a connection must never do is left to this file,
 * through the SSL_CTX it is handed before connecting:
 *   - verify the peer inside the handshake (SSL_VERIFY_PEER), so that a bad
 *     chain aborts it before one byte of AMQP or RESP is sent, and remember
 *     the first verification error, which OpenSSL's "certificate verify
 *     failed" alone does not say;
 *   - check the name in the certificate: server_name, else the host
 *     connected to, checked as an IP address when it is one (a DNS-name
 *     check of "127.0.0.1" would never match);
 *   - send that name as SNI, set when the handshake starts, because the
 *     library set the host it connects to when it made the SSL object.
 * Key material never leaves OpenSSL: messages name files and causes only. */
#include "tls.h"
#include "file.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509v3.h>

static int check_file(const char *label, const char *key, const char *path, bool secret,
                      struct sk_err *err);
static int load_error(const char *label, const char *key, const char *path, struct sk_err *err);
static bool is_ip(const char *host);
static int on_verify(int ok, X509_STORE_CTX *x);
static void on_info(const SSL *ssl, int where, int ret);
static int on_cert_request(SSL *ssl, X509 **cert, EVP_PKEY **key);
static const char *verify_words(int code);

void sk_tls_init_before_fork(void)
{
    /* Fetching a digest is what loads the default provider; SHA-256 is the
     * one SCRAM uses first. Failure only means each child does it itself. */
    if (OPENSSL_init_ssl(OPENSSL_INIT_LOAD_CONFIG, NULL) == 1)
        EVP_MD_free(EVP_MD_fetch(NULL, "SHA256", NULL));
    ERR_clear_error();
}

int sk_tls_check_files(const struct sk_tls_conf *tls, const char *label, struct sk_err *err)
{
    int rc;

    if ((tls->cert_file == NULL) != (tls->key_file == NULL))
        return sk_err_set(err, SK_ERR, "%s: cert_file and key_file go together: a client "
                          "certificate needs its key", label);
    if ((tls->ca_file != NULL && (rc = check_file(label, "ca_file", tls->ca_file, false, err))) ||
        (tls->cert_file != NULL &&
         (rc = check_file(label, "cert_file", tls->cert_file, false, err))) ||
        (tls->key_file != NULL && (rc = check_file(label, "key_file", tls->key_file, true, err))))
        return rc;

    /* What OpenSSL will say at the first connection, said now, with the file. */
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return sk_err_set(err, SK_ERR, "%s: SSL_CTX_new failed", label);
    ERR_clear_error();
    rc = SK_OK;
    if (tls->ca_file != NULL && SSL_CTX_load_verify_locations(ctx, tls->ca_file, NULL) != 1)
        rc = load_error(label, "ca_file", tls->ca_file, err);
    else if (tls->cert_file != NULL &&
             SSL_CTX_use_certificate_chain_file(ctx, tls->cert_file) != 1)
        rc = load_error(label, "cert_file", tls->cert_file, err);
    else if (tls->key_file != NULL &&
             (SSL_CTX_use_PrivateKey_file(ctx, tls->key_file, SSL_FILETYPE_PEM) != 1 ||
              SSL_CTX_check_private_key(ctx) != 1))
        rc = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH ||
             ERR_peek_last_error() == 0
             ? sk_err_set(err, SK_ERR, "%s.key_file: %s is not the key of %s", label,
                          tls->key_file, tls->cert_file)
             : load_error(label, "key_file", tls->key_file, err);
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return rc;
}

/* A readable regular file; a key also not open to others (libpq refuses
 * such a key too). Group read is allowed: Debian's ssl-cert group. */
static int check_file(const char *label, const char *key, const char *path, bool secret,
                      struct sk_err *err)
{
    struct stat st;
    int fd, e = sk_file_open(path, secret ? S_IRWXO | S_IWGRP | S_IXGRP : 0, &fd, &st);

    if (e == 0) {
        close(fd);
        return SK_OK;
    }
    if (e == SK_FILE_TOO_OPEN)
        return sk_err_set(err, SK_ERR, "%s.%s: %s has mode %04o: a private key must not be "
                          "open to others (chmod 600 or 640)", label, key, path,
                          (unsigned)(st.st_mode & 07777));
    return sk_err_set(err, SK_ERR, "%s.%s: cannot open %s: %s", label, key, path,
                      sk_file_error(e));
}

/* OpenSSL's reason ("no start line", "bad decrypt") names no key bytes. */
static int load_error(const char *label, const char *key, const char *path, struct sk_err *err)
{
    unsigned long e = ERR_peek_last_error();
    const char *why = e != 0 ? ERR_reason_error_string(e) : NULL;

    return sk_err_set(err, SK_ERR, "%s.%s: OpenSSL cannot use %s: %s", label, key, path,
                      why != NULL ? why : "not PEM");
}

int sk_tls_prepare(SSL_CTX *ctx, const struct sk_tls_conf *tls, const char *host,
                   struct sk_tls_state *st, struct sk_err *err)
{
    const char *name = tls->server_name != NULL ? tls->server_name : host;
    X509_VERIFY_PARAM *param = SSL_CTX_get0_param(ctx);

    memset(st, 0, sizeof(*st));
    ERR_clear_error();
    if (tls->ca_file == NULL && SSL_CTX_set_default_verify_paths(ctx) != 1)
        return sk_err_set(err, SK_ERR, "TLS: cannot load the system's trust store");
    if (tls->ca_file != NULL && SSL_CTX_load_verify_locations(ctx, tls->ca_file, NULL) != 1)
        return load_error("tls", "ca_file", tls->ca_file, err);
    if (tls->cert_file != NULL &&
        (SSL_CTX_use_certificate_chain_file(ctx, tls->cert_file) != 1 ||
         SSL_CTX_use_PrivateKey_file(ctx, tls->key_file, SSL_FILETYPE_PEM) != 1))
        return load_error("tls", "cert_file/key_file", tls->cert_file, err);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* Without read-ahead, OpenSSL reads each record with two read()s, its
     * 5-byte header and then its body; with it, one read() takes whatever
     * the socket holds, several records at a time. Both users call
     * SSL_read() before they wait on the socket (librabbitmq polls only on
     * SSL_ERROR_WANT_READ, the Redis link blocks in SSL_read()), so bytes
     * read ahead are never left waiting behind a poll(). */
    SSL_CTX_set_read_ahead(ctx, 1);

    if (strlen(name) >= sizeof(st->name))
        return sk_err_set(err, SK_ERR, "TLS: the name %.64s... is too long", name);
    snprintf(st->name, sizeof(st->name), "%s", name);
    st->ip = is_ip(name);
    if (st->ip && X509_VERIFY_PARAM_set1_ip_asc(param, name) != 1)
        return sk_err_set(err, SK_ERR, "TLS: cannot check the address %s", name);
    if (!st->ip && X509_VERIFY_PARAM_set1_host(param, name, 0) != 1)
        return sk_err_set(err, SK_ERR, "TLS: cannot check the name %s", name);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    SSL_CTX_set_app_data(ctx, st);
    SSL_CTX_set_info_callback(ctx, on_info);
    /* Called only when the server asks for a certificate and we have none:
     * remembered, because its refusal (an alert right before the server
     * closes) can be lost to a connection reset. */
    if (tls->cert_file == NULL)
        SSL_CTX_set_client_cert_cb(ctx, on_cert_request);
    SSL_CTX_set_verify(ctx, tls->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE,
                       tls->verify ? on_verify : NULL);
    if (!tls->verify) {
        X509_VERIFY_PARAM_set1_host(param, NULL, 0);
        X509_VERIFY_PARAM_set1_ip(param, NULL, 0);
    }
    return SK_OK;
}

static bool is_ip(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* Keeps the first failure of the chain: the one that says why. */
static int on_verify(int ok, X509_STORE_CTX *x)
{
    SSL *ssl = X509_STORE_CTX_get_ex_data(x, SSL_get_ex_data_X509_STORE_CTX_idx());
    struct sk_tls_state *st = ssl != NULL ? SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)) : NULL;

    if (!ok && st != NULL && st->verify_error == 0) {
        st->verify_error = X509_STORE_CTX_get_error(x);
        st->verify_depth = X509_STORE_CTX_get_error_depth(x);
    }
    return ok;
}

/* SNI is written into the ClientHello, which is built after this. An IP
 * address is never sent as SNI (RFC 6066, 3). */
static void on_info(const SSL *ssl, int where, int ret)
{
    (void)ret;
    if (!(where & SSL_CB_HANDSHAKE_START))
        return;
    struct sk_tls_state *st = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    if (st == NULL)
        return;
    st->ssl = ssl;  /* librabbitmq keeps its SSL to itself: sk_tls_pending() needs it */
    SSL_set_tlsext_host_name((SSL *)ssl, st->ip ? NULL : st->name);
}

bool sk_tls_pending(const struct sk_tls_state *st)
{
    return st != NULL && st->ssl != NULL && SSL_has_pending(st->ssl) == 1;
}

static int on_cert_request(SSL *ssl, X509 **cert, EVP_PKEY **key)
{
    struct sk_tls_state *st = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    (void)cert, (void)key;
    if (st != NULL)
        st->cert_requested = true;
    return 0;  /* none to give: the handshake goes on without one */
}

enum sk_tls_cause sk_tls_explain(const struct sk_tls_state *st, char *buf, size_t size)
{
    unsigned long e = ERR_peek_last_error();
    int reason = ERR_GET_REASON(e);
    enum sk_tls_cause cause = SK_TLS_SETTING;

    buf[0] = '\0';
    if (st != NULL && (st->verify_error == X509_V_ERR_HOSTNAME_MISMATCH ||
                       st->verify_error == X509_V_ERR_IP_ADDRESS_MISMATCH)) {
        snprintf(buf, size, "TLS: host name mismatch: the server's certificate does not name "
                 "%s (tls.server_name)", st->name);
    } else if (st != NULL && st->verify_error != 0) {
        bool dated = st->verify_error == X509_V_ERR_CERT_HAS_EXPIRED ||
                     st->verify_error == X509_V_ERR_CERT_NOT_YET_VALID;
        snprintf(buf, size, "TLS: %s%s (%s)", verify_words(st->verify_error),
                 dated && st->verify_depth > 0 ? ", or a CA certificate in its chain" : "",
                 X509_verify_cert_error_string(st->verify_error));
    } else if (e != 0 && ERR_GET_LIB(e) == ERR_LIB_SSL) {
        /* The server's alerts: in TLS 1.3 a refused client certificate
         * only shows at the first read after the handshake. */
        if (reason == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED ||
            reason == SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE)
            snprintf(buf, size, "TLS: the server requires a client certificate "
                     "(tls.cert_file, tls.key_file) (%s)", ERR_reason_error_string(e));
        else if (reason == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE ||
                 reason == SSL_R_TLSV1_ALERT_UNKNOWN_CA ||
                 reason == SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED ||
                 reason == SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED ||
                 reason == SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN ||
                 reason == SSL_R_TLSV1_ALERT_ACCESS_DENIED)
            snprintf(buf, size, "TLS: the server refused our client certificate (%s)",
                     ERR_reason_error_string(e));
        else if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG)
            snprintf(buf, size, "TLS: the server does not speak TLS on this port (%s)",
                     ERR_reason_error_string(e));
        else if (ERR_reason_error_string(e) != NULL) {
            snprintf(buf, size, "TLS: %s", ERR_reason_error_string(e));
            cause = SK_TLS_TRANSIENT;
        }
    } else if (st != NULL && st->cert_requested) {
        snprintf(buf, size, "TLS: the server requires a client certificate "
                 "(tls.cert_file, tls.key_file) (it asked for one, we have none)");
    }
    ERR_clear_error();
    return buf[0] != '\0' ? cause : SK_TLS_UNEXPLAINED;
}

static const char *verify_words(int code)
{
    switch (code) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
        return "the server's certificate is not signed by a CA we trust (tls.ca_file)";
    case X509_V_ERR_CERT_HAS_EXPIRED:
        return "the server's certificate has expired";
    case X509_V_ERR_CERT_NOT_YET_VALID:
        return "the server's certificate is not valid yet (check the clocks)";
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
        return "the server's certificate is for another host name (tls.server_name)";
    case X509_V_ERR_CERT_REVOKED:
        return "the server's certificate is revoked";
    default:
        return "the server's certificate did not verify";
    }
}

void sk_tls_conf_free(struct sk_tls_conf *tls)
{
    free(tls->ca_file);
    free(tls->cert_file);
    free(tls->key_file);
    free(tls->server_name);
}
