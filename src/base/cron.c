/* cron.c - cron expressions and intervals: parsing, and the next tick.
 *
 * No library: Debian has none for C that parses cron and computes the
 * next time in a zone (cron's own parser lives inside the daemon), so this
 * is the small parser of crontab(5)'s five fields, table-tested in
 * tests/unit/check_cron.c. Day of month and day of week combine as in
 * Vixie cron: when both are restricted (neither begins with '*') a day
 * matching either runs, otherwise a day must match both.
 *
 * The next tick walks local calendar days (integer arithmetic, no zone),
 * and converts only the wall times that match to UTC (tz.c), so a yearly
 * schedule costs as much as a minutely one. */
#include "cron.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "tz.h"

#define SEARCH_DAYS (8 * 366 + 2)   /* 29 February comes back within eight years */

struct field {
    const char        *name;
    int                lo, hi;
    const char *const *names;  /* indexed from lo, or NULL */
};

static const char *const month_names[] = { "jan", "feb", "mar", "apr", "may", "jun", "jul",
                                           "aug", "sep", "oct", "nov", "dec", NULL };
static const char *const day_names[] = { "sun", "mon", "tue", "wed", "thu", "fri", "sat",
                                         NULL };

static const struct field fields[5] = {
    { "minute", 0, 59, NULL },
    { "hour", 0, 23, NULL },
    { "day of month", 1, 31, NULL },
    { "month", 1, 12, month_names },
    { "day of week", 0, 7, day_names },
};

static const struct { const char *name; const char *fields; } macros[] = {
    { "@hourly", "0 * * * *" },  { "@daily", "0 0 * * *" },   { "@midnight", "0 0 * * *" },
    { "@weekly", "0 0 * * 0" },  { "@monthly", "0 0 1 * *" }, { "@yearly", "0 0 1 1 *" },
    { "@annually", "0 0 1 1 *" },
};

static int parse_fields(const char *text, size_t base, struct sk_cron *c, size_t *column,
                        struct sk_err *err);
static int parse_field(const struct field *f, const char *s, size_t len, size_t at,
                       uint64_t *bits, size_t *column, struct sk_err *err);
static int parse_value(const struct field *f, const char *s, size_t len, size_t at, int *out,
                       size_t *used, size_t *column, struct sk_err *err);
static bool day_matches(const struct sk_cron *c, int m, int d, int wday);

int sk_cron_parse(const char *text, struct sk_cron *c, size_t *column, struct sk_err *err)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->zone, sizeof(c->zone), "UTC");
    size_t lead = strspn(text, " \t");
    if (text[lead] == '@') {
        size_t n = strcspn(text + lead, " \t");
        for (size_t i = 0; i < sizeof(macros) / sizeof(macros[0]); i++)
            if (strlen(macros[i].name) == n && strncasecmp(text + lead, macros[i].name, n) == 0 &&
                text[lead + n + strspn(text + lead + n, " \t")] == '\0')
                return parse_fields(macros[i].fields, 0, c, column, err);
        *column = lead;
        return sk_err_set(err, SK_ERR, "unknown cron macro \"%.*s\": expected @hourly, @daily, "
                          "@midnight, @weekly, @monthly, @yearly or @annually", (int)(n > 32 ? 32 : n),
                          text + lead);
    }
    return parse_fields(text, 0, c, column, err);
}

void sk_cron_every(struct sk_cron *c, uint32_t every_s)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->zone, sizeof(c->zone), "UTC");
    c->every_s = every_s;
}

static int parse_fields(const char *text, size_t base, struct sk_cron *c, size_t *column,
                        struct sk_err *err)
{
    uint64_t bits[5] = { 0 };
    size_t at = base;
    for (int i = 0; i < 5; i++) {
        at += strspn(text + at, " \t");
        size_t len = strcspn(text + at, " \t");
        if (len == 0) {
            *column = at;
            return sk_err_set(err, SK_ERR, "cron expression has %d field%s, needs 5 (minute hour "
                              "day-of-month month day-of-week)", i, i == 1 ? "" : "s");
        }
        if (i == 2)
            c->mday_star = text[at] == '*';
        if (i == 4)
            c->wday_star = text[at] == '*';
        if (parse_field(&fields[i], text + at, len, at, &bits[i], column, err) != SK_OK)
            return SK_ERR;
        at += len;
    }
    at += strspn(text + at, " \t");
    if (text[at] != '\0') {
        *column = at;
        return sk_err_set(err, SK_ERR, "cron expression has more than 5 fields");
    }
    c->minutes = bits[0];
    c->hours = (uint32_t)bits[1];
    c->mdays = (uint32_t)bits[2];
    c->months = (uint16_t)bits[3];
    /* 7 is Sunday too. */
    c->wdays = (uint8_t)((bits[4] & 0x7f) | ((bits[4] >> 7) & 1));
    return SK_OK;
}

