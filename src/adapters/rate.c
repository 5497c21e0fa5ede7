/* rate.c - the rate limiter's script and its call (see rate.h): the
 * generic cell rate algorithm, every key of a batch in one EVALSHA on the
 * lock's connection, so that a batch of jobs costs one round trip whatever
 * its size (none of its own in the round trip of the batch's locks:
 * sk_lock_swap_riding()), and a limit costs no connection of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rate.h"

/* KEYS = the limits' keys; ARGV[1] = interval, ARGV[2] = tolerance (both
 * microseconds), ARGV[2 + i] = how many starts KEYS[i] is asked for. One
 * integer a start: 0 admitted, else milliseconds to wait. Refused starts
 * move nothing: only a start that happens is counted. Values are doubles
 * in Lua: microseconds since 1970 stay exact up to 2^53 (the year 2255). */
static const char rate_script[] =
    "local t = redis.call('TIME') "
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) "
    "local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2]) "
    "local out, o = {}, 1 "
    "for i = 1, #KEYS do "
    "local tat = tonumber(redis.call('GET', KEYS[i]) or 0) or 0 "
    "if tat < now then tat = now end "
    "local late, moved = 0, false "
    "for k = 1, tonumber(ARGV[i + 2]) do "
    "local wait = tat - now - tolerance "
    "if wait <= 0 then out[o] = 0 tat = tat + interval moved = true "
    "else out[o] = math.ceil((wait + late * interval) / 1000) late = late + 1 end "
    "o = o + 1 "
    "end "
    "if moved then redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', "
    "math.ceil((tat - now) / 1000) + 1) end "
    "end "
    "return out";

/* The script's SHA1, the same on every connection: found at the first
 * call, and the script loaded again by lock.c wherever Redis lost it. */
static char rate_sha[41];

struct sk_rate sk_rate_of(uint32_t count, uint32_t period_ms, uint32_t burst)
{
    uint64_t interval = (uint64_t)period_ms * 1000 / (count > 0 ? count : 1);
    if (interval == 0)
        interval = 1;
    return (struct sk_rate){ .interval_us = interval,
                             .tolerance_us = interval * (burst > 0 ? burst - 1 : 0) };
}

void sk_rate_key(char *out, size_t size, const char *queue, const char *resource)
{
    if (resource != NULL)
        snprintf(out, size, "sekali:rate:%s:%s", queue, resource);
    else
        snprintf(out, size, "sekali:rate:%s", queue);
}

int sk_rate_ask(struct sk_rate_call *c, const struct sk_rate *rate, size_t n,
                const char *const *keys, const uint32_t *counts, struct sk_err *err)
{
    *c = (struct sk_rate_call){ 0 };
    for (size_t i = 0; i < n; i++)
        c->total += counts[i];
    /* The arguments' text and the answers: one block, sized by the batch. */
    c->text = calloc(n + 2, sizeof(*c->text));
    c->args = calloc(n + 2, sizeof(*c->args));
    c->out = calloc(c->total > 0 ? c->total : 1, sizeof(*c->out));
    if (c->text == NULL || c->args == NULL || c->out == NULL) {
        sk_rate_call_free(c);
        sk_err_set(err, SK_AGAIN, "out of memory for a rate limit's round trip");
        return SK_AGAIN;
    }
    snprintf(c->text[0], sizeof(c->text[0]), "%llu", (unsigned long long)rate->interval_us);
    snprintf(c->text[1], sizeof(c->text[1]), "%llu", (unsigned long long)rate->tolerance_us);
    for (size_t i = 0; i < n; i++)
        snprintf(c->text[i + 2], sizeof(c->text[i + 2]), "%u", counts[i]);
    for (size_t i = 0; i < n + 2; i++)
        c->args[i] = c->text[i];
    c->ride = (struct sk_lock_ride){
        .script = rate_script, .sha = rate_sha, .n_keys = n, .keys = keys, .n_args = n + 2,
        .args = c->args, .out = c->out, .n_out = c->total, .rc = SK_AGAIN,
    };
    sk_err_set(&c->ride.err, SK_AGAIN, "redis unavailable");
    return SK_OK;
}

void sk_rate_answers(const struct sk_rate_call *c, uint32_t *wait_ms)
{
    for (size_t i = 0; c->ride.rc == SK_OK && i < c->total; i++) {
        long long w = c->out[i];
        wait_ms[i] = w <= 0 ? 0 : w > UINT32_MAX ? UINT32_MAX : (uint32_t)w;
    }
}

void sk_rate_call_free(struct sk_rate_call *c)
{
    free(c->text);
    free(c->args);
    free(c->out);
    c->text = NULL;
    c->args = NULL;
    c->out = NULL;
}
