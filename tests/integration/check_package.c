/* check_package.c - the Debian packaging in debian/.
 *
 * dpkg-buildpackage builds sekali and libsekali-dev from a copy of the
 * source in a scratch directory (the .debs land in the parent of the tree it
 * builds, and the repository must not fill up with build products); lintian
 * must find no error in them. Then they are installed on this machine with
 * dpkg, as an operator would, and what the operator relies on is checked:
 * the account, the configuration's owner and mode, its check passing as the
 * unit's user, the header and pkg-config file a handler is built with. The
 * packages are purged at the end, and by the suite's teardown if a check
 * failed before, so that the machine is left as it was. */
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define CONF "/etc/sekali/sekali.yaml"

static bool installed_before;  /* sekali was on this machine before the suite */
static bool user_before;       /* and so was the account sekali */

/* Runs cmd with a shell; its output (stdout and stderr) is returned, and it
 * must exit 0. */
static char *run(const char *cmd)
{
    char full[8192];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    ck_assert_ptr_nonnull(p);
    static char out[65536];
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    ck_assert_msg(status == 0, "`%s` failed (0x%x):\n%s", cmd, status, out);
    return out;
}

static bool package_installed(const char *name)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "dpkg-query -W -f='${Status}' %s 2>/dev/null "
             "| grep -q '^install ok installed$'", name);
    return system(cmd) == 0;
}

/* Purges what the test installed, and the account if it made it; the
 * packages leave the account behind, as Debian's packages do. */
static void leave_the_machine_as_it_was(void)
{
    if (installed_before)
        return;
    if (package_installed("sekali") || package_installed("libsekali-dev"))
        if (system("dpkg --purge sekali libsekali-dev >/dev/null 2>&1") != 0)
            fprintf(stderr, "check_package: dpkg --purge sekali libsekali-dev failed\n");
    if (!user_before && getpwnam("sekali") != NULL)
        if (system("userdel sekali >/dev/null 2>&1; groupdel sekali >/dev/null 2>&1") != 0)
            fprintf(stderr, "check_package: could not remove the account sekali\n");
}

static void remember_the_machine(void)
{
    installed_before = package_installed("sekali") || package_installed("libsekali-dev");
    user_before = getpwnam("sekali") != NULL;
}

/* Builds both packages from a copy of the working tree in dir/src. */
static void build(const char *dir)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "mkdir %s/src && tar -C . --exclude=./build --exclude=./.git "
             "-cf - . | tar -C %s/src -xf -", dir, dir);
    run(cmd);
    snprintf(cmd, sizeof(cmd), "cd %s/src && dpkg-buildpackage -us -uc -b > %s/build.log 2>&1 "
             "|| { tail -40 %s/build.log; exit 1; }", dir, dir, dir);
    run(cmd);
    const char *debs[] = { "sekali_0.1.0_amd64.deb", "libsekali-dev_0.1.0_all.deb" };
    for (size_t i = 0; i < 2; i++) {
        char path[2048];
        snprintf(path, sizeof(path), "%s/%s", dir, debs[i]);
        ck_assert_msg(access(path, F_OK) == 0, "dpkg-buildpackage made no %s (see %s/build.log)",
                      debs[i], dir);
    }
}

/* lintian's errors are failures; its other tags are kept in dir/lintian.txt. */
static void lint(const char *dir)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "lintian --fail-on error --info --display-level '>=pedantic' "
             "%s/sekali_0.1.0_amd64.changes > %s/lintian.txt 2>&1; status=$?; "
             "grep '^E:' %s/lintian.txt; exit $status", dir, dir, dir);
    run(cmd);
}

START_TEST(test_packages_build_pass_lintian_install_and_run_the_config_check_as_sekali)
{
    h_init();
    ck_assert_msg(geteuid() == 0, "installing packages takes root");
    ck_assert_msg(!installed_before, "sekali is installed on this machine already: this test "
                  "would replace and purge it");
    char *dir = h_tmpdir("package");
    build(dir);
    lint(dir);

    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "dpkg -i %s/sekali_0.1.0_amd64.deb %s/libsekali-dev_0.1.0_all.deb",
             dir, dir);
    run(cmd);
    ck_assert(package_installed("sekali") && package_installed("libsekali-dev"));

    /* The account comes from sysusers.d through the postinst; the
     * configuration is a conffile, readable by the account only. */
    ck_assert_ptr_nonnull(strstr(run("cat /var/lib/dpkg/info/sekali.postinst"),
                                 "systemd-sysusers"));
    struct group *g = getgrnam("sekali");
    ck_assert_msg(g != NULL && getpwnam("sekali") != NULL, "the package should make the "
                  "user and group sekali");
    ck_assert_ptr_nonnull(strstr(run("dpkg-query -W -f='${Conffiles}' sekali"), CONF " "));
    struct stat st;
    ck_assert_int_eq(stat(CONF, &st), 0);
    ck_assert_msg(st.st_uid == 0 && st.st_gid == g->gr_gid && (st.st_mode & 07777) == 0640,
                  CONF " is %u:%u %04o, expected root:sekali 0640", (unsigned)st.st_uid,
                  (unsigned)st.st_gid, (unsigned)(st.st_mode & 07777));

    /* The unit's user can read it, load the packaged handler and pass the
     * check the unit's ExecStartPre= runs. */
    ck_assert_str_eq(run("runuser -u sekali -- env SEKALI_AMQP_PASSWORD=x SEKALI_PG_PASSWORD=y "
                         "/usr/bin/sekalid -t -c " CONF),
                     "sekalid: configuration file " CONF " test is successful\n");
    ck_assert_ptr_nonnull(strstr(run("cat /lib/systemd/system/sekali.service"),
                                 "ExecStart=/usr/bin/sekalid -c " CONF "\n"));
    /* Built for /usr: the SQL where the binaries look for it. */
    ck_assert_int_eq(access("/usr/share/sekali/sql/001_idempotency_keys.sql", R_OK), 0);
    run("grep -q -a /usr/share/sekali/sql /usr/bin/sekalictl");
    ck_assert_str_eq(run("man -w sekalid"), "/usr/share/man/man8/sekalid.8.gz\n");

    /* A handler builds against the installed header alone. */
    ck_assert_str_eq(run("pkg-config --variable=includedir sekali"), "/usr/include\n");
    snprintf(cmd, sizeof(cmd), "cc -fPIC -shared -o %s/invoice.so examples/invoice.c "
             "$(pkg-config --cflags --libs sekali libpq)", dir);
    run(cmd);

    run("dpkg --purge sekali libsekali-dev");
    ck_assert_msg(access("/usr/bin/sekalid", F_OK) != 0 && access(CONF, F_OK) != 0 &&
                  access("/usr/include/sekali/handler.h", F_OK) != 0,
                  "the purge should remove the binaries, the configuration and the header");
    free(dir);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_packages_build_pass_lintian_install_and_run_the_config_check_as_sekali,
        NULL,
    };
    Suite *s = suite_create("package");
    TCase *tc = h_tcase(s, "package", 1200, tests);
    /* Unchecked: run in this process around the forked test, so the
     * teardown runs even when a check ended the test early. */
    tcase_add_unchecked_fixture(tc, remember_the_machine, leave_the_machine_as_it_was);
    return h_run_suite(s);
}
