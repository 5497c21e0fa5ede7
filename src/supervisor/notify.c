/* notify.c - sd_notify() messages from the supervisor (see notify.h). */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include <systemd/sd-daemon.h>

#include "notify.h"

void sk_notify_ready(void)
{
    sd_notify(0, "READY=1");
}

void sk_notify_reloading(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu",
               (unsigned long long)t.tv_sec * 1000000ULL + (unsigned long long)t.tv_nsec / 1000);
}

void sk_notify_stopping(void)
{
    sd_notify(0, "STOPPING=1");
}

void sk_notify_watchdog(void)
{
    sd_notify(0, "WATCHDOG=1");
}

void sk_notify_status(const char *fmt, ...)
{
    char status[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(status, sizeof(status), fmt, ap);
    va_end(ap);
    sd_notifyf(0, "STATUS=%s", status);
}

uint32_t sk_notify_watchdog_ms(void)
{
    uint64_t usec = 0;
    /* 0: keep WATCHDOG_USEC in the environment; it is harmless to workers. */
    if (sd_watchdog_enabled(0, &usec) <= 0)
        return 0;
    return usec / 1000 > UINT32_MAX ? UINT32_MAX : (uint32_t)(usec / 1000);
}