/* One field: a comma-separated list of *, N, A-B, each optionally /STEP. */
static int parse_field(const struct field *f, const char *s, size_t len, size_t at,
                       uint64_t *bits, size_t *column, struct sk_err *err)
{
    size_t i = 0;
    for (;;) {
        int lo = f->lo, hi = f->hi, step = 1;
        size_t used;
        bool star = false;
        if (i < len && s[i] == '*') {
            star = true;
            i++;
        } else {
            if (parse_value(f, s + i, len - i, at + i, &lo, &used, column, err) != SK_OK)
                return SK_ERR;
            i += used;
            hi = lo;
            if (i < len && s[i] == '-') {
                i++;
                if (parse_value(f, s + i, len - i, at + i, &hi, &used, column, err) != SK_OK)
                    return SK_ERR;
                if (hi < lo) {
                    *column = at + i;
                    return sk_err_set(err, SK_ERR, "%s range %d-%d runs backwards", f->name,
                                      lo, hi);
                }
                i += used;
            }
        }
        if (i < len && s[i] == '/') {
            i++;
            size_t start = i;
            step = 0;
            while (i < len && s[i] >= '0' && s[i] <= '9' && step <= f->hi + 1)
                step = step * 10 + (s[i++] - '0');
            if (i == start || step == 0 || step > f->hi + 1 - f->lo) {
                *column = at + start;
                return sk_err_set(err, SK_ERR, "%s step must be a number from 1 to %d",
                                  f->name, f->hi + 1 - f->lo);
            }
            if (!star && hi == lo)  /* "5/15": from 5 to the end, as cronie reads it */
                hi = f->hi;
        }
        for (int v = lo; v <= hi; v += step)
            *bits |= UINT64_C(1) << v;
        if (i == len)
            return SK_OK;
        if (s[i] != ',') {
            *column = at + i;
            return sk_err_set(err, SK_ERR, "unexpected \"%c\" in the %s field", s[i], f->name);
        }
        i++;
        if (i == len) {
            *column = at + i;
            return sk_err_set(err, SK_ERR, "the %s field ends with a comma", f->name);
        }
    }
}

static int parse_value(const struct field *f, const char *s, size_t len, size_t at, int *out,
                       size_t *used, size_t *column, struct sk_err *err)
{
    size_t i = 0;
    int v = 0;
    if (len > 0 && s[0] >= '0' && s[0] <= '9') {
        while (i < len && s[i] >= '0' && s[i] <= '9' && v <= 1000)
            v = v * 10 + (s[i++] - '0');
    } else if (f->names != NULL && len >= 3) {
        int j = 0;
        while (f->names[j] != NULL && strncasecmp(s, f->names[j], 3) != 0)
            j++;
        if (f->names[j] == NULL) {
            *column = at;
            return sk_err_set(err, SK_ERR, "unknown %s name \"%.3s\"", f->name, s);
        }
        v = j + (f->lo == 0 ? 0 : f->lo);
        i = 3;
    } else {
        *column = at;
        return sk_err_set(err, SK_ERR, "expected a number%s in the %s field",
                          f->names != NULL ? " or a name" : "", f->name);
    }
    if (v < f->lo || v > f->hi) {
        *column = at;
        return sk_err_set(err, SK_ERR, "%s %d is out of range %d-%d", f->name, v, f->lo, f->hi);
    }
    *out = v;
    *used = i;
    return SK_OK;
}

static bool day_matches(const struct sk_cron *c, int m, int d, int wday)
{
    if (!(c->months & (1u << m)))
        return false;
    bool md = c->mdays & (1u << d), wd = c->wdays & (1u << wday);
    if (c->mday_star || c->wday_star)
        return md && wd;
    return md || wd;
}

bool sk_cron_possible(const struct sk_cron *c)
{
    static const int longest[13] = { 0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    if (c->every_s > 0 || c->mday_star || !c->wday_star)
        return true;  /* every day, or any weekday, of some month comes */
    for (int m = 1; m <= 12; m++)
        for (int d = 1; d <= longest[m]; d++)
            if ((c->months & (1u << m)) && (c->mdays & (1u << d)))
                return true;
    return false;
}

int64_t sk_cron_next(const struct sk_cron *c, int64_t after)
{
    if (c->every_s > 0) {
        int64_t e = c->every_s;
        int64_t q = after >= 0 ? after / e : -((-after + e - 1) / e);
        return (q + 1) * e;
    }
    if (!sk_tz_enter(c->zone))
        return -1;
    struct tm now, later;
    sk_tz_local(after, &now);
    /* An instant u after `after` shows the wall time u + offset(u), and
     * the offsets of the next two days are the ones in force now and after
     * a change in between (the tz database never changes twice in two
     * days): wall times up to wall_lo cannot come after `after`, so the
     * search skips them without converting them. */
    int64_t min_off = now.tm_gmtoff;
    for (int k = 1; k <= 2; k++) {
        sk_tz_local(after + k * 86400, &later);
        if (later.tm_gmtoff < min_off)
            min_off = later.tm_gmtoff;
    }
    int64_t wall_lo = after + min_off;
    /* A day early, in case a clock set back puts a later wall time on the
     * day before. */
    int64_t day0 = sk_tz_days_from_civil(now.tm_year + 1900, now.tm_mon + 1, now.tm_mday) - 1;
    int64_t found = -1;
    for (int64_t k = 0; k < SEARCH_DAYS && found < 0; k++) {
        int y, m, d;
        int64_t day = day0 + k;
        sk_tz_civil_from_days(day, &y, &m, &d);
        int wday = (int)(((day % 7) + 11) % 7);  /* 1970-01-01 was a Thursday */
        if (day * 86400 + 86340 <= wall_lo || !day_matches(c, m, d, wday))
            continue;
        for (int h = 0; h < 24 && found < 0; h++) {
            int64_t hour_wall = day * 86400 + h * 3600;
            if (!(c->hours & (1u << h)) || hour_wall + 3540 <= wall_lo)
                continue;
            for (int mi = 0; mi < 60 && found < 0; mi++) {
                int64_t at[2];
                if (!(c->minutes & (UINT64_C(1) << mi)) || hour_wall + mi * 60 <= wall_lo ||
                    sk_tz_resolve(y, m, d, h, mi, at) == 0)
                    continue;
                /* The first occurrence decides: a repeated wall time that
                 * already ran once is not run again on its second. */
                if (at[0] > after)
                    found = at[0];
            }
        }
    }
    sk_tz_leave();
    return found;
}
