/* outage.c - the outage tracker (see outage.h). */
#include "outage.h"

bool sk_outage_failed(struct sk_outage *o)
{
    sk_outage_pause(o);
    return sk_outage_begin(o);
}

bool sk_outage_begin(struct sk_outage *o)
{
    bool began = !o->down;
    o->down = true;
    return began;
}

void sk_outage_pause(struct sk_outage *o)
{
    o->retry_at_ms = sk_now_ms() + sk_backoff_next(&o->backoff);
}

bool sk_outage_ok(struct sk_outage *o)
{
    bool ended = o->down;
    o->down = false;
    o->retry_at_ms = 0;
    sk_backoff_reset(&o->backoff);
    return ended;
}

bool sk_outage_waiting(const struct sk_outage *o)
{
    return o->down && sk_now_ms() < o->retry_at_ms;
}

uint32_t sk_outage_wait_ms(const struct sk_outage *o)
{
    int64_t left = o->retry_at_ms - sk_now_ms();
    return left > 0 ? (uint32_t)left : 0;
}
