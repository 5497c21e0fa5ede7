/* config_walk.c - the walker: a libyaml document through a table of keys.
 *
 * The file is loaded whole with libyaml's node API and walked in document
 * order; the first error stops the load and carries the offending node's
 * file:line:column, so `sekalid -t` reads like `nginx -t`. Every key type
 * of config_walk.h is applied here, the secrets included: they are
 * resolved at load time, so that a reload picks up rotated ones and the
 * rest of the daemon sees a password.
 *
 * Values that can be parsed without the walker (integers, booleans,
 * durations and sizes, password sources, the handler's section re-emitted
 * as YAML) are in config_value.c; this file hands them their node's text
 * and adds the node's position to their messages. */
#include "config_walk.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SK_HANDLER_DIR
#define SK_HANDLER_DIR "/usr/local/lib/sekali/handlers"
#endif

static int apply_name(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                      void *field);
static int apply_int(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                     void *field);
static int apply_measure(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                         void *field);
static int apply_enum(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                      void *field);
static int load_list(struct loader *L, const struct key *k, yaml_node_t *v, void *field);
static char *resolve(struct loader *L, const char *path);
static char *resolve_handler(struct loader *L, const char *name);

/* Loads the one document of text into *L->doc, which the caller deletes
 * on success. A syntax error, an empty file or a second document fails. */
int sk_walk_parse(struct loader *L, yaml_parser_t *parser, const char *text, size_t len)
{
    yaml_document_t extra;
    yaml_node_t *root;
    yaml_mark_t m;

    yaml_parser_set_input_string(parser, (const unsigned char *)text, len);
    if (yaml_parser_load(parser, L->doc)) {
        root = yaml_document_get_root_node(L->doc);
        if (root == NULL || sk_walk_is_null(root)) {
            yaml_document_delete(L->doc);
            return sk_err_set(L->err, SK_ERR, "%s:1:1: empty file: expected a mapping of "
                              "sections", L->path);
        }
        /* Whatever follows the first document would be silently ignored. */
        if (yaml_parser_load(parser, &extra)) {
            m = extra.start_mark;
            root = yaml_document_get_root_node(&extra);
            yaml_document_delete(&extra);
            if (root == NULL)
                return SK_OK;
            yaml_document_delete(L->doc);
            return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: found a second YAML document; a "
                              "config file holds one", L->path, m.line + 1, m.column + 1);
        }
        yaml_document_delete(L->doc);
    }
    m = parser->problem_mark;
    if (parser->error == YAML_READER_ERROR) {
        /* The reader (bad UTF-8, control characters) has a byte offset, not a mark. */
        m = (yaml_mark_t){ 0, 0, 0 };
        for (size_t i = 0; i < parser->problem_offset && i < len; i++) {
            m.column = text[i] == '\n' ? 0 : m.column + (((unsigned char)text[i] & 0xc0) != 0x80);
            m.line += text[i] == '\n';
        }
    }
    if (parser->context == NULL)
        return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: syntax error: %s", L->path, m.line + 1,
                          m.column + 1, parser->problem ? parser->problem : "out of memory");
    return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: syntax error: %s (%s that starts at %zu:%zu)",
                      L->path, m.line + 1, m.column + 1, parser->problem, parser->context,
                      parser->context_mark.line + 1, parser->context_mark.column + 1);
}

/* Applies each pair of map to base through table, in document order, then
 * checks the required keys. label names the mapping in messages. A null
 * value (a section whose lines are all commented out) counts as empty. */
