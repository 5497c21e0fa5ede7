/* ctl_reports.h - the reports of sekalictl that the console (console.c)
 * serves too: one implementation of each query and of its JSON, written to
 * whatever stream the caller gives (stdout for sekalictl, a memory stream
 * for an HTTP answer). Each returns the exit code sekalictl would
 * (ctl_common.h). Each takes its PostgreSQL connection with
 * sk_ctl_pg_take() (from the console's pool, in sekalictl serve) and gives
 * it back before it returns, so threads may run them at once. */
#ifndef SK_CTL_REPORTS_H
#define SK_CTL_REPORTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

/* sekalictl status (ctl_status.c). */
int sk_ctl_status_report(const struct sk_conf *conf, bool json, FILE *out);

/* sekalictl trace KEY [--queue QUEUE] (ctl_trace.c); queue NULL: everywhere.
 * dead_scan_max > 0 reads at most that many dead letters per queue. */
int sk_ctl_trace_report(const struct sk_conf *conf, const char *key, const char *queue,
                        bool json, size_t dead_scan_max, FILE *out);

/* sekalictl pause QUEUE (ctl_pause.c): reason may be NULL; by is the
 * operator recorded; waits up to wait_ms for the queue's consumers to go
 * (SK_CTL_WAITING if some are left; the pause stands either way). queue
 * must be one of conf's (the caller checks: a pause nobody obeys is no
 * pause). */
int sk_ctl_pause_report(const struct sk_conf *conf, const char *queue, const char *reason,
                        const char *by, uint64_t wait_ms, bool json, FILE *out);
/* sekalictl resume QUEUE (ctl_pause.c). */
int sk_ctl_resume_report(const struct sk_conf *conf, const char *queue, bool json, FILE *out);

/* sekalictl schedules (ctl_schedules.c). */
int sk_ctl_schedules_report(const struct sk_conf *conf, bool json, FILE *out);

/* sekalictl scheduled (ctl_scheduled.c): at most limit jobs that wait in
 * the outbox for a later run_at, soonest first; queue NULL: every queue. */
#define SK_CTL_SCHEDULED_MAX 1000
int sk_ctl_scheduled_report(const struct sk_conf *conf, const char *queue, size_t limit,
                            bool json, FILE *out);

/* sekalictl inflight (ctl_inflight.c): the jobs running now, from sekalid's
 * GET /inflight; SK_CTL_FAILED, with why on stderr, when it cannot be
 * reached (or metrics.listen is off). */
int sk_ctl_inflight_report(const struct sk_conf *conf, bool json, FILE *out);

/* sekalictl dlq (ctl_dlq.c): reads and changes only sekali.dead_letters
 * (sql/023), never the broker, but for import. */
struct sk_ctl_dlq_req {
    const char  *command;      /* list, groups, show, replay, purge or import */
    const char  *queue;
    const char **keys;         /* selectors; a letter must match each one given */
    size_t       n_keys;       /* any of keys[] */
    const char  *reason;       /* as --reason: case and "_"/" " do not matter */
    const char  *fingerprint;  /* the letter's error's fingerprint (sekali.dlq_fingerprint) */
    uint64_t     id;           /* --id: one letter (0: any) */
    bool         all;          /* replay, purge: every letter (and no selector) */
    bool         dry_run;      /* replay, purge, import: say what would be done, change nothing */
    const char  *by;           /* the audit's operator; NULL: the OS user */
    size_t       offset, limit;/* list: a page of the selected letters (limit 0: all) */
    uint64_t     after;        /* list: the letters after this id (keyset paging) */
    size_t       scan_max;     /* import: letters read at most (0: the whole queue) */
    size_t       preview;      /* show: body bytes given (0: 256) */
    bool         json;
};
/* Whether req is a valid command (operands: words after the queue's name). */
bool sk_ctl_dlq_req_ok(const struct sk_ctl_dlq_req *req, int operands);
int sk_ctl_dlq_run(const struct sk_conf *conf, const struct sk_ctl_dlq_req *req, FILE *out);

/* An error text's fingerprint (ctl_fingerprint.c): what is left when the
 * parts that differ from one failure to the next are masked, so that
 * "timeout after 3000 ms on order 8c1f...e2" and the same with other figures
 * fall into one group. Runs of digits become "{n}"; a word of 8 or more
 * hex digits and dashes holding a digit (an id, a UUID) becomes "{id}";
 * whitespace runs become one space; a byte that is not UTF-8 becomes U+FFFD
 * (as sk_ctl_put_json() writes it, so the JSON's fingerprint selects
 * again); cut to size bytes on a UTF-8 boundary. */
void sk_ctl_fingerprint(const char *error, char *out, size_t size);

#endif
