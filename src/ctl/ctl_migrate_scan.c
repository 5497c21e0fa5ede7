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
static bool only_constraints(const struct words *ws);
static bool changes_type(const struct words *ws);
static enum sk_mig_work added_columns(const struct words *ws);
static enum sk_mig_work added_column(const struct words *ws, size_t from, size_t end);
static enum sk_mig_work default_work(const struct words *ws, size_t from, size_t end);
static bool is(const struct words *ws, size_t i, const char *word);
static bool is_one_of(const struct words *ws, size_t i, const char *const *list);
static bool in_list(const char *word, const char *const *list);
static size_t find(const struct words *ws, size_t from, const char *word);
static size_t skip_opt(const struct words *ws, size_t i);
static void name_at(const struct words *ws, size_t i, struct sk_mig_stmt *st);
static void name_of(const struct words *ws, size_t i, char *name, size_t size);

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
    size_t refs = find(ws, 2, "REFERENCES");
    if (find(ws, 2, "VALIDATE") < ws->n) {
        st->lock = SK_MIG_LOCK_SHARE_UPDATE_EXCLUSIVE;
        st->work = SK_MIG_WORK_SCAN;
    } else if (refs < ws->n) {
        /* The referenced table gets triggers, and until the key is valid
         * the check joins every row against it. */
        name_of(ws, refs + 1, st->other, sizeof(st->other));
        st->other_lock = SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE;
        st->other_work = st->work = not_valid ? SK_MIG_WORK_CATALOG : SK_MIG_WORK_SCAN;
        if (only_constraints(ws))
            st->lock = SK_MIG_LOCK_SHARE_ROW_EXCLUSIVE;
    } else if (changes_type(ws)) {
        st->work = SK_MIG_WORK_REWRITE;
    } else if ((find(ws, 2, "CHECK") < ws->n && !not_valid) ||
               (find(ws, 2, "SET") < ws->n && find(ws, 2, "NULL") < ws->n &&
                find(ws, 2, "DROP") == ws->n)) {
        st->work = SK_MIG_WORK_SCAN;  /* checks every row, locked */
    }
    enum sk_mig_work added = added_columns(ws);
    if (added > st->work)
        st->work = added;
}

/* Whether every ADD of the statement adds a table constraint (a column
 * with REFERENCES is an ADD COLUMN, which locks its table exclusively). */
static bool only_constraints(const struct words *ws)
{
    for (size_t i = 2; i < ws->n; i++)
        if ((is(ws, i, "ADD") && !is(ws, i + 1, "CONSTRAINT") && !is(ws, i + 1, "FOREIGN")) ||
            is(ws, i, "COLUMN"))
            return false;
    return true;
}

/* ALTER [COLUMN] c [SET DATA] TYPE t: PostgreSQL rewrites the table and its
 * indexes unless the old type converts to the new one as it is (varchar(n)
 * widened), which the text does not tell: said as a rewrite. */
static bool changes_type(const struct words *ws)
{
    for (size_t i = 3; i < ws->n; i++)
        if (is(ws, i, "TYPE") && (is(ws, i - 1, "DATA") || is(ws, i - 2, "ALTER") ||
                                  (i >= 4 && is(ws, i - 2, "COLUMN") && is(ws, i - 3, "ALTER"))))
            return true;
    return false;
}

/* The work of the columns the statement adds. PostgreSQL (11 and later)
 * keeps a non-volatile default in the catalog, evaluated once, but must
 * write a volatile default, an identity, a serial or a stored generated
 * column into every row: a rewrite under AccessExclusive. */
static enum sk_mig_work added_columns(const struct words *ws)
{
    enum sk_mig_work work = SK_MIG_WORK_CATALOG;
    for (size_t i = 2; i < ws->n; i++) {
        if (!is(ws, i, "ADD") || is(ws, i + 1, "CONSTRAINT") || is(ws, i + 1, "FOREIGN") ||
            is(ws, i + 1, "PRIMARY") || is(ws, i + 1, "UNIQUE") || is(ws, i + 1, "CHECK") ||
            is(ws, i + 1, "EXCLUDE"))
            continue;
        size_t end = i + 1;
        for (int depth = 0; end < ws->n && (depth > 0 || !is(ws, end, ","));  end++)
            depth += is(ws, end, "(") ? 1 : is(ws, end, ")") ? -1 : 0;
        enum sk_mig_work w = added_column(ws, i + 1, end);
        if (w > work)
            work = w;
        i = end;
    }
    return work;
}

