/* bench_sekalid.c - runs sekalid until N jobs of a queue are completed, and
 * measures it: elapsed time, and the workers' memory.
 *
 *   bench_sekalid SEKALID CONF LOG CONNINFO QUEUE N TIMEOUT_S
 *
 * Starts SEKALID -c CONF (stdout and stderr appended to LOG), then polls
 * sekali.idempotency_keys every POLL_MS over one connection opened
 * beforehand, until N keys of QUEUE are completed, or TIMEOUT_S passes, or
 * sekalid exits by itself. The poll is a C loop rather than psql in a shell
 * loop: a process and a connection per poll would cost more than the poll.
 *
 * The clock starts at fork(), so the elapsed time includes sekalid's start-up
 * (loading, forking, connecting), as an operator would see it. It stops at
 * the last job's effect: the largest `committed` (clock_timestamp() in the
 * job's transaction, tests/bench/bench_handler.c) of QUEUE in
 * sekali_bench.jobs, read once all keys are completed. That is exact whatever
 * the poll interval, which matters because the count is a scan of the keys
 * table that takes milliseconds at 20000 keys: polling it every 20 ms would
 * take a third of a core from the 2-core machine being measured, and every
 * 100 ms it takes a few percent. The poll's own view ("detected_s") is
 * printed too, and so is the first effect's time ("first_effect_s"): how
 * much of the elapsed time was sekalid starting up.
 *
 * Memory: the workers are sekalid's children. Their VmRSS is sampled when a
 * quarter of the jobs are done and again when all are, with their PSS (RSS
 * with each shared page divided among the processes mapping it: what one
 * more worker costs, since most of an RSS is shared library text), and VmHWM
 * (the peak RSS, connecting included) just before the stop; the growth
 * between the two samples is what running three quarters of the jobs cost
 * in memory, which should be nothing.
 *
 * Then SIGTERM, and sekalid must exit 0 within STOP_TIMEOUT_S.
 *
 * CPU: once sekalid is reaped, getrusage(RUSAGE_CHILDREN) is the user and
 * system time of sekalid and of every worker it reaped ("sekali_cpu_ms"),
 * start-up and stop included; this driver's own polling is not in it.
 *
 * With BENCH_LOOP in the environment, SEKALID is the hand-written loop
 * (tests/bench/bench_loop.c), and a job is done when its key is in
 * sekali_bench.loop_keys.
 *
 * Prints "name value" lines on stdout for run.sh; exits 1 on a timeout, an
 * early exit, or an unclean stop, saying why on stderr. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#define POLL_MS        100
#define STOP_TIMEOUT_S 30
#define MAX_WORKERS    256

struct sample {
    int  n;
    long pid[MAX_WORKERS];
    long kib[MAX_WORKERS];
};

static long long count_completed(PGconn *pg, const char *queue);
static int effect_span_us(PGconn *pg, const char *queue, int64_t *first, int64_t *last);
static void sample(pid_t parent, const char *file, const char *field, struct sample *out);
static long proc_kib(long pid, const char *file, const char *field);
static int stop(pid_t pid, const char *log);
static double now_s(void);
static void nap_ms(int ms);

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: bench_sekalid SEKALID CONF LOG CONNINFO QUEUE N TIMEOUT_S\n");
        return 2;
    }
    const char *sekalid = argv[1], *conf = argv[2], *log = argv[3], *conninfo = argv[4],
               *queue = argv[5];
    long long n = atoll(argv[6]);
    double timeout_s = atof(argv[7]);

    PGconn *pg = PQconnectdb(conninfo);
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "bench_sekalid: PostgreSQL: %s", PQerrorMessage(pg));
        return 1;
    }
    /* BENCH_LOOP set: SEKALID is tests/bench/bench_loop.c, whose proof of
     * a done job is its bare key row. */
    /* BENCH_EFFECTS set: the queue keeps millions of other keys
     * (tests/bench/scale.sh), which counting would read; the effects,
     * committed with each key, are this run's alone. */
    const char *done_sql = getenv("BENCH_LOOP") != NULL
        ? "SELECT count(*) FROM sekali_bench.loop_keys WHERE queue = $1"
        : getenv("BENCH_EFFECTS") != NULL
        ? "SELECT count(*) FROM sekali_bench.jobs WHERE queue = $1"
        : "SELECT count(*) FROM sekali.idempotency_keys WHERE queue = $1 AND status = 'completed'";
    PGresult *res = PQprepare(pg, "done", done_sql, 1, NULL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        fprintf(stderr, "bench_sekalid: PQprepare: %s", PQresultErrorMessage(res));
        return 1;
    }
    PQclear(res);

    res = PQprepare(pg, "span",
                    "SELECT (extract(epoch FROM min(committed)) * 1e6)::bigint, "
                    "       (extract(epoch FROM max(committed)) * 1e6)::bigint "
                    "FROM sekali_bench.jobs WHERE queue = $1", 1, NULL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        fprintf(stderr, "bench_sekalid: PQprepare: %s", PQresultErrorMessage(res));
        return 1;
    }
    PQclear(res);

    fflush(NULL);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);  /* PostgreSQL's clock_timestamp() is this clock */
    int64_t start_us = (int64_t)wall.tv_sec * 1000000 + wall.tv_nsec / 1000;
    double start = now_s();
    pid_t pid = fork();
    if (pid < 0) {
        perror("bench_sekalid: fork");
        return 1;
    }
    if (pid == 0) {
        /* If this driver dies (run.sh interrupted), sekalid stops too, and
         * its workers follow it: no daemon is left consuming a bench queue. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execl(sekalid, sekalid, "-c", conf, (char *)NULL);
        _exit(127);
    }

    struct sample rss25 = { 0 }, rss100 = { 0 }, pss100 = { 0 }, hwm = { 0 };
    long long done = 0;
    double detected = 0;
    int status;
    for (;;) {
        done = count_completed(pg, queue);
        if (done < 0) {
            stop(pid, log);
            return 1;
        }
        if (rss25.n == 0 && done * 4 >= n)
            sample(pid, "status", "VmRSS:", &rss25);
        if (done >= n) {
            detected = now_s() - start;
            sample(pid, "status", "VmRSS:", &rss100);
            sample(pid, "smaps_rollup", "Pss:", &pss100);
            break;
        }
        if (waitpid(pid, &status, WNOHANG) == pid) {
            fprintf(stderr, "bench_sekalid: sekalid exited early (status 0x%x) with %lld of "
                    "%lld jobs of %s completed; see %s\n", status, done, n, queue, log);
            return 1;
        }
        if (now_s() - start > timeout_s) {
            fprintf(stderr, "bench_sekalid: timed out after %.0f s with %lld of %lld jobs of "
                    "%s completed; see %s\n", timeout_s, done, n, queue, log);
            stop(pid, log);
            return 1;
        }
        nap_ms(POLL_MS);
    }
    /* The peak is read while the workers still live: /proc forgets it at exit. */
    sample(pid, "status", "VmHWM:", &hwm);
    int stopped = stop(pid, log);
    int64_t first_us, last_us;
    int spanned = effect_span_us(pg, queue, &first_us, &last_us);
    PQfinish(pg);
    if (spanned != 0)
        return 1;
    double elapsed = (double)(last_us - start_us) / 1e6;

    printf("done %lld\n", done);
    printf("elapsed_s %.3f\n", elapsed);
    printf("detected_s %.3f\n", detected);
    printf("first_effect_s %.3f\n", (double)(first_us - start_us) / 1e6);
    printf("jobs_per_s %.1f\n", elapsed > 0 ? (double)n / elapsed : 0.0);
    printf("workers %d\n", hwm.n);
    long max_hwm = 0, max_rss = 0, max_pss = 0, max_growth = 0, min_growth = 0;
    bool same_workers = rss25.n == rss100.n;
    for (int i = 0; i < hwm.n; i++)
        if (hwm.kib[i] > max_hwm)
            max_hwm = hwm.kib[i];
    for (int i = 0; i < rss100.n; i++)
        if (rss100.kib[i] > max_rss)
            max_rss = rss100.kib[i];
    for (int i = 0; i < pss100.n; i++)
        if (pss100.kib[i] > max_pss)
            max_pss = pss100.kib[i];
    for (int i = 0; same_workers && i < rss100.n; i++) {
        same_workers = rss25.pid[i] == rss100.pid[i];
        long growth = rss100.kib[i] - rss25.kib[i];
        if (growth > max_growth)
            max_growth = growth;
        if (growth < min_growth)
            min_growth = growth;
        printf("worker %ld rss25_kib %ld rss100_kib %ld\n", rss100.pid[i], rss25.kib[i],
               rss100.kib[i]);
    }
    printf("max_hwm_kib %ld\n", max_hwm);
    printf("max_rss_kib %ld\n", max_rss);
    printf("max_pss_kib %ld\n", max_pss);
    /* The growth that matters is the largest; a shrink is reported if no
     * worker grew, so that a big negative number is not hidden either. */
    printf("rss_growth_kib %ld\n", max_growth > 0 ? max_growth : min_growth);
    printf("same_workers %d\n", same_workers ? 1 : 0);
    struct rusage children;
    if (getrusage(RUSAGE_CHILDREN, &children) == 0)
        printf("sekali_cpu_ms %.0f\n",
               (double)(children.ru_utime.tv_sec + children.ru_stime.tv_sec) * 1e3 +
               (double)(children.ru_utime.tv_usec + children.ru_stime.tv_usec) / 1e3);
    return stopped;
}

