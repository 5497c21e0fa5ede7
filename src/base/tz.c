/* tz.c - wall-clock conversions in a named time zone (see tz.h).
 *
 * glibc is chosen over PostgreSQL's zone support because a schedule's next
 * tick must be computed where there is no database (sekalid -t, unit
 * tests, sekalictl listing a schedule never run) and because a cron search
 * tries many wall times: a round trip each would be slow. Both read the
 * same IANA data on Debian (tzdata), so they agree. */
#include "tz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZONE_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/_+-"
#define ZONE_MAX   64

static char *saved_tz;      /* TZ before the outermost sk_tz_enter(); NULL: it was unset */
static bool  saved_set;
static int   depth;         /* scopes open */

bool sk_tz_known(const char *name)
{
    size_t n = strlen(name);
    if (strcmp(name, "UTC") == 0)
        return true;
    if (n == 0 || n > ZONE_MAX || strspn(name, ZONE_CHARS) != n || name[0] == '/' ||
        strstr(name, "..") != NULL)
        return false;
    const char *dir = getenv("TZDIR");
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir != NULL && dir[0] != '\0' ? dir :
             "/usr/share/zoneinfo", name);
    FILE *f = fopen(path, "rbe");
    if (f == NULL)
        return false;
    char magic[4];
    bool tzif = fread(magic, 1, 4, f) == 4 && memcmp(magic, "TZif", 4) == 0;
    fclose(f);
    return tzif;
}

/* tzset() reads the zone's file again whenever TZ changes, so an inner
 * scope of the zone already in force changes nothing: a walk over many
 * ticks opens one scope around them all (ticks.c). */
bool sk_tz_enter(const char *zone)
{
    const char *old = getenv("TZ");
    if (depth == 0) {
        char *copy = old != NULL ? strdup(old) : NULL;
        if (old != NULL && copy == NULL)
            return false;
        saved_tz = copy;
        saved_set = old != NULL;
    }
    if (old == NULL || strcmp(old, zone) != 0) {
        if (setenv("TZ", zone, 1) != 0) {
            if (depth == 0) {
                free(saved_tz);
                saved_tz = NULL;
            }
            return false;
        }
        tzset();
    }
    depth++;
    return true;
}

void sk_tz_leave(void)
{
    if (depth == 0 || --depth > 0)
        return;
    if (saved_set)
        setenv("TZ", saved_tz, 1);
    else
        unsetenv("TZ");
    free(saved_tz);
    saved_tz = NULL;
    saved_set = false;
    tzset();
}

void sk_tz_local(int64_t utc, struct tm *out)
{
    time_t t = (time_t)utc;
    localtime_r(&t, out);
}

static int64_t offset_at(int64_t utc)
{
    struct tm tm;
    sk_tz_local(utc, &tm);
    return tm.tm_gmtoff;
}

int sk_tz_resolve(int y, int m, int d, int h, int mi, int64_t out[2])
{
    /* The wall time read as if it were UTC; a true instant u shows it when
     * u + offset(u) == wall. The offsets a day before and after are the
     * only ones in force around it. */
    int64_t wall = sk_tz_days_from_civil(y, m, d) * 86400 + h * 3600 + mi * 60;
    int64_t before = offset_at(wall - 86400), after = offset_at(wall + 86400);
    int n = 0;
    int64_t cands[2] = { wall - before, wall - after };
    for (int i = 0; i < 2; i++) {
        int64_t u = cands[i];
        if (u + offset_at(u) != wall || (n == 1 && out[0] == u))
            continue;
        out[n++] = u;
    }
    if (n == 2 && out[1] < out[0]) {
        int64_t t = out[0];
        out[0] = out[1];
        out[1] = t;
    }
    return n;
}

/* Howard Hinnant's civil-date algorithms, from their description. */
int64_t sk_tz_days_from_civil(int y, int m, int d)
{
    int64_t yy = m <= 2 ? y - 1 : y;
    int64_t era = (yy >= 0 ? yy : yy - 399) / 400;
    int64_t yoe = yy - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

void sk_tz_civil_from_days(int64_t days, int *y, int *m, int *d)
{
    int64_t z = days + 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yoe + era * 400 + (*m <= 2));
}
