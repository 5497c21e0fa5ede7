/* check_docs.c - what people read and operators load: the man pages pass
 * mandoc's linter; the configuration keys are the same in the code's schema,
 * conf/sekali.yaml and sekali.yaml(5); the alerting rules pass promtool's
 * check and their own unit tests; the Grafana dashboard is JSON with a panel
 * for each question the metrics answer; dashboard and rules query only
 * metrics that sekalid exports (sekalid(8)'s METRICS, which check_metrics
 * holds equal to a real scrape); the README is a front door of at most 300
 * lines that links every page of docs/, and every relative link of the
 * Markdown documents resolves, anchors included.
 * Run from the repository root, as tests/run.sh does. */
#include <ctype.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "config.h"
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

/* A set of names, kept in the order first added: a key path or a metric. */
struct names {
    char  *v[256];
    size_t n;
};

static bool names_has(const struct names *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i], name) == 0)
            return true;
    return false;
}

static void names_add(struct names *s, const char *name)
{
    if (names_has(s, name))
        return;
    ck_assert_msg(s->n < SK_ARRAY_LEN(s->v), "more than %zu names", SK_ARRAY_LEN(s->v));
    s->v[s->n++] = strdup(name);
}

static void names_free(struct names *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    s->n = 0;
}

/* Every name of a is in b; the message names the first that is not. */
static void assert_subset(const struct names *a, const char *a_name, const struct names *b,
                          const char *b_name)
{
    for (size_t i = 0; i < a->n; i++)
        ck_assert_msg(names_has(b, a->v[i]), "%s has \"%s\", which %s does not", a_name,
                      a->v[i], b_name);
}

static void add_key(const char *path, void *arg)
{
    names_add(arg, path);
}

/* The keys conf/sekali.yaml sets, or shows commented out ("# key: value",
 * one space after the #: a comment that only mentions a key indents it
 * further), as dotted paths found by indentation; a key under "- " makes its
 * parent a sequence ("queues[]."). Below a commented-out section ("# tls:")
 * its keys are commented out too, indented after the # ("#   ca_file: x"),
 * until a line that is no such comment. */
