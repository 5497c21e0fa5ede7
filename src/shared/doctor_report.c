/* doctor_report.c - the report doctor's checks fill (doctor.h): adding a
 * verdict, its worst level, freeing it, and the clock the checks compare
 * with. Apart from doctor.c, which runs the families, so that the families
 * (doctor_broker.c, doctor_servers.c, doctor_schedules.c) call down into
 * this file and never back into their dispatcher. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "doctor.h"
#include "log.h"

const char *const sk_doctor_level_names[4] = { "pass", "skip", "warn", "fail" };

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
