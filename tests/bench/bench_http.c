/* bench_http.c - the service the HTTP handler's benchmark calls: a local
 * keep-alive HTTP server whose every POST is the same job as the C bench
 * handler's, one INSERT of a business row into sekali_bench.jobs.
 *
 *   bench_http CONNINFO PORT_FILE [TLS_DIR]
 *
 * Listens on a free loopback port, writes it into PORT_FILE, and serves
 * until SIGTERM or SIGINT: clear text, or with TLS_DIR HTTPS (libmicrohttpd's
 * GnuTLS) with TLS_DIR's server.crt and server.key, the test CA's server
 * certificate for localhost and 127.0.0.1 (tests/servers.sh, SEKALI_TLS=1),
 * so that the handler verifies it against TLS_DIR/ca.crt as any client
 * would. A POST to /QUEUE with the Idempotency-Key header
 * and a body holding the producer's time stamp (tests/bench/bench_amqp.c)
 * inserts (QUEUE, key, body, clock_timestamp()) and answers 200 "ok"; a
 * failed INSERT answers 503, which the handler retries. The INSERT commits
 * on its own (the service's transaction, not sekali's: external mode) with
 * synchronous_commit on, as sekali's own commits, so that the comparison
 * with the C handler is not won by a cheaper commit. Like the effect table
 * itself it has no uniqueness: a request sent twice is two rows, which the
 * benchmark's check counts as a doubled effect.
 *
 * One thread per connection (libmicrohttpd), each with its own PostgreSQL
 * connection opened at its first request: sekali's workers keep one
 * connection each alive, so that is one thread and one session per worker.
 * On exit prints "requests N failed N connections N tls N PROTOCOL" on
 * stdout: tls counts the requests that came over a TLS session, PROTOCOL
 * is the last one's negotiated version (or "-"), so that the benchmark can
 * tell from this side that HTTPS really was HTTPS; connections, that
 * keep-alive left one connection (one handshake) per worker. A connection
 * that never sends a request (a probe with openssl s_client) adds to
 * connections only. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <libpq-fe.h>
#include <microhttpd.h>
#include <netinet/in.h>

#define BODY_MAX 64  /* a decimal time stamp; anything longer is refused */

#define INSERT_SQL "INSERT INTO sekali_bench.jobs (queue, key, published_us, committed) " \
                   "VALUES ($1, $2, $3, clock_timestamp())"

static const char   *conninfo;
static pthread_key_t pg_key;
static atomic_long   requests, failed, connections, tls_requests;
static const char *_Atomic protocol = "-";  /* GnuTLS's static names */

struct upload {
    char   body[BODY_MAX + 1];
    size_t len;
    int    too_long;
};

static void close_pg(void *pg) { PQfinish(pg); }

static void on_connection(void *arg, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)arg, (void)c, (void)socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add(&connections, 1);
}

/* Counts a request that came over TLS: a clear-text service's connections
 * have no session to show. By a request's first call the handshake is over. */
static void note_tls(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (ci == NULL || ci->tls_session == NULL)
        return;
    const char *name = gnutls_protocol_get_name(gnutls_protocol_get_version(ci->tls_session));
    atomic_store(&protocol, name != NULL ? name : "unknown");
    atomic_fetch_add(&tls_requests, 1);
}

/* This connection thread's session, opened and prepared at its first use;
 * NULL when the server cannot be reached (the request then fails). */