static void example_keys(const char *text, struct names *out)
{
    struct { int indent; char name[128]; } stack[8];
    int depth = 0;
    int section_hash = -1;  /* the column of a commented-out section's # */
    char *copy = strdup(text);
    for (char *line = strtok(copy, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char *p = line + strspn(line, " ");
        int indent = (int)(p - line);
        if (*p != '#') {
            section_hash = -1;
        } else if (p[1] == ' ' && p[2] != ' ') {
            int hash = indent;
            p += 2;
            size_t k = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
            section_hash = k > 0 && p[k] == ':' && p[k + 1 + strspn(p + k + 1, " ")] == '\0'
                               ? hash : -1;
        } else if (p[1] == ' ' && section_hash == indent) {
            size_t spaces = strspn(p + 1, " ");
            p += 1 + spaces;
            indent += 1 + (int)spaces;
        } else {
            continue;
        }
        bool item = strncmp(p, "- ", 2) == 0;
        if (item)
            p += 2;
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
        if (n == 0 || p[n] != ':' || (p[n + 1] != ' ' && p[n + 1] != '\0'))
            continue;
        if (item)
            indent += 2;
        while (depth > 0 && stack[depth - 1].indent >= indent)
            depth--;
        if (item && depth > 0 && strstr(stack[depth - 1].name, "[]") == NULL)
            strcat(stack[depth - 1].name, "[]");
        char path[256] = "";
        for (int i = 0; i < depth; i++)
            snprintf(path + strlen(path), sizeof(path) - strlen(path), "%s.", stack[i].name);
        snprintf(path + strlen(path), sizeof(path) - strlen(path), "%.*s", (int)n, p);
        ck_assert_int_lt(depth, 8);
        stack[depth].indent = indent;
        snprintf(stack[depth].name, sizeof(stack[depth].name), "%.*s", (int)n, p);
        depth++;
        names_add(out, path);
    }
    free(copy);
    /* A section is not a key: keep only the leaves (no other path below them). */
    struct names leaves = { .n = 0 };
    for (size_t i = 0; i < out->n; i++) {
        bool parent = false;
        char prefix[260];
        snprintf(prefix, sizeof(prefix), "%s.", out->v[i]);
        char seq[260];
        snprintf(seq, sizeof(seq), "%s[].", out->v[i]);
        for (size_t j = 0; j < out->n && !parent; j++)
            parent = strncmp(out->v[j], prefix, strlen(prefix)) == 0 ||
                     strncmp(out->v[j], seq, strlen(seq)) == 0;
        if (!parent)
            names_add(&leaves, out->v[i]);
    }
    names_free(out);
    *out = leaves;
}

/* The keys sekali.yaml(5) describes under DESCRIPTION: a ".Ss section"
 * heading names a section (queues and schedules are lists: "queues[]"), or
 * a key itself when no list follows it; each ".It Cm key [, key]" of its lists is a key, and a
 * list inside an item is that key's section ("queues[].retry."). */
static void man_keys(const char *text, struct names *out)
{
    char prefix[8][128];
    int depth = 0;               /* open .Bl lists */
    char section[128] = "";      /* the .Ss heading's first word */
    char item[128] = "";         /* the last .It key of the innermost list */
    bool in_description = false, listed = false;
    char *copy = strdup(text);
    for (char *line = strtok(copy, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, ".Sh ", 4) == 0 || strncmp(line, ".Ss ", 4) == 0) {
            if (section[0] != '\0' && !listed)
                names_add(out, section);
            section[0] = '\0';
            in_description = strcmp(line, ".Sh DESCRIPTION") == 0 ||
                             (in_description && line[2] == 's');
            if (in_description && line[2] == 's')
                snprintf(section, sizeof(section), "%.*s", (int)strcspn(line + 4, " "), line + 4);
            listed = false;
            depth = 0;
            continue;
        }
        if (!in_description || section[0] == '\0')
            continue;
        if (strncmp(line, ".Bl", 3) == 0) {
            ck_assert_int_lt(depth, 8);
            if (depth == 0)
                snprintf(prefix[0], sizeof(prefix[0]), "%.100s%s.", section,
                         strcmp(section, "queues") == 0 || strcmp(section, "schedules") == 0
                             ? "[]" : "");
            else {
                char outer[128];
                memcpy(outer, prefix[depth - 1], sizeof(outer));
                snprintf(prefix[depth], sizeof(prefix[depth]), "%.60s%.60s.", outer, item);
            }
            depth++;
            listed = true;
        } else if (strcmp(line, ".El") == 0 && depth > 0) {
            depth--;
        } else if (strncmp(line, ".It Cm ", 7) == 0 && depth > 0) {
            /* ".It Cm password_env , password_file" names two keys. */
            const char *p = line + 7;
            while (*p != '\0') {
                size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
                if (n > 0) {
                    snprintf(item, sizeof(item), "%.*s", (int)n, p);
                    char path[300];
                    snprintf(path, sizeof(path), "%s%s", prefix[depth - 1], item);
                    names_add(out, path);
                }
                p += n;
                p += strspn(p, " ,");
                if (n == 0 && *p != '\0')
                    p++;
            }
        }
    }
    free(copy);
    /* A key whose item opens a list is a section. */
    struct names leaves = { .n = 0 };
    for (size_t i = 0; i < out->n; i++) {
        char sub[260];
        snprintf(sub, sizeof(sub), "%s.", out->v[i]);
        bool parent = false;
        for (size_t j = 0; j < out->n && !parent; j++)
            parent = strncmp(out->v[j], sub, strlen(sub)) == 0;
        if (!parent)
            names_add(&leaves, out->v[i]);
    }
    names_free(out);
    *out = leaves;
}

/* One reference for the keys: the schema in the code (src/config/config*.c),
 * the documented example (conf/sekali.yaml) and sekali.yaml(5) name the same
 * keys, each with its whole path. */
START_TEST(test_config_keys_are_the_same_in_the_code_the_example_and_the_man_page)
{
    struct names code = { .n = 0 }, example = { .n = 0 }, man = { .n = 0 };
    sk_conf_each_key(add_key, &code);
    char *conf = read_file("conf/sekali.yaml");
    example_keys(conf, &example);
    char *page = read_file("man/sekali.yaml.5");
    man_keys(page, &man);
    ck_assert_uint_ge(code.n, 50);
    assert_subset(&code, "the schema (src/config/config*.c)", &example, "conf/sekali.yaml");
    assert_subset(&example, "conf/sekali.yaml", &code, "the schema (src/config/config*.c)");
    assert_subset(&code, "the schema (src/config/config*.c)", &man, "sekali.yaml(5)");
    assert_subset(&man, "sekali.yaml(5)", &code, "the schema (src/config/config*.c)");
    names_free(&man);
    names_free(&example);
    names_free(&code);
    free(page);
    free(conf);
}
END_TEST

