/* delay_proxy.c - a TCP proxy that makes a server look far away: every byte
 * is held DELAY ms (plus up to JITTER ms) in each direction before it is
 * passed on. The distance benchmark (tests/bench/distance.sh) puts one in
 * front of PostgreSQL, Redis and RabbitMQ.
 *
 *   delay_proxy [-v] LPORT:THOST:TPORT:DELAY_MS[:JITTER_MS[:FAULT_MS[:FAULT_JITTER_MS]]] ...
 *
 * Listens on 127.0.0.1:LPORT for each mapping (0: a free port) and relays
 * each accepted connection to THOST:TPORT, dialled anew for each one (so a
 * server restarted behind it is found again). Once every listener is bound
 * it prints "ready" and the listening ports, in the order of the mappings,
 * on one line of stdout; SIGTERM or SIGINT stop it.
 *
 * A fault can be switched on while it runs: SIGUSR1 makes every mapping
 * hold what it reads from then on FAULT_MS (default: DELAY_MS) plus up to
 * FAULT_JITTER_MS (default: JITTER_MS) instead of DELAY_MS plus up to
 * JITTER_MS, SIGUSR2 switches back; each switch is acknowledged on stderr.
 * The chaos soak (tests/chaos/run.sh, CHAOS_LATENCY) injects its latency
 * window so, without cutting a connection the way a restart would. What was
 * read before a switch keeps the delay it was read with, and a chunk is
 * still never due before the one read ahead of it: after a switch back, new
 * bytes queue behind the slow ones, as on a path that just got fast again.
 *
 * -v: for each accepted connection, one line "conn LPORT CLIENT_PORT
 * UPSTREAM_PORT" on stdout (the client's port and the proxy's own port
 * towards the server), so that a test can tell which client a server sees
 * on a connection (the chaos soak finds the worker holding a Redis lock).
 *
 * Why a proxy of our own: the kernel of the machines this runs on has no
 * sch_netem (tc netem on a veth pair in a namespace of ours was the first
 * choice), and Debian packages no toxiproxy. A delay is a property of the
 * path, not of a packet: what is read at t is written at t + delay, in
 * order, so jitter never reorders bytes (a chunk is never due before the
 * one read ahead of it, as TCP over a real path would deliver them). A
 * connection's end (EOF) is delayed like its data; a reset or error closes
 * both sides at once.
 *
 * One thread, epoll; the wake-up is the earliest due chunk. Back-pressure:
 * a direction holding more than MAX_HELD bytes stops reading its source
 * until it drains, so a slow reader does not make the proxy grow. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_MAPS 16
#define CHUNK    65536
#define MAX_HELD (4 << 20)

struct map {
    int                     listen_fd;
    struct sockaddr_storage target;
    socklen_t               target_len;
    int64_t                 delay_us, jitter_us, fault_us, fault_jitter_us;
    unsigned                lport;
};

struct chunk {
    struct chunk *next;
    int64_t       due_us;
    size_t        len, off; /* len 0: the source's EOF */
    char          data[];
};

/* One direction: bytes read from `from`, held, then written to `to`. */
struct dir {
    int           from, to;
    struct chunk *head, *tail;
    size_t        held;
    int64_t       last_due_us;
    bool          eof_read, done;
};

struct conn {
    struct conn *next, *prev;
    struct map  *map;
    struct dir   d[2]; /* 0: client -> server, 1: server -> client */
    int          fds[2];
    uint32_t     events[2];
    bool         dead;
};

/* epoll data: a listener (tag 0) or a connection's fd (tag 1 = side 0, 2 = side 1). */
struct tag {
    int   kind;
    void *p;
};

static struct map   maps[MAX_MAPS];
static struct tag   map_tags[MAX_MAPS];
static int          n_maps, ep;
static struct conn *conns;
static bool         verbose;
static volatile sig_atomic_t stopping, faulty, switched;

static void on_signal(int sig) { (void)sig; stopping = 1; }

/* The flag is read once per chunk held (hold()), so a switch applies from
 * the next read on; `switched` only asks the loop to say so. */