static enum sk_mig_work added_column(const struct words *ws, size_t from, size_t end)
{
    static const char *const serials[] = { "serial", "serial2", "serial4", "serial8",
                                           "smallserial", "bigserial", NULL };
    for (size_t i = from; i < end; i++) {
        if (is_one_of(ws, i, serials) ||
            (is(ws, i, "GENERATED") && find(ws, i, "VIRTUAL") >= end))
            return SK_MIG_WORK_REWRITE;
        if (is(ws, i, "DEFAULT") && !is(ws, i - 1, "SET"))
            return default_work(ws, i + 1, end);
    }
    return SK_MIG_WORK_CATALOG;
}

/* A default's expression, from `from` to the next column constraint: its
 * constants, operators and casts cost nothing per row; a call of a
 * function known to be volatile rewrites, of one known not to be does not,
 * and of any other may (its volatility is in pg_proc, not in the text). */
static enum sk_mig_work default_work(const struct words *ws, size_t from, size_t end)
{
    static const char *const volatile_fns[] = {
        "random", "random_normal", "gen_random_uuid", "uuidv4", "uuidv7", "uuid_generate_v1",
        "uuid_generate_v1mc", "uuid_generate_v4", "gen_random_bytes", "clock_timestamp",
        "timeofday", "nextval", "setval", "txid_current", "pg_current_xact_id", NULL };
    static const char *const steady_fns[] = {
        "now", "transaction_timestamp", "statement_timestamp", "current_setting", "coalesce",
        "nullif", "greatest", "least", "cast", "lower", "upper", "md5", "concat", "array",
        "jsonb_build_object", "json_build_object", "jsonb_build_array", "json_build_array",
        "make_interval", "date_trunc", "to_jsonb", "to_json", NULL };
    static const char *const constraints[] = { "NOT", "CONSTRAINT", "CHECK", "REFERENCES",
                                               "PRIMARY", "UNIQUE", "GENERATED", "COLLATE",
                                               NULL };
    enum sk_mig_work work = SK_MIG_WORK_CATALOG;
    int depth = 0;
    for (size_t i = from; i < end; i++) {
        depth += is(ws, i, "(") ? 1 : is(ws, i, ")") ? -1 : 0;
        /* A string literal leaves no word: DEFAULT 'x' NULL reads as DEFAULT NULL. */
        if (depth == 0 && (is_one_of(ws, i, constraints) || (i > from && is(ws, i, "NULL"))))
            break;
        /* A call, not a type's modifier (x::numeric(10, 2), CAST(x AS t(n))). */
        if (!is(ws, i + 1, "(") || is(ws, i - 1, ":") || is(ws, i - 1, "AS") ||
            !(isalpha((unsigned char)ws->w[i][0]) || ws->w[i][0] == '_' || ws->w[i][0] == '"'))
            continue;
        const char *fn = ws->w[i];
        if (strncasecmp(fn, "pg_catalog.", 11) == 0)
            fn += 11;
        if (in_list(fn, volatile_fns))
            return SK_MIG_WORK_REWRITE;
        if (!in_list(fn, steady_fns))
            work = SK_MIG_WORK_MAY_REWRITE;
    }
    return work;
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

static bool is_one_of(const struct words *ws, size_t i, const char *const *list)
{
    return i < ws->n && in_list(ws->w[i], list);
}

static bool in_list(const char *word, const char *const *list)
{
    for (; *list != NULL; list++)
        if (strcasecmp(word, *list) == 0)
            return true;
    return false;
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
    name_of(ws, i, st->table, sizeof(st->table));
}

static void name_of(const struct words *ws, size_t i, char *name, size_t size)
{
    if (i < ws->n && (isalpha((unsigned char)ws->w[i][0]) || ws->w[i][0] == '_' ||
                      ws->w[i][0] == '"'))
        snprintf(name, size, "%s", ws->w[i]);
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
