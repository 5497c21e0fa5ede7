/* check_handler_build.c - a handler author's first steps, as the docs write
 * them: `make install` into a scratch prefix, then the README's handler and
 * its build command, and the build comment of examples/invoice.c, each run
 * exactly as written (through /bin/sh, with PKG_CONFIG_PATH pointing at the
 * prefix) in a directory that holds nothing but the source. The README's
 * handler then runs under sekalid: two copies of one job, one shipment.
 * So a build line that only works inside the source tree fails here. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sekali/handler.h>

#include "harness.h"

/* The text between the first `open` after `after` in text and the next
 * "\n```"; NULL if there is none. The caller frees. */
static char *block_after(const char *text, const char *after, const char *open)
{
    const char *from = strstr(text, after);
    const char *start = from != NULL ? strstr(from, open) : NULL;
    const char *end = start != NULL ? strstr(start + strlen(open), "\n```") : NULL;
    if (end == NULL)
        return NULL;
    return strndup(start + strlen(open), (size_t)(end - start) - strlen(open) + 1);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Runs command with /bin/sh in dir, output to dir/<log>; returns its exit
 * status (-1 if it did not exit). */
static int run_in(const char *dir, const char *env, const char *command, const char *log)
{
    char *cmd = NULL;
    ck_assert(asprintf(&cmd, "cd '%s' && %s /bin/sh -c '%s' >%s 2>&1", dir, env, command,
                       log) > 0);
    int status = system(cmd);
    free(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* `make install` of this build into dir/prefix (configuration into
 * dir/etc); returns the prefix. The caller frees. The build must be up to
 * date: make would otherwise rebuild it with the scratch prefix compiled in
 * (SK_SQL_DIR). */
static char *install_into(const char *dir)
{
    char *prefix = NULL, *cmd = NULL;
    /* Under `make check` this runs inside a recipe: the outer make's flags
     * (its jobserver's descriptors) are not this make's. */
    const char *make = "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s";
    ck_assert(asprintf(&cmd, "%s -q B='%s' all", make, h_build_dir()) > 0);
    ck_assert_msg(system(cmd) == 0, "%s/ is not up to date with the sources: run make tests",
                  h_build_dir());
    free(cmd);
    ck_assert(asprintf(&prefix, "%s/prefix", dir) > 0);
    /* DESTDIR=/ installs to the same paths as none, but as a staging
     * install: make install creates no system user on the test machine. */
    ck_assert(asprintf(&cmd, "%s install B='%s' DESTDIR=/ PREFIX='%s' SYSCONFDIR='%s/etc' "
                       ">'%s/install.log' 2>&1", make, h_build_dir(), prefix, dir, dir) > 0);
    ck_assert_msg(system(cmd) == 0, "make install failed: see %s/install.log", dir);
    free(cmd);
    return prefix;
}

/* Loads the handler as sekalid would and returns its descriptor's name. */
static const char *handler_name(const char *so)
{
    void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(lib != NULL, "dlopen(%s): %s", so, dlerror());
    const struct sekali_handler *(*get)(void) =
        (const struct sekali_handler *(*)(void))dlsym(lib, SEKALI_HANDLER_SYMBOL);
    ck_assert_msg(get != NULL, "%s exports no %s", so, SEKALI_HANDLER_SYMBOL);
    ck_assert_int_eq(get()->abi_major, SEKALI_HANDLER_ABI_MAJOR);
    return get()->name;  /* the library stays loaded: the string lives on */
}

/* path as h_run_opts.handler takes it: relative to the build directory. */
static char *from_build_dir(const char *path)
{
    char real[PATH_MAX];
    ck_assert(realpath(h_build_dir(), real) != NULL);
    size_t up = 0;
    for (const char *p = real; *p != '\0'; p++)
        up += *p == '/' && p[1] != '\0';
    char *rel = calloc(1, up * 3 + strlen(path) + 1);
    ck_assert_ptr_nonnull(rel);
    for (size_t i = 0; i < up; i++)
        strcat(rel, "../");
    strcat(rel, path + 1);
    return rel;
}

/* The README's "Writing a handler" example and its build command, as
 * written, against the installed header and sekali.pc; the handler it
 * builds loads and runs under sekalid, making one shipment of two copies of
 * a job. */
START_TEST(test_readme_handler_builds_with_its_command_as_written_and_runs)
{
    struct h_run r;
    h_run_open(&r, "handler_build");
    char *prefix = install_into(r.dir);
    char src_dir[1024];
    snprintf(src_dir, sizeof(src_dir), "%s/author", r.dir);
    ck_assert_int_eq(mkdir(src_dir, 0755), 0);

    char *readme = h_read_file("README.md");
    ck_assert_msg(readme != NULL, "README.md not found: run from the repository root");
    char *source = block_after(readme, "## Writing a handler", "```c\n");
    char *command = block_after(readme, "## Writing a handler", "```sh\n");
    ck_assert_msg(source != NULL && command != NULL,
                  "README's \"Writing a handler\" has no ```c and ```sh blocks");
    ck_assert_msg(strstr(command, "shipments.c") != NULL && strchr(command, '\'') == NULL,
                  "unexpected build command: %s", command);
    char path[1200];
    snprintf(path, sizeof(path), "%s/shipments.c", src_dir);
    write_text(path, source);

    char env[1200];
    snprintf(env, sizeof(env), "PKG_CONFIG_PATH='%s/lib/pkgconfig'", prefix);
    command[strcspn(command, "\n")] = '\0';
    ck_assert_msg(run_in(src_dir, env, command, "build.log") == 0,
                  "the README's build command failed: %s (see %s/build.log)", command, src_dir);
    snprintf(path, sizeof(path), "%s/shipments.so", src_dir);
    ck_assert_str_eq(handler_name(path), "shipments");

    h_pg_exec(r.pg, "CREATE TABLE IF NOT EXISTS shipments (order_key text PRIMARY KEY)");
    char *handler = from_build_dir(path);
    h_run_start(&r, &(struct h_run_opts){ .handler = handler, .workers = 1 });
    char key[200];
    snprintf(key, sizeof(key), "%s-order", r.queue);
    h_publish(r.b, r.queue, "ship", "m-1", key, NULL, "{}");
    h_publish(r.b, r.queue, "ship", "m-2", key, NULL, "{}");
    H_WAIT(h_completed(&r) == 1 &&
           h_queue_depth(r.b, r.queue) == 0 &&
           h_count_outcomes(r.log, "duplicate", NULL) >= 1, 20000,
           "the shipment job should complete once and its copy be a duplicate (see %s)", r.log);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM shipments WHERE order_key = '%s'",
                                key), 1);
    h_run_stop(&r);
    h_run_close(&r);
    free(handler);
    free(command);
    free(source);
    free(readme);
    free(prefix);
}
END_TEST

/* examples/invoice.c's build comment, as written, against the installed
 * header and sekali.pc. */
START_TEST(test_example_build_comment_builds_the_invoice_handler)
{
    h_init();
    char *dir = h_tmpdir("example_build");
    char *prefix = install_into(dir);
    char *text = h_read_file("examples/invoice.c");
    ck_assert_msg(text != NULL, "examples/invoice.c not found: run from the repository root");
    /* The comment's command: the first line holding "cc -fPIC", from "cc". */
    char *line = strstr(text, "cc -fPIC");
    ck_assert_msg(line != NULL, "examples/invoice.c has no build comment");
    char *command = strndup(line, strcspn(line, "\n"));
    ck_assert_msg(strstr(command, "invoice.c") != NULL && strchr(command, '\'') == NULL,
                  "unexpected build comment: %s", command);

    char src_dir[1024], path[1200], env[1200];
    snprintf(src_dir, sizeof(src_dir), "%s/author", dir);
    ck_assert_int_eq(mkdir(src_dir, 0755), 0);
    snprintf(path, sizeof(path), "%s/invoice.c", src_dir);
    write_text(path, text);
    snprintf(env, sizeof(env), "PKG_CONFIG_PATH='%s/lib/pkgconfig'", prefix);
    ck_assert_msg(run_in(src_dir, env, command, "build.log") == 0,
                  "the example's build comment failed: %s (see %s/build.log)", command, src_dir);
    snprintf(path, sizeof(path), "%s/invoice.so", src_dir);
    ck_assert_str_eq(handler_name(path), "invoice");
    free(command);
    free(text);
    free(prefix);
    free(dir);
}
END_TEST

/* make install puts each man page where man(1) looks under the prefix,
 * and the dashboard and alerting rules under share/sekali. */
START_TEST(test_install_puts_the_man_pages_dashboard_and_rules_in_place)
{
    h_init();
    char *dir = h_tmpdir("man_install");
    char *prefix = install_into(dir);
    const char *files[] = { "man/man3/sekali-handler.3", "man/man5/sekali.yaml.5",
                            "man/man8/sekalid.8", "man/man8/sekalictl.8",
                            "sekali/grafana/sekali.json", "sekali/prometheus/sekali-rules.yml" };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[1200];
        snprintf(path, sizeof(path), "%s/share/%s", prefix, files[i]);
        struct stat st;
        ck_assert_msg(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644,
                      "%s should be installed, mode 644", path);
    }
    /* man(1) finds a page by name in that tree. */
    char cmd[1400];
    snprintf(cmd, sizeof(cmd), "man -M '%s/share/man' -w 5 sekali.yaml >/dev/null 2>&1",
             prefix);
    ck_assert_msg(system(cmd) == 0, "man -M %s/share/man -w 5 sekali.yaml found nothing",
                  prefix);
    free(prefix);
    free(dir);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_readme_handler_builds_with_its_command_as_written_and_runs,
        test_example_build_comment_builds_the_invoice_handler,
        test_install_puts_the_man_pages_dashboard_and_rules_in_place,
        NULL,
    };
    return h_run_suite(h_suite("handler_build", 180, tests));
}
