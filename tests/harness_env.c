/* harness_env.c - the test environment: the servers' settings that
 * tests/run.sh exports, the build directory, the reruns' switches
 * (SEKALI_TEST_BATCH, SEKALI_TEST_TLS), time and its stretching under
 * valgrind and ASan, and unique names, directories and ports. */
#include <errno.h>
#include <glob.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness_private.h"

static const char *build_dir;
static const char *amqp_url;
static const char *pg_conninfo;
static const char *scratch;
static int redis_port;
static int slowdown = 1;
static struct sk_amqp_conf amqp_conf;

const char *h_require_env(const char *name)
{
    const char *v = getenv(name);
    ck_assert_msg(v != NULL && v[0] != '\0',
                  "%s is not set: run the suites through tests/run.sh, which reads "
                  "tests/servers.sh env", name);
    return v;
}

void h_init(void)
{
    build_dir = h_require_env("SEKALI_BUILD");
    amqp_url = h_require_env("SEKALI_AMQP_URL");
    pg_conninfo = h_require_env("SEKALI_PG_CONNINFO");
    scratch = h_require_env("SEKALI_SCRATCH");
    redis_port = atoi(h_require_env("SEKALI_REDIS_PORT"));
    if (getenv("SEKALI_VALGRIND") != NULL)
        slowdown = 20;
    else if (strstr(build_dir, "asan") != NULL)
        slowdown = 3;

    static char url_copy[512];
    snprintf(url_copy, sizeof(url_copy), "%s", amqp_url);
    struct amqp_connection_info info;
    ck_assert_int_eq(amqp_parse_url(url_copy, &info), AMQP_STATUS_OK);
    amqp_conf = (struct sk_amqp_conf){
        .nodes = { { .host = info.host, .port = info.port } }, .n_nodes = 1,
        .vhost = info.vhost, .user = info.user,
        .password = info.password, .heartbeat_ms = 0, .connect_timeout_ms = 5000,
    };
}

const char *h_build_dir(void) { return build_dir; }
const char *h_amqp_url(void) { return amqp_url; }
const char *h_pg_conninfo(void) { return pg_conninfo; }
int h_redis_port(void) { return redis_port; }
int h_ms(int ms) { return ms * slowdown; }
const struct sk_amqp_conf *h_amqp_conf(void) { return &amqp_conf; }

int64_t h_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void h_nap(void)
{
    struct timespec t = { .tv_sec = 0, .tv_nsec = 20 * 1000000L };
    nanosleep(&t, NULL);
}

char *h_tmpdir(const char *name)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/tests/%s.XXXXXX", scratch, name) > 0);
    char parent[1024];
    snprintf(parent, sizeof(parent), "%s/tests", scratch);
    mkdir(parent, 0755);
    ck_assert_msg(mkdtemp(path) != NULL, "mkdtemp(%s): %s", path, strerror(errno));
    return path;
}

int h_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
                  getsockname(fd, (struct sockaddr *)&a, &len) == 0, "bind: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

void h_unique_name(char *out, size_t size, const char *prefix)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    snprintf(out, size, "%s-%ld-%ld-%ld", prefix, (long)getpid(), (long)t.tv_sec,
             t.tv_nsec / 1000);
}

int h_test_batch(void)
{
    const char *batch = getenv("SEKALI_TEST_BATCH");
    return batch != NULL && atoi(batch) >= 1 ? atoi(batch) : 0;
}

bool h_test_tls(void)
{
    const char *tls = getenv("SEKALI_TEST_TLS");
    if (tls == NULL || strcmp(tls, "1") != 0)
        return false;
    ck_assert_msg(getenv("SEKALI_TLS_DIR") != NULL && getenv("SEKALI_AMQP_TLS_PORT") != NULL &&
                  getenv("SEKALI_REDIS_TLS_PORT") != NULL,
                  "SEKALI_TEST_TLS=1 needs the TLS listeners: start the servers with "
                  "SEKALI_TLS=1 tests/servers.sh start");
    return true;
}

void h_faketime_preload(char *buf, size_t size)
{
    const char *lib = getenv("SEKALI_FAKETIME");
    glob_t g = { 0 };
    if (lib == NULL &&
        glob("/usr/lib/*/faketime/libfaketime.so.1", 0, NULL, &g) != 0 &&
        glob("/usr/lib/faketime/libfaketime.so.1", 0, NULL, &g) != 0 &&
        glob("/usr/local/lib/faketime/libfaketime.so.1", 0, NULL, &g) != 0)
        ck_abort_msg("libfaketime.so.1 not found under /usr/lib/*/faketime/: install "
                     "libfaketime, or set SEKALI_FAKETIME to its path");
    if (lib == NULL)
        lib = g.gl_pathv[0];
    ck_assert_msg(access(lib, R_OK) == 0, "%s is not readable", lib);
    snprintf(buf, size, "LD_PRELOAD=%s", lib);
    globfree(&g);
}
