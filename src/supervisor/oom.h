/* oom.h - the memory cgroup's OOM-kill counter, shared by sekalid and
 * its workers: how the supervisor tells a worker the kernel's OOM killer
 * SIGKILLed (its job's doing) from one killed from outside. */
#ifndef SK_OOM_H
#define SK_OOM_H

#include <stddef.h>

/* Writes the path of this process's counter file into file (size bytes),
 * or "" when none is readable. */
void sk_oom_find(char *file, size_t size);

/* The counter's value, or -1 when file is "" or cannot be read. */
long long sk_oom_kills(const char *file);

#endif
