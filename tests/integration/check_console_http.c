/* check_console_http.c - sekalictl serve without a browser (that is
 * tests/browser/check_console.c): every answer's security headers, the
 * refusals an action meets without a session, a CSRF token or the same
 * origin (a pause too, and one that has them all: its row in PostgreSQL
 * names the session's operator), HTTPS with libmicrohttpd's TLS and a
 * Secure cookie; a Host of another name (DNS rebinding), reads without a
 * login, a token too short to start with, and failed logins limited and
 * logged. Requests
 * are made with curl, as a script would. */
#include <arpa/inet.h>
#include <glob.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define TOKEN "integration-token-42-0123456789abcdef"

struct console {
    char  *dir, *config, url[160], queue[128];
    pid_t  pid;
};

static int curl(struct console *c, const char *path, const char *args, char **out);

/* Starts sekalictl serve on c->config, its output in c->dir/serve.log,
 * and waits until it listens. */
static void spawn(struct console *c)
{
    char log[1100];
    snprintf(log, sizeof(log), "%s/serve.log", c->dir);
    c->pid = h_serve_console(c->config, log);
}

/* Writes a config whose console listens on a free port, with TLS when
 * tls_dir is set, and starts sekalictl serve on it. */
static void start_with(struct console *c, const char *name, const char *tls_dir,
                       const char *token_text, const char *extra)
{
    h_init();
    c->dir = h_tmpdir(name);
    char token[1100], top[3000];
    h_unique_name(c->queue, sizeof(c->queue), name);
    snprintf(token, sizeof(token), "%s/console.token", c->dir);
    FILE *f = fopen(token, "w");
    ck_assert_ptr_nonnull(f);
    fputs(token_text, f);
    fclose(f);
    int port = h_free_port();
    int n = snprintf(top, sizeof(top), "console:\n  listen: \"127.0.0.1:%d\"\n  token_file: %s\n",
                     port, token);
    if (tls_dir != NULL)
        n += snprintf(top + n, sizeof(top) - (size_t)n, "  tls_cert_file: %s/server.crt\n"
                      "  tls_key_file: %s/server.key\n", tls_dir, tls_dir);
    snprintf(top + n, sizeof(top) - (size_t)n, "%s", extra);
    c->config = h_write_config_top(c->dir, c->queue, H_EFFECT, 1, NULL, top);
    snprintf(c->url, sizeof(c->url), "%s://127.0.0.1:%d", tls_dir ? "https" : "http", port);
    spawn(c);
}

/* The token file as docs/console.md makes it: with a trailing newline. */
static void start(struct console *c, const char *name, const char *tls_dir)
{
    start_with(c, name, tls_dir, TOKEN "\n", "");
}

static char *serve_log(struct console *c)
{
    char log[1100];
    snprintf(log, sizeof(log), "%s/serve.log", c->dir);
    char *t = h_read_file(log);
    return t != NULL ? t : strdup("");
}

/* A session cookie in c->dir/jar; the CSRF token into csrf. */
static void login(struct console *c, char csrf[80])
{
    char args[2000], *out;
    snprintf(args, sizeof(args), "-c '%s/jar' -d operator=alice -d token=" TOKEN, c->dir);
    ck_assert_int_eq(curl(c, "/api/login", args, &out), 200);
    char *at = strstr(out, "\"csrf\":\"");
    ck_assert_ptr_nonnull(at);
    snprintf(csrf, 80, "%.64s", at + 8);
    free(out);
}

static void stop(struct console *c)
{
    kill(c->pid, SIGTERM);
    int st = h_wait_exit(c->pid, 10000, "sekalictl serve");
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "serve should exit 0 on SIGTERM");
    free(c->dir);
    free(c->config);
}

/* Runs curl with args (a shell fragment) on c's URL + path; returns the
 * HTTP status and puts the headers and body in *out (the caller frees). */
