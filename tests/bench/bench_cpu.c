/* bench_cpu.c - CPU time used so far by process trees, from /proc.
 *
 *   bench_cpu NAME=PID...
 *
 * Prints "NAME_ms N" per argument: the user and system time of PID and of
 * every live descendant, plus what they spent in children they have reaped
 * (cutime, cstime), in milliseconds. Called before and after a run, the
 * difference is what that server did for the run: PostgreSQL's backends
 * that exit are reaped by the postmaster, so their time stays counted. The
 * machine is shared (other servers, other users): only these trees are
 * counted, never /proc/stat's whole-machine figures. A PID that is gone
 * counts 0. */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PROCS 65536

struct proc {
    long               pid, ppid;
    unsigned long long ticks;
};

static struct proc procs[MAX_PROCS];
static int         n_procs;

/* Fields after the command's closing parenthesis (the command may hold
 * spaces and parentheses): state ppid ... utime(14) stime cutime cstime. */
static int read_proc(long pid, struct proc *p)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *s = strrchr(buf, ')');
    if (s == NULL)
        return -1;
    long ppid;
    unsigned long long utime, stime, cutime, cstime;
    if (sscanf(s + 2, "%*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu", &ppid,
               &utime, &stime, &cutime, &cstime) != 5)
        return -1;
    p->pid = pid;
    p->ppid = ppid;
    p->ticks = utime + stime + cutime + cstime;
    return 0;
}

static unsigned long long tree_ticks(long root)
{
    unsigned long long sum = 0;
    for (int i = 0; i < n_procs; i++) {
        /* Walk up from each process: is root an ancestor (or itself)? */
        long pid = procs[i].pid;
        for (int depth = 0; depth < 64 && pid > 1; depth++) {
            if (pid == root) {
                sum += procs[i].ticks;
                break;
            }
            long parent = 0;
            for (int j = 0; j < n_procs; j++)
                if (procs[j].pid == pid) {
                    parent = procs[j].ppid;
                    break;
                }
            pid = parent;
        }
    }
    return sum;
}

int main(int argc, char **argv)
{
    DIR *d = opendir("/proc");
    if (d == NULL) {
        perror("bench_cpu: /proc");
        return 1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n_procs < MAX_PROCS) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        if (read_proc(atol(e->d_name), &procs[n_procs]) == 0)
            n_procs++;
    }
    closedir(d);
    long hz = sysconf(_SC_CLK_TCK);
    for (int i = 1; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq == NULL) {
            fprintf(stderr, "bench_cpu: expected NAME=PID, got %s\n", argv[i]);
            return 2;
        }
        long root = atol(eq + 1);
        unsigned long long ticks = root > 1 ? tree_ticks(root) : 0;
        printf("%.*s_ms %llu\n", (int)(eq - argv[i]), argv[i], ticks * 1000 / (unsigned long long)hz);
    }
    return 0;
}
