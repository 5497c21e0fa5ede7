/* failpoint.c - the fault build's self-kill at a named step (see failpoint.h). */
#ifdef SK_FAULTS

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "failpoint.h"

/* Lines in the mark file: how often a failpoint fired so far. */
static long fired(const char *mark)
{
    FILE *f = fopen(mark, "re");
    long lines = 0;
    for (int c; f != NULL && (c = fgetc(f)) != EOF;)
        lines += c == '\n';
    if (f != NULL)
        fclose(f);
    return lines;
}

void sk_failpoint(const char *name, const char *key)
{
    const char *armed = getenv("SEKALI_FAILPOINT");
    if (armed == NULL)
        return;
    size_t name_len = strlen(name);
    if (strncmp(armed, name, name_len) != 0)
        return;
    if (armed[name_len] == ':') {
        if (key == NULL || strcmp(armed + name_len + 1, key) != 0)
            return;
    } else if (armed[name_len] != '\0') {
        return;
    }

    const char *mark = getenv("SEKALI_FAILPOINT_MARK");
    /* SEKALI_FAILPOINT_ONCE: only the first process to get here dies, so a
     * respawned process goes past the point (needs the mark file). */
    if (mark != NULL && getenv("SEKALI_FAILPOINT_ONCE") != NULL && access(mark, F_OK) == 0)
        return;
    /* SEKALI_FAILPOINT_TIMES=N: only the first N processes die (the mark
     * file has a line per death), so a chain of replacements can be killed. */
    const char *times = getenv("SEKALI_FAILPOINT_TIMES");
    if (mark != NULL && times != NULL && fired(mark) >= atol(times))
        return;
    if (mark != NULL) {
        int fd = open(mark, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            char line[64];
            int n = snprintf(line, sizeof(line), "%ld %s\n", (long)getpid(), name);
            ssize_t ignored = write(fd, line, (size_t)n);
            (void)ignored;
            close(fd);
        }
    }
    raise(SIGKILL);
}

bool sk_fault_active(const char *name)
{
    size_t len = strlen(name);
    const char *p = getenv("SEKALI_FAULTS");
    while (p != NULL && *p != '\0') {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, name, len) == 0)
            return true;
        p += n;
        if (*p == ',')
            p++;
    }
    return false;
}

void sk_fault_hold(const char *name)
{
    const char *file = getenv("SEKALI_HOLD_FILE");
    if (file == NULL || !sk_fault_active(name))
        return;
    while (access(file, F_OK) == 0)
        usleep(20000);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int sk_failpoint_unused;
#endif