static int curl(struct console *c, const char *path, const char *args, char **out)
{
    char cmd[4096], file[1100];
    snprintf(file, sizeof(file), "%s/curl.out", c->dir);
    snprintf(cmd, sizeof(cmd), "curl -s -i -o '%s' -w '%%{http_code}' %s '%s%s'", file, args,
             c->url, path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char code[16] = "";
    if (fgets(code, sizeof(code), p) == NULL)
        code[0] = '\0';
    pclose(p);
    *out = h_read_file(file);
    if (*out == NULL)
        *out = strdup("");
    return atoi(code);
}

START_TEST(test_every_answer_has_the_headers_and_actions_are_refused_without_what_they_need)
{
    struct console c;
    start(&c, "consolerefuse", NULL);
    char *out;
    ck_assert_int_eq(curl(&c, "/", "", &out), 200);
    static const char *const headers[] = {
        "Content-Security-Policy: default-src 'none'; script-src 'self'",
        "require-trusted-types-for 'script'", "frame-ancestors 'none'",
        "X-Frame-Options: DENY", "X-Content-Type-Options: nosniff", "Cache-Control: no-store",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(headers); i++)
        ck_assert_msg(strstr(out, headers[i]) != NULL, "missing %s in:\n%s", headers[i], out);
    free(out);
    ck_assert_int_eq(curl(&c, "/assets/app.js", "", &out), 200);
    ck_assert_msg(strstr(out, "innerHTML =") == NULL, "the page's script must not use innerHTML");
    free(out);
    ck_assert_int_eq(curl(&c, "/nope", "", &out), 404);
    free(out);
    ck_assert_int_eq(curl(&c, "/", "-X DELETE", &out), 405);
    free(out);

    const char *purge = "-d queue=x -d all=1";
    ck_assert_int_eq(curl(&c, "/api/dlq/purge", purge, &out), 401);
    free(out);
    /* Without a session a GET reads nothing, an action's route included. */
    ck_assert_int_eq(curl(&c, "/api/dlq/purge?queue=x&all=1", "", &out), 401);
    free(out);
    ck_assert_int_eq(curl(&c, "/api/login", "-d operator=m -d token=wrong", &out), 401);
    ck_assert_msg(strstr(out, "wrong") != NULL && strstr(out, "Set-Cookie") == NULL, "%s", out);
    free(out);
    ck_assert_int_eq(curl(&c, "/api/login", "-d operator= -d token=" TOKEN, &out), 400);
    free(out);
    ck_assert_int_eq(curl(&c, "/api/login", "-H 'Origin: http://evil.example' -d operator=m "
                                            "-d token=" TOKEN, &out), 403);
    free(out);

    char jar[1200], args[2000];
    snprintf(jar, sizeof(jar), "%s/jar", c.dir);
    snprintf(args, sizeof(args), "-c '%s' -d operator=alice -d token=" TOKEN, jar);
    ck_assert_int_eq(curl(&c, "/api/login", args, &out), 200);
    ck_assert_msg(strstr(out, "HttpOnly; SameSite=Strict") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "Secure") == NULL, "no Secure cookie over plain HTTP: %s", out);
    char *csrf = strstr(out, "\"csrf\":\"");
    ck_assert_ptr_nonnull(csrf);
    char token[80];
    snprintf(token, sizeof(token), "%.64s", csrf + 8);
    free(out);
    snprintf(args, sizeof(args), "-b '%s' %s", jar, purge);
    ck_assert_int_eq(curl(&c, "/api/dlq/purge", args, &out), 403);  /* no CSRF token */
    free(out);
    snprintf(args, sizeof(args), "-b '%s' %s -d csrf=%064d", jar, purge, 0);
    ck_assert_int_eq(curl(&c, "/api/dlq/purge", args, &out), 403);
    free(out);
    snprintf(args, sizeof(args), "-b '%s' %s -d csrf=%s -H 'Sec-Fetch-Site: cross-site'", jar,
             purge, token);
    ck_assert_int_eq(curl(&c, "/api/dlq/purge", args, &out), 403);
    free(out);
    /* Everything right but the queue, which this console does not serve. */
    snprintf(args, sizeof(args), "-b '%s' %s -d csrf=%s", jar, purge, token);
    ck_assert_int_eq(curl(&c, "/api/dlq/purge", args, &out), 400);
    free(out);

    /* A pause: refused without a session, by GET, without a CSRF token and
     * for a queue not configured, with no row written; then done. */
    PGconn *pg = h_pg();
    char pause[400];
    snprintf(pause, sizeof(pause), "-d queue=%s -d reason=because", c.queue);
    ck_assert_int_eq(curl(&c, "/api/pause", pause, &out), 401);
    free(out);
    snprintf(args, sizeof(args), "-b '%s' '-G' %s -d csrf=%s", jar, pause, token);
    ck_assert_int_eq(curl(&c, "/api/pause", args, &out), 405);
    free(out);
    snprintf(args, sizeof(args), "-b '%s' %s", jar, pause);
    ck_assert_int_eq(curl(&c, "/api/pause", args, &out), 403);
    free(out);
    snprintf(args, sizeof(args), "-b '%s' -d queue=elsewhere -d csrf=%s", jar, token);
    ck_assert_int_eq(curl(&c, "/api/pause", args, &out), 400);
    free(out);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.queue_pauses WHERE queue IN "
                                    "('%s', 'elsewhere')", c.queue), 0);
    snprintf(args, sizeof(args), "-b '%s' %s -d csrf=%s", jar, pause, token);
    ck_assert_int_eq(curl(&c, "/api/pause", args, &out), 200);
    ck_assert_msg(strstr(out, "\"state\":\"paused\",\"changed\":true") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.queue_pauses WHERE queue = "
                                    "'%s' AND paused_by = 'alice' AND reason = 'because'",
                                c.queue), 1);
    snprintf(args, sizeof(args), "-b '%s' -d queue=%s -d csrf=%s", jar, c.queue, token);
    ck_assert_int_eq(curl(&c, "/api/resume", args, &out), 200);
    ck_assert_msg(strstr(out, "\"state\":\"running\",\"changed\":true") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.queue_pauses WHERE queue = "
                                    "'%s'", c.queue), 0);
    snprintf(args, sizeof(args), "-b '%s'", jar);
    ck_assert_int_eq(curl(&c, "/api/schedules", args, &out), 200);
    ck_assert_msg(strstr(out, "\"schedules\": [") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(curl(&c, "/api/schedules", "-d x=1", &out), 405);
    free(out);
    PQfinish(pg);

    snprintf(args, sizeof(args), "-b '%s' -d csrf=%s", jar, token);
    ck_assert_int_eq(curl(&c, "/api/logout", args, &out), 200);
    free(out);
    snprintf(args, sizeof(args), "-b '%s' %s -d csrf=%s", jar, purge, token);
    ck_assert_int_eq(curl(&c, "/api/dlq/purge", args, &out), 401);  /* stale */
    free(out);
    stop(&c);
}
END_TEST

