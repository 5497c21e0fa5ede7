/* check_prometheus.c - sekali as a real Prometheus sees it: Debian's
 * prometheus, on a private loopback port with its own configuration and
 * storage in the test's directory, scrapes a running sekalid every second
 * with contrib/'s alerting rules loaded. The test reads sekali's series
 * back through Prometheus' HTTP API, checks that every rule evaluates
 * without error against them, and runs each query of contrib/'s Grafana
 * dashboard through the same API. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define PROMETHEUS "/usr/bin/prometheus"

/* Writes dir/prometheus.yml, scraping sekalid's endpoint every second and
 * evaluating contrib's rules every second. */
static void write_prometheus_config(const char *dir, int metrics_port)
{
    char rules[PATH_MAX], path[1200];
    ck_assert_msg(realpath("contrib/prometheus/sekali-rules.yml", rules) != NULL,
                  "contrib/prometheus/sekali-rules.yml not found: run from the repository root");
    snprintf(path, sizeof(path), "%s/prometheus.yml", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            "rule_files:\n"
            "  - %s\n"
            "scrape_configs:\n"
            "  - job_name: sekali\n"
            "    static_configs:\n"
            "      - targets: ['127.0.0.1:%d']\n",
            rules, metrics_port);
    ck_assert_int_eq(fclose(f), 0);
}

/* Starts Prometheus with its storage in dir/tsdb and its log in
 * dir/prometheus.log. It dies with the test process, should the test fail
 * before stopping it. */
