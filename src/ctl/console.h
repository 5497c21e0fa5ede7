/* console.h - the parts of `sekalictl serve`, the operator's console
 * (docs/console.md), that its files share:
 *
 *   console.c         the HTTP server (libmicrohttpd), routing, the headers
 *                     every answer carries, reading arguments and forms;
 *   console_auth.c    logins, sessions, CSRF tokens, the origin check;
 *   console_api.c     the JSON API under /api/, which runs the reports of
 *                     ctl_reports.h: the same queries and JSON as sekalictl;
 *   console_guard.c   cuts slow clients, so that 64 of them cannot keep
 *                     everyone else out;
 *   console_rates.c   jobs/s, duplicates/s and duration quantiles, sampled
 *                     from sekalid's /metrics;
 *   console_history.c a queue's outcomes per minute beyond those five
 *                     minutes, from sekali.history;
 *   console_assets.c  the page, its script and style, embedded at build
 *                     time from src/ctl/console/ (generated).
 *
 * The process queries the servers itself, never through the supervisor:
 * it is an operator's tool, with the operator's credentials and lifetime. */
#ifndef SK_CONSOLE_H
#define SK_CONSOLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <microhttpd.h>

#include "config.h"

#define SK_CONSOLE_BODY_MAX  (512 * 1024)  /* a POST body, at most (500 keys) */
#define SK_CONSOLE_FIELDS    600           /* form fields kept, at most */
#define SK_CONSOLE_KEYS_MAX  500           /* keys one action may select */
#define SK_CONSOLE_CONNECTIONS 64          /* open at once, at most, */
#define SK_CONSOLE_SLOTS (SK_CONSOLE_CONNECTIONS + 1)  /* and one kept for a newcomer */
#define SK_CONSOLE_OPERATOR_MAX 64         /* bytes of an operator's name */
/* The PostgreSQL sessions (and as many AMQP connections) the console's
 * requests share (ctl_pool.c; console.pool of them, 4 unless set): a page
 * reads one or two reports at a time, so four serve a few operators and
 * leave PostgreSQL's max_connections to the workers; a request waits for
 * one at most SK_CONSOLE_PG_WAIT_S, and a
 * session idle for SK_CONSOLE_PG_IDLE_S (six refreshes of the overview) is
 * closed. */
#define SK_CONSOLE_PG_IDLE_S 30
#define SK_CONSOLE_PG_WAIT_S 15

/* How long the depths of the delay queues, read for the overview and
 * /api/retries, are kept (ctl_delays.c): one probe of a queue's ladder is
 * about fifty passive declares, and the overview refreshes every 5 s for
 * each operator; a retry shows up at most this late. */
#define SK_CONSOLE_DELAYS_MS 5000

struct sk_console_sessions;
struct sk_console_rates;
struct sk_console_guard;

struct sk_console {
    const struct sk_conf     *conf;
    bool                      tls;
    /* One dead-letter action (replay, purge) at a time, so that two
     * operators' bulk actions do not interleave their reports; reads
     * take no lock (they are SELECTs of sekali.dead_letters). */
    pthread_mutex_t           dlq_lock;
    struct sk_console_sessions  *sessions;
    struct sk_console_rates     *rates;
    struct sk_console_guard     *guard;
    /* What a request's Host may name besides an address or localhost: the
     * listen address as configured (a name, when it is one), and its port. */
    const char                  *listen_host;
    int                          port;
    bool                         open_reads;  /* console.open_reads, on loopback */
};

struct sk_console_field {
    char *name, *value;
};

/* One request and its answer. */
struct sk_console_call {
    struct sk_console         *con;
    struct MHD_Connection  *conn;
    const char             *method, *path;
    bool                    post;
    char                   *body;        /* the POST body as read, NUL-terminated */
    size_t                  body_len;
    bool                    too_big;
    struct sk_console_field    fields[SK_CONSOLE_FIELDS];
    size_t                  n_fields;
    /* The answer. */
    unsigned                status;
    const char             *type;        /* Content-Type */
    char                   *out;         /* malloc'd, or NULL */
    size_t                  out_len;
    const void             *static_out;  /* an embedded asset: not freed */
    char                    cookie[256]; /* Set-Cookie, or "" */
    /* Who acts, once sk_console_may_act() let an action through: the
     * audit line of the answer names them ("" : no action). */
    char                    operator[SK_CONSOLE_OPERATOR_MAX + 1];
    bool                    shared_token;   /* their login used console.token_file */
};