/* The parsers above find what they should, so the equality can fail: a key
 * missing from either document is seen. */
START_TEST(test_config_key_readers_see_paths_sections_and_commented_keys)
{
    struct names ex = { .n = 0 }, man = { .n = 0 };
    example_keys("# a comment: not a key\namqp:\n  url: x\n  # password_file: f\n"
                 "  #   example: indented further, not a key\nqueues:\n  - name: q\n"
                 "    retry:\n      max: 5m  # 1..\nshutdown_timeout: 1s\n"
                 "redis:\n  # tls:\n  #   ca_file: f  # why\n  #     (a note below it)\n"
                 "  #   verify: true\n  timeout: 2s\n  #   stray: after the section\n", &ex);
    ck_assert_uint_eq(ex.n, 8);
    const char *want[] = { "amqp.url", "amqp.password_file", "queues[].name",
                           "queues[].retry.max", "shutdown_timeout", "redis.tls.ca_file",
                           "redis.tls.verify", "redis.timeout" };
    for (size_t i = 0; i < SK_ARRAY_LEN(want); i++)
        ck_assert_msg(names_has(&ex, want[i]), "example reader missed %s", want[i]);
    man_keys(".Sh NAME\n.Ss nope\n.Sh DESCRIPTION\n.Ss amqp (required)\n.Bl -tag\n"
             ".It Cm password_env , password_file\nThe password.\n.El\n.Ss shutdown_timeout\n"
             "Text.\n.Ss queues (required)\n.Bl -tag\n.It Cm retry\n.Bl -tag\n"
             ".It Cm max\n.El\n.It Cm name\n.El\n.Sh FILES\n", &man);
    const char *want_man[] = { "amqp.password_env", "amqp.password_file", "shutdown_timeout",
                               "queues[].retry.max", "queues[].name" };
    ck_assert_uint_eq(man.n, SK_ARRAY_LEN(want_man));
    for (size_t i = 0; i < SK_ARRAY_LEN(want_man); i++)
        ck_assert_msg(names_has(&man, want_man[i]), "man reader missed %s", want_man[i]);
    names_free(&man);
    names_free(&ex);
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
    assert_panel(q, "Lock waits, holders and losses",
                 (const char *[]){ "sekali_lock_wait_seconds_total", "sekali_lock_busy_total",
                                   "sekali_locks_held", "sekali_locks_lost_total", NULL });
    assert_panel(q, "Job duration against lock TTL",
                 (const char *[]){ "sekali_job_duration_seconds_bucket",
                                   "sekali_lock_ttl_seconds", NULL });
    assert_panel(q, "Outbox lag", (const char *[]){ "sekali_outbox_lag_seconds", NULL });
    assert_panel(q, "Workers up", (const char *[]){ "sekali_workers_up", NULL });
    assert_panel(q, "Worker restarts", (const char *[]){ "sekali_worker_restarts_total", NULL });
    assert_panel(q, "Schedules",
                 (const char *[]){ "sekali_schedule_ticks_total", "sekali_schedule_missed_total",
                                   "sekali_schedule_failures_total",
                                   "sekali_schedule_last_tick_timestamp_seconds",
                                   "sekali_scheduler_last_round_timestamp_seconds", NULL });
    assert_panel(q, "Rate limits", (const char *[]){ "sekali_rate_limited_total",
                                                     "sekali_rate_limit_delay_seconds_total",
                                                     NULL });
    assert_panel(q, "Spans exported and dropped",
                 (const char *[]){ "sekali_spans_exported_total", "sekali_spans_dropped_total",
                                   "sekali_trace_context_dropped_total", NULL });
    assert_panel(q, "Lanes: deliveries forwarded",
                 (const char *[]){ "sekali_lane_forwards_total", NULL });
    free(q);
}
END_TEST

/* Each sekali_* name in text, less a histogram's series suffix, is an
 * entry of the metrics reference in sekalid(8) (".It Va name"), which
 * check_metrics holds equal to a real scrape. Returns how many names were
 * checked. */
static int assert_documented(const char *text, const char *page, const char *what)
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
        char entry[160];
        snprintf(entry, sizeof(entry), "\n.It Va %s ", name);
        ck_assert_msg(strstr(page, entry) != NULL,
                      "%s queries %s, which is not in sekalid(8)'s METRICS", what, name);
    }
    return n;
}

