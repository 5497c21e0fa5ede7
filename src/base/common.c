/* common.c - the error buffer and assertion failure, used by every module. */
#include "common.h"

#include <errno.h>
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

void sk_random_hex(char *out, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[64];
    sk_assert(n % 2 == 0);
    for (size_t done = 0; done < n; ) {
        size_t want = (n - done) / 2 < sizeof(raw) ? (n - done) / 2 : sizeof(raw);
        size_t got = 0;
        while (got < want) {
            ssize_t r = getrandom(raw + got, want - got, 0);
            if (r > 0)
                got += (size_t)r;
        }
        for (size_t i = 0; i < want; i++) {
            out[done++] = hex[raw[i] >> 4];
            out[done++] = hex[raw[i] & 0x0f];
        }
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
