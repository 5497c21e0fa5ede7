/* lane.c - a tenant's lane, and a lane's name (see lane.h). FNV-1a because
 * it is a dozen lines in any language a producer is written in, and
 * spreads short tenant names well enough for 32 lanes. */
#include <stdio.h>
#include <string.h>

#include "lane.h"

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME  0x100000001b3ull

uint64_t sk_lane_hash(const void *p, size_t len)
{
    const unsigned char *s = p;
    uint64_t h = FNV_OFFSET;
    for (size_t i = 0; i < len; i++) {
        h ^= s[i];
        h *= FNV_PRIME;
    }
    return h;
}

unsigned sk_lane_of(const void *tenant, size_t len, unsigned lanes)
{
    if (lanes < 2 || tenant == NULL || len == 0)
        return 0;
    return (unsigned)(sk_lane_hash(tenant, len) % lanes);
}

int sk_lane_name(const char *queue, unsigned i, char *out, size_t size)
{
    int n = snprintf(out, size, "%s.lane.%u", queue, i);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

const char *sk_lane_route(const char *queue, unsigned lanes, const char *tenant, char *out,
                          size_t size)
{
    if (lanes == 0)
        return queue;
    unsigned i = sk_lane_of(tenant, tenant != NULL ? strlen(tenant) : 0, lanes);
    return sk_lane_name(queue, i, out, size) == 0 ? out : queue;
}

unsigned sk_lane_intake_window(unsigned prefetch)
{
    return prefetch > SK_LANE_INTAKE_WINDOW ? prefetch : SK_LANE_INTAKE_WINDOW;
}
