/* common.h - result codes, the error buffer and assertions shared by every module.
 *
 * Every fallible function returns one of the SK_* codes and, when the caller passes
 * a struct sk_err, explains the failure there. The code tells the caller what to do
 * next; the message is for the one place that logs it. */
#ifndef SK_COMMON_H
#define SK_COMMON_H

#include <stddef.h>
#include <stdint.h>

enum {
    SK_OK    =  0,
    SK_ERR   = -1,  /* permanent for this input: do not retry as is */
    SK_AGAIN = -2,  /* transient (server unreachable, timeout): back off and retry */
    SK_BUSY  = -3,  /* someone else holds it: try later */
    SK_DUP   = -4,  /* already completed: acknowledge, do nothing */
    /* Never returned, only left in sk_err.code next to the usual return
     * code: the server refused our credentials. Retrying as is cannot help
     * until someone fixes the password, so callers that can tell it apart
     * (a worker starting up, the Redis policy) do; the rest retry. Kept
     * out of the return so that a caller that does not care needs no case
     * for it: the return says what to do (back off, or give up), err.code
     * only why. Left by (sk_err_mark_auth()):
     *   sk_broker_open()               returning SK_ERR (ACCESS_REFUSED, or
     *                                  NOT_ALLOWED on the vhost);
     *   sk_pg_dial(), and every sk_store_*() call that (re)dials through it,
     *                                  returning SK_AGAIN;
     *   every sk_lock_*() call that (re)connects or is answered NOAUTH or
     *                                  WRONGPASS, returning SK_AGAIN.
     * Read err.code after those only; a new source must be added here. */
    SK_AUTH  = -5,
};

/* Process exit codes are an interface: the supervisor and systemd's
 * RestartPreventExitStatus= both rely on them. */
enum {
    SK_EXIT_OK      = 0,
    SK_EXIT_RUNTIME = 1,
    SK_EXIT_CONFIG  = 2,  /* never respawned: it would fail the same way */
    SK_EXIT_ABI     = 3,  /* never respawned: the plugin must be rebuilt */
};

struct sk_err {
    int  code;
    int  sys_errno;
    char msg[256];
    /* The SQLSTATE of a statement PostgreSQL refused (pg.c), else "": what
     * the refusal means beyond the code, e.g. sk_pg_refused_data(). */
    char sqlstate[6];
};

/* Fills err (which may be NULL) and returns code, so callers can write
 * `return sk_err_set(err, SK_ERR, "...")`. */
int sk_err_set(struct sk_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Marks err (which may be NULL) as an authentication refusal (SK_AUTH) and
 * returns rc unchanged. */
static inline int sk_err_mark_auth(struct sk_err *err, int rc)
{
    if (err != NULL)
        err->code = SK_AUTH;
    return rc;
}

/* Like sk_err_set, appending ": strerror(errno)" and keeping errno. */
int sk_err_errno(struct sk_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes n random hex characters (n even) from the kernel's generator, and
 * a NUL, into out (n + 1 bytes): owner tokens, message ids. */
void sk_random_hex(char *out, size_t n);

/* Writes n in decimal to out (at least 20 bytes), without a NUL; returns
 * the digits written. For the per-job paths (log lines, Redis commands)
 * where printf's format parsing was a measurable share of a job. */
size_t sk_format_u64(char *out, uint64_t n);

_Noreturn void sk_assert_fail(const char *expr, const char *file, int line);

/* For states that cannot occur. Bad input never reaches an assert. */
#define sk_assert(expr) \
    ((expr) ? (void)0 : sk_assert_fail(#expr, __FILE__, __LINE__))

#define SK_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define SK_KEY_MAX 512  /* longest job id or key, in bytes */

#endif
