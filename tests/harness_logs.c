/* harness_logs.c - what tests read from files: whole files, a document's
 * fenced examples, and lines counted in sekalid's logs and the failpoint
 * marks, by text or (preferably) by event name and field. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_private.h"

char *h_read_stream(FILE *in)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(mem);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), in)) > 0)
        fwrite(chunk, 1, n, mem);
    fclose(mem);
    return buf;
}

char *h_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    char *buf = h_read_stream(f);
    fclose(f);
    return buf;
}

char *h_doc_block(const char *path, const char *lang)
{
    char *readme = h_read_file(path);
    ck_assert_msg(readme != NULL, "%s not found: run from the repository root", path);
    char fence[32];
    snprintf(fence, sizeof(fence), "```%s\n", lang);
    char *start = strstr(readme, fence);
    char *end = start != NULL ? strstr(start + strlen(fence), "\n```") : NULL;
    char *block = NULL;
    if (end != NULL)
        block = strndup(start + strlen(fence), (size_t)(end - start) - strlen(fence) + 1);
    free(readme);
    return block;
}

/* The non-empty lines of path for which match(line, arg) holds; 0 if path
 * is missing (a log not written yet). */
static int count_where(const char *path, bool (*match)(const char *line, const void *arg),
                       const void *arg)
{
    char *text = h_read_file(path);
    if (text == NULL)
        return 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n"))
        n += match(line, arg);
    free(text);
    return n;
}

static bool contains(const char *line, const void *needle)
{
    return strstr(line, needle) != NULL;
}

int h_count_lines(const char *path, const char *needle)
{
    return count_where(path, contains, needle);
}

/* h_count_events()'s fields as they stand in a line; "" for one that any
 * line matches. */
struct event_want {
    char role[128], event[128], server[128];
};

static bool is_event(const char *line, const void *arg)
{
    const struct event_want *w = arg;
    return strstr(line, w->event) != NULL &&
           (w->role[0] == '\0' || strstr(line, w->role) != NULL) &&
           (w->server[0] == '\0' || strstr(line, w->server) != NULL);
}

/* A field's key and value, quoted and after a comma, can only be the field
 * itself: a message that quotes one has its quotes escaped. */
int h_count_events(const char *path, const char *role, const char *event, const char *server)
{
    struct event_want w = { "", "", "" };
    if (role != NULL)
        snprintf(w.role, sizeof(w.role), ",\"role\":\"%s\"", role);
    snprintf(w.event, sizeof(w.event), ",\"event\":\"%s\"", event);
    if (server != NULL)
        snprintf(w.server, sizeof(w.server), ",\"server\":\"%s\"", server);
    return count_where(path, is_event, &w);
}

/* Whether line has the field key with value: a string ("key":"value") or a
 * number ("key":value, then ',' or '}'), after a comma as h_count_events()
 * relies on. */
static bool has_field(const char *line, const char *key, const char *value)
{
    char quoted[600], bare[600];
    snprintf(quoted, sizeof(quoted), ",\"%s\":\"%s\"", key, value);
    if (strstr(line, quoted) != NULL)
        return true;
    int n = snprintf(bare, sizeof(bare), ",\"%s\":%s", key, value);
    for (const char *p = line; (p = strstr(p, bare)) != NULL; p++)
        if (p[n] == ',' || p[n] == '}')
            return true;
    return false;
}

/* h_count_event_where()'s key and value pairs, "event" first. */
struct fields_want {
    const char *pairs[2 * 9];
    size_t      n;
};

static bool has_fields(const char *line, const void *arg)
{
    const struct fields_want *w = arg;
    bool all = true;
    for (size_t i = 0; all && i < w->n; i += 2)
        all = has_field(line, w->pairs[i], w->pairs[i + 1]);
    return all;
}

int h_count_event_where(const char *path, const char *event, ...)
{
    struct fields_want w = { { "event", event }, 2 };
    va_list ap;
    va_start(ap, event);
    for (const char *key; (key = va_arg(ap, const char *)) != NULL;) {
        ck_assert_msg(w.n < SK_ARRAY_LEN(w.pairs), "h_count_event_where: too many fields");
        w.pairs[w.n++] = key;
        w.pairs[w.n++] = va_arg(ap, const char *);
    }
    va_end(ap);
    return count_where(path, has_fields, &w);
}

int h_count_outcomes(const char *path, const char *outcome, const char *reason)
{
    return reason == NULL
        ? h_count_event_where(path, SK_EVENT_OUTCOME, "outcome", outcome, NULL)
        : h_count_event_where(path, SK_EVENT_OUTCOME, "outcome", outcome, "reason", reason,
                              NULL);
}

int h_count_deaths(const char *path, const char *key, const char *value)
{
    return h_count_event_where(path, SK_EVENT_WORKER_DIED, "role", "supervisor", key, value,
                               NULL);
}
