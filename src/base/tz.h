/* tz.h - wall-clock time in an IANA time zone, from glibc's reading of the
 * system's tz database (Debian's tzdata, /usr/share/zoneinfo).
 *
 * glibc converts only in the zone named by the process-global TZ, so a
 * conversion is done inside a scope that sets TZ and puts it back: call
 * sk_tz_enter()/sk_tz_leave() around a search, from a single-threaded
 * process only (the scheduler, sekalictl, sekalid's config check before it
 * forks). No other module reads local time, and the log stamps UTC. */
#ifndef SK_TZ_H
#define SK_TZ_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Whether name is a zone of the tz database on this machine: a relative
 * name of letters, digits and "/_+-" without "..", whose file under $TZDIR
 * (default /usr/share/zoneinfo) is a TZif file. glibc silently takes an
 * unknown name for UTC, so this is checked first. "UTC" always is. */
bool sk_tz_known(const char *name);

/* The zone's scope: TZ=zone until the matching sk_tz_leave(); the
 * outermost one restores what was there. Scopes nest (an inner one may
 * name another zone, in force until the outer one ends). Returns false
 * when out of memory (nothing changed, no scope opened). */
bool sk_tz_enter(const char *zone);
void sk_tz_leave(void);

/* Inside a scope: utc's wall clock (tm_gmtoff set). */
void sk_tz_local(int64_t utc, struct tm *out);

/* Inside a scope: the UTC instants whose wall clock reads y-m-d h:mi:00
 * (m 1-12), earliest first, in out; returns how many: 0 in a gap (the
 * clock skipped that time), 2 in an overlap (it read it twice), else 1.
 * Assumes, as the tz database holds, at most one offset change within a day
 * either side. */
int sk_tz_resolve(int y, int m, int d, int h, int mi, int64_t out[2]);

/* The days since 1970-01-01 of a proleptic Gregorian date (m 1-12), and
 * back. For calendar walks that must not go through a zone. */
int64_t sk_tz_days_from_civil(int y, int m, int d);
void    sk_tz_civil_from_days(int64_t days, int *y, int *m, int *d);

#endif
