/* console_auth.c - who may read and act in the console. Both need a
 * session (reads may be opened by console.open_reads, on a loopback
 * listener only), which a login opens: with an operator's own token
 * (console.operators), which names them, or with the shared one
 * (console.token_file, from before there were names), whose holder types
 * the name the audit records;
 *
 *   - every request must name this console in its Host: a page of an
 *     attacker's name that resolves to our address (DNS rebinding) is
 *     refused before anything else;
 *   - failed logins are logged with the client's address (never what was
 *     typed) and limited in number per minute, for every client at once;
 *
 *   - the session id travels only in a cookie that is HttpOnly (no script
 *     reads it), SameSite=Strict (no other site's page sends it), Secure
 *     under TLS, and lives console.session (15 minutes by default);
 *   - each session has a CSRF token that every action must carry as a form
 *     field: the page reads it from GET /api/session, which another origin
 *     cannot read;
 *   - a POST whose Origin (or Sec-Fetch-Site) says another origin is
 *     refused before anything else, the login's included.
 *
 * Sessions live in this process only: a restart logs everyone out. */
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "console.h"
#include "ctl_out.h"

#define SESSIONS_MAX 64
#define ID_BYTES     32
#define OPERATOR_MAX SK_CONSOLE_OPERATOR_MAX
#define COOKIE       "sekali_console"
/* Failed logins allowed per window, from all clients together: one shared
 * budget, since a guesser can come from many addresses (or from the very
 * loopback address the operator uses). Past it, every login is refused,
 * the right token's too, until the window ends. */
#define LOGIN_FAILS_MAX   10
#define LOGIN_WINDOW_S    60

struct session {
    char   id[ID_BYTES * 2 + 1];    /* "" : a free slot */
    char   csrf[ID_BYTES * 2 + 1];
    char   operator[OPERATOR_MAX + 1];
    bool   shared;                  /* logged in with console.token_file's token */
    time_t expires;
};

struct sk_console_sessions {
    pthread_mutex_t lock;
    struct session  s[SESSIONS_MAX];
    time_t          fail_window;    /* start of the window failed logins count in */
    unsigned        fails;
};

struct sk_console_sessions *sk_console_sessions_new(void)
{
    struct sk_console_sessions *s = calloc(1, sizeof(*s));
    if (s != NULL)
        pthread_mutex_init(&s->lock, NULL);
    return s;
}

void sk_console_sessions_free(struct sk_console_sessions *s)
{
    if (s == NULL)
        return;
    pthread_mutex_destroy(&s->lock);
    explicit_bzero(s, sizeof(*s));
    free(s);
}

/* Equal bytes, in a time that does not tell how much of them matched. */
static bool same_bytes(const char *a, size_t la, const char *b, size_t lb)
{
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la && i < lb; i++)
        diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

static bool same_secret(const char *a, const char *b)
{
    return same_bytes(a, strlen(a), b, strlen(b));
}

/* The token as typed or sent: one trailing newline dropped, as the token
 * file's own is, so that `curl --data-urlencode token@file` logs in. */
static bool right_token(const char *token, const char *want)
{
    size_t len = strlen(token);
    if (len > 0 && token[len - 1] == '\n' && --len > 0 && token[len - 1] == '\r')
        len--;
    return same_bytes(token, len, want, strlen(want));
}

static bool random_hex(char *out)
{
    unsigned char raw[ID_BYTES];
    for (size_t got = 0; got < sizeof(raw);) {
        ssize_t r = getrandom(raw + got, sizeof(raw) - got, 0);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    explicit_bzero(raw, sizeof(raw));
    return true;
}

/* Whether the request comes from a page of this console: a browser names
 * the origin of every POST it sends (Origin, Sec-Fetch-Site); a request
 * without them comes from a script, which the CSRF token still guards. */
static bool same_origin(struct sk_console_call *c)
{
    const char *site = sk_console_header(c, "Sec-Fetch-Site");
    if (site != NULL && strcmp(site, "same-origin") != 0)
        return false;
    const char *origin = sk_console_header(c, "Origin");
    if (origin == NULL)
        return true;
    const char *host = sk_console_header(c, "Host");
    const char *scheme = c->con->tls ? "https://" : "http://";
    size_t n = strlen(scheme);
    return host != NULL && strncmp(origin, scheme, n) == 0 && strcmp(origin + n, host) == 0;
}

static bool is_address(const char *name)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, name, buf) == 1 || inet_pton(AF_INET6, name, buf) == 1;
}

