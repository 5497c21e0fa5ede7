/* harness_metrics.c - sekalid's /metrics as a test reads it: a scrape, and
 * one series' value in it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_private.h"

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
