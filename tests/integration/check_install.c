/* check_install.c - `make install` and the systemd unit it installs.
 *
 * Installs into a scratch prefix (paths in the unit then point at files that
 * exist), and runs the real systemd-analyze on the result: the unit must
 * verify cleanly and rate 2.0 or lower in the offline security analysis. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        "usr/include/sekali/handler.h", "usr/lib/pkgconfig/sekali.pc",
        "usr/share/sekali/sql/001_idempotency_keys.sql", "usr/lib/systemd/system/sekali.service",
        "etc/sekali/sekali.yaml",
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
        NULL,
    };
    return h_run_suite(h_suite("install", 120, tests));
}
