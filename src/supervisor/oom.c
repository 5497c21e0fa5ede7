/* oom.c - finds and reads the memory cgroup's OOM-kill counter (see
 * oom.h). Kept apart from supervisor.c: it is cgroup file-format parsing,
 * not process supervision. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "oom.h"

/* cgroup v1's memory.oom_control (also in hybrid mode, where the memory
 * controller is v1's), else cgroup v2's memory.events. */
void sk_oom_find(char *file, size_t size)
{
    file[0] = '\0';
    FILE *f = fopen("/proc/self/cgroup", "re");
    char line[1024], v1[512] = "", v2[512] = "";
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':');
        char *path = controllers != NULL ? strchr(controllers + 1, ':') : NULL;
        if (path == NULL)
            continue;
        *path++ = '\0';
        controllers++;
        if (strcmp(line, "0") == 0 && controllers[0] == '\0')
            snprintf(v2, sizeof(v2), "/sys/fs/cgroup%s/memory.events", path);
        for (char *c = strtok(controllers, ","); c != NULL; c = strtok(NULL, ","))
            if (strcmp(c, "memory") == 0)
                snprintf(v1, sizeof(v1), "/sys/fs/cgroup/memory%s/memory.oom_control", path);
    }
    if (f != NULL)
        fclose(f);
    if (v1[0] != '\0' && access(v1, R_OK) == 0)
        snprintf(file, size, "%s", v1);
    else if (v2[0] != '\0' && access(v2, R_OK) == 0)
        snprintf(file, size, "%s", v2);
}

/* The `oom_kill N` line of the counter file. */
long long sk_oom_kills(const char *file)
{
    if (file[0] == '\0')
        return -1;
    FILE *f = fopen(file, "re");
    char line[128];
    long long n = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "oom_kill %lld", &n) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return n;
}
