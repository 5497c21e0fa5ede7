/* check_doc_facts.c - the reference facts the guides point at stay where
 * they are said, and true: every exit code the code defines is in its man
 * page's EXIT STATUS and that list names no other; every metric a Markdown
 * document names is in sekalid(8)'s METRICS (which check_metrics holds
 * equal to a real scrape). The guides (docs/operations.md) then link to
 * the man pages instead of repeating them, and a renamed counter or a new
 * exit code cannot leave a page behind.
 * Run from the repository root, as tests/run.sh does. */
#include <ctype.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suite.h"

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char *buf = NULL;
    size_t cap = 0, len = 0, n;
    char chunk[8192];
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (buf == NULL)
        buf = calloc(1, 1);
    buf[len] = '\0';
    return buf;
}

/* The section of a man page from ".Sh name" to the next ".Sh", cut in
 * place. */
static char *man_section(char *page, const char *name)
{
    char head[64];
    snprintf(head, sizeof(head), "\n.Sh %s\n", name);
    char *s = strstr(page, head);
    ck_assert_msg(s != NULL, "no %s section", name);
    char *end = strstr(s + 1, "\n.Sh ");
    if (end != NULL)
        *end = '\0';
    return s;
}

/* Each value of "prefix NAME N" in source (a #define or an enum member)
 * is an ".It N" of section; section lists no other. Returns how many codes
 * the source defines. */
static int exit_codes_match(const char *source, const char *prefix, const char *section,
                            const char *where, char *why, size_t size)
{
    bool defined[256] = { false };
    int n = 0;
    for (const char *p = source; (p = strstr(p, prefix)) != NULL; p++) {
        const char *q = p + strlen(prefix);
        while (isupper((unsigned char)*q) || *q == '_')
            q++;
        while (*q == ' ' || *q == '=')
            q++;
        if (!isdigit((unsigned char)*q))
            continue;
        int code = atoi(q);
        if (code < 0 || code > 255 || defined[code])
            continue;
        defined[code] = true;
        n++;
        char item[16];
        snprintf(item, sizeof(item), "\n.It %d\n", code);
        if (strstr(section, item) == NULL) {
            snprintf(why, size, "%s exits %d (%s...), which its EXIT STATUS does not list",
                     where, code, prefix);
            return -1;
        }
    }
    for (const char *p = section; (p = strstr(p, "\n.It ")) != NULL; p++) {
        int code = atoi(p + 5);
        if (isdigit((unsigned char)p[5]) && (code > 255 || !defined[code])) {
            snprintf(why, size, "%s's EXIT STATUS lists %d, which the code does not define",
                     where, code);
            return -1;
        }
    }
    return n;
}

static int assert_exit_codes(const char *header, const char *prefix, const char *page)
{
    char *source = read_file(header), *man = read_file(page), why[256] = "";
    int n = exit_codes_match(source, prefix, man_section(man, "EXIT STATUS"), page, why,
                             sizeof(why));
    ck_assert_msg(n > 0, "%s", why);
    free(man);
    free(source);
    return n;
}

START_TEST(test_man_pages_list_exactly_the_exit_codes_the_code_defines)
{
    ck_assert_int_eq(assert_exit_codes("src/base/common.h", "SK_EXIT_", "man/sekalid.8"), 4);
    ck_assert_int_ge(assert_exit_codes("src/ctl/ctl_common.h", "#define SK_CTL_",
                                       "man/sekalictl.8"), 11);
}
END_TEST

