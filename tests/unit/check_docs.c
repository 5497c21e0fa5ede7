/* check_docs.c - what operators read and load besides the README: the man
 * pages pass mandoc's linter and name every configuration key; the alerting
 * rules pass promtool's check and their own unit tests; the Grafana
 * dashboard is JSON with a panel for each question the README's metrics
 * answer; dashboard and rules query only metrics that sekalid exports (the
 * README's table, kept equal to /metrics by check_metrics).
 * Run from the repository root, as tests/run.sh does. */
#include <ctype.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "suite.h"

#define RULES      "contrib/prometheus/sekali-rules.yml"
#define RULES_TEST "contrib/prometheus/sekali-rules.test.yml"
#define DASHBOARD  "contrib/grafana/sekali.json"

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s not found: run from the repository root", path);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(mem);
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;)
        fwrite(buf, 1, n, mem);
    fclose(f);
    fclose(mem);
    return text;
}

/* Runs cmd through the shell; returns its exit status and, in *out, what it
 * printed on stdout and stderr (caller frees). */
static int run(const char *cmd, char **out)
{
    char *full = NULL;
    ck_assert(asprintf(&full, "%s 2>&1", cmd) > 0);
    FILE *p = popen(full, "r");
    ck_assert_ptr_nonnull(p);
    size_t len = 0;
    FILE *mem = open_memstream(out, &len);
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;)
        fwrite(buf, 1, n, mem);
    fclose(mem);
    int status = pclose(p);
    free(full);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Whether word occurs in text with no [a-z0-9_] on either side. */
static bool has_word(const char *text, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = text; (p = strstr(p, word)) != NULL; p++) {
        bool left = p == text || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        bool right = !(isalnum((unsigned char)p[n]) || p[n] == '_');
        if (left && right)
            return true;
    }
    return false;
}

START_TEST(test_every_man_page_passes_mandoc_lint)
{
    glob_t g;
    ck_assert_int_eq(glob("man/*.[358]", 0, NULL, &g), 0);
    ck_assert_msg(g.gl_pathc == 4, "expected 4 man pages in man/, found %zu", g.gl_pathc);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char cmd[512], *out = NULL;
        snprintf(cmd, sizeof(cmd), "mandoc -T lint -W warning '%s'", g.gl_pathv[i]);
        int rc = run(cmd, &out);
        ck_assert_msg(rc == 0 && out[0] == '\0', "%s: exit %d:\n%s", cmd, rc, out);
        free(out);
    }
    globfree(&g);
}
END_TEST

/* The stable event names are an interface (log.h): each SK_EVENT_* is
 * described in sekalid(8)'s LOGGING list, and that list names no other. */
START_TEST(test_sekalid_man_page_lists_exactly_the_log_event_names)
{
    char *header = read_file("src/base/log.h");
    char *page = read_file("man/sekalid.8");
    char *list = strstr(page, "\n.Sh LOGGING\n");
    ck_assert_msg(list != NULL, "sekalid.8 has no LOGGING section");
    char *end = strstr(list + 1, "\n.Sh ");
    if (end != NULL)
        *end = '\0';
    int in_header = 0;
    for (const char *p = header; (p = strstr(p, "#define SK_EVENT_")) != NULL; p++) {
        const char *q = strchr(p, '"');
        ck_assert_ptr_nonnull(q);
        const char *e = strchr(q + 1, '"');
        char want[128];
        snprintf(want, sizeof(want), "\n.It Li %.*s\n", (int)(e - q - 1), q + 1);
        ck_assert_msg(strstr(list, want) != NULL, "sekalid.8 LOGGING lacks %s", want + 1);
        in_header++;
    }
    int in_page = 0;
    for (const char *p = list; (p = strstr(p, "\n.It Li ")) != NULL; p++)
        in_page++;
    ck_assert_msg(in_header > 0 && in_page == in_header,
                  "log.h defines %d event names, sekalid.8 lists %d", in_header, in_page);
    free(header);
    free(page);
}
END_TEST

/* Every key the example configuration sets (or shows commented out) is
 * described in sekali.yaml(5). */
START_TEST(test_config_man_page_names_every_key_of_the_example_configuration)
{
    char *conf = read_file("conf/sekali.yaml");
    char *page = read_file("man/sekali.yaml.5");
    int keys = 0;
    for (char *line = strtok(conf, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char *p = line + strspn(line, " ");
        if (*p == '#')
            p += 1 + strspn(p + 1, " ");  /* a key shown commented out */
        if (strncmp(p, "- ", 2) == 0)
            p += 2;
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
        if (n == 0 || p[n] != ':' || (p[n + 1] != ' ' && p[n + 1] != '\0'))
            continue;
        p[n] = '\0';
        ck_assert_msg(has_word(page, p), "sekali.yaml(5) does not describe the key \"%s\"", p);
        keys++;
    }
    ck_assert_int_ge(keys, 50);
    free(page);
    free(conf);
}
END_TEST

START_TEST(test_alert_rules_pass_promtool_check)
{
    char *out = NULL;
    int rc = run("promtool check rules " RULES, &out);
    ck_assert_msg(rc == 0, "promtool check rules: exit %d:\n%s", rc, out);
    free(out);
}
END_TEST

/* sekali-rules.test.yml feeds series to each alert and expects it to fire,
 * or to stay quiet on a healthy queue. */
START_TEST(test_alert_rules_fire_as_their_unit_tests_expect)
{
    char *out = NULL;
    int rc = run("promtool test rules " RULES_TEST, &out);
    ck_assert_msg(rc == 0, "promtool test rules: exit %d:\n%s", rc, out);
    /* Each alert of the rules is tested. */
    char *rules = read_file(RULES);
    char *tests = read_file(RULES_TEST);
    int alerts = 0;
    for (const char *p = rules; (p = strstr(p, "- alert: ")) != NULL; alerts++) {
        p += strlen("- alert: ");
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)strcspn(p, "\n "), p);
        char want[160];
        snprintf(want, sizeof(want), "alertname: %s\n", name);
        ck_assert_msg(strstr(tests, want) != NULL, "alert %s has no test in " RULES_TEST, name);
    }
    ck_assert_int_ge(alerts, 5);
    free(tests);
    free(rules);
    free(out);
}
END_TEST

