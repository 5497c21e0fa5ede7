/* config_walk.h - private to src/config/config*.c: the schema's vocabulary
 * and the walker that applies it.
 *
 * The schema is a set of static tables of keys (type, field, bounds,
 * required), one file per group of sections, as nginx gives each module its
 * own directive table: config_servers.c (amqp, redis, postgres, metrics,
 * console), config_queues.c (queues), config_schedules.c (schedules), and
 * the top table with the small sections in config.c. config_walk.c walks a
 * libyaml document through a table and places every error at its node's
 * file:line:column; a section's own checks (one key needing another, a
 * value only its section can judge) are functions of its file, called
 * through a CUSTOM row. A section file uses the walker and never another
 * section file; config.c alone names them all. The walker knows no
 * section's struct: this header does not include config.h, which the
 * section files do. */
#ifndef SK_CONFIG_WALK_H
#define SK_CONFIG_WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "common.h"
#include "config_value.h"

#define MAX_NAME      200         /* AMQP allows 255: leave room for suffixes */
#define NAME_CHARS    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
#define MIN_LOCK_TTL  100         /* shorter leases cannot be renewed (every ttl/3) in time */
#define MAX_RETENTION (100 * 365 * DAY)  /* years; longer is "forever" */

enum type {
    T_STR,            /* char *, non-empty */
    T_NAME,           /* char *, 1 to MAX_NAME of NAME_CHARS: safe in AMQP, Redis and logs */
    T_PATH,           /* char *, resolved against the config file's directory */
    T_HANDLER,        /* T_PATH, or a bare NAME: SK_HANDLER_DIR/NAME.so */
    T_LIST,           /* char ** of non-empty scalars, followed by its size_t count */
    T_INT,            /* int in [min, max] */
    T_BOOL,           /* bool: true/false/yes/no/on/off */
    T_DURATION,       /* uint32_t milliseconds in [min, max] */
    T_SIZE,           /* size_t bytes in [min, max] */
    T_RETENTION,      /* uint64_t milliseconds in [min, max], or "forever": UINT64_MAX */
    T_ENUM,           /* an enum whose values index names[] */
    T_SECTION,        /* a nested mapping described by sub[] */
    T_PASSWORD_ENV,   /* char *password, read from the named variable */
    T_PASSWORD_FILE,  /* char *password, read from the named file */
    T_CUSTOM,         /* fn() parses it and may fill several fields */
};

struct loader;
struct sk_tracing_conf;

struct key {
    const char        *name;
    enum type          type;
    size_t             offset;  /* of the field in the section's struct */
    uint64_t           min, max;
    bool               required;
    const struct key  *sub;
    const char *const *names;
    int              (*fn)(struct loader *L, yaml_node_t *value, void *base);
};

struct loader {
    const char       *path;
    char             *dir;          /* absolute directory of path */
    yaml_document_t  *doc;
    struct sk_err    *err;
    const char       *secret_from;  /* where this section's password came from */
    const char       *text;         /* the file's text, for positions inside values */
    size_t            len;
    const struct key *top;          /* the top table: its messages say "at the top level" */
};

/* The schema. Adding a key: a line in its section's table, a field in
 * config.h (or the adapter's conf struct), its default below the tables, a
 * documented line in conf/sekali.yaml and an entry in man/sekali.yaml.5;
 * tests/unit/check_docs.c holds those three equal (docs/internals.md,
 * "Adding a config key"). */
#define OF(s, f)                   offsetof(struct s, f)
#define STR(n, s, f)               { .name = n, .type = T_STR, .offset = OF(s, f) }
#define NAME(n, s, f, req)         { .name = n, .type = T_NAME, .offset = OF(s, f), .required = req }
#define PATH(n, s, f, req)         { .name = n, .type = T_PATH, .offset = OF(s, f), .required = req }
#define HANDLER(n, s, f, req)      { .name = n, .type = T_HANDLER, .offset = OF(s, f), .required = req }
#define LIST(n, s, f)              { .name = n, .type = T_LIST, .offset = OF(s, f) }
#define INT(n, s, f, lo, hi)       { .name = n, .type = T_INT, .offset = OF(s, f), .min = lo, .max = hi }
#define BOOL(n, s, f)              { .name = n, .type = T_BOOL, .offset = OF(s, f) }
#define DURATION(n, s, f, lo, hi)  { .name = n, .type = T_DURATION, .offset = OF(s, f), .min = lo, .max = hi }
#define SIZE(n, s, f, lo, hi)      { .name = n, .type = T_SIZE, .offset = OF(s, f), .min = lo, .max = hi }
#define RETENTION(n, s, f)         { .name = n, .type = T_RETENTION, .offset = OF(s, f), .min = SEC, .max = MAX_RETENTION }
#define ENUM(n, s, f, list)        { .name = n, .type = T_ENUM, .offset = OF(s, f), .names = list }
#define SUBSECTION(n, s, f, table)  { .name = n, .type = T_SECTION, .offset = OF(s, f), \
                                     .sub = table }