static pid_t start_prometheus(const char *dir, int port)
{
    char config[1200], storage[1200], listen[64], log[1200];
    snprintf(config, sizeof(config), "--config.file=%s/prometheus.yml", dir);
    snprintf(storage, sizeof(storage), "--storage.tsdb.path=%s/tsdb", dir);
    snprintf(listen, sizeof(listen), "--web.listen-address=127.0.0.1:%d", port);
    snprintf(log, sizeof(log), "%s/prometheus.log", dir);
    pid_t parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
            _exit(127);
        execl(PROMETHEUS, PROMETHEUS, config, storage, listen, "--log.level=warn",
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* All of what the command cmd prints (the caller frees) and its length in
 * *len; the status pclose() gave in *status. */
static char *command_output(const char *cmd, size_t *len, int *status)
{
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char *out = NULL;
    FILE *mem = open_memstream(&out, len);
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;)
        fwrite(buf, 1, n, mem);
    fclose(mem);
    *status = pclose(p);
    return out;
}

/* GET path of Prometheus' API, with query (no single quotes) URL-encoded
 * as the query parameter, or none if NULL. Returns the body (caller
 * frees), or NULL if there was no answer. */
static char *api(int port, const char *path, const char *query)
{
    char *cmd = NULL;
    if (query != NULL) {
        ck_assert_msg(strchr(query, '\'') == NULL, "a query with a quote: %s", query);
        ck_assert(asprintf(&cmd, "curl -s --max-time 5 -G --data-urlencode 'query=%s' "
                           "http://127.0.0.1:%d%s", query, port, path) > 0);
    } else {
        ck_assert(asprintf(&cmd, "curl -s --max-time 5 http://127.0.0.1:%d%s", port, path) > 0);
    }
    size_t len;
    int status;
    char *body = command_output(cmd, &len, &status);
    free(cmd);
    if (status != 0 || len == 0) {
        free(body);
        return NULL;
    }
    return body;
}

/* Whether an instant query's only sample has the value want (as
 * Prometheus prints it: "3", "2"). */
static bool query_equals(int port, const char *query, const char *want)
{
    char *body = api(port, "/api/v1/query", query);
    if (body == NULL)
        return false;
    char tail[64];
    snprintf(tail, sizeof(tail), ",\"%s\"]}]}}", want);
    size_t bl = strlen(body), tl = strlen(tail);
    const char *first = strstr(body, "\"value\":[");
    bool ok = strstr(body, "\"status\":\"success\"") != NULL && bl > tl &&
              strcmp(body + bl - tl, tail) == 0 && first != NULL &&
              strstr(first + 1, "\"value\":[") == NULL;  /* one sample only */
    free(body);
    return ok;
}

/* Whether every rule group is loaded, names `alert`, and evaluated without
 * error at least once. */
static bool rules_evaluated(int port, const char *alert)
{
    char *body = api(port, "/api/v1/rules", NULL);
    if (body == NULL)
        return false;
    char name[128];
    snprintf(name, sizeof(name), "\"name\":\"%s\"", alert);
    bool ok = strstr(body, name) != NULL && strstr(body, "\"health\":\"ok\"") != NULL &&
              strstr(body, "\"health\":\"unknown\"") == NULL &&
              strstr(body, "\"health\":\"err\"") == NULL;
    free(body);
    return ok;
}

/* How many times Prometheus evaluated its rule group so far (its own
 * metrics), -1 if it does not say. */
static long long rule_rounds(int port)
{
    char *body = api(port, "/metrics", NULL);
    if (body == NULL)
        return -1;
    long long n = -1;
    const char *name = "\nprometheus_rule_group_iterations_total{";
    const char *p = strstr(body, name);
    if (p != NULL && (p = strchr(p + 1, '\n')) != NULL) {
        while (p > body && p[-1] != ' ')
            p--;
        n = strtoll(p, NULL, 10);
    }
    free(body);
    return n;
}

/* The dashboard's queries, one per line, with Grafana's variables given
 * values Prometheus takes. The caller frees. */
static char *dashboard_queries(void)
{
    size_t len;
    int status;
    char *out = command_output("python3 -c 'import json\n"
                               "for p in json.load(open(\"contrib/grafana/sekali.json\"))"
                               "[\"panels\"]:\n"
                               "    for t in p[\"targets\"]:\n"
                               "        print(t[\"expr\"].replace(\"$__rate_interval\", \"1m\")"
                               ".replace(\"$queue\", \".*\").replace(\"$instance\", \".*\"))\n'",
                               &len, &status);
    ck_assert_msg(status == 0 && len > 0, "cannot read the dashboard's queries");
    return out;
}

/* sekalid runs 3 jobs on 2 workers; Prometheus, scraping it, answers with
 * the completions and the workers up of this run's queue, shows the target
 * up, evaluates every alerting rule without error (none of them firing
 * for a healthy queue) and runs every dashboard query. */
START_TEST(test_prometheus_scrapes_sekalid_and_serves_its_series)
{
    struct h_run r;
    h_run_open(&r, "prometheus");
    int metrics_port = h_free_port(), prom_port = h_free_port();
    ck_assert_int_ne(metrics_port, prom_port);
    char top[256];
    snprintf(top, sizeof(top), "metrics:\n  listen: 127.0.0.1:%d\n", metrics_port);
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .top_yaml = top });
    h_publish(r.b, r.queue, "test", "job-1", NULL, NULL, "ok");
    h_publish(r.b, r.queue, "test", "job-2", NULL, NULL, "ok");
    h_publish(r.b, r.queue, "test", "job-3", NULL, NULL, "ok");
    H_WAIT(h_effects(&r, NULL) == 3, 30000, "the 3 jobs should commit");

    write_prometheus_config(r.dir, metrics_port);
    pid_t prom = start_prometheus(r.dir, prom_port);
    char query[512];
    snprintf(query, sizeof(query), "sum(sekali_completions_total{job=\"sekali\",queue=\"%s\"})",
             r.queue);
    H_WAIT(query_equals(prom_port, query, "3"), 60000,
           "Prometheus should answer %s with 3 (see %s/prometheus.log)", query, r.dir);
    snprintf(query, sizeof(query), "sekali_workers_up{queue=\"%s\"}", r.queue);
    H_WAIT(query_equals(prom_port, query, "2"), 10000, "%s should be 2", query);
    ck_assert_msg(query_equals(prom_port, "up{job=\"sekali\"}", "1"),
                  "the sekali target should be up");

    H_WAIT(rules_evaluated(prom_port, "SekaliWorkersCrashLooping"), 30000,
           "Prometheus should load contrib's rules and evaluate each without error");
    /* With a few scrapes stored, rules over rates see a healthy queue: two
     * more rounds, and nothing may be firing or pending. */
    H_WAIT(query_equals(prom_port, "count_over_time(up{job=\"sekali\"}[1m]) >= bool 5", "1"),
           30000, "Prometheus should have scraped sekalid 5 times");
    long long rounds = rule_rounds(prom_port);
    ck_assert_msg(rounds >= 0, "Prometheus' own metrics have no rule group iterations");
    H_WAIT(rule_rounds(prom_port) >= rounds + 2, 30000, "the rules should be evaluated again");
    char *alerts = api(prom_port, "/api/v1/alerts", NULL);
    ck_assert_msg(alerts != NULL && strstr(alerts, "\"alerts\":[]") != NULL,
                  "no alert should fire for a healthy sekalid: %s", alerts);
    free(alerts);

    char *queries = dashboard_queries();
    int n = 0;
    for (char *line = strtok(queries, "\n"); line != NULL; line = strtok(NULL, "\n"), n++) {
        char *body = api(prom_port, "/api/v1/query", line);
        ck_assert_msg(body != NULL && strstr(body, "\"status\":\"success\"") != NULL,
                      "the dashboard's query %s failed: %s", line, body);
        free(body);
    }
    ck_assert_int_ge(n, 20);
    free(queries);

    ck_assert_int_eq(kill(prom, SIGTERM), 0);
    int status = h_wait_exit(prom, 30000, "prometheus");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "prometheus should stop cleanly (status 0x%x)", status);
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_prometheus_scrapes_sekalid_and_serves_its_series,
        NULL,
    };
    return h_run_suite(h_suite("prometheus", 180, tests));
}
