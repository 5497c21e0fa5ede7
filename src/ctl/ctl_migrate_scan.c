/* ctl_migrate_scan.c - what a migration file's statements will do, read
 * from its text, so that `sekalictl migrate` can say its plan before it
 * runs anything (ctl_migrate_plan.c).
 *
 * This is no SQL parser: it cuts the file into top-level statements (past
 * comments, string literals and dollar-quoted function bodies) and reads
 * the first words of each, the way the migrations of sql/ are written. The
 * lock of each kind of statement is the one PostgreSQL's manual gives
 * ("Explicit Locking"); a statement it cannot read (a call, a DO block) is
 * said to be unknown rather than guessed. */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "ctl_migrate_scan.h"

#define MAX_WORDS 64
#define WORD_SIZE 128

struct words {
    char w[MAX_WORDS][WORD_SIZE];
    size_t n;
};

static const char *skip_quoted(const char *p);
static void add_word(struct words *ws, const char *start, size_t len);
static void classify(const struct words *ws, struct sk_mig_stmt *st);
static void classify_create(const struct words *ws, struct sk_mig_stmt *st);
static void classify_alter(const struct words *ws, struct sk_mig_stmt *st);
static void classify_drop(const struct words *ws, struct sk_mig_stmt *st);
static void classify_lock(const struct words *ws, struct sk_mig_stmt *st);
static bool is(const struct words *ws, size_t i, const char *word);
static size_t find(const struct words *ws, size_t from, const char *word);
static size_t skip_opt(const struct words *ws, size_t i);
static void name_at(const struct words *ws, size_t i, struct sk_mig_stmt *st);

size_t sk_ctl_migration_scan(const char *sql, struct sk_mig_stmt *out, size_t max)
{
    struct words ws = { .n = 0 };
    size_t n = 0;
    const char *p = sql;
    for (;;) {
        const char *next = skip_quoted(p);
        if (next != p) {
            p = next;
            continue;
        }
        if (*p == ';' || *p == '\0') {
            if (ws.n > 0) {
                if (n < max)
                    classify(&ws, &out[n]);
                n++;
            }
            ws.n = 0;
            if (*p == '\0')
                return n;
            p++;
        } else if (isalnum((unsigned char)*p) || *p == '_' || *p == '"' || *p == '.') {
            const char *start = p;
            while (*p != '\0') {
                if (*p == '"') {  /* a quoted identifier never closed runs to the end */
                    const char *close = strchr(p + 1, '"');
                    p = close != NULL ? close + 1 : p + strlen(p);
                } else if (isalnum((unsigned char)*p) || *p == '_' || *p == '.' || *p == '$') {
                    p++;
                } else {
                    break;
                }
            }
            add_word(&ws, start, (size_t)(p - start));
        } else if (isspace((unsigned char)*p)) {
            p++;
        } else {
            add_word(&ws, p, 1);
            p++;
        }
    }
}

/* Past a comment, a string literal or a dollar-quoted body at p; p itself
 * when none starts there. An unterminated one runs to the end. */
