/* common.c - the error buffer and assertion failure, used by every module. */
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int sk_err_set(struct sk_err *err, int code, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    err->code = code;
    err->sys_errno = 0;
    err->sqlstate[0] = '\0';
    return code;
}

int sk_err_errno(struct sk_err *err, int code, const char *fmt, ...)
{
    int saved = errno;
    if (err == NULL)
        return code;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(err->msg))
        snprintf(err->msg + n, sizeof(err->msg) - (size_t)n, ": %s", strerror(saved));
    err->code = code;
    err->sys_errno = saved;
    err->sqlstate[0] = '\0';
    errno = saved;
    return code;
}

/* A span id per job was a getrandom() call per job, 2-3 % of a worker's
 * CPU at batch 1: the bytes are drawn a pool at a time instead. A forked
 * child must never hand out its parent's bytes (two workers would share
 * span ids and lock-token prefixes), so fork empties the forking thread's
 * pool in the child; each thread has its own. */
static _Thread_local unsigned char random_pool[256];
static _Thread_local size_t        random_left;
static pthread_once_t              random_once = PTHREAD_ONCE_INIT;

static void random_forget_in_child(void)
{
    explicit_bzero(random_pool, sizeof(random_pool));
    random_left = 0;
}

static void random_register(void)
{
    pthread_atfork(NULL, NULL, random_forget_in_child);
}

static unsigned char random_byte(void)
{
    if (random_left == 0) {
        pthread_once(&random_once, random_register);
        size_t got = 0;
        while (got < sizeof(random_pool)) {
            ssize_t r = getrandom(random_pool + got, sizeof(random_pool) - got, 0);
            if (r > 0)
                got += (size_t)r;
        }
        random_left = sizeof(random_pool);
    }
    unsigned char b = random_pool[--random_left];
    random_pool[random_left] = 0;  /* a byte is handed out once */
    return b;
}

void sk_random_hex(char *out, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    sk_assert(n % 2 == 0);
    for (size_t i = 0; i < n; i += 2) {
        unsigned char b = random_byte();
        out[i] = hex[b >> 4];
        out[i + 1] = hex[b & 0x0f];
    }
    out[n] = '\0';
}

void sk_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "sekali: assertion \"%s\" failed at %s:%d\n", expr, file, line);
    abort();
}

size_t sk_format_u64(char *out, uint64_t n)
{
    char digits[20];
    size_t len = 0;
    do {
        digits[len++] = (char)('0' + n % 10);
        n /= 10;
    } while (n != 0);
    for (size_t i = 0; i < len; i++)
        out[i] = digits[len - 1 - i];
    return len;
}
