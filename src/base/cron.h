/* cron.h - when a schedule fires: a five-field cron expression in a time
 * zone, or a fixed interval, and the next tick after an instant.
 *
 * Times are Unix seconds (UTC); a tick is always a whole second. */
#ifndef SK_CRON_H
#define SK_CRON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* A parsed schedule. Plain data: copy it freely. */
struct sk_cron {
    uint32_t every_s;       /* > 0: an interval, ticks at multiples of it since the epoch */
    uint64_t minutes;       /* bit n: minute n (0-59) */
    uint32_t hours;         /* bit n: hour n (0-23) */
    uint32_t mdays;         /* bit n: day of month n (1-31) */
    uint16_t months;        /* bit n: month n (1-12) */
    uint8_t  wdays;         /* bit n: weekday n (0 Sunday - 6) */
    bool     mday_star;     /* day-of-month field began with '*' */
    bool     wday_star;     /* day-of-week field began with '*' */
    char     zone[72];      /* IANA name, "UTC" by default */
};

/* Parses text, five fields "minute hour day-of-month month day-of-week"
 * (numbers, *, ranges a-b, steps /n, lists, month and weekday names, 7 as
 * Sunday) or one of @hourly @daily @midnight @weekly @monthly @yearly
 * @annually, into c (zone "UTC"). On error returns SK_ERR with a message
 * and, in *column, the 0-based offset of the offending character. */
int sk_cron_parse(const char *text, struct sk_cron *c, size_t *column, struct sk_err *err);

/* Whether some date matches c's day and month fields (a cron expression
 * such as "0 0 30 2 *" never fires). Needs no zone. */
bool sk_cron_possible(const struct sk_cron *c);

/* An interval schedule of every_s seconds (> 0). */
void sk_cron_every(struct sk_cron *c, uint32_t every_s);

/* The first tick strictly after `after`, or -1 when none comes within
 * eight years (a date that never exists, such as 30 February). A wall time
 * the zone's clock skips (spring forward) is no tick; one it shows twice
 * (fall back) is one tick, at its first occurrence. Changes the process's
 * TZ while it runs (tz.h): single-threaded callers only. */
int64_t sk_cron_next(const struct sk_cron *c, int64_t after);

#endif
