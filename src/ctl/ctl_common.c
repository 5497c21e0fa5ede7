/* ctl_common.c - what every sekalictl command shares (ctl_common.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "ctl_common.h"

PGconn *sk_ctl_pg_connect(const struct sk_conf *conf)
{
    struct sk_err err = { 0 };
    PGconn *pg = sk_pg_dial(&conf->postgres, "sekalictl", &err);
    if (pg == NULL)
        fprintf(stderr, "sekalictl: %s\n", err.msg);
    return pg;
}

bool sk_ctl_pg_exec(PGconn *pg, const struct sk_pg_stmt *st, PGresult **out)
{
    struct sk_err err = { 0 };
    if (sk_pg_exec(pg, st, out, &err) == SK_OK)
        return true;
    fprintf(stderr, "sekalictl: %s\n", err.msg);
    return false;
}

bool sk_ctl_pg_run(PGconn *pg, const char *sql, const char *what)
{
    const struct sk_pg_stmt st = { .sql = sql, .what = what };
    return sk_ctl_pg_exec(pg, &st, NULL);
}

char *sk_ctl_read_all(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return NULL;
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                return NULL;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

bool sk_ctl_json_option(int argc, char **argv, bool *json)
{
    static const struct option options[] = {
        { "json", no_argument, NULL, 'j' },
        { NULL, 0, NULL, 0 },
    };
    *json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (opt != 'j')
            return false;
        *json = true;
    }
    return true;
}

bool sk_ctl_whole_number(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v > max)
        return false;
    *out = v;
    return true;
}
