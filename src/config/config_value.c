/* config_value.c - config values that need parsing but not the schema:
 * integers and booleans, durations and sizes with their units, addresses to
 * listen on, passwords read from the environment or a file, and a handler's
 * `config:` section turned back into YAML text.
 *
 * It exists so that config*.c are only the schema and its walker. Nothing here
 * knows which key it serves or where the node sits in the file: the caller
 * passes a label for messages and adds the file:line:column. Reading a file
 * whole lives here too, because a password file and the config file itself
 * are read the same way: bounded, and wiped on failure. */
#include "config_value.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SECRET (64 * KIB)  /* keeps password_file: /dev/zero finite */
#define MAX_DEPTH  64          /* libyaml's emitter recurses */

struct unit { const char *name; uint64_t n; };

/* One re-emission: the source document, the copy, and where to report. */
struct copy {
    yaml_document_t    *src, *dst;
    int                *memo;   /* source index -> copied index, 0 if not yet copied */
    const char         *label;
    const yaml_node_t **at;
    struct sk_err      *err;
};

static int parse_unit(const char *s, const struct unit *units, uint64_t *out);
static bool valid_hostname(const char *s);
static const char *fmt_unit(uint64_t n, const struct unit *units, char *buf, size_t len);
static int copy_node(struct copy *C, int index, int depth);
static int replace(char **dst, const char *s, struct sk_err *err);

/* Largest first: fmt_unit() picks the first that divides exactly. */
static const struct unit duration_units[] = {
    { "h", HOUR }, { "m", MIN }, { "s", SEC }, { "ms", 1 }, { NULL, 0 },
};
static const struct unit size_units[] = {
    { "GiB", 1024 * MIB }, { "MiB", MIB }, { "KiB", KIB }, { "GB", 1000000000 },
    { "MB", 1000000 }, { "kB", 1000 }, { "B", 1 }, { "", 1 }, { NULL, 0 },
};

int sk_conf_value_parse_duration(const char *text, uint64_t *ms, struct sk_err *err)
{
    int r = parse_unit(text, duration_units, ms);

    if (r == SK_AGAIN)
        return sk_err_set(err, SK_ERR, "duration \"%.64s\" is too large", text);
    if (r != SK_OK)
        return sk_err_set(err, SK_ERR, "invalid duration \"%.64s\": expected a number "
                          "followed by ms, s, m or h", text);
    return SK_OK;
}

int sk_conf_value_parse_rate(const char *text, uint32_t *count, uint32_t *period_ms,
                             struct sk_err *err)
{
    const char *slash = strchr(text, '/');
    char digits[24];
    int64_t n = 0;
    uint64_t ms = 0;
    size_t len = slash != NULL ? (size_t)(slash - text) : 0;
    if (slash == NULL || len == 0 || len >= sizeof(digits))
        return sk_err_set(err, SK_ERR, "invalid rate \"%.64s\": expected <count>/<period>, "
                          "e.g. 100/s, 5/m or 10/2s", text);
    memcpy(digits, text, len);
    digits[len] = '\0';
    if (sk_conf_value_parse_int(digits, &n) != SK_OK || n < 1 || n > 1000000)
        return sk_err_set(err, SK_ERR, "invalid rate \"%.64s\": the count must be a whole "
                          "number from 1 to 1000000", text);
    /* "s" alone means "1s": the usual way to write a rate. */
    char period[40];
    const char *p = slash + 1;
    snprintf(period, sizeof(period), "%s%s", *p >= '0' && *p <= '9' ? "" : "1", p);
    if (strlen(p) > 30 || sk_conf_value_parse_duration(period, &ms, NULL) != SK_OK ||
        ms < 1 || ms > DAY)
        return sk_err_set(err, SK_ERR, "invalid rate \"%.64s\": the period must be a "
                          "duration from 1ms to 24h (ms, s, m or h), e.g. 100/s", text);
    if ((uint64_t)n > ms * 1000)
        return sk_err_set(err, SK_ERR, "rate \"%.64s\" is too high: at most 1000000 a second",
                          text);
    *count = (uint32_t)n;
    *period_ms = (uint32_t)ms;
    return SK_OK;
}

int sk_conf_value_parse_size(const char *text, uint64_t *bytes, struct sk_err *err)
{
    int r = parse_unit(text, size_units, bytes);

    if (r == SK_AGAIN)
        return sk_err_set(err, SK_ERR, "size \"%.64s\" is too large", text);
    if (r != SK_OK)
        return sk_err_set(err, SK_ERR, "invalid size \"%.64s\": expected a number optionally "
                          "followed by B, kB, KiB, MB, MiB, GB or GiB", text);
    return SK_OK;
}