static long long count_completed(PGconn *pg, const char *queue)
{
    const char *values[] = { queue };
    PGresult *res = PQexecPrepared(pg, "done", 1, values, NULL, NULL, 0);
    long long n = -1;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        n = atoll(PQgetvalue(res, 0, 0));
    else
        fprintf(stderr, "bench_sekalid: counting completed keys: %s",
                PQresultErrorMessage(res));
    PQclear(res);
    return n;
}

/* CLOCK_REALTIME microseconds of the first and the last effect of queue.
 * Returns 0, or 1 after saying why. */
static int effect_span_us(PGconn *pg, const char *queue, int64_t *first, int64_t *last)
{
    const char *values[] = { queue };
    PGresult *res = PQexecPrepared(pg, "span", 1, values, NULL, NULL, 0);
    int rc = 1;
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
        !PQgetisnull(res, 0, 0)) {
        *first = atoll(PQgetvalue(res, 0, 0));
        *last = atoll(PQgetvalue(res, 0, 1));
        rc = 0;
    } else {
        fprintf(stderr, "bench_sekalid: no effects of %s in sekali_bench.jobs: %s", queue,
                PQresultErrorMessage(res));
    }
    PQclear(res);
    return rc;
}

/* The workers are the processes whose parent is sekalid (pgrep -P), listed in
 * pid order so that two samples line up worker by worker. */