START_TEST(test_over_tls_the_console_speaks_https_only_with_a_secure_cookie)
{
    const char *tls = getenv("SEKALI_TLS_DIR");
    if (tls == NULL || access(tls, R_OK) != 0) {
        /* servers.sh without SEKALI_TLS=1 made no certificates. */
        ck_assert_msg(getenv("SEKALI_REQUIRE_TLS") == NULL, "no SEKALI_TLS_DIR");
        return;
    }
    struct console c;
    start(&c, "consoletls", tls);
    char *out, args[1200];
    snprintf(args, sizeof(args), "--cacert '%s/ca.crt'", tls);
    ck_assert_int_eq(curl(&c, "/api/session", args, &out), 200);
    ck_assert_msg(strstr(out, "Strict-Transport-Security") != NULL, "%s", out);
    free(out);
    snprintf(args, sizeof(args), "--cacert '%s/ca.crt' -d operator=alice -d token=" TOKEN, tls);
    ck_assert_int_eq(curl(&c, "/api/login", args, &out), 200);
    ck_assert_msg(strstr(out, "SameSite=Strict; Secure") != NULL, "%s", out);
    free(out);
    /* TLS 1.1 is refused (the client's own floor lowered to offer it). */
    snprintf(args, sizeof(args), "--cacert '%s/ca.crt' --tlsv1.1 --tls-max 1.1 "
             "--ciphers 'DEFAULT@SECLEVEL=0'", tls);
    ck_assert_int_eq(curl(&c, "/api/session", args, &out), 0);
    free(out);
    snprintf(args, sizeof(args), "--cacert '%s/ca.crt' --tlsv1.2 --tls-max 1.2", tls);
    ck_assert_int_eq(curl(&c, "/api/session", args, &out), 200);
    free(out);
    /* Plain HTTP to the TLS port gets no answer. */
    memmove(c.url + 4, c.url + 5, strlen(c.url + 5) + 1);  /* https:// -> http:// */
    ck_assert_int_eq(curl(&c, "/api/session", "--max-time 5", &out), 0);
    free(out);
    stop(&c);
}
END_TEST

/* DNS rebinding: a page at an attacker's name, resolved to 127.0.0.1, sends
 * that name in Host; and without a session it reads nothing anyway. */
START_TEST(test_another_name_in_host_and_reads_without_a_login_are_refused)
{
    struct console c;
    start(&c, "consolehost", NULL);
    const char *port = strrchr(c.url, ':') + 1;
    char *out, args[2000], csrf[80];
    snprintf(args, sizeof(args), "-H 'Host: rebind.evil.example:%s'", port);
    ck_assert_int_eq(curl(&c, "/api/status", args, &out), 421);
    free(out);
    ck_assert_int_eq(curl(&c, "/", args, &out), 421);
    free(out);
    snprintf(args, sizeof(args), "-H 'Host: rebind.evil.example:%s' -d operator=m -d token="
             TOKEN, port);
    ck_assert_int_eq(curl(&c, "/api/login", args, &out), 421);
    ck_assert_msg(strstr(out, "Set-Cookie") == NULL, "%s", out);
    free(out);
    snprintf(args, sizeof(args), "-H 'Host: localhost:%s'", port);
    ck_assert_int_eq(curl(&c, "/", args, &out), 200);
    free(out);
    ck_assert_int_eq(curl(&c, "/", "-H 'Host: 127.0.0.1:1'", &out), 421);  /* another port */
    free(out);

    ck_assert_int_eq(curl(&c, "/api/rates", "", &out), 401);
    free(out);
    static const char *const reads[] = { "/api/status", "/api/schedules" };
    for (size_t i = 0; i < SK_ARRAY_LEN(reads); i++) {
        ck_assert_int_eq(curl(&c, reads[i], "", &out), 401);
        ck_assert_msg(strstr(out, "log in first") != NULL, "%s: %s", reads[i], out);
        free(out);
    }
    ck_assert_int_eq(curl(&c, "/api/session", "", &out), 200);  /* the login page asks */
    free(out);
    /* The documented login: the token file sent as it is, newline and all. */
    snprintf(args, sizeof(args), "-d operator=alice --data-urlencode 'token@%s/console.token'",
             c.dir);
    ck_assert_int_eq(curl(&c, "/api/login", args, &out), 200);
    free(out);
    login(&c, csrf);
    snprintf(args, sizeof(args), "-b '%s/jar'", c.dir);
    for (size_t i = 0; i < SK_ARRAY_LEN(reads); i++) {
        ck_assert_int_eq(curl(&c, reads[i], args, &out), 200);
        free(out);
    }
    stop(&c);
}
END_TEST

START_TEST(test_open_reads_open_them_on_loopback)
{
    struct console c;
    start_with(&c, "consoleopen", NULL, TOKEN "\n", "  open_reads: true\n");
    char *out;
    ck_assert_int_eq(curl(&c, "/api/status", "", &out), 200);
    free(out);
    ck_assert_int_eq(curl(&c, "/api/dlq/purge", "-d queue=x -d all=1", &out), 401);
    free(out);
    stop(&c);
}
END_TEST

/* Guesses: a shared budget of failures a minute, each logged with the
 * client's address and never with what was typed. */
START_TEST(test_failed_logins_are_limited_and_logged_without_the_guess)
{
    struct console c;
    start(&c, "consoleguess", NULL);
    char *out, args[200];
    for (int i = 0; i < 10; i++) {
        snprintf(args, sizeof(args), "-d operator=m -d token=guess-%02d-xyzzy", i);
        ck_assert_int_eq(curl(&c, "/api/login", args, &out), 401);
        free(out);
    }
    ck_assert_int_eq(curl(&c, "/api/login", "-d operator=m -d token=guess-10-xyzzy", &out), 429);
    free(out);
    ck_assert_int_eq(curl(&c, "/api/login", "-d operator=m -d token=" TOKEN, &out), 429);
    ck_assert_msg(strstr(out, "Set-Cookie") == NULL, "%s", out);
    free(out);
    char *log = serve_log(&c);
    ck_assert_msg(strstr(log, "failed login (wrong token) from 127.0.0.1, 10 of 10") != NULL,
                  "%s", log);
    ck_assert_msg(strstr(log, "xyzzy") == NULL, "a guess reached the log: %s", log);
    free(log);
    stop(&c);
}
END_TEST