int sk_conf_value_parse_int(const char *s, int64_t *v)
{
    const char *d = *s == '-' ? s + 1 : s;
    char *end;

    if (*d < '0' || *d > '9')
        return SK_ERR;
    *v = strtoll(s, &end, 10);
    return *end == '\0' ? SK_OK : SK_ERR;
}

int sk_conf_value_parse_bool(const char *s, bool *v)
{
    static const char *const words[] = { "false", "true", "no", "yes", "off", "on" };

    for (size_t i = 0; i < SK_ARRAY_LEN(words); i++) {
        if (strcasecmp(s, words[i]) == 0) {
            *v = i % 2 == 1;
            return SK_OK;
        }
    }
    return SK_ERR;
}

const char *sk_conf_value_fmt_duration(uint64_t ms, char *buf, size_t len)
{
    return fmt_unit(ms, duration_units, buf, len);
}

const char *sk_conf_value_fmt_size(uint64_t bytes, char *buf, size_t len)
{
    return fmt_unit(bytes, size_units, buf, len);
}

int sk_conf_value_parse_listen(const char *label, const char *s, char **host, int *port,
                               struct sk_err *err)
{
    const char *colon = strrchr(s, ':'), *start = s, *end;
    unsigned char addr[sizeof(struct in6_addr)];
    char name[256];
    int64_t n;

    if (colon == NULL)
        return sk_err_set(err, SK_ERR, "%s: expected host:port, got \"%.64s\"", label, s);
    end = colon;
    if (*s == '[') {
        if (colon[-1] != ']')
            return sk_err_set(err, SK_ERR, "%s: expected [IPv6 address]:port, got \"%.64s\"",
                              label, s);
        start = s + 1;
        end = colon - 1;
    }
    if ((size_t)(end - start) >= sizeof(name))
        return sk_err_set(err, SK_ERR, "%s: host of %zu bytes is too long", label,
                          (size_t)(end - start));
    memcpy(name, start, (size_t)(end - start));
    name[end - start] = '\0';

    /* No empty host meaning "every interface": exposing the endpoint beyond
     * this machine should be written out as 0.0.0.0 or [::]. */
    if (name[0] == '\0')
        return sk_err_set(err, SK_ERR, "%s: missing host in \"%.64s\" (127.0.0.1:PORT for "
                          "this machine only, 0.0.0.0:PORT for every interface)", label, s);
    if (start != s) {
        if (inet_pton(AF_INET6, name, addr) != 1)
            return sk_err_set(err, SK_ERR, "%s: invalid IPv6 address \"%.64s\"", label, name);
    } else if (strchr(name, ':') != NULL) {
        return sk_err_set(err, SK_ERR, "%s: an IPv6 address needs brackets, as in [::1]:9187, "
                          "got \"%.64s\"", label, s);
    } else if (name[strspn(name, "0123456789.")] == '\0') {
        if (inet_pton(AF_INET, name, addr) != 1)
            return sk_err_set(err, SK_ERR, "%s: invalid IPv4 address \"%.64s\"", label, name);
    } else if (!valid_hostname(name)) {
        return sk_err_set(err, SK_ERR, "%s: invalid host name \"%.64s\"", label, name);
    }

    if (sk_conf_value_parse_int(colon + 1, &n) != SK_OK || colon[1] == '-' || n < 1 || n > 65535)
        return sk_err_set(err, SK_ERR, "%s: port must be between 1 and 65535, got \"%.16s\"",
                          label, colon + 1);
    if ((*host = strdup(name)) == NULL)
        return sk_err_set(err, SK_ERR, "out of memory");
    *port = (int)n;
    return SK_OK;
}

/* The variables password_env has read in this process, for
 * sk_conf_value_forget_password_envs(): the supervisor keeps them (a reload
 * reads them again), its children need them no more. A config names at
 * most twenty (amqp, redis and its sentinels, postgres, 16 otlp_headers);
 * reloads may name others. */
#define MAX_PASSWORD_ENVS 32
static char password_envs[MAX_PASSWORD_ENVS][65];
static size_t n_password_envs;

int sk_conf_value_password_env(const char *label, const char *name, char **dst,
                               struct sk_err *err)
{
    const char *val = getenv(name);

    if (val == NULL || *val == '\0')
        return sk_err_set(err, SK_ERR, "%s: environment variable %.64s is %s", label, name,
                          val ? "empty" : "not set");
    bool known = false;
    for (size_t i = 0; i < n_password_envs && !known; i++)
        known = strcmp(password_envs[i], name) == 0;
    if (!known && n_password_envs < MAX_PASSWORD_ENVS && strlen(name) < sizeof(password_envs[0]))
        memcpy(password_envs[n_password_envs++], name, strlen(name) + 1);
    return replace(dst, val, err);
}

