/* fuzz_values.c - libFuzzer harness for the value parsers of config_value.c.
 *
 * Every input, as one NUL-terminated string, goes through each parser a
 * config file can reach: durations, sizes, integers, booleans and listen
 * addresses. Besides not crashing, each accepted value must survive a round
 * trip: formatted back the way sekali quotes it in messages (or as host:port)
 * and parsed again, it must give the same value. A parser that accepts text
 * its own formatter cannot reproduce would quote wrong bounds to users. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_value.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_duration(const char *s);
static void check_size(const char *s);
static void check_int_and_bool(const char *s);
static void check_listen(const char *s);

/* abort() is what libFuzzer reports as a finding, with the input saved. */
#define EXPECT(cond, ...)                                                \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "fuzz_values: " __VA_ARGS__);                \
            fputc('\n', stderr);                                         \
            abort();                                                     \
        }                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A YAML scalar is a C string to these parsers (config.c refuses one
     * with a NUL byte), so an input stops at its first NUL. */
    char *s = malloc(size + 1);

    if (s == NULL)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    check_duration(s);
    check_size(s);
    check_int_and_bool(s);
    check_listen(s);
    free(s);
    return 0;
}

static void check_duration(const char *s)
{
    struct sk_err err = { 0 };
    uint64_t ms, again;
    char buf[64];

    if (sk_conf_value_parse_duration(s, &ms, &err) != SK_OK) {
        EXPECT(err.msg[0] != '\0', "duration \"%s\" refused without a message", s);
        return;
    }
    sk_conf_value_fmt_duration(ms, buf, sizeof(buf));
    /* "0" has no unit, and a bare number is not a duration: 0ms is the
     * text a user would write. */
    if (ms == 0)
        snprintf(buf, sizeof(buf), "0ms");
    EXPECT(sk_conf_value_parse_duration(buf, &again, &err) == SK_OK && again == ms,
           "duration \"%s\" = %llu ms, formatted \"%s\", does not parse back", s,
           (unsigned long long)ms, buf);
}

static void check_size(const char *s)
{
    struct sk_err err = { 0 };
    uint64_t bytes, again;
    char buf[64];

    if (sk_conf_value_parse_size(s, &bytes, &err) != SK_OK) {
        EXPECT(err.msg[0] != '\0', "size \"%s\" refused without a message", s);
        return;
    }
    sk_conf_value_fmt_size(bytes, buf, sizeof(buf));
    EXPECT(sk_conf_value_parse_size(buf, &again, &err) == SK_OK && again == bytes,
           "size \"%s\" = %llu bytes, formatted \"%s\", does not parse back", s,
           (unsigned long long)bytes, buf);
}

static void check_int_and_bool(const char *s)
{
    char buf[32];
    int64_t v, again;
    bool b;

    if (sk_conf_value_parse_int(s, &v) == SK_OK) {
        snprintf(buf, sizeof(buf), "%lld", (long long)v);
        EXPECT(sk_conf_value_parse_int(buf, &again) == SK_OK && again == v,
               "integer \"%s\" = %lld does not parse back", s, (long long)v);
    }
    if (sk_conf_value_parse_bool(s, &b) == SK_OK)
        EXPECT(sk_conf_value_parse_bool(b ? "true" : "false", &b) == SK_OK,
               "boolean \"%s\" broke the parser", s);
}

static void check_listen(const char *s)
{
    struct sk_err err = { 0 };
    char *host = NULL, *host2 = NULL, *buf = NULL;
    int port = 0, port2 = 0;

    if (sk_conf_value_parse_listen("metrics.listen", s, &host, &port, &err) != SK_OK) {
        EXPECT(err.msg[0] != '\0', "listen \"%s\" refused without a message", s);
        EXPECT(host == NULL, "listen \"%s\" refused but set host", s);
        return;
    }
    EXPECT(host != NULL && host[0] != '\0', "listen \"%s\" accepted with no host", s);
    EXPECT(port >= 1 && port <= 65535, "listen \"%s\" accepted port %d", s, port);
    EXPECT(asprintf(&buf, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port) >= 0,
           "out of memory");
    EXPECT(sk_conf_value_parse_listen("metrics.listen", buf, &host2, &port2, &err) == SK_OK &&
           strcmp(host, host2) == 0 && port == port2,
           "listen \"%s\" = host \"%s\" port %d, written \"%s\", does not parse back", s, host,
           port, buf);
    free(buf);
    free(host);
    free(host2);
}