START_TEST(test_dashboard_and_rules_query_only_metrics_sekalid_exports)
{
    char *page = read_file("man/sekalid.8");
    char *q = dashboard_queries();
    ck_assert_int_ge(assert_documented(q, page, "the dashboard"), 20);
    char *rules = read_file(RULES);
    ck_assert_int_ge(assert_documented(rules, page, RULES), 8);
    free(rules);
    free(q);
    free(page);
}
END_TEST

/* The Markdown documents whose links are checked. */
static void markdown_files(glob_t *g)
{
    ck_assert_int_eq(glob("README.md", GLOB_NOCHECK, NULL, g), 0);
    ck_assert_int_eq(glob("docs/*.md", GLOB_APPEND, NULL, g), 0);
    ck_assert_int_eq(glob("tests/README.md", GLOB_APPEND | GLOB_NOCHECK, NULL, g), 0);
    ck_assert_int_eq(glob("NEWS.md", GLOB_APPEND | GLOB_NOCHECK, NULL, g), 0);
}

/* text with its fenced code blocks and HTML comments blanked out: links and
 * headings there are examples, or (the README's "lead: add when merged"
 * block) pages not written yet. */
static char *prose_of(const char *text)
{
    char *s = strdup(text);
    for (char *p = s; (p = strstr(p, "<!--")) != NULL;) {
        char *end = strstr(p, "-->");
        size_t n = end != NULL ? (size_t)(end + 3 - p) : strlen(p);
        memset(p, ' ', n);
        p += n;
    }
    bool fenced = false;
    for (char *line = s; *line != '\0';) {
        size_t len = strcspn(line, "\n");
        bool fence = strncmp(line, "```", 3) == 0;
        if (fenced || fence)
            memset(line, ' ', len);
        if (fence)
            fenced = !fenced;
        line += len + (line[len] == '\n');
    }
    return s;
}

/* GitHub's anchor of a heading: lower case, punctuation dropped but for
 * '-' and '_', spaces as '-'. */
static void slug(const char *heading, size_t len, char *out, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < size; i++) {
        unsigned char c = (unsigned char)heading[i];
        if (isalnum(c) || c == '-' || c == '_')
            out[o++] = (char)tolower(c);
        else if (c == ' ')
            out[o++] = '-';
        else if (c >= 0x80)
            out[o++] = (char)c;
    }
    out[o] = '\0';
}

/* Whether the Markdown file at path has a heading whose anchor is anchor. */
static bool has_anchor(const char *path, const char *anchor)
{
    char *text = read_file(path);
    char *prose = prose_of(text);
    bool found = false;
    for (const char *line = prose; *line != '\0' && !found;) {
        size_t len = strcspn(line, "\n");
        if (line[0] == '#') {
            size_t hashes = strspn(line, "#");
            const char *h = line + hashes + strspn(line + hashes, " ");
            char s[256];
            slug(h, len - (size_t)(h - line), s, sizeof(s));
            found = strcmp(s, anchor) == 0;
        }
        line += len + (line[len] == '\n');
    }
    free(prose);
    free(text);
    return found;
}

/* Every "](target)" of the file's prose that is not a URL: the file exists,
 * relative to the document, and so does its #anchor. Returns the count. */
static int check_links(const char *doc)
{
    char *text = read_file(doc);
    char *prose = prose_of(text);
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", doc);
    char *slash = strrchr(dir, '/');
    if (slash != NULL)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    int n = 0;
    for (const char *p = prose; (p = strstr(p, "](")) != NULL; n++) {
        p += 2;
        size_t len = strcspn(p, ") \n");
        char target[512];
        snprintf(target, sizeof(target), "%.*s", (int)len, p);
        if (strstr(target, "://") != NULL || strncmp(target, "mailto:", 7) == 0)
            continue;
        char *hash = strchr(target, '#');
        if (hash != NULL)
            *hash++ = '\0';
        char path[1100];
        if (target[0] == '\0')
            snprintf(path, sizeof(path), "%s", doc);
        else
            snprintf(path, sizeof(path), "%s%s", dir, target);
        ck_assert_msg(access(path, F_OK) == 0, "%s links to %s, which does not exist", doc,
                      path);
        if (hash != NULL) {
            ck_assert_msg(strlen(path) > 3 && strcmp(path + strlen(path) - 3, ".md") == 0,
                          "%s links to an anchor #%s of %s, which is not Markdown", doc, hash,
                          path);
            ck_assert_msg(has_anchor(path, hash), "%s links to %s#%s: no such heading", doc,
                          path, hash);
        }
    }
    free(prose);
    free(text);
    return n;
}

