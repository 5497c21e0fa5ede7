/* ctl_doctor.c - sekalictl doctor: are the settings that sekali's
 * guarantee rests on, and that live outside sekali, what it needs? The
 * queues' arguments and the broker's consumer timeout, Redis' eviction
 * and role, PostgreSQL's synchronous commit and standbys, the clocks, the
 * schema, retention against the oldest waiting job. Each check passes,
 * warns or fails with its fix in one line.
 *
 * Exit codes: 0 every check passed (or was skipped), 6 (SK_CTL_WARNINGS)
 * some warned and none failed, 7 (SK_CTL_FAILURES) some failed (a server
 * that cannot be reached fails its checks), 2 usage. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_value.h"
#include "ctl_commands.h"
#include "ctl_common.h"
#include "ctl_http.h"
#include "ctl_out.h"
#include "doctor.h"

#define SCRAPE_TIMEOUT_MS 3000

static bool doctor_args(struct sk_doctor *d, int argc, char **argv, bool *json);
static void print_text(const struct sk_doctor *d);
static void print_json(const struct sk_doctor *d, int code);

int sk_ctl_doctor(const struct sk_conf *conf, int argc, char **argv)
{
    struct sk_doctor d = { .conf = conf };
    bool json = false;
    if (!doctor_args(&d, argc, argv, &json))
        return SK_CTL_SHOW_USAGE;
    if (conf->metrics.listen_host != NULL) {
        char why[256];
        d.metrics = sk_ctl_http_get(conf->metrics.listen_host, conf->metrics.listen_port,
                                    "/metrics", conf->metrics.token, SCRAPE_TIMEOUT_MS, why,
                                    sizeof(why));
    }
    sk_doctor_run(&d);

    enum sk_doctor_level worst = sk_doctor_worst(&d);
    int code = worst == SK_DOCTOR_FAIL ? SK_CTL_FAILURES
               : worst == SK_DOCTOR_WARN ? SK_CTL_WARNINGS : SK_CTL_OK;
    if (json)
        print_json(&d, code);
    else
        print_text(&d);
    sk_doctor_free(&d);
    free(d.metrics);
    return code;
}

/* false: a usage error. --consumer-timeout is the broker's consumer_timeout
 * (rabbitmq.conf), which AMQP does not tell a client; it overrides
 * amqp.consumer_timeout. */
static bool doctor_args(struct sk_doctor *d, int argc, char **argv, bool *json)
{
    static const struct option options[] = {
        { "json", no_argument, NULL, 'j' },
        { "consumer-timeout", required_argument, NULL, 't' },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (opt == 'j') {
            *json = true;
        } else if (opt == 't') {
            uint64_t ms;
            struct sk_err err = { 0 };
            if (sk_conf_value_parse_duration(optarg, &ms, &err) != SK_OK || ms == 0 || ms > UINT32_MAX) {
                fprintf(stderr, "sekalictl: --consumer-timeout %s: a duration such as 30m\n",
                        optarg);
                return false;
            }
            d->consumer_timeout_ms = (uint32_t)ms;
        } else {
            return false;
        }
    }
    return optind == argc;
}

/* One line a verdict, and the fix under it. Names of queues and servers
 * come from the configuration, found texts from servers: both are printed
 * made safe for a terminal. */
static void print_text(const struct sk_doctor *d)
{
    size_t count[4] = { 0 };
    for (size_t i = 0; i < d->n; i++) {
        const struct sk_doctor_verdict *v = &d->v[i];
        count[v->level]++;
        printf("%-4s %s", sk_doctor_level_names[v->level], v->check);
        if (v->object[0] != '\0') {
            printf(" ");
            sk_ctl_put_text(stdout, v->object, strlen(v->object), 0);
        }
        printf(": ");
        sk_ctl_put_text(stdout, v->found, strlen(v->found), 0);
        printf("\n");
        if (v->fix[0] != '\0' && v->level >= SK_DOCTOR_WARN) {
            printf("     fix: ");
            sk_ctl_put_text(stdout, v->fix, strlen(v->fix), 0);
            printf("\n");
        }
    }
    printf("%zu passed, %zu warned, %zu failed, %zu skipped\n", count[SK_DOCTOR_PASS],
           count[SK_DOCTOR_WARN], count[SK_DOCTOR_FAIL], count[SK_DOCTOR_SKIP]);
}

static void print_json(const struct sk_doctor *d, int code)
{
    printf("{\"checks\":[");
    for (size_t i = 0; i < d->n; i++) {
        const struct sk_doctor_verdict *v = &d->v[i];
        printf("%s{\"check\":", i > 0 ? "," : "");
        sk_ctl_put_jstr(stdout, v->check);
        printf(",\"object\":");
        sk_ctl_put_jstr(stdout, v->object);
        printf(",\"level\":\"%s\",\"found\":", sk_doctor_level_names[v->level]);
        sk_ctl_put_jstr(stdout, v->found);
        printf(",\"fix\":");
        sk_ctl_put_jstr(stdout, v->fix);
        printf("}");
    }
    printf("],\"exit\":%d}\n", code);
}
