/* check_hardening.c - the binaries `make` builds, and the handlers it ships
 * (which run inside sekalid), carry the hardening the Debian package has
 * (dpkg-buildflags): full RELRO and immediate binding, the stack protector
 * and _FORTIFY_SOURCE, read off the ELF files with readelf and nm
 * (binutils). HARDEN=0 builds are not tested here. */
/* links: none */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suite.h"

/* Lines of cmd's output that contain needle. */
static int lines_with(const char *cmd, const char *needle)
{
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), p) != NULL)
        n += strstr(line, needle) != NULL;
    pclose(p);
    return n;
}

static void check_binary(const char *name)
{
    const char *build = getenv("SEKALI_BUILD") != NULL ? getenv("SEKALI_BUILD") : "build";
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "readelf -lW %s/%s", build, name);
    ck_assert_msg(lines_with(cmd, "GNU_RELRO") == 1, "%s: no RELRO segment", name);
    snprintf(cmd, sizeof(cmd), "readelf -dW %s/%s", build, name);
    ck_assert_msg(lines_with(cmd, "BIND_NOW") >= 1, "%s: not linked with -z now", name);
    snprintf(cmd, sizeof(cmd), "nm -D %s/%s", build, name);
    ck_assert_msg(lines_with(cmd, "__stack_chk_fail") == 1, "%s: no stack protector", name);
    /* `make asan` builds at -O1, where a small handler may have no call
     * whose size gcc can prove, so no _chk call; AddressSanitizer checks
     * those accesses itself there. */
    if (lines_with(cmd, "__asan_init") == 0)
        ck_assert_msg(lines_with(cmd, "_chk@") >= 1, "%s: no _FORTIFY_SOURCE checks", name);
}

START_TEST(test_sekalid_and_sekalictl_are_hardened)
{
    check_binary("sekalid");
    check_binary("sekalictl");
}
END_TEST

START_TEST(test_the_shipped_handlers_are_hardened)
{
    check_binary("handlers/sql.so");
    check_binary("handlers/http.so");
    check_binary("handlers/invoice.so");
}
END_TEST

int main(void)
{
    const TTest *tests[] = { test_sekalid_and_sekalictl_are_hardened,
                             test_the_shipped_handlers_are_hardened, NULL };
    /* readelf and nm on a loaded machine outlast check's default 4 s. */
    return h_run_suite(h_suite("hardening", 60, tests));
}
