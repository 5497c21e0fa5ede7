/* main.c - sekalid's command line: check a configuration, or run the daemon.
 *
 *   sekalid -c /etc/sekali/sekali.yaml      run
 *   sekalid -t -c /etc/sekali/sekali.yaml   check the configuration and the
 *                                           handlers, then exit (like nginx -t)
 *   sekalid --help | --version
 * Every option has a GNU long form (--config, --test). A bad option or an
 * operand prints the usage on stderr and exits 2, as a bad configuration
 * does; --help prints it on stdout and exits 0.
 *
 * Configuration and handlers are loaded here, before any worker exists, so a
 * mistake stops sekalid at once with exit code 2 (configuration, handler
 * files that are missing, unsafe or unloadable, and handler configs that the
 * handler's check() rejects) or 3 (a handler built for another ABI), which
 * the systemd unit lists as not worth a restart. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "host.h"
#include "log.h"
#include "plugin.h"
#include "proctitle.h"
#include "supervisor.h"

#ifndef SK_VERSION
#define SK_VERSION "0.1.0"
#endif
#ifndef SK_CONF_PATH
#define SK_CONF_PATH "/etc/sekali/sekali.yaml"
#endif

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sekalid [-t] [-c FILE]\n"
            "Run sekali's workers, outbox relays and janitor as configured in FILE.\n"
            "  -c, --config FILE  configuration file (default " SK_CONF_PATH ")\n"
            "  -t, --test         check the configuration and handlers, then exit\n"
            "  -h, --help         print this help and exit\n"
            "  -V, --version      print the version and exit\n"
            "exit codes: 0 stopped cleanly, 1 runtime failure, 2 bad usage or\n"
            "configuration (handler files and configs included), 3 a handler\n"
            "built for another ABI\n");
}

/* A finding of sk_conf_advise(): on stderr for -t, else in the log. */
static void advise(const char *text, void *arg)
{
    if (*(const bool *)arg)
        fprintf(stderr, "sekalid: warning: %s\n", text);
    else
        sk_log_warn("%s", text);
}

/* -c, -t, -h, -V: -1 to go on, or the exit code (SK_EXIT_OK after -h or
 * -V). */
static int read_args(int argc, char **argv, const char **path, bool *test_only)
{
    static const struct option options[] = {
        { "config", required_argument, NULL, 'c' },
        { "test", no_argument, NULL, 't' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { NULL, 0, NULL, 0 },
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "c:thV", options, NULL)) != -1) {
        switch (opt) {
        case 'c': *path = optarg; break;
        case 't': *test_only = true; break;
        case 'V': printf("sekalid %s (handler ABI %d.%d)\n", SK_VERSION,
                         SEKALI_HANDLER_ABI_MAJOR, SEKALI_HANDLER_ABI_MINOR);
                  return SK_EXIT_OK;
        case 'h': usage(stdout); return SK_EXIT_OK;
        default: usage(stderr); return SK_EXIT_CONFIG;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return SK_EXIT_CONFIG;
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *path = SK_CONF_PATH;
    bool test_only = false;
    /* First: getopt's optarg and getenv must already point at the copies. */
    sk_proctitle_init(argc, argv);
    int code = read_args(argc, argv, &path, &test_only);
    if (code >= 0)
        return code;

    struct sk_conf *conf = NULL;
    struct sk_err err = { 0 };
    if (sk_conf_load(path, &conf, &err) != SK_OK) {
        fprintf(stderr, "sekalid: %s\n", err.msg);
        if (test_only)
            fprintf(stderr, "sekalid: configuration file %s test failed\n", path);
        return SK_EXIT_CONFIG;
    }
    sk_log_init(conf->log.level, conf->log.format, "supervisor");
    sk_conf_advise(conf, advise, &test_only);

    struct sk_plugin *plugins = NULL;
    int rc = sk_plugin_load_queues(conf, sk_host(), &plugins, &err);
    if (rc != SK_OK) {
        /* The log exists now: a refused handler is a line with its event
         * (sekalid -t still prints to the terminal). */
        if (test_only)
            fprintf(stderr, "sekalid: %s\nsekalid: configuration file %s test failed\n",
                    err.msg, path);
        else
            sk_log_event(SK_LOG_ERROR, SK_EVENT_HANDLER_REFUSED, NULL, NULL, "%s", err.msg);
        sk_conf_free(conf);
        return rc == SK_PLUGIN_ABI ? SK_EXIT_ABI : SK_EXIT_CONFIG;
    }

    if (test_only) {
        sk_plugin_try_ready(conf, plugins, sk_host(), advise, &test_only);
        fprintf(stderr, "sekalid: configuration file %s test is successful\n", path);
        free(plugins);
        sk_conf_free(conf);
        return SK_EXIT_OK;
    }
    return sk_supervisor_run(conf, plugins);
}
