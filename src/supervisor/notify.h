/* notify.h - what the supervisor tells systemd (sd_notify).
 *
 * Only the supervisor talks to systemd. Without NOTIFY_SOCKET (not under
 * systemd) every call is a cheap no-op. */
#ifndef SK_NOTIFY_H
#define SK_NOTIFY_H

#include <stdint.h>

void sk_notify_ready(void);
void sk_notify_reloading(void);  /* with MONOTONIC_USEC, as systemd 253+ expects */
void sk_notify_stopping(void);
void sk_notify_watchdog(void);
void sk_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The watchdog interval systemd asked for (WatchdogSec=), in ms, or 0. */
uint32_t sk_notify_watchdog_ms(void);

#endif