/* "name", "name:port", "[v6]" or "[v6]:port" into name and *port (0: none). */
static bool split_host(const char *host, char *name, size_t size, long *port)
{
    const char *end, *colon;
    if (host[0] == '[') {
        if ((end = strchr(host, ']')) == NULL)
            return false;
        host++;
        colon = end[1] == ':' ? end + 1 : NULL;
        if (colon == NULL && end[1] != '\0')
            return false;
    } else {
        colon = strrchr(host, ':');
        end = colon != NULL ? colon : host + strlen(host);
    }
    if ((size_t)(end - host) >= size || end == host)
        return false;
    memcpy(name, host, (size_t)(end - host));
    name[end - host] = '\0';
    *port = 0;
    if (colon != NULL) {
        char *stop;
        *port = strtol(colon + 1, &stop, 10);
        if (colon[1] == '\0' || *stop != '\0' || *port <= 0)
            return false;
    }
    return true;
}

bool sk_console_host_ok(struct sk_console_call *c)
{
    const char *host = sk_console_header(c, "Host");
    char name[256];
    long port;
    if (host == NULL || !split_host(host, name, sizeof(name), &port))
        return false;
    if (port == 0)
        port = c->con->tls ? 443 : 80;
    if (port != c->con->port)
        return false;
    return is_address(name) || strcasecmp(name, "localhost") == 0 ||
           (c->con->listen_host != NULL && strcasecmp(name, c->con->listen_host) == 0);
}

/* The live session the cookie names, copied out; false if none. */
static bool find_session(struct sk_console_call *c, struct session *out)
{
    const char *id = MHD_lookup_connection_value(c->conn, MHD_COOKIE_KIND, COOKIE);
    if (id == NULL || strlen(id) != ID_BYTES * 2)
        return false;
    struct sk_console_sessions *all = c->con->sessions;
    bool found = false;
    time_t now = time(NULL);
    pthread_mutex_lock(&all->lock);
    for (size_t i = 0; i < SESSIONS_MAX && !found; i++) {
        struct session *s = &all->s[i];
        if (s->id[0] == '\0' || !same_secret(s->id, id))
            continue;
        if (s->expires <= now) {
            explicit_bzero(s, sizeof(*s));  /* stale: gone for good */
            break;
        }
        *out = *s;
        found = true;
    }
    pthread_mutex_unlock(&all->lock);
    return found;
}

/* An operator's name for the audit: printable ASCII or UTF-8, no control
 * characters, 1 to 64 bytes. */
static bool good_operator(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len > OPERATOR_MAX)
        return false;
    for (size_t i = 0, n; i < len; i += n) {
        n = sk_ctl_utf8_len((const unsigned char *)name + i, len - i);
        if (n == 0 || (n == 1 && ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)))
            return false;
    }
    return true;
}

static void session_json(struct sk_console_call *c, const struct session *s, bool logged_in)
{
    char *doc = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&doc, &len);
    if (f == NULL)
        return sk_console_fail(c, 500, "out of memory");
    const struct sk_conf *conf = c->con->conf;
    /* named_tokens: a token names its operator, so the form needs no name
     * (unless the shared token is still accepted too). */
    fprintf(f, "{\"logged_in\":%s,\"actions\":%s,\"named_tokens\":%s,\"shared_token\":%s",
            logged_in ? "true" : "false", sk_console_logins(conf) ? "true" : "false",
            conf->console.n_operators > 0 ? "true" : "false",
            conf->console.http.token != NULL ? "true" : "false");
    if (logged_in) {
        fputs(",\"operator\":", f);
        sk_ctl_put_jstr(f, s->operator);
        fprintf(f, ",\"csrf\":\"%s\",\"expires_in_seconds\":%lld", s->csrf,
                (long long)(s->expires - time(NULL)));
    }
    fputs("}\n", f);
    fclose(f);
    sk_console_json(c, 200, doc, len);
}

bool sk_console_may_read(struct sk_console_call *c)
{
    struct session s;
    bool in = find_session(c, &s);
    explicit_bzero(&s, sizeof(s));
    if (in || c->con->open_reads)
        return true;
    sk_console_fail(c, 401, sk_console_logins(c->con->conf)
                    ? "log in first: reading needs a session (no session, or it expired)"
                    : "this console has no console.operators or token_file, so no one can "
                      "log in to read; set them (or console.open_reads on a loopback "
                      "listener)");
    return false;
}

