/* console_guard.c - keeps the console reachable while slow clients hold
 * its connections, as the supervisor's metrics_http.c does for /livez.
 *
 * libmicrohttpd's timeout is an idle one, which a client sending a byte a
 * second never reaches, and at its connection limit it closes every new
 * connection at once: 64 such clients kept the console from answering for
 * as long as they liked. So a request must be in whole (headers and body)
 * within REQUEST_DEADLINE_MS of its connection's start or previous answer,
 * and libmicrohttpd is given one slot more than SK_CONSOLE_CONNECTIONS:
 * whenever that many are open, the connection that has waited longest for
 * its request is cut, so that the spare slot is free for whoever comes. A request
 * being answered (a long dead-letter scan) is never cut. A connection is
 * cut with shutdown(): its thread in libmicrohttpd reads the end of it and
 * closes it as it would any other, and keeps the descriptor its own. */
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "console.h"

#define REQUEST_DEADLINE_MS 10000
#define CHECK_MS            50
#define BUSY                INT64_MAX      /* answering: never cut */
#define CUT                 (INT64_MAX - 1) /* shut down, not yet closed */

struct sk_console_guard {
    pthread_mutex_t    lock;
    pthread_cond_t     wake;
    pthread_t          thread;
    bool               running, stop;
    int                fds[SK_CONSOLE_SLOTS];  /* -1: a free slot */
    int64_t            since[SK_CONSOLE_SLOTS];
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

struct sk_console_guard *sk_console_guard_new(void)
{
    struct sk_console_guard *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    pthread_mutex_init(&g->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g->wake, &attr);
    pthread_condattr_destroy(&attr);
    for (size_t i = 0; i < SK_CONSOLE_SLOTS; i++)
        g->fds[i] = -1;
    return g;
}

static int fd_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info != NULL ? info->connect_fd : -1;
}

void sk_console_guard_track(void *cls, struct MHD_Connection *conn, void **socket_context,
                            enum MHD_ConnectionNotificationCode code)
{
    struct sk_console_guard *g = cls;
    (void)socket_context;
    int fd = fd_of(conn);
    if (fd < 0)
        return;
    pthread_mutex_lock(&g->lock);
    for (size_t i = 0; i < SK_CONSOLE_SLOTS; i++) {
        if (code == MHD_CONNECTION_NOTIFY_STARTED && g->fds[i] < 0) {
            g->fds[i] = fd;
            g->since[i] = now_ms();
            break;
        }
        if (code == MHD_CONNECTION_NOTIFY_CLOSED && g->fds[i] == fd) {
            g->fds[i] = -1;
            break;
        }
    }
    pthread_mutex_unlock(&g->lock);
}

void sk_console_guard_busy(struct sk_console_guard *g, struct MHD_Connection *conn, bool busy)
{
    int fd = fd_of(conn);
    pthread_mutex_lock(&g->lock);
    for (size_t i = 0; i < SK_CONSOLE_SLOTS; i++)
        if (g->fds[i] == fd && fd >= 0 && g->since[i] != CUT)
            g->since[i] = busy ? BUSY : now_ms();
    pthread_mutex_unlock(&g->lock);
}

/* One look, under the lock: the late ones cut, then the longest waiting
 * one if the spare slot is taken. */
static void cut_slow(struct sk_console_guard *g)
{
    int64_t now = now_ms();
    size_t open = 0, oldest = SK_CONSOLE_SLOTS;
    bool cut = false;
    for (size_t i = 0; i < SK_CONSOLE_SLOTS; i++) {
        if (g->fds[i] < 0)
            continue;
        open++;
        if (g->since[i] >= CUT)
            continue;
        if (now - g->since[i] >= REQUEST_DEADLINE_MS) {
            shutdown(g->fds[i], SHUT_RDWR);
            g->since[i] = CUT;
            cut = true;
        } else if (oldest == SK_CONSOLE_SLOTS || g->since[i] < g->since[oldest]) {
            oldest = i;
        }
    }
    if (open >= SK_CONSOLE_CONNECTIONS && !cut && oldest < SK_CONSOLE_SLOTS) {
        shutdown(g->fds[oldest], SHUT_RDWR);
        g->since[oldest] = CUT;
    }
}

static void *watch(void *arg)
{
    struct sk_console_guard *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        cut_slow(g);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += CHECK_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->wake, &g->lock, &until);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

bool sk_console_guard_start(struct sk_console_guard *g)
{
    g->running = pthread_create(&g->thread, NULL, watch, g) == 0;
    return g->running;
}

/* Before MHD_stop_daemon: the descriptors it lists are about to close. */
void sk_console_guard_stop(struct sk_console_guard *g)
{
    if (g == NULL || !g->running)
        return;
    pthread_mutex_lock(&g->lock);
    g->stop = true;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    g->running = false;
}

void sk_console_guard_free(struct sk_console_guard *g)
{
    if (g == NULL)
        return;
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    free(g);
}
