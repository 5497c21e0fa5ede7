/* check_install.c - `make install` and the systemd unit it installs.
 *
 * Installs into a scratch prefix (paths in the unit then point at files that
 * exist), and runs the real systemd-analyze on the result: the unit must
 * verify cleanly and rate 2.0 or lower in the offline security analysis. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static char *run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    static char out[65536];
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    ck_assert_msg(status == 0, "`%s` failed (%d):\n%s", cmd, status, out);
    return out;
}

/* `make install` of this build into dir/usr, with its configuration in dir/etc. */
static void install_into(const char *dir)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "make -s install B=%s PREFIX=%s/usr SYSCONFDIR=%s/etc 2>&1",
             h_build_dir(), dir, dir);
    run(cmd);
}

START_TEST(test_install_lays_out_every_file_and_keeps_an_existing_config)
{
    h_init();
    char *dir = h_tmpdir("install");
    install_into(dir);
    static const char *const files[] = {
        "usr/bin/sekalid", "usr/bin/sekalictl", "usr/lib/sekali/handlers/invoice.so",
        "usr/lib/sekali/handlers/sql.so",
        "usr/lib/sekali/handlers/http.so", "usr/share/man/man7/sekali-handlers.7",
        "usr/include/sekali/handler.h", "usr/lib/pkgconfig/sekali.pc",
        "usr/share/sekali/sql/001_idempotency_keys.sql", "usr/lib/systemd/system/sekali.service",
        "etc/sekali/sekali.yaml", "usr/lib/sysusers.d/sekali.conf",
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[2048];
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        ck_assert_msg(access(path, F_OK) == 0, "make install did not install %s", files[i]);
    }

    /* An operator's configuration survives a reinstall. */
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "echo '# mine' > %s/etc/sekali/sekali.yaml && "
             "make -s install B=%s PREFIX=%s/usr SYSCONFDIR=%s/etc 2>&1 && "
             "cat %s/etc/sekali/sekali.yaml", dir, h_build_dir(), dir, dir, dir);
    ck_assert_str_eq(run(cmd), "# mine\n");

    snprintf(cmd, sizeof(cmd), "PKG_CONFIG_PATH=%s/usr/lib/pkgconfig pkg-config --cflags sekali",
             dir);
    char expected[2048];
    snprintf(expected, sizeof(expected), "-I%s/usr/include", dir);
    ck_assert_msg(strstr(run(cmd), expected) != NULL, "pkg-config should give %s", expected);
    free(dir);
}
END_TEST

/* The unit runs as User=sekali: the installed configuration must be readable
 * by that user (root:sekali 0640) and pass `sekalid -t` as it, handler and
 * all. The scratch prefix is opened up so that sekali can reach it at all. */
START_TEST(test_installed_config_passes_the_check_as_the_units_user)
{
    h_init();
    char *dir = h_tmpdir("install-user");
    ck_assert_int_eq(chmod(dir, 0755), 0);
    install_into(dir);

    char conf[2048], cmd[8192];
    snprintf(conf, sizeof(conf), "%s/etc/sekali/sekali.yaml", dir);
    struct stat st;
    ck_assert_int_eq(stat(conf, &st), 0);
    struct group *g = getgrnam("sekali");
    ck_assert_msg(g != NULL, "make install should create the group sekali");
    ck_assert_msg(getpwnam("sekali") != NULL, "make install should create the user sekali");
    ck_assert_msg(st.st_uid == 0 && st.st_gid == g->gr_gid && (st.st_mode & 07777) == 0640,
                  "%s is %u:%u %04o, expected root:sekali 0640", conf, (unsigned)st.st_uid,
                  (unsigned)st.st_gid, (unsigned)(st.st_mode & 07777));

    /* Every directory above the scratch prefix must let sekali through. */
    char up[2048];
    snprintf(up, sizeof(up), "%s", dir);
    for (char *p = strrchr(up, '/'); p != NULL && p != up; p = strrchr(up, '/')) {
        *p = '\0';
        ck_assert_int_eq(stat(up, &st), 0);
        ck_assert_msg(st.st_mode & S_IXOTH, "%s is not searchable by sekali", up);
    }
    snprintf(cmd, sizeof(cmd), "runuser -u sekali -- env SEKALI_AMQP_PASSWORD=x "
             "SEKALI_PG_PASSWORD=y %s/usr/bin/sekalid -t -c %s 2>&1", dir, conf);
    char want[2200];
    snprintf(want, sizeof(want), "sekalid: configuration file %s test is successful\n", conf);
    ck_assert_str_eq(run(cmd), want);
    free(dir);
}
END_TEST

START_TEST(test_unit_verifies_and_rates_2_0_or_lower)
{
    h_init();
    char *dir = h_tmpdir("unit");
    install_into(dir);
    char unit[2048], cmd[4096];
    snprintf(unit, sizeof(unit), "%s/usr/lib/systemd/system/sekali.service", dir);
    snprintf(cmd, sizeof(cmd), "systemd-analyze verify %s 2>&1", unit);
    ck_assert_str_eq(run(cmd), "");

    snprintf(cmd, sizeof(cmd), "systemd-analyze security --offline=true %s 2>&1", unit);
    const char *report = run(cmd);
    const char *level = strstr(report, "Overall exposure level for sekali.service: ");
    ck_assert_msg(level != NULL, "no exposure level in:\n%s", report);
    double exposure = atof(level + strlen("Overall exposure level for sekali.service: "));
    ck_assert_msg(exposure <= 2.0, "the unit's exposure is %.1f, above 2.0", exposure);
    free(dir);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_install_lays_out_every_file_and_keeps_an_existing_config,
        test_unit_verifies_and_rates_2_0_or_lower,
        test_installed_config_passes_the_check_as_the_units_user,
        NULL,
    };
    return h_run_suite(h_suite("install", 120, tests));
}