/* Runs sekalictl serve on a config with top, which it must refuse at
 * start: its output and exit code ("rc=N") into text. */
static void serve_refused(const char *dir, const char *queue, const char *top, char *text,
                          size_t size)
{
    char cmd[3000];
    char *config = h_write_config_top(dir, queue, H_EFFECT, 1, NULL, top);
    snprintf(cmd, sizeof(cmd), "timeout 10 '%s/sekalictl' -c '%s' serve 2>&1; echo rc=$?",
             h_build_dir(), config);
    free(config);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(text, 1, size - 1, p);
    text[n] = '\0';
    pclose(p);
    ck_assert_msg(strstr(text, "rc=0") == NULL && strstr(text, "rc=124") == NULL,
                  "sekalictl serve should refuse to start: %s", text);
}

/* A one-character token was accepted: now the start refuses it, clearly. */
START_TEST(test_a_token_shorter_than_32_bytes_is_refused_at_start)
{
    h_init();
    char *dir = h_tmpdir("consoleshort"), queue[128], token[1100], top[2000];
    h_unique_name(queue, sizeof(queue), "consoleshort");
    snprintf(token, sizeof(token), "%s/console.token", dir);
    FILE *f = fopen(token, "w");
    ck_assert_ptr_nonnull(f);
    fputs("x\n", f);
    fclose(f);
    snprintf(top, sizeof(top), "console:\n  listen: \"127.0.0.1:%d\"\n  token_file: %s\n",
             h_free_port(), token);
    char text[4096];
    serve_refused(dir, queue, top, text, sizeof(text));
    ck_assert_msg(strstr(text, "at least 32 characters") != NULL, "%s", text);

    free(dir);
}
END_TEST

/* 64 clients that send half a request and wait: every slot taken, and
 * libmicrohttpd's idle timeout (30 s) never reached. The console must still
 * answer someone else at once. */
