/* doctor.h - the checks of the settings sekali's guarantee rests on that
 * live outside it (the queues' arguments, the broker's consumer timeout,
 * Redis' eviction and role, PostgreSQL's synchronous commit and standbys,
 * the clocks, the schema, retention), shared by `sekalictl doctor`, which
 * runs them all and prints them, and sekalid, which runs the cheap subset
 * once per generation and logs each failure (sk_doctor_at_start()).
 *
 * One report of verdicts, each a check's name, its object, its level, what
 * was found and the fix in one line. doctor_report.c keeps the report,
 * doctor.c runs the families; doctor_broker.c checks the queues,
 * doctor_servers.c PostgreSQL, Redis, the clocks, the schema and retention,
 * doctor_versions.c and doctor_pages.c judge what the servers told,
 * doctor_schedules.c the schedules' specs across hosts. Each family dials its own
 * short-lived connections with the daemon's configuration. */
#ifndef SK_DOCTOR_H
#define SK_DOCTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

enum sk_doctor_level { SK_DOCTOR_PASS = 0, SK_DOCTOR_SKIP, SK_DOCTOR_WARN, SK_DOCTOR_FAIL };

struct sk_doctor_verdict {
    char                 check[48];   /* e.g. "queue.dead_letter" */
    char                 object[160]; /* the queue, server or "" */
    enum sk_doctor_level level;
    char                 found[400];
    char                 fix[300];    /* "" when nothing is to be done */
};

struct sk_doctor {
    const struct sk_conf     *conf;
    /* The cheap subset, for sekalid's start: no check that reads more than
     * a few rows or needs what only an operator can give (retention scans
     * the outbox; the observed durations need sekalid's own /metrics). */
    bool                      cheap;
    uint32_t                  consumer_timeout_ms;  /* the broker's, as told; 0: unknown */
    char                     *metrics;              /* sekalid's /metrics text, or NULL */
    struct sk_doctor_verdict *v;
    size_t                    n, cap;
};

/* The families in their order (PostgreSQL, Redis, the broker, the
 * schedules' specs across hosts); the report is d->v. consumer_timeout_ms
 * 0 takes conf->amqp.consumer_timeout. Free it with sk_doctor_free(). */
void sk_doctor_run(struct sk_doctor *d);
void sk_doctor_free(struct sk_doctor *d);

/* The worst level of the report. */
enum sk_doctor_level sk_doctor_worst(const struct sk_doctor *d);

extern const char *const sk_doctor_level_names[4];  /* "pass", "skip", "warn", "fail" */

/* sekalid, once per generation, in the process that runs it (never the
 * supervisor, which does not talk to servers): the cheap subset, each
 * failure logged once as a warning with the event doctor_failed and its
 * fix. Never fatal: a failed check is a setting to correct, not a reason
 * to stop serving (the schema, which is, sekalid refuses before this).
 * Returns how many failed. Blocks for at most a connect timeout a server. */
size_t sk_doctor_at_start(const struct sk_conf *conf);

/* Adds a verdict; fix may be NULL. Out of memory drops it and is noted on
 * stderr (the exit code then says failure). */
void sk_doctor_add(struct sk_doctor *d, const char *check, const char *object,
                   enum sk_doctor_level level, const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The families. Each adds its verdicts; a server it cannot reach is a
 * failed verdict, not an error. */
void sk_doctor_broker(struct sk_doctor *d);    /* doctor_broker.c */
void sk_doctor_postgres(struct sk_doctor *d);  /* doctor_servers.c: schema, sync, clock,
                                                * retention */
void sk_doctor_redis(struct sk_doctor *d);     /* doctor_servers.c */
void sk_doctor_schedules(struct sk_doctor *d); /* doctor_schedules.c: every host runs a
                                                * schedule with one spec; not cheap */

/* doctor_versions.c: each server's version, warning on a line past its end
 * of life; called by the families above (not in the cheap subset). */
void sk_doctor_rabbitmq_version(struct sk_doctor *d, const char *version);
void sk_doctor_postgres_version(struct sk_doctor *d, int server_version_num);
void sk_doctor_redis_version(struct sk_doctor *d, const char *object, const char *server,
                             const char *version);

/* doctor_pages.c: whether PostgreSQL's shared buffers (shared_buffers in
 * bytes) sit on huge pages where their size makes 4 kB pages cost claims;
 * huge_pages as set (on, off, try), status as huge_pages_status says it
 * (PostgreSQL 17 on; "" before). Not in the cheap subset. */
void sk_doctor_postgres_pages(struct sk_doctor *d, long long shared_buffers,
                              const char *huge_pages, const char *status);

/* Clock skew: below warn_ms passes, below fail_ms warns. */
#define SK_DOCTOR_SKEW_WARN_MS 1000
#define SK_DOCTOR_SKEW_FAIL_MS 10000

/* Wall-clock ms now (CLOCK_REALTIME: the host's clock is what is checked). */
int64_t sk_doctor_now_ms(void);

#endif
