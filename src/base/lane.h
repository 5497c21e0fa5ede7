/* lane.h - which lane of a queue a tenant's jobs go to (queues[].lanes).
 *
 * Part of the wire contract: a producer that publishes straight to a lane
 * computes the same lane, so this is the one place that says how. The lane
 * of a message is FNV-1a (64 bit) of the tenant header's value, its bytes
 * as sent, modulo the queue's lanes; a message without the header, with an
 * empty value or one that is not text goes to lane 0. */
#ifndef SK_LANE_H
#define SK_LANE_H

#include <stddef.h>
#include <stdint.h>

/* The most lanes a queue may have, and the longest tenant_header. */
#define SK_LANES_MAX      32
#define SK_TENANT_HEADER_MAX 128

/* The least window of a worker's consumer of a queue's intake (whose
 * deliveries it forwards to lanes): a forward costs a publish and an ack,
 * far less than a job, and with the jobs' window the intake would be
 * forwarded at the jobs' pace (worker's links.c). */
#define SK_LANE_INTAKE_WINDOW 256

/* The intake's window beside lanes whose window is prefetch. */
unsigned sk_lane_intake_window(unsigned prefetch);

/* The header a tenant travels in when a queue names none of its own. */
#define SK_TENANT_HEADER_DEFAULT "x-tenant"

/* FNV-1a, 64 bit, of len bytes at p. */
uint64_t sk_lane_hash(const void *p, size_t len);

/* The lane (0 .. lanes-1) of a tenant given as len bytes (NULL or empty:
 * lane 0). lanes 0 or 1: 0. */
unsigned sk_lane_of(const void *tenant, size_t len, unsigned lanes);

/* Writes `<queue>.lane.<i>` into out: the one place that spells a lane's
 * name. Returns 0, or -1 when it does not fit in size. */
int sk_lane_name(const char *queue, unsigned i, char *out, size_t size);

/* Where a producer publishes a job of tenant (NULL: none) to queue, which
 * has lanes lanes: its tenant's lane, named into out, so that the job
 * skips the intake; queue itself when it has no lanes (or the lane's name
 * does not fit in size, and the intake forwards it). */
const char *sk_lane_route(const char *queue, unsigned lanes, const char *tenant, char *out,
                          size_t size);

#endif
