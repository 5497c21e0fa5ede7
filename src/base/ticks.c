/* ticks.c - the due ticks of a schedule and the missed policy (ticks.h). */
#include "ticks.h"

#include <stdio.h>

#include "tz.h"

static void keep(struct sk_ticks *t, size_t *head, int64_t at);
static void unroll(struct sk_ticks *t, size_t head);

void sk_ticks_due(const struct sk_cron *c, int64_t last, int64_t now, uint32_t grace_s,
                  enum sk_missed missed, struct sk_ticks *t)
{
    t->n = 0;
    t->dropped = 0;
    t->latest = last;
    int64_t from = last;
    if (now - from > SK_TICKS_LOOKBACK_S) {
        from = now - SK_TICKS_LOOKBACK_S;
        t->dropped++;  /* at least one; how many more is not worth a walk */
    }
    int64_t latest_missed = -1;
    size_t head = 0;  /* t->at is a ring while it fills: its oldest entry */
    /* One zone scope for the whole walk (tz.c); without it each tick
     * would read the zone's file again. */
    bool scoped = c->every_s == 0 && sk_tz_enter(c->zone);
    for (int64_t at = sk_cron_next(c, from); at >= 0 && at <= now; at = sk_cron_next(c, at)) {
        t->latest = at;
        if (now - at <= (int64_t)grace_s || missed == SK_MISSED_ALL) {
            keep(t, &head, at);
        } else {
            if (latest_missed >= 0 || missed == SK_MISSED_SKIP)
                t->dropped++;
            if (missed == SK_MISSED_ONCE)
                latest_missed = at;
        }
    }
    if (scoped)
        sk_tz_leave();
    unroll(t, head);
    if (latest_missed < 0)
        return;
    /* Older than every on-time tick kept: it goes first, if there is room. */
    if (t->n == t->cap) {
        t->dropped++;
        return;
    }
    for (size_t i = t->n; i > 0; i--)
        t->at[i] = t->at[i - 1];
    t->at[0] = latest_missed;
    t->n++;
}

/* Adds at to the ring; when it is full the oldest entry goes (and is
 * counted as dropped). */
static void keep(struct sk_ticks *t, size_t *head, int64_t at)
{
    if (t->cap == 0) {
        t->dropped++;
        return;
    }
    if (t->n < t->cap) {
        t->at[(*head + t->n++) % t->cap] = at;
        return;
    }
    t->at[*head] = at;
    *head = (*head + 1) % t->cap;
    t->dropped++;
}

/* Puts the ring in order, oldest first at t->at[0]. */
static void unroll(struct sk_ticks *t, size_t head)
{
    for (size_t turn = 0; turn < head; turn++) {
        int64_t first = t->at[0];
        for (size_t i = 1; i < t->n; i++)
            t->at[i - 1] = t->at[i];
        t->at[t->n - 1] = first;
    }
}

void sk_ticks_iso(int64_t t, char *buf, size_t size)
{
    int64_t days = t >= 0 ? t / 86400 : -((-t + 86399) / 86400);
    int64_t rest = t - days * 86400;
    int y, m, d;
    sk_tz_civil_from_days(days, &y, &m, &d);
    snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02dZ", y, m, d, (int)(rest / 3600),
             (int)(rest / 60 % 60), (int)(rest % 60));
}