START_TEST(test_relative_links_of_the_markdown_documents_resolve)
{
    glob_t g;
    markdown_files(&g);
    int links = 0;
    for (size_t i = 0; i < g.gl_pathc; i++)
        links += check_links(g.gl_pathv[i]);
    ck_assert_int_ge(links, 30);
    globfree(&g);
}
END_TEST

/* A checker that can fail: a missing file and a missing anchor are seen,
 * links in code blocks and comments are not. */
START_TEST(test_link_checker_sees_a_missing_file_and_a_missing_anchor)
{
    char *out = prose_of("a [x](y.md)\n```\n[z](w.md)\n```\n<!-- [v](u.md) -->\n");
    ck_assert_ptr_nonnull(strstr(out, "[x](y.md)"));
    ck_assert_ptr_null(strstr(out, "w.md"));
    ck_assert_ptr_null(strstr(out, "u.md"));
    free(out);
    char s[64];
    const char *h = "Health: `/livez` and `/readyz`";
    slug(h, strlen(h), s, sizeof(s));
    ck_assert_str_eq(s, "health-livez-and-readyz");
    ck_assert(has_anchor("README.md", "sekali"));
    ck_assert(!has_anchor("README.md", "no-such-heading-anywhere"));
    ck_assert_int_eq(access("docs/no-such-page.md", F_OK), -1);
}
END_TEST

/* The README is the front door: short, and every page of docs/ is one of
 * its links, so nothing written is out of reach. */
START_TEST(test_readme_is_short_and_links_every_doc_page)
{
    char *readme = read_file("README.md");
    int lines = 0;
    for (const char *p = readme; *p != '\0'; p++)
        lines += *p == '\n';
    ck_assert_msg(lines <= 300, "README.md has %d lines: at most 300 (move detail to docs/)",
                  lines);
    char *prose = prose_of(readme);
    glob_t g;
    ck_assert_int_eq(glob("docs/*.md", 0, NULL, &g), 0);
    ck_assert_uint_ge(g.gl_pathc, 5);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char link[300];
        snprintf(link, sizeof(link), "](%s", g.gl_pathv[i]);
        ck_assert_msg(strstr(prose, link) != NULL, "README.md does not link %s",
                      g.gl_pathv[i]);
    }
    ck_assert_msg(strstr(prose, "](tests/README.md") != NULL, "README.md does not link "
                  "tests/README.md");
    globfree(&g);
    free(prose);
    free(readme);
}
END_TEST

/* STATUS.md says what is true now; history goes to NEWS.md and git, figures
 * to the benchmark. A cap keeps it from becoming a diary again. */
START_TEST(test_status_is_a_status_not_a_diary)
{
    char *status = read_file("docs/STATUS.md");
    int lines = 0;
    for (const char *p = status; *p != '\0'; p++)
        lines += *p == '\n';
    ck_assert_msg(lines <= 120, "docs/STATUS.md has %d lines: at most 120 (history to NEWS.md, "
                  "figures to docs/benchmark.md)", lines);
    free(status);
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

/* Whether word occurs in text on its own: not inside a longer name
 * (console* names console, not console_api). */
static bool has_word(const char *text, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = text; (p = strstr(p, word)) != NULL; p++) {
        bool before = p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
        bool after = isalnum((unsigned char)p[n]) || p[n] == '_';
        if (!before && !after)
            return true;
    }
    return false;
}

/* internals.md's table of the layers (from its header row to the blank
 * line after it), in a new string. */
static char *layer_table(const char *internals)
{
    const char *from = strstr(internals, "\n| layer | folder |");
    ck_assert_msg(from != NULL, "docs/internals.md has no \"| layer | folder |\" table");
    const char *to = strstr(from + 1, "\n\n");
    return strndup(from, to != NULL ? (size_t)(to - from) : strlen(from));
}

/* Writes into missing the modules of src/ (a .c or .h: a module's name is
 * its file's) that table does not name, separated by spaces. */
static void unmapped_modules(const char *table, char *missing, size_t size)
{
    glob_t g;
    ck_assert_int_eq(glob("src/*/*.[ch]", 0, NULL, &g), 0);
    missing[0] = '\0';
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *base = strrchr(g.gl_pathv[i], '/') + 1;
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)strcspn(base, "."), base);
        if (!has_word(table, name) && !has_word(missing, name))
            snprintf(missing + strlen(missing), size - strlen(missing), " %s", name);
    }
    globfree(&g);
}

