/* inflight.h - private to src/supervisor/: the jobs in flight, read from
 * the scoreboards of the running generations, as the JSON document that
 * GET /inflight serves (docs/console.md describes it).
 *
 * Why the supervisor and not PostgreSQL: a job's claim is part of its
 * transaction, uncommitted until the job ends, so no other session can see
 * it. Each worker names its job in its scoreboard slot
 * (sk_slot_publish_job()); a slot counts only while its process runs and
 * its job_started_ms is set, so a dead worker's job, whose key its slot
 * keeps for the crash count, is never listed. */
#ifndef SK_INFLIGHT_H
#define SK_INFLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "generation.h"

/* The document for the n generations gens (NULLs skipped), oldest job
 * first: {"now": ..., "inflight": [{"queue", "pid", "phase", "key",
 * "job_type", "attempt", "trace_id", "started_at", "age_ms"}, ...]}.
 * Strings escape '<', '>', '&', C1 and bidi controls as well, so that the
 * text is safe to pass on whole into a page or onto a terminal, and bytes
 * that are not UTF-8 become U+FFFD. Malloc'ed,
 * *len set; NULL when out of memory. */
char *sk_inflight_json(const struct generation *const *gens, size_t n, size_t *len);

#endif
