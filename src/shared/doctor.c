/* doctor.c - running the families of checks (doctor.h), and sekalid's
 * start-time subset: each failure logged once. The report they fill is
 * doctor_report.c's, so that the families call it and not back here. */
#include <stddef.h>

#include "doctor.h"
#include "log.h"

void sk_doctor_run(struct sk_doctor *d)
{
    if (d->consumer_timeout_ms == 0)
        d->consumer_timeout_ms = d->conf->amqp.consumer_timeout_ms;
    sk_doctor_postgres(d);
    sk_doctor_redis(d);
    sk_doctor_broker(d);
    sk_doctor_schedules(d);
}

/* Only failures: a warning (no job_timeout, a dead-letter queue sekalid is
 * about to declare) is what the defaults give, and would be logged by
 * every start of every installation; `sekalictl doctor` shows them. */
size_t sk_doctor_at_start(const struct sk_conf *conf)
{
    struct sk_doctor d = { .conf = conf, .cheap = true };
    sk_doctor_run(&d);
    size_t failed = 0;
    for (size_t i = 0; i < d.n; i++) {
        const struct sk_doctor_verdict *v = &d.v[i];
        if (v->level != SK_DOCTOR_FAIL)
            continue;
        failed++;
        sk_log_event_fields(SK_LOG_WARN, SK_EVENT_DOCTOR_FAILED, NULL, NULL,
                            (const struct sk_log_field[]){ { "check", v->check },
                                                           { "object", v->object } }, 2,
                            "doctor: %s%s%s failed: %s%s%s", v->check,
                            v->object[0] ? " " : "", v->object, v->found,
                            v->fix[0] ? "; fix: " : "", v->fix);
    }
    if (failed > 0)
        sk_log_warn("doctor: %zu of %zu start checks failed; `sekalictl doctor` tells more",
                    failed, d.n);
    else
        sk_log_event(SK_LOG_INFO, SK_EVENT_DOCTOR_PASSED, NULL, NULL,
                     "doctor: %zu start checks passed or warned", d.n);
    sk_doctor_free(&d);
    return failed;
}
