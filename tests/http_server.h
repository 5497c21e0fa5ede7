/* http_server.h - a small real HTTP server for the HTTP handler's tests
 * (libmicrohttpd, one thread per connection, on a free loopback port).
 *
 * It records every request (its sekali headers, Authorization, body) and
 * answers as the request's body says, on the first request of a key
 * (later ones get 200):
 *   ok      200 "done KEY fence=N"          (every time)
 *   429     429 with Retry-After: 1
 *   500     500 "oops"
 *   500always  500 "oops" every time
 *   cut     500 with "x" and 150 "é" (every time): an excerpt of 200 bytes
 *           ends inside a character
 *   400     400 "bad request: <the Authorization header echoed>" (every time)
 *   401     401 "invalid token TOKEN (base64 .., header ..)": the token of
 *           "Bearer TOKEN", in base64, and the header URL-encoded
 *   echo    200 with the request's secret headers as JSON, and in base64
 *   drop    the connection closed without an answer, on every request of
 *           attempt 1 (libcurl's own resend included)
 *   slow    200 after 3 s
 *   hang    200 "late fence=N" once hs_release() is called (or after 60 s) */
#ifndef SK_TEST_HTTP_SERVER_H
#define SK_TEST_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hs_request {
    char    key[256];        /* Idempotency-Key */
    char    job_id[256];     /* X-Sekali-Job-Id */
    char    job_type[128];   /* X-Sekali-Job-Type */
    char    content_type[128];
    char    authorization[256];
    char    from_env[256];   /* X-From-Env */
    char    traceparent[128];
    char    tracestate[600];
    int64_t fence;           /* X-Sekali-Fence */
    int     attempt;         /* X-Sekali-Attempt */
    char    body[256];
    int64_t at_ms;           /* when it arrived (CLOCK_MONOTONIC) */
};

struct hs;

/* Starts the server; fails the test if it cannot. */
struct hs *hs_start(void);
/* The same over TLS with the PEM certificate and key in these files. */
struct hs *hs_start_tls(const char *cert_file, const char *key_file);
int hs_port(const struct hs *s);
/* Requests seen so far for key (all keys when key is NULL). */
size_t hs_count(struct hs *s, const char *key);
/* The i-th request for key (0-based); false if there is none yet. */
bool hs_get(struct hs *s, const char *key, size_t i, struct hs_request *out);
/* Lets every hanging request answer. */
void hs_release(struct hs *s);
void hs_stop(struct hs *s);

#endif
