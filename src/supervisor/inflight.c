/* inflight.c - the jobs in flight as JSON (see inflight.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "inflight.h"
#include "text.h"

struct entry {
    const char         *queue;
    long                pid;
    int                 phase;
    int64_t             started_ms;  /* CLOCK_MONOTONIC, as the slot has it */
    struct sk_slot_job  job;
};

static size_t collect(const struct generation *g, struct entry *out);
static int by_start(const void *a, const void *b);
static void put_entry(FILE *f, const struct entry *e, int64_t now_ms, int64_t wall_ms);
static void put_str(FILE *f, const char *s);
static void put_time(FILE *f, int64_t wall_ms);

char *sk_inflight_json(const struct generation *const *gens, size_t n, size_t *len)
{
    size_t slots = 0;
    for (size_t i = 0; i < n; i++)
        slots += gens[i] != NULL ? gens[i]->n_slots : 0;
    struct entry *entries = calloc(slots > 0 ? slots : 1, sizeof(*entries));
    if (entries == NULL)
        return NULL;
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        if (gens[i] != NULL)
            count += collect(gens[i], entries + count);
    qsort(entries, count, sizeof(*entries), by_start);

    int64_t now_ms = sk_now_ms();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t wall_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (f == NULL) {
        free(entries);
        return NULL;
    }
    fputs("{\"now\":", f);
    put_time(f, wall_ms);
    fputs(",\"inflight\":[", f);
    for (size_t i = 0; i < count; i++) {
        fputs(i > 0 ? ",\n" : "\n", f);
        put_entry(f, &entries[i], now_ms, wall_ms);
    }
    fputs("]}\n", f);
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0 || failed) {
        free(text);
        text = NULL;
    }
    free(entries);
    return text;
}

/* A slot's job, if its process runs one: the start is read before the
 * fields and again after, so a job that ended meanwhile is left out
 * rather than shown under the next job's start. */
static size_t collect(const struct generation *g, struct entry *out)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n_slots; i++) {
        const struct slot *slot = &g->slots[i];
        if (!slot->ops->counts_as_worker || slot->pid <= 0)
            continue;
        const struct sk_slot *shared = sk_scoreboard_slot(g->scoreboard, i);
        int64_t started = atomic_load(&shared->job_started_ms);
        if (started == 0)
            continue;
        struct entry *e = &out[n];
        *e = (struct entry){ .queue = g->conf->queues[slot->queue].name, .pid = (long)slot->pid,
                             .phase = atomic_load(&shared->phase), .started_ms = started };
        sk_slot_read_job(shared, &e->job);
        if (atomic_load(&shared->job_started_ms) == started)
            n++;
    }
    return n;
}

static int by_start(const void *a, const void *b)
{
    int64_t x = ((const struct entry *)a)->started_ms, y = ((const struct entry *)b)->started_ms;
    return (x > y) - (x < y);
}

static void put_entry(FILE *f, const struct entry *e, int64_t now_ms, int64_t wall_ms)
{
    int64_t age = now_ms > e->started_ms ? now_ms - e->started_ms : 0;
    fputs("{\"queue\":", f);
    put_str(f, e->queue);
    fprintf(f, ",\"pid\":%ld,\"phase\":\"%s\",\"key\":", e->pid,
            e->phase == SK_PHASE_HANDLER ? "handler" : "job");
    put_str(f, e->job.key);
    fputs(",\"job_type\":", f);
    put_str(f, e->job.type);
    fprintf(f, ",\"attempt\":%u,\"trace_id\":", (unsigned)e->job.attempt);
    put_str(f, e->job.trace_id);
    fputs(",\"started_at\":", f);
    put_time(f, wall_ms - age);
    fprintf(f, ",\"age_ms\":%lld}", (long long)age);
}

/* A JSON string whose text may be passed on whole, into a page or onto a
 * terminal (as sekalictl's own JSON is): control characters, C0 and C1,
 * '"', '\\', '<', '>', '&', and the characters that reorder text (bidi
 * controls and marks, the line and paragraph separators) as \u escapes. A
 * string that is not UTF-8 keeps its ASCII and shows U+FFFD for every
 * other byte. */
static void put_str(FILE *f, const char *s)
{
    size_t len = strlen(s);
    bool utf8 = sk_text_valid(s, len);
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        const unsigned char *p = (const unsigned char *)s + i;
        if (*p >= 0x80 && !utf8) {
            fputs("\\ufffd", f);
            i++;
            continue;
        }
        size_t n = *p < 0x80 ? 1 : *p < 0xe0 ? 2 : *p < 0xf0 ? 3 : 4;
        uint32_t cp = n == 1 ? *p : sk_text_disguising(p, n);
        if ((n == 1 && (cp < 0x20 || cp == 0x7f || strchr("\"\\<>&", (int)cp) != NULL)) ||
            (n > 1 && cp != 0))
            fprintf(f, "\\u%04x", (unsigned)cp);
        else
            fwrite(p, 1, n, f);
        i += n;
    }
    fputc('"', f);
}

static void put_time(FILE *f, int64_t wall_ms)
{
    time_t secs = (time_t)(wall_ms / 1000);
    struct tm tm;
    char text[32];
    gmtime_r(&secs, &tm);
    strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(f, "\"%s.%03dZ\"", text, (int)(wall_ms % 1000));
}