void sk_conf_value_forget_password_envs(void)
{
    for (size_t i = 0; i < n_password_envs; i++) {
        char *val = getenv(password_envs[i]);
        if (val != NULL)
            explicit_bzero(val, strlen(val));
        unsetenv(password_envs[i]);
    }
}

/* The file holds the password alone, and editors append a newline, so one
 * is dropped. */
int sk_conf_value_password_file(const char *label, const char *path, char **dst,
                                struct sk_err *err)
{
    char *buf = NULL;
    const char *op;
    size_t len = 0;
    int rc, e;

    if ((e = sk_conf_value_read_file(path, MAX_SECRET, &buf, &len, &op)) == 0 &&
        len > 0 && buf[len - 1] == '\n') {
        buf[--len] = '\0';
        if (len > 0 && buf[len - 1] == '\r')
            buf[--len] = '\0';
    }
    if (e != 0)
        rc = sk_err_set(err, SK_ERR, "%s: cannot %s %.128s: %s", label, op, path,
                        sk_conf_value_read_error(e));
    else if (len == 0 || strlen(buf) != len)
        rc = sk_err_set(err, SK_ERR, "%s: %.128s %s", label, path,
                        len ? "contains a NUL byte" : "is empty");
    else
        rc = replace(dst, buf, err);
    if (buf != NULL)
        explicit_bzero(buf, len);
    free(buf);
    return rc;
}

/* The subtree is copied into a document of its own and run through the
 * emitter, which has no call for writing part of a document. */
int sk_conf_value_emit(yaml_document_t *doc, const yaml_node_t *v, const char *label,
                       char **out, const yaml_node_t **at, struct sk_err *err)
{
    struct copy C = { .src = doc, .label = label, .at = at, .err = err };
    size_t len = 0, n = (size_t)(doc->nodes.top - doc->nodes.start);
    yaml_document_t dst;
    yaml_emitter_t em;
    char *buf = NULL;
    FILE *f = NULL;
    int root, rc;

    *at = v;
    if ((C.memo = calloc(n + 1, sizeof(*C.memo))) == NULL ||
        !yaml_document_initialize(&dst, NULL, NULL, NULL, 1, 1)) {
        free(C.memo);
        return sk_err_set(err, SK_ERR, "out of memory");
    }
    C.dst = &dst;
    root = copy_node(&C, (int)(v - doc->nodes.start) + 1, 0);
    free(C.memo);
    if (root == 0 || (f = open_memstream(&buf, &len)) == NULL || !yaml_emitter_initialize(&em)) {
        yaml_document_delete(&dst);
        if (f != NULL)
            fclose(f);
        free(buf);
        return root == 0 ? SK_ERR : sk_err_set(err, SK_ERR, "out of memory");
    }
    yaml_emitter_set_output_file(&em, f);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, -1);  /* folding long scalars helps no one */
    /* dump() consumes the document, whether or not it succeeds. */
    if (yaml_emitter_open(&em) && yaml_emitter_dump(&em, &dst) && yaml_emitter_close(&em))
        rc = SK_OK;
    else
        rc = sk_err_set(err, SK_ERR, "%s: cannot re-emit as YAML: %s", label,
                        em.problem ? em.problem : "out of memory");
    yaml_emitter_delete(&em);
    if (fclose(f) != 0 && rc == SK_OK)
        rc = sk_err_set(err, SK_ERR, "out of memory");
    if (rc == SK_OK)
        *out = buf;
    else
        free(buf);
    return rc;
}

