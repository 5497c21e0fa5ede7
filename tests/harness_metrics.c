/* harness_metrics.c - HTTP as a test reads it: sekalid's /metrics (a
 * scrape, and one series' value in it) and one plain GET of a loopback
 * listener (the console's pages and API). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness_private.h"

int h_metrics_top(char *top, size_t size)
{
    int port = h_free_port();
    int n = snprintf(top, size, "metrics:\n  listen: 127.0.0.1:%d\n", port);
    ck_assert_msg(n > 0 && (size_t)n < size, "h_metrics_top: %zu bytes are too few", size);
    return port;
}

int h_curl_status(int port, const char *path, const char *header, const char *body_path,
                  int max_s)
{
    char cmd[2400];
    int n = snprintf(cmd, sizeof(cmd), "curl -s --max-time %d -o '%s' -w '%%{http_code}' %s%s%s "
                     "'http://127.0.0.1:%d%s'", max_s, body_path, header != NULL ? "-H '" : "",
                     header != NULL ? header : "", header != NULL ? "'" : "", port, path);
    ck_assert_msg(n > 0 && (size_t)n < sizeof(cmd), "h_curl_status: %s is too long", path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int status = 0;
    if (fscanf(p, "%d", &status) != 1)
        status = 0;
    pclose(p);
    return status;
}

char *h_scrape(int port)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "curl -sf --max-time 10 http://127.0.0.1:%d/metrics", port);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char *text = h_read_stream(p);
    if (pclose(p) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

double h_metric_value(const char *text, const char *series)
{
    size_t len = strlen(series);
    for (const char *p = text; (p = strstr(p, series)) != NULL; p += len)
        if ((p == text || p[-1] == '\n') && p[len] == ' ')
            return strtod(p + len + 1, NULL);
    return -1;
}

double h_metric(int port, const char *series_fmt, ...)
{
    char series[512];
    va_list ap;
    va_start(ap, series_fmt);
    vsnprintf(series, sizeof(series), series_fmt, ap);
    va_end(ap);
    char *text = h_scrape(port);
    if (text == NULL)
        return -1;
    double v = h_metric_value(text, series);
    free(text);
    return v;
}

int h_http_get(int port, const char *path, char **body)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    char req[1200];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                     "Connection: close\r\n\r\n", path, port);
    ck_assert_int_lt(n, (int)sizeof(req));
    ck_assert_int_eq(write(fd, req, (size_t)n), n);
    size_t len = 0, cap = 65536;
    char *all = malloc(cap);
    ssize_t got;
    while (all != NULL && (got = read(fd, all + len, cap - len - 1)) > 0)
        if ((len += (size_t)got) == cap - 1)
            all = realloc(all, cap *= 2);
    close(fd);
    ck_assert_ptr_nonnull(all);
    all[len] = '\0';
    int status = strncmp(all, "HTTP/1.1 ", 9) == 0 ? atoi(all + 9) : 0;
    if (body != NULL) {
        char *at = strstr(all, "\r\n\r\n");
        *body = strdup(at != NULL ? at + 4 : "");
    }
    free(all);
    return status;
}
