/* tls.h - what sekali's TLS client connections share, whichever library
 * opens the socket: the settings (the same keys under amqp.tls and
 * redis.tls), the check of the certificate and key files at load time, and
 * the OpenSSL context set-up that verifies the peer, checks its name and
 * sends SNI, and then says in plain words why a handshake failed.
 *
 * PostgreSQL is not here: libpq does its own TLS from conninfo's
 * sslmode/sslrootcert/sslcert/sslkey. */
#ifndef SK_TLS_H
#define SK_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

#include "common.h"

struct sk_tls_conf {
    bool  enabled;      /* amqps:// (or redis.tls given): never falls back to plain text */
    bool  verify;       /* verify the peer's chain and name; default true */
    char *ca_file;      /* PEM bundle of trusted CAs; NULL: the system's trust store */
    char *cert_file;    /* client certificate chain (PEM); with key_file or not at all */
    char *key_file;     /* its private key (PEM), not readable by others */
    char *server_name;  /* the name checked in the peer's certificate and sent as SNI;
                         * NULL: the host connected to */
};

/* What one connection's handshake found; zeroed by sk_tls_prepare(), and
 * filled by OpenSSL's callbacks during the handshake. Lives as long as the
 * SSL_CTX it is attached to. */
struct sk_tls_state {
    char name[256];     /* the name verified, and sent as SNI unless an IP address */
    bool ip;
    int  verify_error;  /* the first X509_V_ERR_* of the peer's chain; 0: none */
    int  verify_depth;  /* where in the chain (0: the server's own certificate) */
    bool cert_requested; /* the server asked for a client certificate we do not have */
    const SSL *ssl;     /* the connection, once its handshake started (sk_tls_pending) */
};

/* OpenSSL's one-time set-up (its configuration file, the default provider,
 * the digest tables), done by the supervisor before it forks: each worker,
 * relay and janitor then inherits it instead of repeating it at its first
 * connection, which SCRAM's password exchange with PostgreSQL makes even
 * without TLS. A worker starts (and restarts after a crash) that much
 * sooner, and keeps some 800 KiB of libcrypto's pages out of its resident
 * memory. Before any thread is started: fork() copies no lock. */
void sk_tls_init_before_fork(void);

/* Checks the files tls names, as a load does (at start and on every
 * reload): each is a readable regular file of PEM that OpenSSL accepts,
 * the key matches the certificate, and the key file is neither
 * world-readable nor writable by others. label is the section ("amqp.tls").
 * Returns SK_OK, or SK_ERR with "<label>.<key>: ..." in err, naming the
 * path and the problem, never the contents. Blocks on file reads only. */
int sk_tls_check_files(const struct sk_tls_conf *tls, const char *label, struct sk_err *err);

/* Sets up ctx (one connection's context, not yet connected) for tls when
 * connecting to host: trust (ca_file, else the system store), client
 * certificate, peer verification that fails the handshake itself, the name
 * to check (server_name, else host; an IP literal is checked as an IP), and
 * SNI. st must outlive ctx. Returns SK_OK or SK_ERR (a file that became
 * unreadable since the load) with err filled. */
int sk_tls_prepare(SSL_CTX *ctx, const struct sk_tls_conf *tls, const char *host,
                   struct sk_tls_state *st, struct sk_err *err);

/* What sk_tls_explain() found. A setting is what an operator must change
 * (trust, name, certificate, port): retrying as is cannot help, so a link
 * that cares (the Redis locks) treats it as it treats a refused password,
 * never as an outage. */
enum sk_tls_cause {
    SK_TLS_UNEXPLAINED = 0,  /* TLS does not explain the failure */
    SK_TLS_TRANSIENT,        /* explained, and may pass by itself */
    SK_TLS_SETTING,          /* the peer's certificate did not verify (CA, name,
                              * dates), the server refused or wanted our
                              * certificate, or the port does not speak TLS */
};

/* After a failed handshake or a connection that broke right after it:
 * writes into buf why, in words an operator can act on ("the server's
 * certificate has expired", "the server refused our client certificate"),
 * from st and the thread's OpenSSL error queue, which it then clears.
 * Returns SK_TLS_UNEXPLAINED (buf "") when TLS does not explain the
 * failure. */
enum sk_tls_cause sk_tls_explain(const struct sk_tls_state *st, char *buf, size_t size);

/* Whether the connection of st holds bytes read from the socket that the
 * application has not taken yet (decrypted or still raw, read ahead): more
 * data is waiting even though the socket may have none. false before the
 * handshake and for st NULL. */
bool sk_tls_pending(const struct sk_tls_state *st);

/* Frees tls's strings (the struct itself is the caller's). */
void sk_tls_conf_free(struct sk_tls_conf *tls);

#endif