static PGconn *session(void)
{
    PGconn *pg = pthread_getspecific(pg_key);
    if (pg != NULL && PQstatus(pg) == CONNECTION_OK)
        return pg;
    PQfinish(pg);
    pthread_setspecific(pg_key, NULL);
    pg = PQconnectdb(conninfo);
    PGresult *r = NULL;
    if (PQstatus(pg) == CONNECTION_OK) {
        PQclear(PQexec(pg, "SET synchronous_commit = on"));
        r = PQprepare(pg, "insert", INSERT_SQL, 3, NULL);
    }
    if (r == NULL || PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "bench_http: %s", PQerrorMessage(pg));
        PQclear(r);
        PQfinish(pg);
        return NULL;
    }
    PQclear(r);
    pthread_setspecific(pg_key, pg);
    return pg;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text,
                                                             MHD_RESPMEM_PERSISTENT);
    if (r == NULL)
        return MHD_NO;
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *arg, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *data, size_t *data_size, void **cls)
{
    (void)arg, (void)version;
    struct upload *u = *cls;
    if (u == NULL) {
        note_tls(c);
        *cls = u = calloc(1, sizeof(*u));
        return u != NULL ? MHD_YES : MHD_NO;
    }
    if (*data_size > 0) {
        if (u->len + *data_size > BODY_MAX)
            u->too_long = 1;
        else
            memcpy(u->body + u->len, data, *data_size), u->len += *data_size;
        *data_size = 0;
        return MHD_YES;
    }
    atomic_fetch_add(&requests, 1);
    const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
    if (strcmp(method, "POST") != 0 || url[0] != '/' || url[1] == '\0' || key == NULL ||
        u->too_long || u->len == 0)
        return atomic_fetch_add(&failed, 1), answer(c, 400, "POST /QUEUE, Idempotency-Key, a time stamp");
    PGconn *pg = session();
    const char *values[3] = { url + 1, key, u->body };
    PGresult *r = pg != NULL ? PQexecPrepared(pg, "insert", 3, values, NULL, NULL, 0) : NULL;
    int ok = r != NULL && PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok && pg != NULL)
        fprintf(stderr, "bench_http: INSERT failed: %s", PQerrorMessage(pg));
    PQclear(r);
    if (!ok)
        return atomic_fetch_add(&failed, 1), answer(c, 503, "the INSERT failed");
    return answer(c, 200, "ok");
}

static void on_done(void *arg, struct MHD_Connection *c, void **cls,
                    enum MHD_RequestTerminationCode why)
{
    (void)arg, (void)c, (void)why;
    free(*cls);
    *cls = NULL;
}

/* DIR/NAME's contents as a new string (the caller frees it), or NULL. */
static char *slurp(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    char *text = NULL;
    size_t size = 0;
    if (f != NULL) {
        FILE *m = open_memstream(&text, &size);
        char buf[4096];
        size_t n;
        while (m != NULL && (n = fread(buf, 1, sizeof(buf), f)) > 0)
            fwrite(buf, 1, n, m);
        if (m != NULL && (ferror(f) || fclose(m) != 0))
            free(text), text = NULL;
        fclose(f);
    }
    if (text == NULL)
        fprintf(stderr, "bench_http: cannot read %s: %s\n", path, strerror(errno));
    return text;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: bench_http CONNINFO PORT_FILE [TLS_DIR]\n");
        return 2;
    }
    conninfo = argv[1];
    char *cert = NULL, *key = NULL;
    unsigned tls = 0;
    if (argc == 4) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            fprintf(stderr, "bench_http: this libmicrohttpd has no TLS\n");
            return 1;
        }
        if ((cert = slurp(argv[3], "server.crt")) == NULL || (key = slurp(argv[3], "server.key")) == NULL)
            return 1;
        tls = MHD_USE_TLS;
    }
    if (pthread_key_create(&pg_key, close_pg) != 0)
        return 1;
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);  /* every thread inherits it: sigwait() below */

    /* libmicrohttpd refuses HTTPS options without MHD_USE_TLS: clear text
     * passes only the end of this list. */
    struct MHD_OptionItem https[] = {
        { MHD_OPTION_HTTPS_MEM_CERT, 0, cert },
        { MHD_OPTION_HTTPS_MEM_KEY, 0, key },
        { MHD_OPTION_END, 0, NULL },
    };
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = 0 };
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | tls, 0, NULL, NULL,
        on_request, NULL, MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_NOTIFY_COMPLETED, on_done,
        NULL, MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
        MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_ARRAY, tls ? https : https + 2,
        MHD_OPTION_END);
    const union MHD_DaemonInfo *info =
        d != NULL ? MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT) : NULL;
    if (info == NULL) {
        fprintf(stderr, "bench_http: cannot start the server\n");
        return 1;
    }
    FILE *f = fopen(argv[2], "w");
    if (f == NULL || fprintf(f, "%u\n", (unsigned)info->port) < 0 || fclose(f) != 0) {
        fprintf(stderr, "bench_http: %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    int sig;
    sigwait(&stop, &sig);
    MHD_stop_daemon(d);
    printf("requests %ld failed %ld connections %ld tls %ld %s\n", atomic_load(&requests),
           atomic_load(&failed), atomic_load(&connections), atomic_load(&tls_requests),
           atomic_load(&protocol));
    free(cert);
    free(key);
    return 0;
}