int sk_walk_map(struct loader *L, yaml_node_t *map, const char *label,
                    const struct key *table, void *base)
{
    const char *saved = L->secret_from, *name;
    yaml_node_pair_t *p = NULL, *end = NULL;
    char where[48];
    uint64_t seen = 0;
    int rc = SK_OK;

    if (map->type != YAML_MAPPING_NODE && !sk_walk_is_null(map))
        return sk_walk_fail(L, map, "%s: expected a mapping, got %s", label, sk_walk_kind(map));
    if (map->type == YAML_MAPPING_NODE) {
        p = map->data.mapping.pairs.start;
        end = map->data.mapping.pairs.top;
    }
    snprintf(where, sizeof(where), "%s %s", table == L->top ? "at the" : "in", label);
    L->secret_from = NULL;
    for (; p < end && rc == SK_OK; p++) {
        yaml_node_t *kn = sk_walk_node(L, p->key);
        size_t i;

        if ((rc = sk_walk_scalar(L, kn, "key", "a scalar", &name)) != SK_OK)
            break;
        for (i = 0; table[i].name != NULL && strcmp(table[i].name, name) != 0; i++)
            ;
        sk_assert(i < 64);
        if (table[i].name == NULL)
            rc = sk_walk_fail(L, kn, "unknown key \"%.64s\" %s", name, where);
        else if (seen & (UINT64_C(1) << i))
            rc = sk_walk_fail(L, kn, "duplicate key \"%s\" %s", name, where);
        else
            rc = sk_walk_apply(L, &table[i], sk_walk_node(L, p->value), base);
        seen |= UINT64_C(1) << i;
    }
    for (size_t i = 0; rc == SK_OK && table[i].name != NULL; i++)
        if (table[i].required && !(seen & (UINT64_C(1) << i)))
            rc = sk_walk_fail(L, map, "missing required key \"%s\" %s", table[i].name, where);
    L->secret_from = saved;
    return rc;
}

int sk_walk_apply(struct loader *L, const struct key *k, yaml_node_t *v, void *base)
{
    void *field = (char *)base + k->offset;
    const char *s;

    if (k->type == T_SECTION)
        return sk_walk_map(L, v, k->name, k->sub, field);
    if (k->type == T_CUSTOM)
        return k->fn(L, v, base);
    if (k->type == T_PASSWORD_ENV || k->type == T_PASSWORD_FILE)
        return sk_walk_password(L, k, v, field);
    if (k->type == T_LIST)
        return load_list(L, k, v, field);
    int rc = sk_walk_scalar(L, v, k->name, k->type == T_INT ? "an integer" : k->type == T_BOOL ?
                            "a boolean" : "a scalar", &s);
    if (rc != SK_OK)
        return rc;
    if ((*s == '\0' || sk_walk_is_null(v)) && (k->type == T_STR || k->type == T_PATH ||
                                          k->type == T_HANDLER))
        return sk_walk_fail(L, v, "%s must not be empty", k->name);

    switch (k->type) {
    case T_STR:
        return sk_walk_store(L, v, field, s);
    case T_NAME:
        return apply_name(L, k, v, s, field);
    case T_PATH:  /* existence is the plugin loader's business: it can say why */
    case T_HANDLER:
        free(*(char **)field);
        if ((*(char **)field = k->type == T_HANDLER ? resolve_handler(L, s) : resolve(L, s)) == NULL)
            return sk_walk_fail(L, v, "out of memory");
        return SK_OK;
    case T_INT:
        return apply_int(L, k, v, s, field);
    case T_BOOL:
        if (sk_conf_value_parse_bool(s, field) != SK_OK)
            return sk_walk_fail(L, v, "%s: expected a boolean (true/false/yes/no/on/off), "
                                "got \"%.64s\"", k->name, s);
        return SK_OK;
    case T_RETENTION:
        if (strcmp(s, "forever") == 0) {
            *(uint64_t *)field = UINT64_MAX;  /* SK_RETENTION_FOREVER */
            return SK_OK;
        }
        /* fall through */
    case T_DURATION:
    case T_SIZE:
        return apply_measure(L, k, v, s, field);
    case T_ENUM:
        return apply_enum(L, k, v, s, field);
    default:
        sk_assert(!"unhandled key type");
        return SK_ERR;
    }
}

static int apply_name(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                      void *field)
{
    if (strlen(s) > MAX_NAME || s[strspn(s, NAME_CHARS)] != '\0' || *s == '\0')
        return sk_walk_fail(L, v, "invalid %s \"%.64s\": use 1 to %d characters from "
                            "A-Z a-z 0-9 . _ -", k->name, s, MAX_NAME);
    /* RabbitMQ reserves the prefix: declaring such a queue is refused
     * with ACCESS_REFUSED, which workers would retry for ever. */
    if (strncmp(s, "amq.", 4) == 0)
        return sk_walk_fail(L, v, "invalid %s \"%.64s\": names starting with \"amq.\" are "
                            "reserved by RabbitMQ", k->name, s);
    return sk_walk_store(L, v, field, s);
}

static int apply_int(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                     void *field)
{
    int64_t i;
    if (sk_conf_value_parse_int(s, &i) != SK_OK)
        return sk_walk_fail(L, v, "%s: expected an integer, got \"%.64s\"", k->name, s);
    if (i < (int64_t)k->min || i > (int64_t)k->max)
        return sk_walk_fail(L, v, "%s must be between %" PRIu64 " and %" PRIu64 ", got %.64s",
                            k->name, k->min, k->max, s);
    *(int *)field = (int)i;
    return SK_OK;
}

