/* doctor_versions.c - doctor's verdicts on the servers' versions (doctor.h):
 * each server's version is reported, and a line past its end of life
 * warns. The lines' ends are rules, not a table of dates, so that they do
 * not go stale: RabbitMQ supports only its 4.x lines (3.13 was the last
 * 3.x); PostgreSQL supports a major version for five years, until the
 * November of its number plus 2012 (13 ended in November 2025); Redis
 * before 6.2 has neither the ACLs nor the TLS sekali's docs configure.
 * Not in the cheap subset: sekalid's start does not log them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "doctor.h"

void sk_doctor_rabbitmq_version(struct sk_doctor *d, const char *version)
{
    if (version[0] == '\0') {
        sk_doctor_add(d, "broker.version", "", SK_DOCTOR_WARN, NULL,
                      "the broker did not say its version");
        return;
    }
    int major = atoi(version);
    if (major < 4)
        sk_doctor_add(d, "broker.version", "", SK_DOCTOR_WARN,
                      "upgrade through 3.13 to a supported 4.x line (docs/operations.md)",
                      "RabbitMQ %s: the 3.x lines are past their end of life (3.13 was the "
                      "last)", version);
    else
        sk_doctor_add(d, "broker.version", "", SK_DOCTOR_PASS, NULL, "RabbitMQ %s", version);
}

/* server_version_num: PQserverVersion(), e.g. 170004. */
void sk_doctor_postgres_version(struct sk_doctor *d, int server_version_num)
{
    int major = server_version_num / 10000;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    int year = tm.tm_year + 1900, month = tm.tm_mon + 1;
    /* Five years of support, until November: 17 until November 2029. */
    int end_year = major + 2012;
    bool ended = major < 10 || year > end_year || (year == end_year && month >= 11);
    if (ended)
        sk_doctor_add(d, "postgres.version", "", SK_DOCTOR_WARN,
                      "upgrade PostgreSQL to a supported major version",
                      "PostgreSQL %d.%d: past its end of life (November %d)", major,
                      server_version_num % 100, end_year);
    else
        sk_doctor_add(d, "postgres.version", "", SK_DOCTOR_PASS, NULL,
                      "PostgreSQL %d.%d, supported until November %d", major,
                      server_version_num % 100, end_year);
}

/* server: "Redis" or "Valkey"; version as its INFO says it. */
void sk_doctor_redis_version(struct sk_doctor *d, const char *object, const char *server,
                             const char *version)
{
    int major = 0, minor = 0;
    if (version[0] == '\0' || sscanf(version, "%d.%d", &major, &minor) != 2) {
        sk_doctor_add(d, "redis.version", object, SK_DOCTOR_WARN, NULL,
                      "INFO did not tell the version");
        return;
    }
    if (strcmp(server, "Redis") == 0 && (major < 6 || (major == 6 && minor < 2)))
        sk_doctor_add(d, "redis.version", object, SK_DOCTOR_WARN,
                      "upgrade Redis (or move to Valkey)",
                      "Redis %s: past its end of life", version);
    else
        sk_doctor_add(d, "redis.version", object, SK_DOCTOR_PASS, NULL, "%s %s", server,
                      version);
}