/* console_http.c */
/* A query argument (GET) or a form field (POST), or NULL. */
const char *sk_console_arg(struct sk_console_call *c, const char *name);
/* Every form field called name, up to max; how many. */
size_t sk_console_args(struct sk_console_call *c, const char *name, const char **out, size_t max);
/* A request header, or NULL. */
const char *sk_console_header(struct sk_console_call *c, const char *name);
/* Answers with a JSON document {"error": why} and status. */
void sk_console_fail(struct sk_console_call *c, unsigned status, const char *why);
/* Answers with the JSON that write() printed to a memory stream. */
void sk_console_json(struct sk_console_call *c, unsigned status, char *doc, size_t len);
/* A POST's application/x-www-form-urlencoded body into c->fields, decoded
 * in place; false if it is no such form or has more than
 * SK_CONSOLE_FIELDS fields. */
bool sk_console_read_form(struct sk_console_call *c);

/* console_auth.c */
struct sk_console_sessions *sk_console_sessions_new(void);
void sk_console_sessions_free(struct sk_console_sessions *s);
/* POST /api/login (token, operator), POST /api/logout, GET /api/session. */
void sk_console_login(struct sk_console_call *c);
void sk_console_logout(struct sk_console_call *c);
void sk_console_session(struct sk_console_call *c);
/* Whether the request's Host names this console: an address, localhost or
 * the configured listen name, with the listening port. A page of another
 * name that resolves here (DNS rebinding) sends its own name. */
bool sk_console_host_ok(struct sk_console_call *c);
/* Whether this GET may read the API: a live session, or console.open_reads
 * (a loopback listener only). Otherwise the refusal is answered (401). */
bool sk_console_may_read(struct sk_console_call *c);
/* Whether this POST may act: same origin, a live session, its CSRF token.
 * Otherwise the refusal is answered (403 or 401) and false returned;
 * c->operator gets the session's name. */
bool sk_console_may_act(struct sk_console_call *c);
/* Whether anyone can log in: console.token_file or console.operators. */
bool sk_console_logins(const struct sk_conf *conf);
/* The audit line of an action that was let through (c->operator set), on
 * stderr once it is answered: who, what, on which queue, and the answer's
 * status; every value JSON-escaped. Nothing when no one acted. */
void sk_console_audit(struct sk_console_call *c);

/* console_api.c: every /api/ route but the session's; false: no such route. */
bool sk_console_api(struct sk_console_call *c);

/* console_guard.c */
struct sk_console_guard *sk_console_guard_new(void);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION, cls the guard. */
void sk_console_guard_track(void *cls, struct MHD_Connection *conn, void **socket_context,
                            enum MHD_ConnectionNotificationCode code);
/* A request is in and being answered (busy), or answered: its connection's
 * deadline for the next request starts. */
void sk_console_guard_busy(struct sk_console_guard *g, struct MHD_Connection *conn, bool busy);
bool sk_console_guard_start(struct sk_console_guard *g);
void sk_console_guard_stop(struct sk_console_guard *g);
void sk_console_guard_free(struct sk_console_guard *g);

/* console_history.c: GET /api/history */
void sk_console_history(struct sk_console_call *c);

/* console_rates.c */
struct sk_console_rates *sk_console_rates_start(const struct sk_conf *conf);
void sk_console_rates_stop(struct sk_console_rates *r);
/* GET /api/rates */
void sk_console_rates_json(struct sk_console_rates *r, struct sk_console_call *c);

/* console_assets.c (generated from src/ctl/console/) */
struct sk_console_asset {
    const char          *path;   /* "app.js" */
    const unsigned char *data;
    size_t               len;
};
extern const struct sk_console_asset sk_console_assets[];
extern const size_t sk_console_n_assets;

#endif