START_TEST(test_64_slow_clients_do_not_keep_the_console_from_answering)
{
    struct console c;
    start(&c, "consoleslow", NULL);
    int port = atoi(strrchr(c.url, ':') + 1), slow[64];
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    for (size_t i = 0; i < SK_ARRAY_LEN(slow); i++) {
        slow[i] = socket(AF_INET, SOCK_STREAM, 0);
        ck_assert_int_ge(slow[i], 0);
        ck_assert_int_eq(connect(slow[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
        static const char half[] = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n";
        ck_assert_int_eq(send(slow[i], half, sizeof(half) - 1, 0), (ssize_t)sizeof(half) - 1);
    }
    char *out;
    ck_assert_int_eq(curl(&c, "/api/session", "--max-time 8", &out), 200);
    free(out);
    for (size_t i = 0; i < SK_ARRAY_LEN(slow); i++)
        close(slow[i]);
    stop(&c);
}
END_TEST

/* A private key others may read has leaked already: the start refuses it. */
START_TEST(test_a_key_file_readable_by_others_is_refused_at_start)
{
    const char *tls = getenv("SEKALI_TLS_DIR");
    if (tls == NULL || access(tls, R_OK) != 0) {
        ck_assert_msg(getenv("SEKALI_REQUIRE_TLS") == NULL, "no SEKALI_TLS_DIR");
        return;
    }
    h_init();
    char *dir = h_tmpdir("consolekey"), queue[128], path[1100], top[3000], cmd[5000];
    h_unique_name(queue, sizeof(queue), "consolekey");
    snprintf(cmd, sizeof(cmd), "cp '%s/server.key' '%s/' && chmod 640 '%s/server.key' && "
             "echo " TOKEN " > '%s/token'", tls, dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(path, sizeof(path), "%s/server.key", dir);
    snprintf(top, sizeof(top), "console:\n  listen: \"127.0.0.1:%d\"\n  token_file: %s/token\n"
             "  tls_cert_file: %s/server.crt\n  tls_key_file: %s\n", h_free_port(), dir, tls,
             path);
    char text[4096];
    serve_refused(dir, queue, top, text, sizeof(text));
    ck_assert_msg(strstr(text, "readable or writable by group or others") != NULL, "%s", text);

    free(dir);
}
END_TEST

#define BOB_TOKEN  "bob-own-token-0123456789abcdef-0123"
#define EVE_TOKEN  "hostile-name-token-0123456789abcdef"
/* An operator's name as hostile as YAML lets an operator write it: markup,
 * a quote, a backslash and a non-ASCII letter. */
#define EVE_NAME   "<img src=x onerror=alert(1)>\"\\é"
#define EVE_JSON   "\"<img src=x onerror=alert(1)>\\\"\\\\é\""

/* A token file of its own, mode 0600, in dir; its path into path. */
static void token_file(const char *dir, const char *name, const char *token, char *path,
                       size_t size)
{
    snprintf(path, size, "%s/%s.token", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s\n", token);
    fclose(f);
    ck_assert_int_eq(chmod(path, 0600), 0);
}

/* Logs in with args; the session's JSON into *out, the CSRF token into csrf. */
static void login_as(struct console *c, const char *args, char **out, char csrf[80])
{
    ck_assert_int_eq(curl(c, "/api/login", args, out), 200);
    char *at = strstr(*out, "\"csrf\":\"");
    ck_assert_ptr_nonnull(at);
    snprintf(csrf, 80, "%.64s", at + 8);
}

/* console.operators: each token names its operator, whatever name the
 * login sends; the audit (a line on stderr per action, and the rows the
 * action writes) names them; the old shared token still logs in with a
 * typed name; no token reaches the log. */
START_TEST(test_each_operator_logs_in_with_a_token_that_names_them_in_the_audit)
{
    h_init();
    char *tokens = h_tmpdir("consoleopstok"), bob[1100], eve[1100], extra[3000];
    token_file(tokens, "bob", BOB_TOKEN, bob, sizeof(bob));
    token_file(tokens, "eve", EVE_TOKEN, eve, sizeof(eve));
    snprintf(extra, sizeof(extra), "  operators:\n    - name: bob\n      token_file: %s\n"
             "    - name: '%s'\n      token_file: %s\n", bob, EVE_NAME, eve);
    struct console c;
    start_with(&c, "consoleops", NULL, TOKEN "\n", extra);
    char *out, args[2000], csrf[80];

    ck_assert_int_eq(curl(&c, "/api/session", "", &out), 200);
    ck_assert_msg(strstr(out, "\"named_tokens\":true") != NULL, "%s", out);
    free(out);
    /* Bob's token, sent with another name: the session is bob's. */
    snprintf(args, sizeof(args), "-c '%s/jar' -d operator=mallory -d token=" BOB_TOKEN, c.dir);
    login_as(&c, args, &out, csrf);
    ck_assert_msg(strstr(out, "\"operator\":\"bob\"") != NULL, "%s", out);
    free(out);
    PGconn *pg = h_pg();
    snprintf(args, sizeof(args), "-b '%s/jar' -d queue=%s -d reason=deploy -d csrf=%s", c.dir,
             c.queue, csrf);
    ck_assert_int_eq(curl(&c, "/api/pause", args, &out), 200);
    free(out);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.queue_pauses WHERE queue = "
                                    "'%s' AND paused_by = 'bob'", c.queue), 1);
    snprintf(args, sizeof(args), "-b '%s/jar' -d queue=%s -d csrf=%s", c.dir, c.queue, csrf);
    ck_assert_int_eq(curl(&c, "/api/resume", args, &out), 200);
    free(out);
    snprintf(args, sizeof(args), "-b '%s/jar' -d queue=%s -d all=1 -d dry_run=1 -d csrf=%s",
             c.dir, c.queue, csrf);
    ck_assert_int_eq(curl(&c, "/api/dlq/purge", args, &out), 200);
    free(out);

    /* The hostile name: no name sent, the token's is used, escaped as JSON. */
    snprintf(args, sizeof(args), "-c '%s/jar2' -d token=" EVE_TOKEN, c.dir);
    login_as(&c, args, &out, csrf);
    ck_assert_msg(strstr(out, "\"operator\":" EVE_JSON) != NULL, "%s", out);
    free(out);
    snprintf(args, sizeof(args), "-b '%s/jar2' -d queue=%s -d reason=x -d csrf=%s", c.dir,
             c.queue, csrf);
    ck_assert_int_eq(curl(&c, "/api/pause", args, &out), 200);
    free(out);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.queue_pauses WHERE queue = "
                                    "'%s' AND paused_by = E'<img src=x onerror=alert(1)>\"\\\\é'",
                                c.queue), 1);
    snprintf(args, sizeof(args), "-b '%s/jar2' -d queue=%s -d csrf=%s", c.dir, c.queue, csrf);
    ck_assert_int_eq(curl(&c, "/api/resume", args, &out), 200);
    free(out);
    PQfinish(pg);

    /* The shared token of before: a typed name, needed, and recorded as shared. */
    ck_assert_int_eq(curl(&c, "/api/login", "-d token=" TOKEN, &out), 400);
    free(out);
    snprintf(args, sizeof(args), "-c '%s/jar3' -d operator=alice -d token=" TOKEN, c.dir);
    login_as(&c, args, &out, csrf);
    ck_assert_msg(strstr(out, "\"operator\":\"alice\"") != NULL, "%s", out);
    free(out);
    snprintf(args, sizeof(args), "-b '%s/jar3' -d csrf=%s", c.dir, csrf);
    ck_assert_int_eq(curl(&c, "/api/logout", args, &out), 200);
    free(out);
    ck_assert_int_eq(curl(&c, "/api/login", "-d operator=bob -d token=" BOB_TOKEN "x", &out),
                     401);
    free(out);

    char *log = serve_log(&c), want[1000];
    static const char *const lines[] = {
        "audit {\"operator\":\"bob\",\"token\":\"own\",\"action\":\"login\",\"client\":\"127.0.0.1\"}",
        "audit {\"operator\":\"bob\",\"token\":\"own\",\"action\":\"pause\",\"queue\":\"%s\","
            "\"dry_run\":false,\"status\":200}",
        "audit {\"operator\":\"bob\",\"token\":\"own\",\"action\":\"resume\",\"queue\":\"%s\","
            "\"dry_run\":false,\"status\":200}",
        "audit {\"operator\":\"bob\",\"token\":\"own\",\"action\":\"dlq/purge\",\"queue\":\"%s\","
            "\"dry_run\":true,\"status\":200}",
        "audit {\"operator\":" EVE_JSON ",\"token\":\"own\",\"action\":\"pause\",\"queue\":\"%s\"",
        "audit {\"operator\":\"alice\",\"token\":\"shared\",\"action\":\"login\"",
        "audit {\"operator\":\"alice\",\"token\":\"shared\",\"action\":\"logout\"",
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(lines); i++) {
        snprintf(want, sizeof(want), lines[i], c.queue);
        ck_assert_msg(strstr(log, want) != NULL, "no line %s in:\n%s", want, log);
    }
    ck_assert_msg(strstr(log, "mallory") == NULL, "a name the token did not prove: %s", log);
    static const char *const secrets[] = { TOKEN, BOB_TOKEN, EVE_TOKEN, "-0123" };
    for (size_t i = 0; i < SK_ARRAY_LEN(secrets); i++)
        ck_assert_msg(strstr(log, secrets[i]) == NULL, "a token reached the log: %s", log);
    free(log);
    stop(&c);
    free(tokens);
}
END_TEST

/* Two operators with one name or one token, a short token and a name with
 * a control character are refused at start, naming the entry and never
 * the token. */
START_TEST(test_operators_alike_or_malformed_are_refused_at_start)
{
    h_init();
    char *dir = h_tmpdir("consoleopsbad"), queue[128], bob[1100], eve[1100], shrt[1100];
    h_unique_name(queue, sizeof(queue), "consoleopsbad");
    token_file(dir, "bob", BOB_TOKEN, bob, sizeof(bob));
    token_file(dir, "eve", EVE_TOKEN, eve, sizeof(eve));
    token_file(dir, "short", "abc", shrt, sizeof(shrt));
    char top[4000], text[4096];
    int port = h_free_port();
    struct { const char *ops, *says; } cases[] = {
        { "    - {name: bob, token_file: %1$s}\n    - {name: bob, token_file: %2$s}\n",
          "operators[1]: the name \"bob\" is given twice" },
        { "    - {name: bob, token_file: %1$s}\n    - {name: eve, token_file: %1$s}\n",
          "operators[1]: the same token as operators[0]" },
        { "%1$.0s%2$.0s    - {name: bob, token_file: %3$s}\n", "at least 32 characters" },
        { "    - {name: \"b\\to\", token_file: %1$s}\n",
          "name: 1 to 64 bytes of UTF-8 without control characters" },
        { "    - {name: bob}\n", "missing required key \"token_file\" in operators[0]" },
        { "    - {name: bob, token_file: %1$s, role: admin}\n", "unknown key \"role\"" },
    };
    for (size_t i = 0; i < SK_ARRAY_LEN(cases); i++) {
        char ops[3000];
        snprintf(ops, sizeof(ops), cases[i].ops, bob, eve, shrt);
        snprintf(top, sizeof(top), "console:\n  listen: \"127.0.0.1:%d\"\n  operators:\n%s",
                 port, ops);
        serve_refused(dir, queue, top, text, sizeof(text));
        ck_assert_msg(strstr(text, cases[i].says) != NULL, "case %zu: %s", i, text);
        ck_assert_msg(strstr(text, "0123456789abcdef") == NULL, "a token shown: %s", text);
    }
    free(dir);
}
END_TEST

/* Starts a real sekalid on r (opened) with o, its metrics endpoint on and a
 * console configured beside it (not started); returns the console's port. */
static int start_with_console(struct h_run *r, struct h_run_opts *o)
{
    char token[1100], top[2000];
    snprintf(token, sizeof(token), "%s/console.token", r->dir);
    FILE *f = fopen(token, "w");
    ck_assert_ptr_nonnull(f);
    fputs(TOKEN "\n", f);
    fclose(f);
    int metrics = h_free_port(), port = h_free_port();
    snprintf(top, sizeof(top), "metrics:\n  listen: \"127.0.0.1:%d\"\nconsole:\n  listen: "
             "\"127.0.0.1:%d\"\n  token_file: %s\n", metrics, port, token);
    o->top_yaml = top;
    h_run_start(r, o);
    return port;
}

/* A queue whose consumers are up but whose every job fails was shown
 * "healthy": the rates now give the window's completed and failed counts,
 * from which the page says "failing". A real sekalid, its real /metrics. */
START_TEST(test_a_queue_where_every_job_fails_is_counted_failing_in_the_rates)
{
    struct h_run r;
    h_run_open(&r, "consolefail");
    int port = start_with_console(&r, &(struct h_run_opts){ .workers = 1,
                                                            .queue_yaml = H_FAST_RETRIES });
    struct console c = { .dir = strdup(r.dir), .config = strdup(r.config) };
    snprintf(c.queue, sizeof(c.queue), "%s", r.queue);
    snprintf(c.url, sizeof(c.url), "http://127.0.0.1:%d", port);
    spawn(&c);
    char csrf[80], args[1200], *out = NULL;
    login(&c, csrf);
    snprintf(args, sizeof(args), "-b '%s/jar'", c.dir);
    /* The sampler's first scrape, before any job: the window starts there. */
    H_WAIT((free(out), curl(&c, "/api/rates", args, &out) == 200 &&
            strstr(out, "\"completed_in_window\":0") != NULL), 30000,
           "the rates should have two samples: %s", out);
    char key[64], id[64];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "fails-%d", i);
        snprintf(id, sizeof(id), "m-fails-%d", i);
        h_publish(r.b, r.queue, "test", id, key, NULL, "fail");
    }
    H_WAIT(h_queue_depth(r.b, r.dead) + (unsigned)h_pg_count(r.pg, "SELECT count(*) FROM "
           "sekali.dead_letters WHERE queue = '%s'", r.queue) >= 5, 60000,
           "the five jobs should fail");
    H_WAIT((free(out), curl(&c, "/api/rates", args, &out) == 200 &&
            strstr(out, "\"failed_in_window\":5") != NULL), 30000,
           "the window should count the five failures: %s", out);
    ck_assert_msg(strstr(out, "\"completed_in_window\":0") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "\"job_timeout_seconds\":0") != NULL, "%s", out);
    free(out);
    stop(&c);
    h_stop_sekalid(r.sekalid, r.dir);
    r.sekalid = -1;
    h_run_close(&r);
}
END_TEST