static void on_fault(int sig)
{
    faulty = sig == SIGUSR1;
    switched = 1;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void die(const char *what)
{
    fprintf(stderr, "delay_proxy: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void parse_map(const char *arg, struct map *m)
{
    char host[256];
    unsigned lport, tport;
    double delay, jitter = 0, fault = -1, fault_jitter = -1;
    int n = sscanf(arg, "%u:%255[^:]:%u:%lf:%lf:%lf:%lf", &lport, host, &tport, &delay, &jitter,
                   &fault, &fault_jitter);
    if (n < 4 || lport > 65535 || tport == 0 || tport > 65535 || delay < 0 ||
        jitter < 0 || (n >= 6 && fault < 0) || (n == 7 && fault_jitter < 0)) {
        fprintf(stderr, "delay_proxy: bad mapping '%s': want "
                        "LPORT:THOST:TPORT:DELAY_MS[:JITTER_MS[:FAULT_MS[:FAULT_JITTER_MS]]]\n",
                arg);
        exit(2);
    }
    m->delay_us = (int64_t)(delay * 1000);
    m->jitter_us = (int64_t)(jitter * 1000);
    m->fault_us = n >= 6 ? (int64_t)(fault * 1000) : m->delay_us;
    m->fault_jitter_us = n == 7 ? (int64_t)(fault_jitter * 1000) : m->jitter_us;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai;
    char port[16];
    snprintf(port, sizeof(port), "%u", tport);
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
        fprintf(stderr, "delay_proxy: %s: %s\n", host, gai_strerror(rc));
        exit(2);
    }
    memcpy(&m->target, ai->ai_addr, ai->ai_addrlen);
    m->target_len = ai->ai_addrlen;
    freeaddrinfo(ai);

    m->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (m->listen_fd < 0)
        die("socket");
    int one = 1;
    setsockopt(m->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)lport),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (bind(m->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        die("bind");
    if (listen(m->listen_fd, 512) < 0)
        die("listen");
    socklen_t len = sizeof(sa);
    if (getsockname(m->listen_fd, (struct sockaddr *)&sa, &len) < 0)
        die("getsockname");
    m->lport = ntohs(sa.sin_port);
}

/* The -v line: which client port a connection came from, and which port
 * of ours the server sees it on. */
static void say_conn(const struct map *m, int cfd, int sfd)
{
    struct sockaddr_storage a, b;
    socklen_t la = sizeof(a), lb = sizeof(b);
    if (getpeername(cfd, (struct sockaddr *)&a, &la) < 0 ||
        getsockname(sfd, (struct sockaddr *)&b, &lb) < 0)
        return;
    /* Both are IPv4 or IPv6; the port sits at the same place in either. */
    printf("conn %u %u %u\n", m->lport, ntohs(((struct sockaddr_in *)&a)->sin_port),
           ntohs(((struct sockaddr_in *)&b)->sin_port));
    fflush(stdout);
}

static struct tag *side_tag(struct conn *c, int side);

static void rearm(struct conn *c, int side)
{
    /* Side s reads for direction s and writes for direction 1 - s. */
    struct dir *rd = &c->d[side], *wr = &c->d[1 - side];
    uint32_t ev = 0;
    if (!rd->eof_read && rd->held < MAX_HELD)
        ev |= EPOLLIN;
    if (wr->head != NULL && wr->head->due_us <= now_us() && wr->head->len > 0)
        ev |= EPOLLOUT;
    if (c->events[side] == ev)
        return;
    struct epoll_event e = { .events = ev, .data.ptr = side_tag(c, side) };
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fds[side], &e) < 0)
        die("epoll_ctl(MOD)");
    c->events[side] = ev;
}

/* The tags live right after the conn, one per side. */
static struct tag *side_tag(struct conn *c, int side) { return (struct tag *)(c + 1) + side; }

static void conn_kill(struct conn *c)
{
    c->dead = true;
}

static void conn_free(struct conn *c)
{
    for (int i = 0; i < 2; i++) {
        close(c->fds[i]);
        struct chunk *k = c->d[i].head;
        while (k != NULL) {
            struct chunk *n = k->next;
            free(k);
            k = n;
        }
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void accept_one(struct map *m)
{
    int cfd = accept4(m->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (cfd < 0)
        return;
    int sfd = socket(m->target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (sfd < 0) {
        close(cfd);
        return;
    }
    /* Non-blocking connect: a write before it completes fails with EAGAIN
     * and is retried on EPOLLOUT, so nothing special is needed here. */
    if (connect(sfd, (struct sockaddr *)&m->target, m->target_len) < 0 && errno != EINPROGRESS) {
        close(cfd);
        close(sfd);
        return;
    }
    nodelay(cfd);
    nodelay(sfd);
    if (verbose)
        say_conn(m, cfd, sfd);
    struct conn *c = calloc(1, sizeof(*c) + 2 * sizeof(struct tag));
    if (c == NULL) {
        close(cfd);
        close(sfd);
        return;
    }
    c->map = m;
    c->fds[0] = cfd;
    c->fds[1] = sfd;
    c->d[0] = (struct dir){ .from = cfd, .to = sfd };
    c->d[1] = (struct dir){ .from = sfd, .to = cfd };
    for (int i = 0; i < 2; i++) {
        *side_tag(c, i) = (struct tag){ .kind = 1 + i, .p = c };
        c->events[i] = EPOLLIN;
        struct epoll_event e = { .events = EPOLLIN, .data.ptr = side_tag(c, i) };
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fds[i], &e) < 0)
            die("epoll_ctl(ADD)");
    }
    c->next = conns;
    if (conns)
        conns->prev = c;
    conns = c;
}

static void hold(struct conn *c, struct dir *d, const char *buf, size_t len)
{
    struct chunk *k = malloc(sizeof(*k) + len);
    if (k == NULL) {
        conn_kill(c);
        return;
    }
    bool fault = faulty;
    int64_t due = now_us() + (fault ? c->map->fault_us : c->map->delay_us);
    int64_t jitter = fault ? c->map->fault_jitter_us : c->map->jitter_us;
    if (jitter > 0)
        due += (int64_t)(drand48() * (double)jitter);
    /* In order: never due before what was read ahead of it. */
    if (due < d->last_due_us)
        due = d->last_due_us;
    d->last_due_us = due;
    *k = (struct chunk){ .due_us = due, .len = len };
    memcpy(k->data, buf, len);
    if (d->tail)
        d->tail->next = k;
    else
        d->head = k;
    d->tail = k;
    d->held += len;
}

static void read_side(struct conn *c, int side)
{
    struct dir *d = &c->d[side];
    static char buf[CHUNK];
    while (!d->eof_read && d->held < MAX_HELD && !c->dead) {
        ssize_t n = read(d->from, buf, sizeof(buf));
        if (n > 0) {
            hold(c, d, buf, (size_t)n);
        } else if (n == 0) {
            d->eof_read = true;
            hold(c, d, buf, 0);
        } else if (errno == EINTR) {
            continue;
        } else {
            if (errno != EAGAIN)
                conn_kill(c);
            return;
        }
    }
}

/* Writes what is due in direction d; returns false on a fatal error. */
static bool flush_dir(struct dir *d, int64_t now)
{
    while (d->head != NULL && d->head->due_us <= now) {
        struct chunk *k = d->head;
        if (k->len == 0) {
            shutdown(d->to, SHUT_WR);
            d->done = true;
        } else {
            while (k->off < k->len) {
                ssize_t n = write(d->to, k->data + k->off, k->len - k->off);
                if (n > 0) {
                    k->off += (size_t)n;
                    d->held -= (size_t)n;
                } else if (n < 0 && errno == EINTR) {
                    continue;
                } else if (n < 0 && errno == EAGAIN) {
                    return true;
                } else {
                    return false;
                }
            }
        }
        d->head = k->next;
        if (d->head == NULL)
            d->tail = NULL;
        free(k);
    }
    return true;
}

static void service(struct conn *c, int64_t now)
{
    for (int i = 0; i < 2 && !c->dead; i++)
        if (!flush_dir(&c->d[i], now))
            conn_kill(c);
    if (c->dead || (c->d[0].done && c->d[1].done)) {
        conn_free(c);
        return;
    }
    rearm(c, 0);
    rearm(c, 1);
}

static int next_timeout_ms(int64_t now)
{
    int64_t next = -1;
    for (struct conn *c = conns; c != NULL; c = c->next)
        for (int i = 0; i < 2; i++) {
            struct chunk *k = c->d[i].head;
            /* A chunk waiting on EPOLLOUT is not a timer. */
            if (k != NULL && (k->due_us > now || k->len == 0) && (next < 0 || k->due_us < next))
                next = k->due_us;
        }
    if (next < 0)
        return -1;
    return next <= now ? 0 : (int)((next - now + 999) / 1000);
}

int main(int argc, char **argv)
{
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        verbose = true;
        first = 2;
    }
    if (argc - first < 1 || argc - first > MAX_MAPS) {
        fprintf(stderr, "usage: delay_proxy [-v] LPORT:THOST:TPORT:DELAY_MS[:JITTER_MS[:FAULT_MS]] "
                        "... (at most %d)\n",
                MAX_MAPS);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = { .sa_handler = on_signal };
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    struct sigaction fa = { .sa_handler = on_fault };
    sigaction(SIGUSR1, &fa, NULL);
    sigaction(SIGUSR2, &fa, NULL);
    srand48((long)getpid());
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    for (int i = first; i < argc; i++) {
        parse_map(argv[i], &maps[n_maps]);
        map_tags[n_maps] = (struct tag){ .kind = 0, .p = &maps[n_maps] };
        struct epoll_event e = { .events = EPOLLIN, .data.ptr = &map_tags[n_maps] };
        if (epoll_ctl(ep, EPOLL_CTL_ADD, maps[n_maps].listen_fd, &e) < 0)
            die("epoll_ctl(listen)");
        n_maps++;
    }
    printf("ready");
    for (int i = 0; i < n_maps; i++)
        printf(" %u", maps[i].lport);
    printf("\n");
    fflush(stdout);

    struct epoll_event evs[64];
    while (!stopping) {
        if (switched) {
            switched = 0;
            fprintf(stderr, "delay_proxy: %s delay\n", faulty ? "fault" : "normal");
        }
        int n = epoll_wait(ep, evs, 64, next_timeout_ms(now_us()));
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            struct tag *t = evs[i].data.ptr;
            if (t->kind == 0) {
                accept_one(t->p);
                continue;
            }
            struct conn *c = t->p;
            if (c->dead)
                continue;
            int side = t->kind - 1;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                read_side(c, side);
        }
        /* Every connection is looked at after each wake-up: a few hundred at
         * most in a benchmark, cheaper than a timer heap's bookkeeping. Dead
         * ones are freed here only, so no event above can see a freed one. */
        int64_t now = now_us();
        struct conn *c = conns;
        while (c != NULL) {
            struct conn *next = c->next;
            service(c, now);
            c = next;
        }
    }
    return 0;
}