/* The code map is held to the code: every module of src/ has a word in
 * internals.md's layer table, so a new file cannot go unmapped. */
START_TEST(test_internals_layer_table_names_every_module_of_src)
{
    char *internals = read_file("docs/internals.md");
    char *table = layer_table(internals);
    char missing[2048];
    unmapped_modules(table, missing, sizeof(missing));
    ck_assert_msg(missing[0] == '\0', "docs/internals.md's layer table does not name these "
                  "modules of src/ (add each to its layer's row):%s", missing);
    free(table);
    free(internals);
}
END_TEST

/* Every `file.c:function` internals.md names is a function defined in that
 * file (a line that starts a definition: a type at column 0, then the
 * name and its parenthesis), so a renamed or removed one is noticed. */
static bool defines(const char *source, const char *function)
{
    char want[128];
    snprintf(want, sizeof(want), "%s(", function);
    for (const char *line = source; line != NULL && *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        if (islower((unsigned char)*line)) {
            char *copy = strndup(line, len);
            bool found = false;
            for (const char *p = copy; !found && (p = strstr(p, want)) != NULL; p++)
                found = p == copy || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
            free(copy);
            if (found)
                return true;
        }
        line = end != NULL ? end + 1 : NULL;
    }
    return false;
}

START_TEST(test_internals_names_only_functions_that_exist)
{
    char *internals = read_file("docs/internals.md");
    int seen = 0;
    for (const char *p = internals; (p = strchr(p, '`')) != NULL; p++) {
        char file[64], function[64];
        int n = 0;
        if (sscanf(p + 1, "%63[a-z0-9_].c:%63[A-Za-z0-9_]%n", file, function, &n) != 2 ||
            n == 0)
            continue;
        char pattern[128];
        snprintf(pattern, sizeof(pattern), "src/*/%s.c", file);
        glob_t g;
        ck_assert_msg(glob(pattern, 0, NULL, &g) == 0, "docs/internals.md names %s.c:%s, but "
                      "there is no src/*/%s.c", file, function, file);
        char *source = read_file(g.gl_pathv[0]);
        ck_assert_msg(defines(source, function), "docs/internals.md names %s.c:%s, which %s "
                      "does not define", file, function, g.gl_pathv[0]);
        free(source);
        globfree(&g);
        seen++;
    }
    ck_assert_int_gt(seen, 20);
    free(internals);
}
END_TEST

/* Both checks can fail: a table without a module, a module named only by
 * a longer name or a glob, a function that is not there. */
START_TEST(test_internals_checks_see_a_missing_module_and_function)
{
    char missing[2048];
    unmapped_modules("| config | `src/config/` | `config`, `console*`, `config_walk_x` |",
                     missing, sizeof(missing));
    ck_assert_msg(strstr(missing, " config_walk") != NULL, "%s", missing);
    ck_assert_msg(strstr(missing, " console_api") != NULL, "%s", missing);
    ck_assert_msg(!has_word(missing, "config"), "%s", missing);
    char *source = read_file("src/worker/span.c");
    ck_assert(defines(source, "sk_span_process"));
    ck_assert(!defines(source, "sk_span_proc"));
    ck_assert(!defines(source, "sk_job_run_transactional"));
    free(source);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_sekalid_man_page_lists_exactly_the_log_event_names,
        test_every_man_page_passes_mandoc_lint,
        test_config_keys_are_the_same_in_the_code_the_example_and_the_man_page,
        test_config_key_readers_see_paths_sections_and_commented_keys,
        test_alert_rules_pass_promtool_check,
        test_alert_rules_fire_as_their_unit_tests_expect,
        test_dashboard_has_a_panel_for_each_operator_question,
        test_dashboard_and_rules_query_only_metrics_sekalid_exports,
        test_relative_links_of_the_markdown_documents_resolve,
        test_link_checker_sees_a_missing_file_and_a_missing_anchor,
        test_readme_is_short_and_links_every_doc_page,
        test_status_is_a_status_not_a_diary,
        test_internals_layer_table_names_every_module_of_src,
        test_internals_names_only_functions_that_exist,
        test_internals_checks_see_a_missing_module_and_function,
        NULL,
    };
    return h_run_suite(h_suite("docs", 120, tests));
}
