/* harness_proc.c - the processes a test runs and watches: sekalid and
 * sekalictl as children (under valgrind when SEKALI_VALGRIND is set, with
 * sanitizer reports kept), their exits, and sekalid's own children. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness_private.h"

/* In a forked child before exec: stdout (and stderr, if both) to path,
 * opened with flags, and env (NAME=VALUE, NULL-terminated, or NULL) added
 * to the environment. False if path cannot be opened. */
static bool child_output(const char *path, int flags, bool both, const char *const *env)
{
    int fd = open(path, O_WRONLY | O_CREAT | flags, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || (both && dup2(fd, STDERR_FILENO) < 0))
        return false;
    for (; env != NULL && *env != NULL; env++)
        putenv((char *)*env);
    return true;
}

/* In a forked child before exec: stdin from /dev/null, stdout and stderr
 * to sp's files (truncated), one file for both when they are one path. */
static bool child_stdio(const struct h_spawn *sp)
{
    bool both = sp->out != NULL && sp->err != NULL && strcmp(sp->out, sp->err) == 0;
    int in = open("/dev/null", O_RDONLY);
    if (in < 0 || dup2(in, STDIN_FILENO) < 0)
        return false;
    if (sp->out != NULL && !child_output(sp->out, O_TRUNC, both, NULL))
        return false;
    int fd = sp->err == NULL || both ? STDERR_FILENO
           : open(sp->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    return fd >= 0 && (fd == STDERR_FILENO || dup2(fd, STDERR_FILENO) >= 0);
}

/* The first H_SPAWN_READ_MAX bytes of the file at path, NUL-terminated, or
 * NULL if it cannot be read; the caller frees. A child that writes without
 * end costs the test no more than that. */
static char *read_bounded(const char *path)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return NULL;
    char *buf = malloc((size_t)H_SPAWN_READ_MAX + 1);
    ck_assert_ptr_nonnull(buf);
    size_t len = fread(buf, 1, H_SPAWN_READ_MAX, f);
    fclose(f);
    buf[len] = '\0';
    return buf;
}

pid_t h_start_sekalid(const char *binary, const char *config, const char *dir,
                      const char *const *extra_env)
{
    char exe[1024], log[1024], vg_log[1024];
    snprintf(exe, sizeof(exe), "%s/%s", h_build_dir(), binary);
    snprintf(log, sizeof(log), "%s/sekalid.log", dir);
    snprintf(vg_log, sizeof(vg_log), "--log-file=%s/valgrind.%%p.log", dir);

    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!child_output(log, O_APPEND, true, extra_env))
            _exit(120);
        /* Sanitizer reports go to files that h_stop_sekalid() looks for: a
         * worker that aborts on one is restarted, and its report would
         * otherwise vanish in the log of a test that still passes. */
        char asan[1200], ubsan[1200];
        snprintf(asan, sizeof(asan),
                 "detect_leaks=1:abort_on_error=1:verify_asan_link_order=0:log_path=%s/asan", dir);
        snprintf(ubsan, sizeof(ubsan), "print_stacktrace=1:log_path=%s/ubsan", dir);
        setenv("ASAN_OPTIONS", asan, 1);
        setenv("UBSAN_OPTIONS", ubsan, 1);
        if (getenv("SEKALI_VALGRIND") != NULL) {
            execlp("valgrind", "valgrind", "-q", "--leak-check=full",
                   "--errors-for-leak-kinds=definite", "--show-leak-kinds=definite",
                   vg_log, exe, "-c", config, (char *)NULL);
        } else {
            execl(exe, exe, "-c", config, (char *)NULL);
        }
        _exit(127);
    }
    return pid;
}

int h_wait_exit(pid_t pid, int timeout_ms, const char *what)
{
    int64_t deadline = h_now_ms() + h_ms(timeout_ms);
    for (;;) {
        int status;
        pid_t got = waitpid(pid, &status, WNOHANG);
        ck_assert_int_ge(got, 0);
        if (got == pid)
            return status;
        if (h_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            ck_abort_msg("%s: process %ld did not exit within %d ms", what, (long)pid,
                         h_ms(timeout_ms));
        }
        h_nap();
    }
}

void h_stop_sekalid(pid_t pid, const char *dir)
{
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    int status = h_wait_exit(pid, 30000, "sekalid after SIGTERM");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "sekalid should exit 0 after SIGTERM, got status 0x%x (see %s/sekalid.log)",
                  status, dir);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "ls %s/asan.* %s/ubsan.* >/dev/null 2>&1", dir, dir);
    ck_assert_msg(system(cmd) != 0, "a sanitizer reported errors: see %s/asan.* or ubsan.*", dir);
    if (getenv("SEKALI_VALGRIND") != NULL) {
        snprintf(cmd, sizeof(cmd), "cat %s/valgrind.*.log 2>/dev/null | grep -q .", dir);
        ck_assert_msg(system(cmd) != 0, "valgrind reported errors: see %s/valgrind.*.log",
                      dir);
    }
}