/* Jobs enqueued for later: /api/scheduled lists them soonest first, from
 * the outbox, their hostile keys escaped as JSON; it takes a login, a
 * configured queue and a bounded limit. */
START_TEST(test_jobs_scheduled_for_later_are_listed_soonest_first_with_keys_escaped)
{
    struct console c;
    start(&c, "consolesched", NULL);
    PGconn *pg = h_pg();
    char sql[1000];
    snprintf(sql, sizeof(sql), "SELECT sekali.enqueue('%s', 'test', 'x'::bytea, "
             "p_idempotency_key => k, p_run_at => now() + d) FROM (VALUES "
             "(E'later-\"<script>alert(1)</script>\\x01', interval '2 hours'), "
             "('sooner', interval '1 hour'), ('now', interval '0')) v(k, d)", c.queue);
    h_pg_exec(pg, sql);
    char *out, args[1200], csrf[80];
    ck_assert_int_eq(curl(&c, "/api/scheduled", "", &out), 401);
    free(out);
    login(&c, csrf);
    snprintf(args, sizeof(args), "-b '%s/jar' -G -d queue=%s", c.dir, c.queue);
    ck_assert_int_eq(curl(&c, "/api/scheduled", args, &out), 200);
    char *sooner = strstr(out, "\"key\":\"sooner\""),
         *later = strstr(out, "\"key\":\"later-\\\"<script>alert(1)</script>\\u0001\"");
    ck_assert_msg(sooner != NULL && later != NULL && sooner < later, "%s", out);
    ck_assert_msg(strstr(out, "\"key\":\"now\"") == NULL, "a job due now is no later: %s", out);
    ck_assert_msg(strstr(out, "\"in_seconds\":3600") != NULL ||
                  strstr(out, "\"in_seconds\":3599") != NULL, "%s", out);
    free(out);
    snprintf(args, sizeof(args), "-b '%s/jar' -G -d queue=%s -d limit=1", c.dir, c.queue);
    ck_assert_int_eq(curl(&c, "/api/scheduled", args, &out), 200);
    ck_assert_msg(strstr(out, "sooner") != NULL && strstr(out, "later-") == NULL, "%s", out);
    free(out);
    static const char *const bad[] = { "-d queue=elsewhere", "-d limit=0", "-d limit=1001",
                                       "-d limit=x" };
    for (size_t i = 0; i < SK_ARRAY_LEN(bad); i++) {
        snprintf(args, sizeof(args), "-b '%s/jar' -G %s", c.dir, bad[i]);
        ck_assert_int_eq(curl(&c, "/api/scheduled", args, &out), 400);
        free(out);
    }
    /* The terminal's form of the same report escapes the key too. */
    char cmd[3000];
    snprintf(cmd, sizeof(cmd), "'%s/sekalictl' -c '%s' scheduled --queue %s 2>&1",
             h_build_dir(), c.config, c.queue);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char text[4096];
    size_t n = fread(text, 1, sizeof(text) - 1, p);
    text[n] = '\0';
    ck_assert_int_eq(pclose(p), 0);
    ck_assert_msg(strstr(text, "later-\"<script>alert(1)</script>\\x01") != NULL &&
                  strchr(text, '\x01') == NULL && strstr(text, "sooner") < strstr(text, "later-"),
                  "%s", text);
    snprintf(sql, sizeof(sql), "DELETE FROM sekali.outbox WHERE queue = '%s'", c.queue);
    h_pg_exec(pg, sql);
    PQfinish(pg);
    stop(&c);
}
END_TEST