static void sample(pid_t parent, const char *file, const char *field, struct sample *out)
{
    out->n = 0;
    DIR *proc = opendir("/proc");
    if (proc == NULL)
        return;
    struct dirent *d;
    while ((d = readdir(proc)) != NULL && out->n < MAX_WORKERS) {
        if (!isdigit((unsigned char)d->d_name[0]))
            continue;
        char path[300], buf[512];
        snprintf(path, sizeof(path), "/proc/%s/stat", d->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        /* "pid (comm) state ppid ...": comm may hold spaces, so after the last ')'. */
        char *close = strrchr(buf, ')');
        char state;
        long ppid;
        if (close == NULL || sscanf(close + 1, " %c %ld", &state, &ppid) != 2 || ppid != parent)
            continue;
        long pid = atol(d->d_name);
        int i = out->n++;
        while (i > 0 && out->pid[i - 1] > pid) {
            out->pid[i] = out->pid[i - 1];
            out->kib[i] = out->kib[i - 1];
            i--;
        }
        out->pid[i] = pid;
        out->kib[i] = proc_kib(pid, file, field);
    }
    closedir(proc);
}

/* A "Field:   N kB" line of /proc/PID/FILE. */
static long proc_kib(long pid, const char *file, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%ld/%s", pid, file);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, field, strlen(field)) == 0)
            kib = atol(line + strlen(field));
    fclose(f);
    return kib;
}

/* SIGTERM, then wait; sekalid must exit 0 (its workers finish the job in
 * hand and ack). Returns 0 if it did, 1 otherwise. */
static int stop(pid_t pid, const char *log)
{
    kill(pid, SIGTERM);
    double deadline = now_s() + STOP_TIMEOUT_S;
    int status;
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (now_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fprintf(stderr, "bench_sekalid: sekalid did not exit within %d s of SIGTERM; "
                    "killed (see %s)\n", STOP_TIMEOUT_S, log);
            return 1;
        }
        nap_ms(10);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "bench_sekalid: sekalid should exit 0 after SIGTERM, got status 0x%x "
                "(see %s)\n", status, log);
        return 1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void nap_ms(int ms)
{
    struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&t, &t) == -1 && errno == EINTR)
        ;
}
