/* proctitle.c - process titles by overwriting the argv area, the way
 * nginx and PostgreSQL do on Linux.
 *
 * The kernel shows /proc/PID/cmdline from the memory the argv strings were
 * placed in at exec; environ's strings follow them in the same block. Once
 * both are copied elsewhere that whole block is ours to write a title into,
 * so the title may be longer than the original command line. */
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "proctitle.h"

extern char **environ;

static char  *area;      /* start of the original argv strings; NULL if unusable */
/* The environment, copied: the array environ points at, which setenv()
 * may drop for one it allocates, and a second array of the same strings,
 * never handed to glibc, since unsetenv() edits the first in place. Held
 * here, both stay reachable rather than leaked, whatever glibc does.
 * Volatile because nothing reads them: the compiler would drop the stores. */
static char **volatile environ_array;
static char **volatile environ_strings;
static size_t area_len;  /* contiguous bytes from area, through the last string's NUL */

static void free_strings(char **v, size_t n)
{
    if (v)
        for (size_t i = 0; i < n; i++)
            free(v[i]);
    free(v);
}

void sk_proctitle_init(int argc, char **argv)
{
    if (area || argc < 1 || !argv || !argv[0])
        return;
    /* Only strings laid out end to end belong to the block; stop at the
     * first gap so nothing not ours is overwritten. */
    char *start = argv[0];
    char *end = start;
    for (int i = 0; i < argc && argv[i] == end; i++)
        end = argv[i] + strlen(argv[i]) + 1;
    size_t n_env = 0;
    while (environ && environ[n_env])
        n_env++;
    for (size_t i = 0; i < n_env && environ[i] == end; i++)
        end = environ[i] + strlen(environ[i]) + 1;

    char **env = calloc(n_env + 1, sizeof *env);
    char **kept = calloc(n_env + 1, sizeof *kept);
    char **args = calloc((size_t)argc, sizeof *args);
    if (!env || !kept || !args) {
        free(env);
        free(kept);
        free(args);
        return;
    }
    for (size_t i = 0; i < n_env; i++)
        if (!(env[i] = strdup(environ[i]))) {
            free_strings(env, n_env);
            free_strings(args, (size_t)argc);
            free(kept);
            return;
        }
    for (int i = 0; i < argc; i++)
        if (!(args[i] = strdup(argv[i]))) {
            free_strings(env, n_env);
            free_strings(args, (size_t)argc);
            free(kept);
            return;
        }
    /* Only now, with every copy made, repoint: the old strings are dead. */
    memcpy(kept, env, n_env * sizeof *kept);
    environ_strings = kept;
    environ = environ_array = env;
    for (int i = 0; i < argc; i++)
        argv[i] = args[i];
    free(args);  /* the array only: the strings live on through argv */
    area = start;
    area_len = (size_t)(end - start);
}

void sk_proctitle_set(const char *title, const char *comm)
{
    if (title && area && area_len > 1) {
        size_t n = strnlen(title, area_len - 1);
        memcpy(area, title, n);
        memset(area + n, 0, area_len - n);
    }
    if (comm) {
        char name[16];  /* the kernel's TASK_COMM_LEN */
        strncpy(name, comm, sizeof name - 1);
        name[sizeof name - 1] = '\0';
        prctl(PR_SET_NAME, name, 0, 0, 0);
    }
}
