/* console.c - sekalictl serve: the operator's console over HTTP(S), with
 * libmicrohttpd (a thread per connection, so a long dead-letter scan holds
 * up only its own request).
 *
 * Every page is the same embedded shell (src/ctl/console/index.html); its
 * script reads the JSON API and puts every value into the page as text
 * (textContent), never as markup, so a value from a message cannot become
 * HTML or script; the Content-Security-Policy below allows only our own
 * script and style, and Trusted Types make any use of innerHTML throw.
 * Every request must name this console in its Host; reading the API needs
 * a session (or console.open_reads, on loopback), and every action is a
 * POST with a session cookie and its CSRF token (console_auth.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_value.h"
#include "console.h"
#include "ctl_delays.h"
#include "file.h"
#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_out.h"

/* GnuTLS (libmicrohttpd's TLS): its defaults, but TLS 1.2 and 1.3 only. */
#define TLS_PRIORITIES  "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"
#define IDLE_TIMEOUT_S  30  /* console_guard.c cuts a slow request sooner */

/* On every answer. The page builds its DOM with textContent only; Trusted
 * Types turn a slip (an innerHTML assignment) into an exception. */
static const char CSP[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "require-trusted-types-for 'script'";

/* The pages: all the same shell, the script picks what to show by path. */
static const char *const pages[] = { "/", "/dead", "/letters", "/letter", "/key", "/login",
                                      "/schedules", "/scheduled", "/inflight",
                                      "/retries", "/history" };

static void usage(FILE *out)
{
    fprintf(out, "usage: sekalictl serve [--listen HOST:PORT]\n");
}

static bool is_page(const char *path)
{
    for (size_t i = 0; i < SK_ARRAY_LEN(pages); i++)
        if (strcmp(path, pages[i]) == 0)
            return true;
    return false;
}

static const struct sk_console_asset *asset(const char *name)
{
    for (size_t i = 0; i < sk_console_n_assets; i++)
        if (strcmp(sk_console_assets[i].path, name) == 0)
            return &sk_console_assets[i];
    return NULL;
}

static void serve_asset(struct sk_console_call *c, const char *name)
{
    const struct sk_console_asset *a = asset(name);
    if (a == NULL)
        return sk_console_fail(c, 404, "no such file");
    const char *dot = strrchr(name, '.');
    c->status = 200;
    c->type = dot == NULL ? "application/octet-stream"
              : strcmp(dot, ".js") == 0 ? "text/javascript; charset=utf-8"
              : strcmp(dot, ".css") == 0 ? "text/css; charset=utf-8"
              : strcmp(dot, ".html") == 0 ? "text/html; charset=utf-8"
              : strcmp(dot, ".svg") == 0 ? "image/svg+xml" : "application/octet-stream";
    c->static_out = a->data;
    c->out_len = a->len;
}

/* Decides the answer of a complete request. */
static void route(struct sk_console_call *c)
{
    bool get = strcmp(c->method, "GET") == 0 || strcmp(c->method, "HEAD") == 0;
    if (!sk_console_host_ok(c))
        return sk_console_fail(c, 421, "refused: the Host header does not name this console "
                            "(an address, localhost, or the name in console.listen)");
    if (!get && !c->post)
        return sk_console_fail(c, 405, "only GET and POST");
    if (c->post && c->too_big)
        return sk_console_fail(c, 413, "the request is too large");
    if (c->post && !sk_console_read_form(c))
        return sk_console_fail(c, 400, "a POST takes an application/x-www-form-urlencoded form "
                            "of at most 600 fields");
    if (strncmp(c->path, "/api/", 5) == 0) {
        const char *api = c->path + 5;
        if (strcmp(api, "login") == 0 || strcmp(api, "logout") == 0) {
            if (!c->post)
                return sk_console_fail(c, 405, "use POST");
            return strcmp(api, "login") == 0 ? sk_console_login(c) : sk_console_logout(c);
        }
        if (strcmp(api, "session") == 0)
            return get ? sk_console_session(c) : sk_console_fail(c, 405, "use GET");
        if (get && !sk_console_may_read(c))
            return;
        if (!sk_console_api(c))
            sk_console_fail(c, 404, "no such API route");
        sk_console_audit(c);
        return;
    }
    if (c->post)
        return sk_console_fail(c, 405, "pages are read with GET; actions are POSTs to /api/");
    if (is_page(c->path))
        return serve_asset(c, "index.html");
    if (strcmp(c->path, "/favicon.ico") == 0) {
        c->status = 204;  /* none: a browser asks, and a 404 would log an error */
        return;
    }
    if (strncmp(c->path, "/assets/", 8) == 0)
        return serve_asset(c, c->path + 8);
    sk_console_fail(c, 404, "no such page");
}

static enum MHD_Result send_answer(struct sk_console_call *c)
{
    struct MHD_Response *r;
    if (c->static_out != NULL)
        r = MHD_create_response_from_buffer(c->out_len, (void *)c->static_out,
                                            MHD_RESPMEM_PERSISTENT);
    else if (c->out != NULL) {
        r = MHD_create_response_from_buffer(c->out_len, c->out, MHD_RESPMEM_MUST_FREE);
        c->out = NULL;  /* the response owns it now */
    } else {
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", c->type != NULL ? c->type : "text/plain");
    MHD_add_response_header(r, "Content-Security-Policy", CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cross-Origin-Opener-Policy", "same-origin");
    MHD_add_response_header(r, "Cross-Origin-Resource-Policy", "same-origin");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (c->con->tls)
        MHD_add_response_header(r, "Strict-Transport-Security", "max-age=31536000");
    if (c->cookie[0] != '\0')
        MHD_add_response_header(r, "Set-Cookie", c->cookie);
    enum MHD_Result rc = MHD_queue_response(c->conn, c->status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **state)
{
    (void)version;
    struct sk_console_call *c = *state;
    if (c == NULL) {
        /* The headers are in; a POST's body follows in further calls. */
        if ((c = calloc(1, sizeof(*c))) == NULL)
            return MHD_NO;
        c->con = cls;
        c->conn = conn;
        c->method = method;
        c->path = url;
        c->post = strcmp(method, "POST") == 0;
        *state = c;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (c->body_len + *upload_size > SK_CONSOLE_BODY_MAX) {
            c->too_big = true;  /* read and dropped: the answer says why */
        } else if (!c->too_big) {
            char *bigger = realloc(c->body, c->body_len + *upload_size + 1);
            if (bigger == NULL)
                return MHD_NO;
            c->body = bigger;
            memcpy(c->body + c->body_len, upload, *upload_size);
            c->body_len += *upload_size;
            c->body[c->body_len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->body == NULL && (c->body = calloc(1, 1)) == NULL)
        return MHD_NO;
    sk_console_guard_busy(c->con->guard, conn, true);
    route(c);
    enum MHD_Result rc = send_answer(c);
    sk_console_guard_busy(c->con->guard, conn, false);
    return rc;
}

static void on_done(void *cls, struct MHD_Connection *conn, void **state,
                    enum MHD_RequestTerminationCode why)
{
    (void)cls;
    (void)conn;
    (void)why;
    struct sk_console_call *c = *state;
    if (c == NULL)
        return;
    free(c->body);
    free(c->out);
    free(c);
    *state = NULL;
}

/* libmicrohttpd's own complaints, on stderr without the request's data. */
static void on_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fputs("sekalictl: serve: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* A PEM file; a private key (secret) must also be one that only its owner
 * may read: one that others can read has leaked already. */
static char *read_pem(const char *path, bool secret)
{
    struct stat st;
    int fd, e = sk_file_open(path, secret ? S_IRWXG | S_IRWXO : 0, &fd, &st);
    FILE *f = e == 0 ? fdopen(fd, "r") : NULL;
    if (f == NULL) {
        fprintf(stderr, "sekalictl: serve: cannot open %s: %s\n", path,
                e == SK_FILE_TOO_OPEN ? "readable or writable by group or others: chmod 600 it"
                : sk_file_error(e != 0 ? e : errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    size_t len;
    char *text = sk_ctl_read_all(f, &len);
    fclose(f);
    return text;
}

/* host as metrics.listen takes it: an address, or a name's first address. */
static bool listen_addr(const char *host, int port, struct sockaddr_storage *sa, bool *v6)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE }, *res = NULL;
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0 || res == NULL) {
        fprintf(stderr, "sekalictl: serve: listen %s: %s\n", host, gai_strerror(rc));
        return false;
    }
    memset(sa, 0, sizeof(*sa));
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return true;
}

/* 127.0.0.0/8 or ::1: only this machine's users reach it. */
static bool loopback(const struct sockaddr_storage *sa)
{
    if (sa->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    return sa->ss_family == AF_INET6 &&
           IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* --listen, or console.listen: *host and *port; *own_host, what --listen
 * gave, is the caller's to free. Returns -1 to go on, or the exit code
 * (SK_CTL_OK after --help). */
static int where_to_listen(const struct sk_conf *conf, int argc, char **argv, char **own_host,
                           char **host, int *port)
{
    static const struct option options[] = { { "listen", required_argument, NULL, 'l' },
                                             { "help", no_argument, NULL, 'h' },
                                             { NULL, 0, NULL, 0 } };
    const char *listen = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "l:h", options, NULL)) != -1) {
        switch (opt) {
        case 'l': listen = optarg; break;
        case 'h': usage(stdout); return SK_CTL_OK;
        default: usage(stderr); return SK_CTL_USAGE;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return SK_CTL_USAGE;
    }
    *host = conf->console.http.listen_host;
    *port = conf->console.http.listen_port;
    if (listen != NULL) {
        struct sk_err e = { 0 };
        if (sk_conf_value_parse_listen("--listen", listen, own_host, port, &e) != SK_OK) {
            fprintf(stderr, "sekalictl: serve: %s\n", e.msg);
            return SK_CTL_USAGE;
        }
        *host = *own_host;
    }
    if (*host == NULL) {
        fprintf(stderr, "sekalictl: serve: no console.listen in %s (and no --listen)\n",
                conf->path);
        return SK_CTL_USAGE;
    }
    return -1;
}

/* console.tls_cert_file and tls_key_file, read into *cert and *key (both
 * NULL without TLS). SK_CTL_OK, or the exit code with nothing kept. */
static int tls_material(const struct sk_conf *conf, char **cert, char **key)
{
    const char *cert_file = conf->console.tls_cert_file, *key_file = conf->console.tls_key_file;
    if ((cert_file == NULL) != (key_file == NULL)) {
        fprintf(stderr, "sekalictl: serve: console.tls_cert_file and tls_key_file go "
                        "together\n");
        return SK_CTL_USAGE;
    }
    *cert = cert_file != NULL ? read_pem(cert_file, false) : NULL;
    *key = key_file != NULL ? read_pem(key_file, true) : NULL;
    if (cert_file != NULL && (*cert == NULL || *key == NULL)) {
        free(*cert);
        sk_conf_value_wipe(*key);
        *cert = *key = NULL;
        return SK_CTL_FAILED;
    }
    return SK_CTL_OK;
}

/* libmicrohttpd on sa, a thread per connection, over TLS when cert is
 * given; NULL if it cannot listen. */
static struct MHD_Daemon *start_daemon(struct sk_console *con, int port,
                                       struct sockaddr_storage *sa, bool v6, char *cert,
                                       char *key)
{
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0) | (cert ? MHD_USE_TLS : 0);
    /* Without a certificate the TLS options' place holds MHD_OPTION_END,
     * where libmicrohttpd stops reading them. */
    return MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, con,
                            MHD_OPTION_EXTERNAL_LOGGER, on_log, NULL,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)SK_CONSOLE_SLOTS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
                            MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL,
                            MHD_OPTION_NOTIFY_CONNECTION, sk_console_guard_track, con->guard,
                            cert != NULL ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, cert,
                            MHD_OPTION_HTTPS_MEM_KEY, key,
                            MHD_OPTION_HTTPS_PRIORITIES, TLS_PRIORITIES,
                            MHD_OPTION_END);
}

int sk_ctl_serve(const struct sk_conf *conf, int argc, char **argv)
{
    char *own_host = NULL, *host, *cert = NULL, *key = NULL;
    int port, code = where_to_listen(conf, argc, argv, &own_host, &host, &port);
    if (code >= 0)
        return code;
    struct sockaddr_storage sa;
    bool v6;
    if (!listen_addr(host, port, &sa, &v6)) {
        free(own_host);
        return SK_CTL_USAGE;
    }
    if ((code = tls_material(conf, &cert, &key)) != SK_CTL_OK) {
        free(own_host);
        return code;
    }

    if (conf->console.open_reads && !loopback(&sa)) {
        fprintf(stderr, "sekalictl: serve: console.open_reads is for a loopback listener only, "
                "and %s is not one: remove it (reading then needs a login)\n", host);
        free(own_host);
        free(cert);
        sk_conf_value_wipe(key);
        return SK_CTL_USAGE;
    }
    struct sk_console con = { .conf = conf, .tls = cert != NULL, .listen_host = host,
                              .port = port, .open_reads = conf->console.open_reads };
    pthread_mutex_init(&con.dlq_lock, NULL);
    con.sessions = sk_console_sessions_new();
    con.guard = sk_console_guard_new();
    if (con.sessions == NULL || con.guard == NULL) {
        fprintf(stderr, "sekalictl: serve: out of memory\n");
        return SK_CTL_FAILED;
    }
    /* Signals for the main thread's sigwait only: blocked before any
     * thread starts, so every thread inherits the mask. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    con.rates = sk_console_rates_start(conf);
    sk_ctl_pool_start(conf, (size_t)conf->console.pool, SK_CONSOLE_PG_IDLE_S, SK_CONSOLE_PG_WAIT_S);
    sk_ctl_delays_cache(SK_CONSOLE_DELAYS_MS);

    struct MHD_Daemon *d = start_daemon(&con, port, &sa, v6, cert, key);
    if (d != NULL && !sk_console_guard_start(con.guard)) {
        MHD_stop_daemon(d);
        d = NULL;
    }
    if (d == NULL) {
        fprintf(stderr, "sekalictl: serve: cannot listen on %s:%d\n", host, port);
        code = SK_CTL_FAILED;
    } else {
        code = SK_CTL_OK;
        printf("sekalictl: console on %s://%s%s%s:%d/ (%s)\n", cert ? "https" : "http",
               v6 ? "[" : "", host, v6 ? "]" : "", port,
               !sk_console_logins(conf)
                   ? (con.open_reads ? "read-only: no console.token_file or operators"
                                     : "closed: no console.token_file or operators, so no one "
                                       "can log in")
                   : con.open_reads ? "actions need a login" : "reads and actions need a login");
        fflush(stdout);
        /* The main thread has nothing else to do: it closes idle sessions
         * while it waits for the signal to stop. */
        const struct timespec tick = { .tv_sec = 1 };
        while (sigtimedwait(&stop, NULL, &tick) < 0)
            sk_ctl_pool_sweep();
        sk_console_guard_stop(con.guard);
        MHD_stop_daemon(d);
    }
    sk_console_rates_stop(con.rates);
    sk_ctl_pool_stop();
    sk_console_sessions_free(con.sessions);
    sk_console_guard_free(con.guard);
    pthread_mutex_destroy(&con.dlq_lock);
    free(cert);
    sk_conf_value_wipe(key);
    free(own_host);
    return code;
}