/* The pid in the name of the test handler's mark DIR/PREFIX.<pid>, or 0. */
static long marked_pid(const char *dir, const char *prefix)
{
    char pattern[1200];
    snprintf(pattern, sizeof(pattern), "%s/%s.*", dir, prefix);
    glob_t g;
    long pid = 0;
    if (glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0)
        pid = strtol(strrchr(g.gl_pathv[0], '.') + 1, NULL, 10);
    globfree(&g);
    return pid;
}

/* sekalictl inflight [--json]'s output, or why it failed (no list in it). */
static char *inflight(struct h_run *r, bool json)
{
    const char *args[] = { "inflight", json ? "--json" : NULL, NULL };
    char *out = NULL;
    int code = h_sekalictl(r, &out, args);
    if (code != 0) {
        char *why = NULL;
        if (asprintf(&why, "sekalictl inflight failed (exit %d): %s", code,
                     out != NULL ? out : "") < 0)
            why = NULL;
        free(out);
        return why != NULL ? why : strdup("");
    }
    return out;
}

static long long age_of(const char *json)
{
    const char *at = json != NULL ? strstr(json, "\"age_ms\":") : NULL;
    return at != NULL ? strtoll(at + 9, NULL, 10) : -1;
}

/* A claim is uncommitted while its job runs, so only the supervisor's
 * scoreboard can show it: a job whose handler waits is listed by
 * `sekalictl inflight` (text and JSON) and /api/inflight with its key,
 * escaped for a terminal, for JSON and for a page, and an age that grows;
 * it is gone once it ends, and a SIGKILLed worker's job goes with it. */