static const char *skip_quoted(const char *p)
{
    if (p[0] == '-' && p[1] == '-')
        return p + strcspn(p, "\n");
    if (p[0] == '/' && p[1] == '*') {
        const char *end = strstr(p + 2, "*/");
        return end != NULL ? end + 2 : p + strlen(p);
    }
    if (p[0] == '\'') {
        const char *end = strchr(p + 1, '\'');  /* '' inside: two literals, same effect */
        return end != NULL ? end + 1 : p + strlen(p);
    }
    if (p[0] != '$' || isdigit((unsigned char)p[1]))  /* $1 is a parameter */
        return p;
    size_t tag = 1 + strspn(p + 1, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
    if (p[tag] != '$')
        return p;
    char delim[WORD_SIZE];
    if (tag + 1 >= sizeof(delim))
        return p + tag + 1;
    memcpy(delim, p, tag + 1);
    delim[tag + 1] = '\0';
    const char *end = strstr(p + tag + 1, delim);
    return end != NULL ? end + tag + 1 : p + strlen(p);
}

static void add_word(struct words *ws, const char *start, size_t len)
{
    if (ws->n == MAX_WORDS)
        return;
    if (len >= WORD_SIZE)
        len = WORD_SIZE - 1;
    memcpy(ws->w[ws->n], start, len);
    ws->w[ws->n][len] = '\0';
    ws->n++;
}

static void classify(const struct words *ws, struct sk_mig_stmt *st)
{
    memset(st, 0, sizeof(*st));
    st->lock = SK_MIG_LOCK_NONE;
    st->work = SK_MIG_WORK_CATALOG;
    if (is(ws, 0, "CREATE")) {
        classify_create(ws, st);
    } else if (is(ws, 0, "ALTER")) {
        classify_alter(ws, st);
    } else if (is(ws, 0, "DROP")) {
        classify_drop(ws, st);
    } else if (is(ws, 0, "LOCK")) {
        classify_lock(ws, st);
    } else if (is(ws, 0, "TRUNCATE")) {
        st->lock = SK_MIG_LOCK_ACCESS_EXCLUSIVE;
        name_at(ws, skip_opt(ws, 1), st);
    } else if (is(ws, 0, "INSERT") || is(ws, 0, "UPDATE") || is(ws, 0, "DELETE")) {
        st->lock = SK_MIG_LOCK_ROW_EXCLUSIVE;
        st->work = SK_MIG_WORK_ROWS;
        name_at(ws, skip_opt(ws, 1), st);
    } else if (is(ws, 0, "SELECT") || is(ws, 0, "DO") || is(ws, 0, "CALL") ||
               is(ws, 0, "WITH") || is(ws, 0, "REINDEX") || is(ws, 0, "CLUSTER") ||
               is(ws, 0, "VACUUM")) {
        st->work = SK_MIG_WORK_UNKNOWN;
    }
    /* SET, COMMENT, GRANT, REVOKE, ANALYZE: the catalog or the session only. */
}

static void classify_create(const struct words *ws, struct sk_mig_stmt *st)
{
    size_t i = 1;
    while (is(ws, i, "OR") || is(ws, i, "REPLACE") || is(ws, i, "UNIQUE") ||
           is(ws, i, "UNLOGGED") || is(ws, i, "TEMP") || is(ws, i, "TEMPORARY") ||
           is(ws, i, "CONSTRAINT"))
        i++;
    if (is(ws, i, "INDEX")) {
        bool concurrently = is(ws, i + 1, "CONCURRENTLY");
        st->lock = concurrently ? SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE : SK_MIG_LOCK_SHARE;
        st->work = SK_MIG_WORK_SCAN;
        size_t on = find(ws, i + 1, "ON");
        name_at(ws, skip_opt(ws, on + 1), st);
    } else if (is(ws, i, "TABLE")) {
        /* A new table: no one waits; IF NOT EXISTS on an existing one does nothing. */
        name_at(ws, skip_opt(ws, i + 1), st);
    } else if (is(ws, i, "TRIGGER")) {
        st->lock = SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE;
        name_at(ws, skip_opt(ws, find(ws, i + 1, "ON") + 1), st);
    }
}

static void classify_alter(const struct words *ws, struct sk_mig_stmt *st)
{
    if (!is(ws, 1, "TABLE"))
        return;  /* a function, a type, a sequence: the catalog */
    name_at(ws, skip_opt(ws, 2), st);
    st->lock = SK_MIG_LOCK_ACCESS_EXCLUSIVE;
    bool not_valid = find(ws, 2, "VALID") < ws->n && is(ws, find(ws, 2, "VALID") - 1, "NOT");
    if (find(ws, 2, "VALIDATE") < ws->n) {
        st->lock = SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE;
        st->work = SK_MIG_WORK_SCAN;
    } else if (find(ws, 2, "FOREIGN") < ws->n || find(ws, 2, "REFERENCES") < ws->n) {
        st->lock = SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE;
        st->work = not_valid ? SK_MIG_WORK_CATALOG : SK_MIG_WORK_SCAN;
    } else if ((find(ws, 2, "CHECK") < ws->n && !not_valid) || find(ws, 2, "TYPE") < ws->n ||
               (find(ws, 2, "SET") < ws->n && find(ws, 2, "NULL") < ws->n &&
                find(ws, 2, "DROP") == ws->n)) {
        st->work = SK_MIG_WORK_SCAN;  /* checks (or rewrites) every row, locked */
    }
}

static void classify_drop(const struct words *ws, struct sk_mig_stmt *st)
{
    if (is(ws, 1, "INDEX")) {
        bool concurrently = is(ws, 2, "CONCURRENTLY");
        st->lock = concurrently ? SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE
                                : SK_MIG_LOCK_ACCESS_EXCLUSIVE;
        name_at(ws, skip_opt(ws, concurrently ? 3 : 2), st);
    } else if (is(ws, 1, "TABLE")) {
        st->lock = SK_MIG_LOCK_ACCESS_EXCLUSIVE;
        name_at(ws, skip_opt(ws, 2), st);
    } else if (is(ws, 1, "TRIGGER")) {
        st->lock = SK_MIG_LOCK_ACCESS_EXCLUSIVE;
        name_at(ws, skip_opt(ws, find(ws, 2, "ON") + 1), st);
    }
}

static void classify_lock(const struct words *ws, struct sk_mig_stmt *st)
{
    static const struct {
        const char *first, *second;
        enum sk_mig_lock lock;
    } modes[] = {
        { "ROW", "EXCLUSIVE", SK_MIG_LOCK_ROW_EXCLUSIVE },
        { "SHARE", "UPDATE", SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE },
        { "SHARE", "ROW", SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE },
        { "SHARE", "MODE", SK_MIG_LOCK_SHARE },
        { "EXCLUSIVE", "MODE", SK_MIG_LOCK_EXCLUSIVE },
    };
    name_at(ws, skip_opt(ws, 1), st);
    st->lock = SK_MIG_LOCK_ACCESS_EXCLUSIVE;
    size_t in = find(ws, 1, "IN");
    for (size_t m = 0; in < ws->n && m < sizeof(modes) / sizeof(modes[0]); m++)
        if (is(ws, in + 1, modes[m].first) && is(ws, in + 2, modes[m].second))
            st->lock = modes[m].lock;
}

static bool is(const struct words *ws, size_t i, const char *word)
{
    return i < ws->n && strcasecmp(ws->w[i], word) == 0;
}

/* The index of word at or after from, or ws->n. */
static size_t find(const struct words *ws, size_t from, const char *word)
{
    while (from < ws->n && !is(ws, from, word))
        from++;
    return from;
}

/* Past the words that may stand between a keyword and the object's name. */
static size_t skip_opt(const struct words *ws, size_t i)
{
    while (is(ws, i, "IF") || is(ws, i, "NOT") || is(ws, i, "EXISTS") || is(ws, i, "ONLY") ||
           is(ws, i, "TABLE") || is(ws, i, "INTO") || is(ws, i, "FROM"))
        i++;
    return i;
}

static void name_at(const struct words *ws, size_t i, struct sk_mig_stmt *st)
{
    if (i < ws->n && (isalpha((unsigned char)ws->w[i][0]) || ws->w[i][0] == '_' ||
                      ws->w[i][0] == '"'))
        snprintf(st->table, sizeof(st->table), "%s", ws->w[i]);
}

const char *sk_ctl_mig_lock_name(enum sk_mig_lock lock)
{
    switch (lock) {
    case SK_MIG_LOCK_NONE: return "none";
    case SK_MIG_LOCK_ROW_EXCLUSIVE: return "RowExclusive";
    case SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE: return "ShareUpdateExclusive";
    case SK_MIG_LOCK_SHARE: return "Share";
    case SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE: return "ShareRowExclusive";
    case SK_MIG_LOCK_EXCLUSIVE: return "Exclusive";
    case SK_MIG_LOCK_ACCESS_EXCLUSIVE: return "AccessExclusive";
    }
    return "unknown";
}

const char *sk_ctl_mig_lock_effect(enum sk_mig_lock lock)
{
    switch (lock) {
    case SK_MIG_LOCK_NONE: return "nobody waits";
    case SK_MIG_LOCK_ROW_EXCLUSIVE: return "writers of the same rows wait";
    case SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE: return "writes go on";
    case SK_MIG_LOCK_SHARE:
    case SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE:
    case SK_MIG_LOCK_EXCLUSIVE: return "writes wait, reads go on";
    case SK_MIG_LOCK_ACCESS_EXCLUSIVE: return "reads and writes wait";
    }
    return "unknown";
}
