/* console_auth.c - who may act in the console. Reading is open (the
 * listener is loopback by default); acting needs a session, which a login
 * with console.token_file's token opens:
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "console.h"
#include "ctl_out.h"

#define SESSIONS_MAX 64
#define ID_BYTES     32
#define OPERATOR_MAX 64
#define COOKIE       "sekali_console"

struct session {
    char   id[ID_BYTES * 2 + 1];    /* "" : a free slot */
    char   csrf[ID_BYTES * 2 + 1];
    char   operator[OPERATOR_MAX + 1];
    time_t expires;
};

struct sk_console_sessions {
    pthread_mutex_t lock;
    struct session  s[SESSIONS_MAX];
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

/* Equal strings, in a time that does not tell how much of them matched. */
static bool same_secret(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la && i < lb; i++)
        diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
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
    fprintf(f, "{\"logged_in\":%s,\"actions\":%s", logged_in ? "true" : "false",
            c->con->conf->console.http.token != NULL ? "true" : "false");
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

void sk_console_session(struct sk_console_call *c)
{
    struct session s;
    bool in = find_session(c, &s);
    session_json(c, &s, in);
    explicit_bzero(&s, sizeof(s));
}

void sk_console_login(struct sk_console_call *c)
{
    const char *want = c->con->conf->console.http.token;
    const char *token = sk_console_arg(c, "token"), *name = sk_console_arg(c, "operator");
    if (!same_origin(c))
        return sk_console_fail(c, 403, "refused: the request comes from another origin");
    if (want == NULL)
        return sk_console_fail(c, 403, "this console is read-only: no console.token_file");
    if (token == NULL || name == NULL || !good_operator(name))
        return sk_console_fail(c, 400, "a login needs the token and your name (1 to 64 "
                            "printable characters) for the audit");
    if (!same_secret(token, want)) {
        /* One guess a second per connection; the answer never echoes it. */
        sleep(1);
        return sk_console_fail(c, 401, "wrong token");
    }
    struct session s = { 0 };
    if (!random_hex(s.id) || !random_hex(s.csrf))
        return sk_console_fail(c, 500, "no randomness for a session");
    snprintf(s.operator, sizeof(s.operator), "%s", name);
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
    session_json(c, &s, true);
    explicit_bzero(&s, sizeof(s));
}

void sk_console_logout(struct sk_console_call *c)
{
    char who[OPERATOR_MAX + 1];
    if (!sk_console_may_act(c, who, sizeof(who)))
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
    struct session none = { 0 };
    session_json(c, &none, false);
}

bool sk_console_may_act(struct sk_console_call *c, char *operator, size_t size)
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
    if (c->con->conf->console.http.token == NULL) {
        sk_console_fail(c, 403, "this console is read-only: no console.token_file");
        return false;
    }
    if (!find_session(c, &s)) {
        sk_console_fail(c, 401, "log in first (no session, or it expired)");
        return false;
    }
    const char *csrf = sk_console_arg(c, "csrf");
    bool ok = csrf != NULL && same_secret(csrf, s.csrf);
    if (ok)
        snprintf(operator, size, "%s", s.operator);
    explicit_bzero(&s, sizeof(s));
    if (!ok)
        sk_console_fail(c, 403, "refused: missing or wrong CSRF token");
    return ok;
}