/* The dashboard's panel titles and queries, "title\texpr" per line, as
 * python3's json module reads the file; fails the test if it is not JSON. */
static char *dashboard_queries(void)
{
    char *out = NULL;
    int rc = run("python3 -c 'import json, sys\n"
                 "d = json.load(open(sys.argv[1]))\n"
                 "for p in d[\"panels\"]:\n"
                 "    for t in p[\"targets\"]:\n"
                 "        print(p[\"title\"] + \"\\t\" + t[\"expr\"])\n"
                 "' " DASHBOARD, &out);
    ck_assert_msg(rc == 0, DASHBOARD " is not a dashboard in JSON:\n%s", out);
    return out;
}

/* A panel titled title queries each of the metrics (NULL-terminated). */
static void assert_panel(const char *queries, const char *title, const char *const *metrics)
{
    for (const char *const *m = metrics; *m != NULL; m++) {
        bool found = false;
        for (const char *line = queries; *line != '\0' && !found;) {
            size_t len = strcspn(line, "\n");
            char *one = strndup(line, len);
            char *tab = strchr(one, '\t');
            found = tab != NULL && strncmp(one, title, (size_t)(tab - one)) == 0 &&
                    strlen(title) == (size_t)(tab - one) && strstr(tab, *m) != NULL;
            free(one);
            line += len + (line[len] == '\n');
        }
        ck_assert_msg(found, "the dashboard has no panel \"%s\" querying %s", title, *m);
    }
}

START_TEST(test_dashboard_has_a_panel_for_each_operator_question)
{
    char *q = dashboard_queries();
    assert_panel(q, "Throughput", (const char *[]){ "sekali_completions_total", NULL });
    assert_panel(q, "Duplicates suppressed", (const char *[]){ "sekali_duplicates_total", NULL });
    assert_panel(q, "Retries", (const char *[]){ "sekali_retries_total", NULL });
    assert_panel(q, "Dead letters by reason",
                 (const char *[]){ "sekali_dead_letters_total", "by (queue, reason)", NULL });
    assert_panel(q, "Lock waits and losses",
                 (const char *[]){ "sekali_lock_wait_seconds_total", "sekali_lock_busy_total",
                                   "sekali_locks_lost_total", NULL });
    assert_panel(q, "Job duration against lock TTL",
                 (const char *[]){ "sekali_job_duration_seconds_bucket",
                                   "sekali_lock_ttl_seconds", NULL });
    assert_panel(q, "Outbox lag", (const char *[]){ "sekali_outbox_lag_seconds", NULL });
    assert_panel(q, "Workers up", (const char *[]){ "sekali_workers_up", NULL });
    assert_panel(q, "Worker restarts", (const char *[]){ "sekali_worker_restarts_total", NULL });
    free(q);
}
END_TEST

/* Each sekali_* name in text, less a histogram's series suffix, is a row
 * of the README's metrics table. Returns how many names were checked. */
static int assert_documented(const char *text, const char *readme, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, "sekali_")) != NULL; n++) {
        size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)len, p);
        p += len;
        const char *suffixes[] = { "_bucket", "_count", "_sum" };
        for (size_t i = 0; i < 3; i++) {
            size_t s = strlen(suffixes[i]), l = strlen(name);
            if (l > s && strcmp(name + l - s, suffixes[i]) == 0 &&
                strstr(name, "_seconds") == name + l - s - strlen("_seconds"))
                name[l - s] = '\0';
        }
        char row[160];
        snprintf(row, sizeof(row), "\n| `%s` |", name);
        ck_assert_msg(strstr(readme, row) != NULL,
                      "%s queries %s, which is not in the README's metrics table", what, name);
    }
    return n;
}

START_TEST(test_dashboard_and_rules_query_only_metrics_sekalid_exports)
{
    char *readme = read_file("README.md");
    char *q = dashboard_queries();
    ck_assert_int_ge(assert_documented(q, readme, "the dashboard"), 20);
    char *rules = read_file(RULES);
    ck_assert_int_ge(assert_documented(rules, readme, RULES), 8);
    free(rules);
    free(q);
    free(readme);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_every_man_page_passes_mandoc_lint,
        test_config_man_page_names_every_key_of_the_example_configuration,
        test_sekalid_man_page_lists_exactly_the_log_event_names,
        test_alert_rules_pass_promtool_check,
        test_alert_rules_fire_as_their_unit_tests_expect,
        test_dashboard_has_a_panel_for_each_operator_question,
        test_dashboard_and_rules_query_only_metrics_sekalid_exports,
        NULL,
    };
    return h_run_suite(h_suite("docs", 120, tests));
}