START_TEST(test_exit_code_check_sees_a_missing_and_an_extra_code)
{
    char why[256];
    char section[] = "\n.Sh EXIT STATUS\n.Bl\n.It 0\ndone\n.It 1\nfailed\n.El";
    ck_assert_int_eq(exit_codes_match("#define X_OK 0\n#define X_FAILED 1\n", "#define X_",
                                      section, "x.1", why, sizeof(why)), 2);
    ck_assert_int_eq(exit_codes_match("#define X_OK 0\n#define X_FAILED 1\n#define X_NEW 7\n",
                                      "#define X_", section, "x.1", why, sizeof(why)), -1);
    ck_assert_ptr_nonnull(strstr(why, "exits 7"));
    ck_assert_int_eq(exit_codes_match("#define X_OK 0\n", "#define X_", section, "x.1", why,
                                      sizeof(why)), -1);
    ck_assert_ptr_nonnull(strstr(why, "lists 1"));
}
END_TEST

/* Whether name, a sekali_* word, has the shape of a Prometheus family
 * (its unit or type as suffix): the documents also name functions, types
 * and channels that start with sekali_. */
static bool metric_shaped(const char *name)
{
    static const char *const suffixes[] = {
        "_total", "_seconds", "_seconds_bucket", "_seconds_count", "_seconds_sum", "_info",
        "_bytes",
    };
    size_t l = strlen(name);
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        size_t s = strlen(suffixes[i]);
        if (l > s && strcmp(name + l - s, suffixes[i]) == 0)
            return true;
    }
    return false;
}

/* The first metric-shaped sekali_* name of text that is not an entry of
 * page's METRICS (".It Va name "), a histogram's series counted as its
 * family; copied to out. Returns how many metric names text holds, or -1
 * at the first undocumented one. */
static int undocumented_metric(const char *text, const char *page, char *out, size_t size)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, "sekali_")) != NULL;) {
        bool inside = p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
        size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)len, p);
        p += len;
        if (inside || !metric_shaped(name))
            continue;
        char *series = strstr(name, "_seconds_");
        if (series != NULL && strcmp(series, "_seconds_total") != 0)
            series[strlen("_seconds")] = '\0';
        char entry[160];
        snprintf(entry, sizeof(entry), "\n.It Va %s ", name);
        if (strstr(page, entry) == NULL) {
            snprintf(out, size, "%s", name);
            return -1;
        }
        n++;
    }
    return n;
}

START_TEST(test_documents_name_only_metrics_sekalid_exports)
{
    char *page = read_file("man/sekalid.8");
    glob_t g;
    ck_assert_int_eq(glob("README.md", 0, NULL, &g), 0);
    ck_assert_int_eq(glob("docs/*.md", GLOB_APPEND, NULL, &g), 0);
    int total = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char *text = read_file(g.gl_pathv[i]), name[128] = "";
        int n = undocumented_metric(text, page, name, sizeof(name));
        ck_assert_msg(n >= 0, "%s names the metric %s, which is not in sekalid(8)'s METRICS",
                      g.gl_pathv[i], name);
        total += n;
        free(text);
    }
    ck_assert_int_ge(total, 20);
    globfree(&g);
    free(page);
}
END_TEST

START_TEST(test_metric_check_sees_an_undocumented_name_and_skips_others)
{
    const char *page = "\n.It Va sekali_a_total Pq counter\n"
                       "\n.It Va sekali_job_duration_seconds Pq histogram\n";
    char name[128] = "";
    ck_assert_int_eq(undocumented_metric("`sekali_a_total`, `sekali.enqueue()`, "
                                         "struct sekali_job, sekali_pause, "
                                         "sekali_job_duration_seconds_bucket{le=\"1\"}",
                                         page, name, sizeof(name)), 2);
    ck_assert_str_eq(name, "");
    ck_assert_int_eq(undocumented_metric("rate(sekali_b_total[5m]), sekali_c_seconds_total", page, name, sizeof(name)),
                     -1);
    ck_assert_str_eq(name, "sekali_b_total");
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_man_pages_list_exactly_the_exit_codes_the_code_defines,
        test_exit_code_check_sees_a_missing_and_an_extra_code,
        test_documents_name_only_metrics_sekalid_exports,
        test_metric_check_sees_an_undocumented_name_and_skips_others,
        NULL,
    };
    return h_run_suite(h_suite("doc_facts", 60, tests));
}
