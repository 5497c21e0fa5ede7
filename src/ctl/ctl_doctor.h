/* ctl_doctor.h - what sekalictl doctor's check families share: one report
 * of verdicts, each a check's name, its object, its level, what was found
 * and the fix in one line. ctl_doctor.c runs the families and prints;
 * ctl_doctor_broker.c checks the queues, ctl_doctor_servers.c PostgreSQL,
 * Redis, the clocks, the schema and retention. */
#ifndef SK_CTL_DOCTOR_H
#define SK_CTL_DOCTOR_H

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
    uint32_t                  consumer_timeout_ms;  /* the broker's, as told; 0: unknown */
    char                     *metrics;              /* sekalid's /metrics text, or NULL */
    struct sk_doctor_verdict *v;
    size_t                    n, cap;
};

/* Adds a verdict; fix may be NULL. Out of memory drops it and is noted on
 * stderr (the exit code then says failure). */
void sk_doctor_add(struct sk_doctor *d, const char *check, const char *object,
                   enum sk_doctor_level level, const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The families. Each adds its verdicts; a server it cannot reach is a
 * failed verdict, not an error. */
void sk_doctor_broker(struct sk_doctor *d);    /* ctl_doctor_broker.c */
void sk_doctor_postgres(struct sk_doctor *d);  /* ctl_doctor_servers.c: schema, sync, clock,
                                                * retention */
void sk_doctor_redis(struct sk_doctor *d);     /* ctl_doctor_servers.c */

/* Clock skew: below warn_ms passes, below fail_ms warns. */
#define SK_DOCTOR_SKEW_WARN_MS 1000
#define SK_DOCTOR_SKEW_FAIL_MS 10000

/* Wall-clock ms now (CLOCK_REALTIME: the host's clock is what is checked). */
int64_t sk_doctor_now_ms(void);

#endif
