/* common.c - the error buffer and assertion failure, used by every module. */
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    errno = saved;
    return code;
}

void sk_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "sekali: assertion \"%s\" failed at %s:%d\n", expr, file, line);
    abort();
}
