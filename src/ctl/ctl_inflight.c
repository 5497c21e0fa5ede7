/* ctl_inflight.c - sekalictl inflight [--json]: the jobs running now, who
 * runs them and for how long, oldest first. A claim is uncommitted until
 * its job ends, so PostgreSQL cannot list them: sekalid's supervisor reads
 * them from its workers' scoreboard and serves them at GET /inflight on
 * its metrics endpoint (src/supervisor/inflight.h), which this reads.
 *
 * The JSON form is the supervisor's document as served: it escapes every
 * string (and '<', '>', '&'), so it is passed on unchanged. The text form
 * reads it back (a reader of that one flat shape, not of JSON at large)
 * and prints keys and types through sk_ctl_put_text(), as every value that
 * came from a producer. */
#include <ctype.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_http.h"
#include "ctl_out.h"
#include "ctl_reports.h"

#define SCRAPE_TIMEOUT_MS 3000
#define FIELD_MAX         1024  /* above any field the supervisor writes */

int sk_ctl_inflight(const struct sk_conf *conf, int argc, char **argv)
{
    bool json;
    optind = 1;
    if (!sk_ctl_json_option(argc, argv, &json))
        return SK_CTL_USAGE;
    if (optind != argc) {
        fprintf(stderr, "usage: sekalictl inflight [--json]\n");
        return SK_CTL_USAGE;
    }
    return sk_ctl_inflight_report(conf, json, stdout);
}

/* One string or number at *p into out (a string unescaped: the
 * supervisor writes only \uXXXX escapes of the BMP); *p moves past it.
 * False on anything else. */
static bool value(const char **p, char *out, size_t size)
{
    const char *s = *p;
    size_t n = 0;
    if (*s != '"') {
        while ((*s >= '0' && *s <= '9') || *s == '-')
            if (n + 1 < size)
                out[n++] = *s++;
            else
                s++;
        out[n] = '\0';
        *p = s;
        return n > 0;
    }
    for (s++; *s != '"'; s++) {
        char buf[4];
        size_t k = 1;
        buf[0] = *s;
        if (*s == '\0')
            return false;
        if (*s == '\\') {
            if (s[1] != 'u' || !isxdigit((unsigned char)s[2]) || !isxdigit((unsigned char)s[3]) ||
                !isxdigit((unsigned char)s[4]) || !isxdigit((unsigned char)s[5]))
                return false;  /* four digits, checked before any is skipped */
            unsigned cp = (unsigned)strtoul((char[]){ s[2], s[3], s[4], s[5], '\0' }, NULL, 16);
            s += 5;
            if (cp >= 0xd800 && cp < 0xe000)
                cp = 0xfffd;
            k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
            buf[0] = (char)(k == 1 ? cp : k == 2 ? 0xc0 | cp >> 6 : 0xe0 | cp >> 12);
            if (k == 3)
                buf[1] = (char)(0x80 | (cp >> 6 & 0x3f));
            if (k > 1)
                buf[k - 1] = (char)(0x80 | (cp & 0x3f));
        }
        if (n + k < size) {
            memcpy(out + n, buf, k);
            n += k;
        }
    }
    out[n] = '\0';
    *p = s + 1;
    return true;
}

struct job {
    char queue[FIELD_MAX], key[FIELD_MAX], type[FIELD_MAX], trace[FIELD_MAX];
    char phase[FIELD_MAX], started[FIELD_MAX], age[FIELD_MAX], pid[FIELD_MAX];
    char attempt[FIELD_MAX];
};

/* One {"name":value,...} at *p into j. */
static bool job_of(const char **p, struct job *j)
{
    struct { const char *name; char *out; } fields[] = {
        { "queue", j->queue }, { "key", j->key }, { "job_type", j->type },
        { "trace_id", j->trace }, { "phase", j->phase }, { "started_at", j->started },
        { "age_ms", j->age }, { "pid", j->pid }, { "attempt", j->attempt },
    };
    char name[64], scratch[FIELD_MAX];
    memset(j, 0, sizeof(*j));
    const char *s = *p + 1;
    while (*s == '"') {
        if (!value(&s, name, sizeof(name)) || *s++ != ':')
            return false;
        char *out = scratch;
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            if (strcmp(name, fields[i].name) == 0)
                out = fields[i].out;
        if (!value(&s, out, FIELD_MAX))
            return false;
        if (*s == ',')
            s++;
    }
    *p = s;
    return *s == '}';
}

static void put_job(FILE *out, const struct job *j)
{
    long long age = strtoll(j->age, NULL, 10);
    fprintf(out, "%8lld.%llds  ", age / 1000, age % 1000 / 100);
    sk_ctl_put_tstr(out, j->queue);
    fprintf(out, "  pid %s  %s  attempt %s  ", j->pid, j->phase, j->attempt);
    sk_ctl_put_text(out, j->key, strlen(j->key), 120);
    fputs("  ", out);
    sk_ctl_put_text(out, j->type, strlen(j->type), 60);
    fprintf(out, "  since %s", j->started);
    if (j->trace[0] != '\0') {
        fputs("  trace ", out);
        sk_ctl_put_tstr(out, j->trace);
    }
    fputc('\n', out);
}

static int print_text(FILE *out, const char *doc)
{
    const char *s = strstr(doc, "\"inflight\":[");
    if (s == NULL) {
        fprintf(stderr, "sekalictl: inflight: sekalid's answer is not a list of jobs\n");
        return SK_CTL_FAILED;
    }
    s += strlen("\"inflight\":[");
    size_t shown = 0;
    struct job j;
    while (*s == '\n' || *s == ',')
        s++;
    while (*s == '{') {
        if (!job_of(&s, &j)) {
            fprintf(stderr, "sekalictl: inflight: sekalid's answer could not be read\n");
            return SK_CTL_FAILED;
        }
        put_job(out, &j);
        shown++;
        for (s++; *s == '\n' || *s == ','; s++) {}
    }
    if (shown == 0)
        fputs("no job is in flight\n", out);
    return SK_CTL_OK;
}

int sk_ctl_inflight_report(const struct sk_conf *conf, bool json, FILE *out)
{
    const struct sk_metrics_conf *m = &conf->metrics;
    if (m->listen_host == NULL) {
        fprintf(stderr, "sekalictl: inflight: sekalid's metrics endpoint is off "
                "(metrics.listen), and only it knows the jobs in flight\n");
        return SK_CTL_FAILED;
    }
    char why[256];
    char *doc = sk_ctl_http_get(m->listen_host, m->listen_port, "/inflight", m->token,
                                SCRAPE_TIMEOUT_MS, why, sizeof(why));
    if (doc == NULL) {
        fprintf(stderr, "sekalictl: inflight: %s\n", why);
        return SK_CTL_FAILED;
    }
    int rc = SK_CTL_OK;
    if (json)
        fputs(doc, out);
    else
        rc = print_text(out, doc);
    free(doc);
    return rc;
}
