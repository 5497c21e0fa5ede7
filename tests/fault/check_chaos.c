/* check_chaos.c - the short chaos soak, as part of the test suite.
 *
 * Runs tests/chaos/run.sh with CHAOS_SHORT=1 (2,000 keys, 30 % published
 * twice, a worker SIGKILLed every 100-200 ms, a worker stopped past its lock,
 * Redis, RabbitMQ and PostgreSQL restarted; see the script) against the
 * production sekalid, and holds it to its result line: every key exactly one
 * effect, every fault happened and was verified. The script restarts the
 * servers, so this suite runs with the fault suites, after the others. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

/* The value of "name=" in line, as a number; -1 if it is missing. */
static long field(const char *line, const char *name)
{
    char key[64];
    snprintf(key, sizeof(key), " %s=", name);
    const char *p = strstr(line, key);
    return p != NULL ? strtol(p + strlen(key), NULL, 10) : -1;
}

START_TEST(test_short_soak_gives_every_key_exactly_one_effect_under_faults)
{
    h_init();
    char *dir = h_tmpdir("chaos");
    char cmd[2048];
    /* Its deadline stretches with the harness's (valgrind, sanitizers). */
    snprintf(cmd, sizeof(cmd),
             "CHAOS_SHORT=1 CHAOS_TIMEOUT=%d tests/chaos/run.sh '%s' >'%s/line' 2>'%s/log'",
             h_ms(45000) / 1000, h_build_dir(), dir, dir);
    int status = system(cmd);

    char path[1024];
    snprintf(path, sizeof(path), "%s/log", dir);
    char *log = h_read_file(path);
    snprintf(path, sizeof(path), "%s/line", dir);
    char *line = h_read_file(path);
    ck_assert_msg(line != NULL && strncmp(line, "chaos: keys=", 12) == 0,
                  "the soak should print its result line; its output:\n%s", log ? log : "");
    ck_assert_msg(strchr(line, '\n') == line + strlen(line) - 1, "one line expected: %s", line);
    const char *tail = log != NULL && strlen(log) > 1500 ? log + strlen(log) - 1500 : log;

    /* Exactly once: the figures the soak exits on, checked here by name. */
    ck_assert_msg(field(line, "doubled") == 0, "no key may have two effects: %s%s", line, tail);
    ck_assert_msg(field(line, "lost") == 0, "every key needs its effect: %s%s", line, tail);
    ck_assert_msg(field(line, "effects") == field(line, "keys"), "effects != keys: %s", line);
    /* Every fault happened and was proven. */
    ck_assert_msg(field(line, "kills") > 0, "workers should have been killed: %s", line);
    ck_assert_msg(field(line, "stops") == 1, "a worker should have been stopped: %s", line);
    ck_assert_msg(strstr(line, " restarts=redis:1,rabbitmq:1,postgres:1 ") != NULL,
                  "each server should have been restarted once: %s", line);
    ck_assert_msg(field(line, "unverified") == 0, "every fault must be verified: %s%s", line, tail);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the soak should exit 0 (status %d): %s%s", status, line, tail);
    free(line);
    free(log);
    free(dir);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_short_soak_gives_every_key_exactly_one_effect_under_faults,
        NULL,
    };
    return h_run_suite(h_suite("chaos", 600, tests));
}