/* A duration (stored in ms as uint32_t, a retention's as uint64_t) or a
 * size (bytes, size_t). */
static int apply_measure(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                         void *field)
{
    bool duration = k->type != T_SIZE;
    const char *(*fmt)(uint64_t, char *, size_t) = duration ?
        sk_conf_value_fmt_duration : sk_conf_value_fmt_size;
    char lo[32], hi[32];
    struct sk_err e;
    uint64_t u;
    int rc = duration ? sk_conf_value_parse_duration(s, &u, &e) : sk_conf_value_parse_size(s, &u, &e);
    if (rc != SK_OK)
        return sk_walk_fail(L, v, "%s%s", e.msg, k->type == T_RETENTION ? ", or forever" : "");
    if (u < k->min || u > k->max)
        return sk_walk_fail(L, v, "%s must be between %s and %s%s, got %.64s", k->name,
                            fmt(k->min, lo, sizeof(lo)), fmt(k->max, hi, sizeof(hi)),
                            k->type == T_RETENTION ? ", or forever" : "", s);
    if (k->type == T_DURATION)
        *(uint32_t *)field = (uint32_t)u;
    else if (k->type == T_RETENTION)
        *(uint64_t *)field = u;
    else
        *(size_t *)field = (size_t)u;
    return SK_OK;
}

static int apply_enum(struct loader *L, const struct key *k, yaml_node_t *v, const char *s,
                      void *field)
{
    for (int j = 0; k->names[j] != NULL; j++) {
        if (strcmp(k->names[j], s) == 0) {
            *(int *)field = j;
            return SK_OK;
        }
    }
    char names[96] = "";
    for (int j = 0; k->names[j] != NULL; j++)
        snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                 j == 0 ? "" : k->names[j + 1] ? ", " : " or ", k->names[j]);
    return sk_walk_fail(L, v, "unknown %s \"%.64s\": expected %s", k->name, s, names);
}

static int load_list(struct loader *L, const struct key *k, yaml_node_t *v, void *field)
{
    char ***items = field;
    size_t *count = (size_t *)(items + 1);
    char label[48];
    const char *s;
    int rc;

    if (sk_walk_is_null(v))
        return SK_OK;
    if (v->type != YAML_SEQUENCE_NODE)
        return sk_walk_fail(L, v, "%s: expected a sequence, got %s", k->name, sk_walk_kind(v));
    size_t n = sk_walk_items(v);
    if (n > 0 && (*items = calloc(n, sizeof(**items))) == NULL)
        return sk_walk_fail(L, v, "out of memory");
    *count = n;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = sk_walk_item(L, v, i);
        snprintf(label, sizeof(label), "%s[%zu]", k->name, i);
        if ((rc = sk_walk_scalar(L, item, label, "a scalar", &s)) != SK_OK)
            return rc;
        if (*s == '\0')
            return sk_walk_fail(L, item, "%s must not be empty", label);
        if ((rc = sk_walk_store(L, item, &(*items)[i], s)) != SK_OK)
            return rc;
    }
    return SK_OK;
}

/* password_env: NAME or password_file: PATH, one source per section. */
int sk_walk_password(struct loader *L, const struct key *k, yaml_node_t *v, char **dst)
{
    const char *name;
    char *path;
    struct sk_err e;
    int rc;

    if ((rc = sk_walk_scalar(L, v, k->name, "a scalar", &name)) != SK_OK ||
        (rc = sk_walk_claim_secret(L, v, k->name)) != SK_OK)
        return rc;
    if (k->type == T_PASSWORD_ENV) {
        rc = sk_conf_value_password_env(k->name, name, dst, &e);
    } else {
        if ((path = resolve(L, name)) == NULL)
            return sk_walk_fail(L, v, "out of memory");
        rc = sk_conf_value_password_file(k->name, path, dst, &e);
        free(path);
    }
    return rc == SK_OK ? SK_OK : sk_walk_fail(L, v, "%s", e.msg);
}

/* One source per password, so that no one has to wonder which one wins. */
int sk_walk_claim_secret(struct loader *L, yaml_node_t *v, const char *source)
{
    if (L->secret_from != NULL)
        return sk_walk_fail(L, v, "%s conflicts with %s: give the password one way only",
                            source, L->secret_from);
    L->secret_from = source;
    return SK_OK;
}

