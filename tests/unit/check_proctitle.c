/* check_proctitle.c - titles written over the argv area show in
 * /proc/self/cmdline, never spill past it, and leave the environment and
 * the arguments readable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <valgrind/valgrind.h>

#include "proctitle.h"
#include "suite.h"

static char  *saved_path;  /* getenv("PATH") before init */
static char  *saved_arg0;
static char **args;

/* The file's bytes; *len is how many. */
static char *slurp(const char *path, size_t *len)
{
    static char buf[1 << 17];
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "fopen(%s)", path);
    *len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[*len] = '\0';
    return buf;
}

START_TEST(test_title_replaces_cmdline_and_keeps_environment_and_arguments)
{
    /* Valgrind serves /proc/self/cmdline from its own copy of argv. */
    if (RUNNING_ON_VALGRIND)
        return;
    sk_proctitle_set("sekalid: worker q#1", NULL);
    size_t len;
    const char *cmdline = slurp("/proc/self/cmdline", &len);
    ck_assert_str_eq(cmdline, "sekalid: worker q#1");
    for (size_t i = strlen(cmdline); i < len; i++)
        ck_assert_msg(cmdline[i] == '\0', "byte %zu after the title is not NUL", i);
    ck_assert_str_eq(getenv("PATH") ? getenv("PATH") : "", saved_path);
    ck_assert_str_eq(args[0], saved_arg0);
}
END_TEST

START_TEST(test_title_longer_than_the_area_is_truncated_not_overflowed)
{
    /* Valgrind serves /proc/self/cmdline from its own copy of argv. */
    if (RUNNING_ON_VALGRIND)
        return;
    static char huge[1 << 16];
    memset(huge, 'x', sizeof huge - 1);
    sk_proctitle_set(huge, NULL);
    size_t len;
    const char *cmdline = slurp("/proc/self/cmdline", &len);
    size_t n = strlen(cmdline);
    ck_assert_uint_gt(n, 0);
    ck_assert_uint_lt(n, sizeof huge - 1);
    ck_assert_uint_eq(strspn(cmdline, "x"), n);
    ck_assert_str_eq(getenv("PATH") ? getenv("PATH") : "", saved_path);
}
END_TEST

START_TEST(test_comm_name_is_cut_to_fifteen_bytes)
{
    sk_proctitle_set(NULL, "sk-abcdefghijklmnopqrstuvwxyz");
    size_t len;
    const char *comm = slurp("/proc/self/comm", &len);
    ck_assert_str_eq(comm, "sk-abcdefghijkl\n");
}
END_TEST

int main(int argc, char **argv)
{
    saved_path = strdup(getenv("PATH") ? getenv("PATH") : "");
    saved_arg0 = strdup(argv[0]);
    args = argv;
    sk_proctitle_init(argc, argv);
    const TTest *tests[] = {
        test_title_replaces_cmdline_and_keeps_environment_and_arguments,
        test_title_longer_than_the_area_is_truncated_not_overflowed,
        test_comm_name_is_cut_to_fifteen_bytes,
        NULL,
    };
    return h_run_suite(h_suite("proctitle", 10, tests));
}