START_TEST(test_jobs_in_flight_are_listed_with_escaped_keys_until_they_end_or_die)
{
    static const char key[] = "k-\"<img src=x onerror=alert(1)>\x1b[31m\xe2\x80\xae-end";
    static const char key_json[] =
        "\"key\":\"k-\\u0022\\u003cimg src=x onerror=alert(1)\\u003e\\u001b[31m\\u202e-end\"";
    struct h_run r;
    h_run_open(&r, "inflight");
    char yaml[1600];
    snprintf(yaml, sizeof(yaml), "%s    config:\n      marker_dir: %s\n", H_FAST_RETRIES, r.dir);
    int port = start_with_console(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = yaml });
    char *out = inflight(&r, false);
    ck_assert_msg(strstr(out, "no job is in flight") != NULL, "%s", out);
    free(out);
    out = NULL;

    h_publish(r.b, r.queue, "test", "m-held", key, NULL, "hold");
    H_WAIT(marked_pid(r.dir, "hold") > 0, 30000, "the handler should be running");
    long holder = marked_pid(r.dir, "hold");
    char *first = inflight(&r, true);
    ck_assert_msg(strstr(first, key_json) != NULL && strstr(first, "\"phase\":\"handler\"") &&
                  strstr(first, "\"job_type\":\"test\"") && strstr(first, "\"attempt\":1") &&
                  strstr(first, "<img") == NULL, "%s", first);
    char pid_json[40];
    snprintf(pid_json, sizeof(pid_json), "\"pid\":%ld,", holder);
    ck_assert_msg(strstr(first, pid_json) != NULL, "pid %ld: %s", holder, first);
    H_WAIT((free(out), out = inflight(&r, true), age_of(out) > age_of(first)), 10000,
           "the age should grow: %s, then %s", first, out);
    free(out);
    out = NULL;
    out = inflight(&r, false);
    ck_assert_msg(strstr(out, "k-\"<img src=x onerror=alert(1)>\\x1b[31m\\u202e-end") != NULL &&
                  strchr(out, '\x1b') == NULL && strstr(out, "\xe2\x80\xae") == NULL &&
                  strstr(out, r.queue) != NULL && strstr(out, "handler") != NULL, "%s", out);
    free(out);
    out = NULL;

    /* The console passes the document on, escaped as it is. */
    struct console c = { .dir = strdup(r.dir), .config = strdup(r.config) };
    snprintf(c.url, sizeof(c.url), "http://127.0.0.1:%d", port);
    spawn(&c);
    char csrf[80], args[1200];
    ck_assert_int_eq(curl(&c, "/api/inflight", "", &out), 401);
    free(out);
    out = NULL;
    login(&c, csrf);
    snprintf(args, sizeof(args), "-b '%s/jar'", c.dir);
    ck_assert_int_eq(curl(&c, "/api/inflight", args, &out), 200);
    ck_assert_msg(strstr(out, key_json) != NULL && strstr(out, "<img") == NULL, "%s", out);
    free(out);
    out = NULL;
    ck_assert_int_eq(curl(&c, "/inflight", args, &out), 200);  /* the page */
    free(out);
    out = NULL;

    char path[1200];
    snprintf(path, sizeof(path), "%s/release", r.dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    H_WAIT(h_effects(&r, key) == 1, 30000, "the held job should complete");
    H_WAIT((free(out), out = inflight(&r, true), strstr(out, "\"inflight\":[]") != NULL), 10000,
           "nothing should be in flight once it ended: %s", out);
    free(out);
    out = NULL;

    /* A worker killed in its job: its entry goes with it. */
    h_publish(r.b, r.queue, "test", "m-stall", "k-stall", NULL, "stall");
    H_WAIT(marked_pid(r.dir, "stall") > 0, 30000, "the stalling handler should run");
    long staller = marked_pid(r.dir, "stall");
    snprintf(pid_json, sizeof(pid_json), "\"pid\":%ld,", staller);
    out = inflight(&r, true);
    ck_assert_msg(strstr(out, pid_json) != NULL && strstr(out, "\"key\":\"k-stall\""), "%s", out);
    free(out);
    out = NULL;
    ck_assert_int_eq(kill((pid_t)staller, SIGKILL), 0);
    H_WAIT((free(out), out = inflight(&r, true), strstr(out, "\"inflight\":[") != NULL &&
            strstr(out, pid_json) == NULL), 10000, "the dead worker's job should go: %s", out);
    free(out);
    out = NULL;
    H_WAIT(h_effects(&r, "k-stall") == 1, 30000, "the stalled job should run again and end");
    free(first);
    stop(&c);
    h_stop_sekalid(r.sekalid, r.dir);
    r.sekalid = -1;
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_every_answer_has_the_headers_and_actions_are_refused_without_what_they_need,
        test_over_tls_the_console_speaks_https_only_with_a_secure_cookie,
        test_another_name_in_host_and_reads_without_a_login_are_refused,
        test_open_reads_open_them_on_loopback,
        test_failed_logins_are_limited_and_logged_without_the_guess,
        test_a_token_shorter_than_32_bytes_is_refused_at_start,
        test_64_slow_clients_do_not_keep_the_console_from_answering,
        test_a_key_file_readable_by_others_is_refused_at_start,
        test_each_operator_logs_in_with_a_token_that_names_them_in_the_audit,
        test_operators_alike_or_malformed_are_refused_at_start,
        test_a_queue_where_every_job_fails_is_counted_failing_in_the_rates,
        test_jobs_scheduled_for_later_are_listed_soonest_first_with_keys_escaped,
        test_jobs_in_flight_are_listed_with_escaped_keys_until_they_end_or_die,
        NULL,
    };
    return h_run_suite(h_suite("console_http", 120, tests));
}