#define SECTION(n, f, table, req)  { .name = n, .type = T_SECTION, .offset = OF(sk_conf, f), \
                                     .sub = table, .required = req }
#define CUSTOM(n, func, req)       { .name = n, .type = T_CUSTOM, .fn = func, .required = req }
/* A section with checks of its own: fn() loads it by table, which names its
 * keys for sk_conf_each_key() (the loader itself goes through fn() only). */
#define CUSTOM_SECTION(n, func, table, req) \
    { .name = n, .type = T_CUSTOM, .fn = func, .sub = table, .required = req }
#define PASSWORD(s) \
    { .name = "password_env",  .type = T_PASSWORD_ENV,  .offset = OF(s, password) }, \
    { .name = "password_file", .type = T_PASSWORD_FILE, .offset = OF(s, password) }
#define END                        { .name = NULL }

/* The walker (config_walk.c). Each returns SK_OK, or SK_ERR with
 * "path:line:column: message" in L->err. */

/* Loads the one document of text into *L->doc, which the caller deletes
 * on success. A syntax error, an empty file or a second document fails. */
int sk_walk_parse(struct loader *L, yaml_parser_t *parser, const char *text, size_t len);
/* Applies each pair of map to base through table, in document order, then
 * checks the required keys. label names the mapping in messages. */
int sk_walk_map(struct loader *L, yaml_node_t *map, const char *label,
                const struct key *table, void *base);
/* One key's value v into its field of base, by the key's type. */
int sk_walk_apply(struct loader *L, const struct key *k, yaml_node_t *v, void *base);
/* A T_PASSWORD_ENV or T_PASSWORD_FILE key k into *dst (one source per section). */
int sk_walk_password(struct loader *L, const struct key *k, yaml_node_t *v, char **dst);
/* Records source as the section's password's; fails if it already has one. */
int sk_walk_claim_secret(struct loader *L, yaml_node_t *v, const char *source);
/* *out = n's text, a scalar without NUL bytes; expect completes
 * "label: expected ..., got ..." otherwise. */
int sk_walk_scalar(struct loader *L, yaml_node_t *n, const char *label,
                   const char *expect, const char **out);
/* Replaces *dst (wiped, then freed) by a copy of s. */
int sk_walk_store(struct loader *L, yaml_node_t *n, char **dst, const char *s);
/* Fills L->err with the message at n's position; returns SK_ERR. */
int sk_walk_fail(struct loader *L, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The document's node of that index; it exists. */
yaml_node_t *sk_walk_node(struct loader *L, int index);
/* How many items the sequence v holds, and its item i (i below that). */
size_t sk_walk_items(const yaml_node_t *v);
yaml_node_t *sk_walk_item(struct loader *L, const yaml_node_t *v, size_t i);
/* The value of the first pair named key; the caller knows there is one. */
yaml_node_t *sk_walk_find(struct loader *L, yaml_node_t *map, const char *key);
/* As sk_walk_find(), but the key may be absent: NULL then. */
yaml_node_t *sk_walk_lookup(struct loader *L, yaml_node_t *map, const char *key);
/* "null", "a mapping", "a sequence" or "a scalar", for messages. */
const char *sk_walk_kind(const yaml_node_t *n);
/* YAML's null: an empty, ~ or null plain scalar. A quoted "" is a string. */
bool sk_walk_is_null(const yaml_node_t *n);

/* The sections' tables and checks, which config.c's top table names. */
extern const struct key sk_conf_amqp_keys[], sk_conf_redis_keys[], sk_conf_postgres_keys[],
                        sk_conf_metrics_keys[], sk_conf_console_keys[],
                        sk_conf_tracing_keys[];
int sk_conf_amqp_section(struct loader *L, yaml_node_t *v, void *base);
int sk_conf_redis_section(struct loader *L, yaml_node_t *v, void *base);
/* Frees t's otlp_headers (values wiped); t stays usable. */
void sk_conf_tracing_free_headers(struct sk_tracing_conf *t);

extern const struct key sk_conf_queue_keys[];
int sk_conf_queues_load(struct loader *L, yaml_node_t *v, void *base);

extern const struct key sk_conf_schedule_keys[];
int sk_conf_schedules_load(struct loader *L, yaml_node_t *v, void *base);

#endif