void sk_console_session(struct sk_console_call *c)
{
    struct session s;
    bool in = find_session(c, &s);
    session_json(c, &s, in);
    explicit_bzero(&s, sizeof(s));
}

/* Whether the window's budget of failed logins has some left. */
static bool login_allowed(struct sk_console_call *c)
{
    struct sk_console_sessions *all = c->con->sessions;
    time_t now = time(NULL);
    pthread_mutex_lock(&all->lock);
    if (now - all->fail_window >= LOGIN_WINDOW_S) {
        all->fail_window = now;
        all->fails = 0;
    }
    bool ok = all->fails < LOGIN_FAILS_MAX;
    pthread_mutex_unlock(&all->lock);
    return ok;
}

/* The client's address, numeric, into addr ("?" if unknown). */
static void client_address(struct sk_console_call *c, char addr[NI_MAXHOST])
{
    snprintf(addr, NI_MAXHOST, "?");
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info != NULL && info->client_addr != NULL)
        getnameinfo(info->client_addr, info->client_addr->sa_family == AF_INET6
                    ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in),
                    addr, NI_MAXHOST, NULL, 0, NI_NUMERICHOST);
}

static void login_failed(struct sk_console_call *c)
{
    struct sk_console_sessions *all = c->con->sessions;
    pthread_mutex_lock(&all->lock);
    unsigned n = ++all->fails;
    pthread_mutex_unlock(&all->lock);
    char addr[NI_MAXHOST];
    client_address(c, addr);
    fprintf(stderr, "sekalictl: serve: failed login (wrong token) from %s, %u of %d allowed "
            "in %d s\n", addr, n, LOGIN_FAILS_MAX, LOGIN_WINDOW_S);
    fflush(stderr);
    sk_console_fail(c, 401, "wrong token");
}

bool sk_console_logins(const struct sk_conf *conf)
{
    return conf->console.http.token != NULL || conf->console.n_operators > 0;
}

/* The operator whose own token this is, or NULL. Every token is compared,
 * whichever matches, so the time taken does not tell which one came close. */
static const struct sk_console_operator *token_owner(const struct sk_conf *conf,
                                                      const char *token)
{
    const struct sk_console_operator *who = NULL;
    for (size_t i = 0; i < conf->console.n_operators; i++)
        if (right_token(token, conf->console.operators[i].token))
            who = &conf->console.operators[i];
    return who;
}

/* One line on stderr: what the audit says of a login or a logout. */
static void audit_session(struct sk_console_call *c, const char *action, const char *name,
                          bool shared)
{
    char addr[NI_MAXHOST];
    client_address(c, addr);
    fprintf(stderr, "sekalictl: serve: audit {\"operator\":");
    sk_ctl_put_jstr(stderr, name);
    fprintf(stderr, ",\"token\":\"%s\",\"action\":\"%s\",\"client\":", shared ? "shared" : "own",
            action);
    sk_ctl_put_jstr(stderr, addr);
    fputs("}\n", stderr);
    fflush(stderr);
}