/* Checks that n is a scalar without NUL bytes (a C string would cut it
 * short); expect completes "label: expected ..., got ..." otherwise. */
int sk_walk_scalar(struct loader *L, yaml_node_t *n, const char *label,
                  const char *expect, const char **out)
{
    if (n->type != YAML_SCALAR_NODE)
        return sk_walk_fail(L, n, "%s: expected %s, got %s", label, expect, sk_walk_kind(n));
    *out = (const char *)n->data.scalar.value;
    if (strlen(*out) != n->data.scalar.length)
        return sk_walk_fail(L, n, "%s: contains a NUL character", label);
    return SK_OK;
}

int sk_walk_store(struct loader *L, yaml_node_t *n, char **dst, const char *s)
{
    char *copy = strdup(s);

    if (copy == NULL)
        return sk_walk_fail(L, n, "out of memory");
    sk_conf_value_wipe(*dst);
    *dst = copy;
    return SK_OK;
}

int sk_walk_fail(struct loader *L, const yaml_node_t *n, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return sk_err_set(L->err, SK_ERR, "%s:%zu:%zu: %s", L->path,
                      n->start_mark.line + 1, n->start_mark.column + 1, msg);
}

yaml_node_t *sk_walk_node(struct loader *L, int index)
{
    yaml_node_t *n = yaml_document_get_node(L->doc, index);

    sk_assert(n != NULL);
    return n;
}

size_t sk_walk_items(const yaml_node_t *v)
{
    return (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
}

yaml_node_t *sk_walk_item(struct loader *L, const yaml_node_t *v, size_t i)
{
    return sk_walk_node(L, v->data.sequence.items.start[i]);
}

/* The value of the first pair named key; the caller knows there is one. */
yaml_node_t *sk_walk_find(struct loader *L, yaml_node_t *map, const char *key)
{
    yaml_node_pair_t *p = map->data.mapping.pairs.start;

    while (strcmp((const char *)sk_walk_node(L, p->key)->data.scalar.value, key) != 0)
        p++;
    return sk_walk_node(L, p->value);
}

/* As sk_walk_find(), but the key may be absent: NULL then. */
yaml_node_t *sk_walk_lookup(struct loader *L, yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++)
        if (strcmp((const char *)sk_walk_node(L, p->key)->data.scalar.value, key) == 0)
            return sk_walk_node(L, p->value);
    return NULL;
}

const char *sk_walk_kind(const yaml_node_t *n)
{
    if (sk_walk_is_null(n))
        return "null";
    return n->type == YAML_MAPPING_NODE ? "a mapping"
         : n->type == YAML_SEQUENCE_NODE ? "a sequence" : "a scalar";
}

/* YAML's null: an empty, ~ or null plain scalar. A quoted "" is a string. */
bool sk_walk_is_null(const yaml_node_t *n)
{
    static const char *const nulls[] = { "", "~", "null", "Null", "NULL" };

    for (size_t i = 0; n->type == YAML_SCALAR_NODE && i < SK_ARRAY_LEN(nulls); i++)
        if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
            strcmp((const char *)n->data.scalar.value, nulls[i]) == 0)
            return true;
    return false;
}

/* A stock handler is named, not pathed: `handler: sql` is sekali's own
 * SK_HANDLER_DIR/sql.so (SEKALI_HANDLER_DIR overrides the directory, for a
 * build tree). Anything with a '/' or ending in ".so" is a path, as always;
 * the name's characters are NAME_CHARS, so it cannot climb out. Returns a
 * new string. */
static char *resolve_handler(struct loader *L, const char *name)
{
    size_t n = strlen(name);
    if (strchr(name, '/') != NULL || (n >= 3 && strcmp(name + n - 3, ".so") == 0) ||
        strspn(name, NAME_CHARS) != n || strstr(name, "..") != NULL)
        return resolve(L, name);
    const char *dir = getenv("SEKALI_HANDLER_DIR");
    char *out;
    if (dir == NULL || dir[0] == '\0')
        dir = SK_HANDLER_DIR;
    return asprintf(&out, "%s/%s.so", dir, name) < 0 ? NULL : out;
}

/* Returns a new string: path if absolute, else path under the config's directory. */
static char *resolve(struct loader *L, const char *path)
{
    char *out;

    if (path[0] == '/')
        return strdup(path);
    return asprintf(&out, "%s/%s", L->dir, path) < 0 ? NULL : out;
}