int h_sekalictl(struct h_run *r, char **out, const char *const *args)
{
    return h_sekalictl_as(r, "sekalictl", NULL, out, args);
}

int h_sekalictl_as(struct h_run *r, const char *binary, const char *const *env, char **out,
                   const char *const *args)
{
    char path[1100];
    snprintf(path, sizeof(path), "%s/ctl.out", r->dir);
    const char *argv[H_SPAWN_ARGS + 1] = { "-c", r->config };
    size_t n = 2;
    for (; *args != NULL; args++) {
        ck_assert_msg(n < H_SPAWN_ARGS, "h_sekalictl_as: too many arguments");
        argv[n++] = *args;
    }
    argv[n] = NULL;
    struct h_spawn sp = { .binary = binary, .args = argv, .env = env, .out = path };
    int code = h_spawn(&sp, 60000, out, NULL);
    ck_assert_ptr_nonnull(*out);
    return code;
}

pid_t h_spawn_start(const struct h_spawn *sp)
{
    char exe[1100];
    snprintf(exe, sizeof(exe), "%s/%s", h_build_dir(), sp->binary);
    const char *argv[H_SPAWN_ARGS + 2] = { exe };
    size_t n = 1;
    for (const char *const *a = sp->args; a != NULL && *a != NULL; a++) {
        ck_assert_msg(n <= H_SPAWN_ARGS, "h_spawn: %s: more than %d arguments", sp->binary,
                      H_SPAWN_ARGS);
        argv[n++] = *a;
    }
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "h_spawn: fork for %s: %s", sp->binary, strerror(errno));
    if (pid == 0) {
        for (const char *const *e = sp->env; e != NULL && *e != NULL; e++)
            putenv((char *)*e);
        if (child_stdio(sp))
            execv(exe, (char **)argv);
        _exit(127);
    }
    return pid;
}

int h_spawn_wait(const struct h_spawn *sp, pid_t pid, int timeout_ms, char **out, char **err)
{
    char what[1200];
    snprintf(what, sizeof(what), "%s (its output in %s)", sp->binary,
             sp->out != NULL ? sp->out : sp->err != NULL ? sp->err : "the test's log");
    int status = h_wait_exit(pid, timeout_ms, what);
    if (out != NULL)
        *out = sp->out != NULL ? read_bounded(sp->out) : NULL;
    if (err != NULL)
        *err = sp->err != NULL ? read_bounded(sp->err) : NULL;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int h_spawn(const struct h_spawn *sp, int timeout_ms, char **out, char **err)
{
    return h_spawn_wait(sp, h_spawn_start(sp), timeout_ms, out, err);
}

pid_t h_stalled_pid(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    pid_t pid = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "stall.", 6) == 0)
            pid = (pid_t)atol(e->d_name + 6);
    closedir(d);
    return pid;
}

/* Whether /proc/<pid>/stat names parent as pid's parent, and pid is not a
 * zombie. */
static bool is_live_child(long pid, pid_t parent)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* pid (comm) state ppid: comm may hold spaces, so after the last ')'. */
    const char *rp = strrchr(buf, ')');
    char state;
    long ppid;
    return rp != NULL && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent &&
           state != 'Z';
}

size_t h_children(pid_t parent, pid_t *out, size_t max)
{
    size_t n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d != NULL && n < max && (e = readdir(d)) != NULL) {
        long pid = atol(e->d_name);
        if (pid > 0 && is_live_child(pid, parent))
            out[n++] = (pid_t)pid;
    }
    if (d != NULL)
        closedir(d);
    return n;
}

pid_t h_serve_console(const char *config, const char *log)
{
    pid_t pid = h_spawn_start(&(struct h_spawn){
        .binary = "sekalictl", .args = (const char *const[]){ "-c", config, "serve", NULL },
        .out = log, .err = log });
    H_WAIT(({ char *t = h_read_file(log); bool up = t && strstr(t, "console on"); free(t); up; }),
           10000, "sekalictl serve should start (see %s)", log);
    return pid;
}

pid_t h_worker_pid(pid_t sekalid, pid_t not)
{
    pid_t pids[16];
    size_t n = h_children(sekalid, pids, 16);
    for (size_t i = 0; i < n; i++) {
        char path[64], comm[32] = "";
        snprintf(path, sizeof(path), "/proc/%ld/comm", (long)pids[i]);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        bool worker = fgets(comm, sizeof(comm), f) != NULL && strncmp(comm, "sk-worker", 9) == 0;
        fclose(f);
        if (worker && pids[i] != not)
            return pids[i];
    }
    return 0;
}

bool h_process_gone(pid_t pid)
{
    return kill(pid, 0) != 0 && errno == ESRCH;
}