void sk_console_login(struct sk_console_call *c)
{
    const struct sk_conf *conf = c->con->conf;
    const char *token = sk_console_arg(c, "token"), *name = sk_console_arg(c, "operator");
    if (!same_origin(c))
        return sk_console_fail(c, 403, "refused: the request comes from another origin");
    if (!sk_console_logins(conf))
        return sk_console_fail(c, 403, "this console is read-only: no console.operators or "
                               "token_file");
    if (token == NULL)
        return sk_console_fail(c, 400, "a login needs the token");
    if (!login_allowed(c))
        return sk_console_fail(c, 429, "too many failed logins: try again in a minute");
    const struct sk_console_operator *who = token_owner(conf, token);
    bool shared = who == NULL && conf->console.http.token != NULL &&
                  right_token(token, conf->console.http.token);
    /* The shared token proves no name: its holder gives one, as before. */
    if (shared && (name == NULL || !good_operator(name)))
        return sk_console_fail(c, 400, "a login with the shared token needs your name (1 to "
                               "64 printable characters) for the audit");
    if (who == NULL && !shared)
        return login_failed(c);  /* the answer and the log never echo the guess */
    struct session s = { 0 };
    if (!random_hex(s.id) || !random_hex(s.csrf))
        return sk_console_fail(c, 500, "no randomness for a session");
    snprintf(s.operator, sizeof(s.operator), "%s", who != NULL ? who->name : name);
    s.shared = shared;
    time_t now = time(NULL);
    long ttl = (long)(c->con->conf->console.session_ms / 1000);
    s.expires = now + ttl;
    struct sk_console_sessions *all = c->con->sessions;
    pthread_mutex_lock(&all->lock);
    /* A free or stale slot, else the one closest to expiry. */
    size_t slot = 0;
    for (size_t i = 0; i < SESSIONS_MAX; i++) {
        if (all->s[i].id[0] == '\0' || all->s[i].expires <= now) {
            slot = i;
            break;
        }
        if (all->s[i].expires < all->s[slot].expires)
            slot = i;
    }
    all->s[slot] = s;
    pthread_mutex_unlock(&all->lock);
    snprintf(c->cookie, sizeof(c->cookie), COOKIE "=%s; Path=/; Max-Age=%ld; HttpOnly; "
             "SameSite=Strict%s", s.id, ttl, c->con->tls ? "; Secure" : "");
    audit_session(c, "login", s.operator, s.shared);
    session_json(c, &s, true);
    explicit_bzero(&s, sizeof(s));
}

void sk_console_logout(struct sk_console_call *c)
{
    if (!sk_console_may_act(c))
        return;
    const char *id = MHD_lookup_connection_value(c->conn, MHD_COOKIE_KIND, COOKIE);
    struct sk_console_sessions *all = c->con->sessions;
    pthread_mutex_lock(&all->lock);
    for (size_t i = 0; i < SESSIONS_MAX; i++)
        if (all->s[i].id[0] != '\0' && id != NULL && same_secret(all->s[i].id, id))
            explicit_bzero(&all->s[i], sizeof(all->s[i]));
    pthread_mutex_unlock(&all->lock);
    snprintf(c->cookie, sizeof(c->cookie), COOKIE "=; Path=/; Max-Age=0; HttpOnly; "
             "SameSite=Strict%s", c->con->tls ? "; Secure" : "");
    audit_session(c, "logout", c->operator, c->shared_token);
    c->operator[0] = '\0';  /* audited here, not again as an API action */
    struct session none = { 0 };
    session_json(c, &none, false);
}

bool sk_console_may_act(struct sk_console_call *c)
{
    struct session s;
    if (!c->post) {
        sk_console_fail(c, 405, "an action is a POST");
        return false;
    }
    if (!same_origin(c)) {
        sk_console_fail(c, 403, "refused: the request comes from another origin");
        return false;
    }
    if (!sk_console_logins(c->con->conf)) {
        sk_console_fail(c, 403, "this console is read-only: no console.operators or "
                        "token_file");
        return false;
    }
    if (!find_session(c, &s)) {
        sk_console_fail(c, 401, "log in first (no session, or it expired)");
        return false;
    }
    const char *csrf = sk_console_arg(c, "csrf");
    bool ok = csrf != NULL && same_secret(csrf, s.csrf);
    if (ok) {
        snprintf(c->operator, sizeof(c->operator), "%s", s.operator);
        c->shared_token = s.shared;
    }
    explicit_bzero(&s, sizeof(s));
    if (!ok)
        sk_console_fail(c, 403, "refused: missing or wrong CSRF token");
    return ok;
}

void sk_console_audit(struct sk_console_call *c)
{
    if (c->operator[0] == '\0')
        return;
    const char *queue = sk_console_arg(c, "queue");
    fprintf(stderr, "sekalictl: serve: audit {\"operator\":");
    sk_ctl_put_jstr(stderr, c->operator);
    fprintf(stderr, ",\"token\":\"%s\",\"action\":", c->shared_token ? "shared" : "own");
    sk_ctl_put_jstr(stderr, c->path + strlen("/api/"));
    fputs(",\"queue\":", stderr);
    if (queue != NULL)
        sk_ctl_put_jstr(stderr, queue);
    else
        fputs("null", stderr);
    const char *dry = sk_console_arg(c, "dry_run");
    fprintf(stderr, ",\"dry_run\":%s,\"status\":%u}\n",
            dry != NULL && strcmp(dry, "1") == 0 ? "true" : "false", c->status);
    fflush(stderr);
}
