/* check_titles.c - every sekalid process and thread says what it is in
 * ps (/proc/PID/cmdline), top (/proc/PID/comm) and per thread; the
 * supervisor, which forks, is a single thread. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* /proc/<pid>/<file> as text: cmdline up to its first NUL, with the
 * assertion that only NULs follow (the rest of the old argv area). */
static void read_proc(const char *path, char *out, size_t size)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "fopen(%s): %s", path, strerror(errno));
    size_t n = fread(out, 1, size - 1, f);
    fclose(f);
    out[n] = '\0';
    size_t len = strlen(out);
    for (size_t i = len; i < n; i++)
        ck_assert_msg(out[i] == '\0', "%s has bytes after its title at %zu", path, i);
    if (len > 0 && out[len - 1] == '\n')
        out[len - 1] = '\0';
}

/* Children of parent: fills pids (up to max) and returns how many. */
static size_t children(pid_t parent, pid_t *pids, size_t max)
{
    size_t n = 0;
    DIR *proc = opendir("/proc");
    ck_assert(proc != NULL);
    struct dirent *e;
    while ((e = readdir(proc)) != NULL && n < max) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        char path[300], stat[1024];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;  /* gone meanwhile */
        size_t len = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[len] = '\0';
        const char *close = strrchr(stat, ')');  /* comm may hold spaces */
        char state;
        int ppid;
        if (close && sscanf(close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
            pids[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(proc);
    return n;
}

/* Whether any thread of pid is named name. */
static bool has_thread(pid_t pid, const char *name)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *tasks = opendir(path);
    if (tasks == NULL)
        return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(tasks)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        char comm_path[600], comm[64];
        snprintf(comm_path, sizeof comm_path, "%s/%s/comm", path, e->d_name);
        read_proc(comm_path, comm, sizeof comm);
        found = strcmp(comm, name) == 0;
    }
    closedir(tasks);
    return found;
}

/* How many threads pid has. */
static size_t threads(pid_t pid)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *tasks = opendir(path);
    ck_assert_msg(tasks != NULL, "opendir(%s): %s", path, strerror(errno));
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(tasks)) != NULL)
        n += isdigit((unsigned char)e->d_name[0]) != 0;
    closedir(tasks);
    return n;
}

START_TEST(test_supervisor_workers_relay_janitor_and_threads_carry_their_titles)
{
    /* Under valgrind, /proc/PID/cmdline is valgrind's copy of argv. */
    if (getenv("SEKALI_VALGRIND") != NULL)
        return;
    struct h_run r;
    h_run_open(&r, "titles");
    char second[160], queue_yaml[600], top[300];
    snprintf(second, sizeof second, "%s-b", r.queue);
    snprintf(queue_yaml, sizeof queue_yaml,
             "  - name: %s\n    handler: %s/" H_EFFECT "\n    workers: 2\n", second,
             h_build_dir());
    snprintf(top, sizeof top, H_RELAY "metrics:\n  listen: 127.0.0.1:%d\n", h_free_port());
    /* h_run_start() waits for the first queue's consumers only: declared
     * here, the second one exists before its workers do, and counting its
     * consumers cannot find it missing (a 404 that closed the channel). */
    ck_assert_int_eq(sk_broker_declare(r.b, second, NULL, NULL), SK_OK);
    h_run_start(&r, &(struct h_run_opts){ .workers = 2, .queue_yaml = queue_yaml,
                                          .top_yaml = top });
    H_WAIT(h_consumers(r.b, second) == 2, 20000, "the second queue should have 2 consumers");

    char path[300], text[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)r.sekalid);
    read_proc(path, text, sizeof text);
    ck_assert_str_eq(text, "sekalid: supervisor");
    snprintf(path, sizeof path, "/proc/%d/comm", (int)r.sekalid);
    read_proc(path, text, sizeof text);
    ck_assert_str_eq(text, "sk-supervisor");
    ck_assert_msg(threads(r.sekalid) == 1, "the supervisor should be one thread, has %zu "
                  "(it forks: another thread's locks would be copied held)",
                  threads(r.sekalid));

    /* 2 + 2 workers, 1 relay, 1 janitor: each title exactly once. */
    char expected[6][300];
    const char *comms[6] = { "sk-worker", "sk-worker", "sk-worker", "sk-worker",
                             "sk-relay", "sk-janitor" };
    snprintf(expected[0], sizeof expected[0], "sekalid: worker %s#1", r.queue);
    snprintf(expected[1], sizeof expected[1], "sekalid: worker %s#2", r.queue);
    snprintf(expected[2], sizeof expected[2], "sekalid: worker %s#1", second);
    snprintf(expected[3], sizeof expected[3], "sekalid: worker %s#2", second);
    snprintf(expected[4], sizeof expected[4], "sekalid: outbox relay #1");
    snprintf(expected[5], sizeof expected[5], "sekalid: janitor");
    bool seen[6] = { false };
    pid_t pids[32];
    size_t n = children(r.sekalid, pids, 32);
    ck_assert_msg(n == 6, "the supervisor should have 6 children, has %zu", n);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pids[i]);
        read_proc(path, text, sizeof text);
        size_t j = 0;
        while (j < 6 && (seen[j] || strcmp(text, expected[j]) != 0))
            j++;
        ck_assert_msg(j < 6, "child %d has an unexpected or repeated title '%s'",
                      (int)pids[i], text);
        seen[j] = true;
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pids[i]);
        read_proc(path, text, sizeof text);
        ck_assert_msg(strcmp(text, comms[j]) == 0, "'%s' should be named %s in top, is %s",
                      expected[j], comms[j], text);
        if (j < 4)
            H_WAIT(has_thread(pids[i], "sk-heartbeat"), 5000,
                   "worker '%s' has no sk-heartbeat thread", expected[j]);
    }
    h_run_stop(&r);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_supervisor_workers_relay_janitor_and_threads_carry_their_titles,
        NULL,
    };
    return h_run_suite(h_suite("titles", 120, tests));
}
