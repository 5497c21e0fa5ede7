/* doctor.c - the report doctor's checks fill (doctor.h), running the
 * families, and sekalid's start-time subset: each failure logged once. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "doctor.h"
#include "log.h"

const char *const sk_doctor_level_names[4] = { "pass", "skip", "warn", "fail" };

void sk_doctor_run(struct sk_doctor *d)
{
    if (d->consumer_timeout_ms == 0)
        d->consumer_timeout_ms = d->conf->amqp.consumer_timeout_ms;
    sk_doctor_postgres(d);
    sk_doctor_redis(d);
    sk_doctor_broker(d);
    sk_doctor_schedules(d);
}

void sk_doctor_free(struct sk_doctor *d)
{
    free(d->v);
    d->v = NULL;
    d->n = d->cap = 0;
}

enum sk_doctor_level sk_doctor_worst(const struct sk_doctor *d)
{
    enum sk_doctor_level worst = SK_DOCTOR_PASS;
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].level > worst)
            worst = d->v[i].level;
    return worst;
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
        sk_log_event(SK_LOG_WARN, SK_EVENT_DOCTOR_FAILED, NULL, NULL,
                     "doctor: %s%s%s failed: %s%s%s", v->check, v->object[0] ? " " : "",
                     v->object, v->found, v->fix[0] ? "; fix: " : "", v->fix);
    }
    if (failed > 0)
        sk_log_warn("doctor: %zu of %zu start checks failed; `sekalictl doctor` tells more",
                    failed, d.n);
    else
        sk_log_info("doctor: %zu start checks passed or warned", d.n);
    sk_doctor_free(&d);
    return failed;
}

void sk_doctor_add(struct sk_doctor *d, const char *check, const char *object,
                   enum sk_doctor_level level, const char *fix, const char *fmt, ...)
{
    if (d->n == d->cap) {
        size_t cap = d->cap == 0 ? 32 : d->cap * 2;
        struct sk_doctor_verdict *v = realloc(d->v, cap * sizeof(*v));
        if (v == NULL) {
            sk_log_error("doctor: out of memory: verdict of %s dropped", check);
            return;
        }
        d->v = v;
        d->cap = cap;
    }
    struct sk_doctor_verdict *v = &d->v[d->n++];
    snprintf(v->check, sizeof(v->check), "%s", check);
    snprintf(v->object, sizeof(v->object), "%s", object != NULL ? object : "");
    v->level = level;
    snprintf(v->fix, sizeof(v->fix), "%s", fix != NULL ? fix : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->found, sizeof(v->found), fmt, ap);
    va_end(ap);
}

int64_t sk_doctor_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