int sk_conf_value_read_file(const char *path, size_t max, char **out, size_t *len,
                            const char **op)
{
    struct stat st;
    FILE *f;
    char *buf;
    int fd, e;

    /* Checked before reading: a FIFO would otherwise hang `sekalid -t` and
     * a reload until someone writes to it. */
    if ((e = sk_file_open(path, 0, &fd, &st)) != 0) {
        *op = e == EISDIR || e == SK_FILE_NOT_REGULAR ? "read" : "open";
        return e;
    }
    *op = "read";
    if ((f = fdopen(fd, "r")) == NULL) {
        e = errno;
        close(fd);
        return e;
    }
    if ((buf = malloc(max + 2)) == NULL) {
        fclose(f);
        return ENOMEM;
    }
    size_t n = fread(buf, 1, max + 1, f);
    if (ferror(f))
        e = errno;
    else if (n > max)
        e = EFBIG;
    fclose(f);
    if (e != 0) {
        explicit_bzero(buf, n);  /* it may be a password */
        free(buf);
        return e;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

const char *sk_conf_value_read_error(int e)
{
    return sk_file_error(e);
}

void sk_conf_value_wipe(char *s)
{
    if (s != NULL)
        explicit_bzero(s, strlen(s));
    free(s);
}

/* Digits, then exactly one of units. Returns SK_OK, SK_ERR (malformed) or
 * SK_AGAIN (does not fit in 64 bits). */
static int parse_unit(const char *s, const struct unit *units, uint64_t *out)
{
    bool overflow = false;
    const char *p = s;
    uint64_t n = 0;

    for (; *p >= '0' && *p <= '9'; p++) {
        overflow = overflow || n > (UINT64_MAX - (uint64_t)(*p - '0')) / 10;
        n = n * 10 + (uint64_t)(*p - '0');
    }
    for (size_t i = 0; p != s && units[i].name != NULL; i++) {
        if (strcmp(p, units[i].name) != 0)
            continue;
        if (overflow || n > UINT64_MAX / units[i].n)
            return SK_AGAIN;
        *out = n * units[i].n;
        return SK_OK;
    }
    return SK_ERR;
}

/* In the largest unit that divides n exactly, so that bounds read as written. */
/* RFC 1123: dot-separated labels of 1 to 63 letters, digits and hyphens,
 * not starting or ending with a hyphen; 253 bytes at most. */
static bool valid_hostname(const char *s)
{
    size_t len = strlen(s);

    if (len == 0 || len > 253)
        return false;
    while (*s != '\0') {
        size_t n = strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-");
        if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-' || (s[n] != '.' && s[n] != '\0'))
            return false;
        s += n + (s[n] == '.');
        if (s[-1] == '.' && *s == '\0')
            return false;
    }
    return true;
}

static const char *fmt_unit(uint64_t n, const struct unit *units, char *buf, size_t len)
{
    size_t i = 0;

    while (n != 0 && n % units[i].n != 0)
        i++;
    snprintf(buf, len, "%" PRIu64 "%s", n == 0 ? 0 : n / units[i].n, n == 0 ? "" : units[i].name);
    return buf;
}

/* Copies node `index` of C->src into C->dst; C->memo keeps aliases shared.
 * Returns the new index, or 0 with the error and *C->at set. */
static int copy_node(struct copy *C, int index, int depth)
{
    yaml_node_t *n = yaml_document_get_node(C->src, index);
    int d, ok = 1;

    sk_assert(n != NULL);
    if (C->memo[index] != 0)
        return C->memo[index];
    if (depth > MAX_DEPTH) {
        *C->at = n;
        sk_err_set(C->err, SK_ERR, "%s: nested deeper than %d levels", C->label, MAX_DEPTH);
        return 0;
    }
    if (n->type == YAML_SCALAR_NODE)
        d = yaml_document_add_scalar(C->dst, n->tag, n->data.scalar.value,
                                     (int)n->data.scalar.length, n->data.scalar.style);
    else if (n->type == YAML_SEQUENCE_NODE)
        d = yaml_document_add_sequence(C->dst, n->tag, YAML_ANY_SEQUENCE_STYLE);
    else
        d = yaml_document_add_mapping(C->dst, n->tag, YAML_ANY_MAPPING_STYLE);
    C->memo[index] = d;

    if (d != 0 && n->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             ok && it < n->data.sequence.items.top; it++) {
            int item = copy_node(C, *it, depth + 1);
            if (item == 0)
                return 0;
            ok = yaml_document_append_sequence_item(C->dst, d, item);
        }
    } else if (d != 0 && n->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start;
             ok && p < n->data.mapping.pairs.top; p++) {
            int k = copy_node(C, p->key, depth + 1);
            int val = k != 0 ? copy_node(C, p->value, depth + 1) : 0;
            if (val == 0)
                return 0;
            ok = yaml_document_append_mapping_pair(C->dst, d, k, val);
        }
    }
    if (d == 0 || !ok) {
        *C->at = n;
        sk_err_set(C->err, SK_ERR, "out of memory");
        return 0;
    }
    return d;
}

/* Like config_walk.c's sk_walk_store(), without a node to blame. */
static int replace(char **dst, const char *s, struct sk_err *err)
{
    char *copy = strdup(s);

    if (copy == NULL)
        return sk_err_set(err, SK_ERR, "out of memory");
    sk_conf_value_wipe(*dst);
    *dst = copy;
    return SK_OK;
}
