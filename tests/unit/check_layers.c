/* check_layers.c - the layering docs/internals.md states, kept true: every
 * file of src/ sits in a layer's folder, includes only from its own layer or
 * the layers below, and no two modules include each other through any path.
 * The same rules hold for calls, read from the built objects' symbols (a
 * module uses another when one of its undefined symbols is defined there,
 * as `nm` shows): no call to a layer above, no two modules calling each
 * other through any path, and none of the "nevers" below. An adapter that
 * starts reading the configuration schema, or a pipeline file that calls
 * back into the process that runs it, fails here before it reaches a
 * review. Run from the repository root after `make`, as tests/run.sh does;
 * the objects are read from $SEKALI_BUILD/obj (build/obj by default). */
/* links: none */
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "suite.h"

/* The folders of src/, top to bottom; a module may include its own layer and
 * any layer below. Within a layer, the cycle test below still forbids loops.
 * Keep in step with SRC_DIRS in the Makefile. */
static const char *const layers[] = {
    "ctl", "supervisor", "worker", "producer", "shared", "config", "adapters", "base",
};
enum { LAYERS = sizeof(layers) / sizeof(layers[0]), MODULES = 128, NAME = 32 };

/* What the layer order alone allows but docs/internals.md forbids, by
 * folder, for includes and calls alike. */
static const struct never {
    const char *from, *to, *why;
} nevers[] = {
    { "supervisor", "adapters", "the supervisor never touches a broker or a database, so that "
      "a crashing handler takes down one worker, never the parent" },
};

struct graph {
    size_t n;
    char   name[MODULES][NAME];
    int    layer[MODULES];         /* index into layers, 0 = top */
    bool   edge[MODULES][MODULES]; /* edge[a][b]: a includes b.h */
    bool   call[MODULES][MODULES]; /* call[a][b]: a.o uses a symbol b.o defines */
    bool   built[MODULES];         /* has a .c, so an object to read */
};

/* "src/worker/links.c" -> the index of "worker", or -1 for a file outside
 * every layer's folder. */
static int layer_of(const char *path)
{
    for (int i = 0; i < LAYERS; i++) {
        char folder[NAME + 8];
        snprintf(folder, sizeof(folder), "src/%s/", layers[i]);
        if (strncmp(path, folder, strlen(folder)) == 0 && strchr(path + strlen(folder), '/') == NULL)
            return i;
    }
    return -1;
}

/* The module called name, registered on first sight with no layer yet. */
static size_t module(struct graph *g, const char *name)
{
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->name[i], name) == 0)
            return i;
    ck_assert_msg(g->n < MODULES, "more than %d modules in src/", MODULES);
    snprintf(g->name[g->n], NAME, "%s", name);
    g->layer[g->n] = -1;
    return g->n++;
}

/* "src/worker/links.c" -> "links" */
static void module_name(const char *path, char *out, size_t size)
{
    const char *base = strrchr(path, '/');
    base = base != NULL ? base + 1 : path;
    snprintf(out, size, "%.*s", (int)strcspn(base, "."), base);
}

/* A module's .c and .h must sit in one folder: the layer is the folder's. */
static void place(struct graph *g, const char *path)
{
    char self[NAME];
    module_name(path, self, sizeof(self));
    size_t m = module(g, self);
    int layer = layer_of(path);
    ck_assert_msg(layer >= 0, "%s is in no layer's folder: move it into one of src/*/ "
                  "(docs/internals.md, \"The layers\")", path);
    ck_assert_msg(g->layer[m] < 0 || g->layer[m] == layer,
                  "%s: the module %s has files in two layers' folders", path, self);
    g->layer[m] = layer;
    if (path[strlen(path) - 1] == 'c')
        g->built[m] = true;
}

static void read_includes(struct graph *g, const char *path)
{
    char self[NAME];
    module_name(path, self, sizeof(self));
    size_t from = module(g, self);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s: run from the repository root", path);
    char line[512];
    while (fgets(line, sizeof(line), f) != NULL) {
        char header[NAME + 2];
        if (sscanf(line, "#include \"%33[^\"]\"", header) != 1)
            continue;
        char target[NAME];
        module_name(header, target, sizeof(target));
        size_t to = module(g, target);
        ck_assert_msg(g->layer[to] >= 0, "%s includes \"%s\", which is no file of src/*/",
                      path, header);
        if (to != from)
            g->edge[from][to] = true;
    }
    fclose(f);
}

static void load(struct graph *g)
{
    memset(g, 0, sizeof(*g));
    glob_t files;
    ck_assert_msg(glob("src/*.[ch]", 0, NULL, &files) == GLOB_NOMATCH,
                  "%s is straight in src/: move it into a layer's folder", files.gl_pathv[0]);
    ck_assert_int_eq(glob("src/*/*.[ch]", 0, NULL, &files), 0);
    ck_assert_uint_gt(files.gl_pathc, 20);
    for (size_t i = 0; i < files.gl_pathc; i++)
        place(g, files.gl_pathv[i]);
    for (size_t i = 0; i < files.gl_pathc; i++)
        read_includes(g, files.gl_pathv[i]);
    globfree(&files);
}

/* Where a module's object is; "" for a module with no .c. */
static char object[MODULES][320];

/* Calls each() with the module and the name of every global symbol that
 * the objects define (defined = true) or use, from one run of `nm -P -A`
 * ("file: name type [value size]") over all of them: one process, not one
 * per object, since a loaded machine starts processes slowly. */
static void read_symbols(const struct graph *g, bool defined,
                         void (*each)(size_t module, const char *symbol, void *arg), void *arg)
{
    static char command[MODULES * 340];
    size_t len = (size_t)snprintf(command, sizeof(command), "nm -P -A %s",
                                  defined ? "--defined-only -g" : "-u");
    for (size_t m = 0; m < g->n; m++)
        if (object[m][0] != '\0')
            len += (size_t)snprintf(command + len, sizeof(command) - len, " '%s'", object[m]);
    ck_assert(len < sizeof(command));
    FILE *p = popen(command, "r");
    ck_assert_msg(p != NULL, "popen(nm) failed");
    char line[1024], file[320], symbol[256];
    while (fgets(line, sizeof(line), p) != NULL) {
        if (sscanf(line, "%319[^:]: %255s", file, symbol) != 2)
            continue;
        for (size_t m = 0; m < g->n; m++)
            if (strcmp(object[m], file) == 0)
                each(m, symbol, arg);
    }
    ck_assert_msg(pclose(p) == 0, "nm failed: is binutils installed?");
}

struct symbols {
    size_t n, cap;
    struct { char name[64]; size_t module; } *at;
};

struct reading {
    struct graph   *g;
    struct symbols *defs;
};

static void add_def(size_t module, const char *symbol, void *arg)
{
    struct symbols *d = ((struct reading *)arg)->defs;
    if (d->n == d->cap) {
        d->cap = d->cap == 0 ? 1024 : 2 * d->cap;
        d->at = realloc(d->at, d->cap * sizeof(*d->at));
        ck_assert(d->at != NULL);
    }
    snprintf(d->at[d->n].name, sizeof(d->at[d->n].name), "%s", symbol);
    d->at[d->n++].module = module;
}

static void add_use(size_t module, const char *symbol, void *arg)
{
    struct reading *r = arg;
    for (size_t i = 0; i < r->defs->n; i++)
        if (strcmp(r->defs->at[i].name, symbol) == 0 && r->defs->at[i].module != module)
            r->g->call[module][r->defs->at[i].module] = true;
}

/* Fills g->call from the object of each module with a .c. A missing object
 * means the tree is not built (or not rebuilt since a module was added). */
static void load_calls(struct graph *g)
{
    const char *build = getenv("SEKALI_BUILD");
    if (build == NULL || *build == '\0')
        build = "build";
    for (size_t m = 0; m < g->n; m++) {
        object[m][0] = '\0';
        if (!g->built[m])
            continue;
        snprintf(object[m], sizeof(object[m]), "%s/obj/%s.o", build, g->name[m]);
        ck_assert_msg(access(object[m], R_OK) == 0, "%s: no object for src/%s/%s.c: run make "
                      "first (or set SEKALI_BUILD)", object[m], layers[g->layer[m]], g->name[m]);
    }
    struct symbols defs = { 0 };
    struct reading r = { .g = g, .defs = &defs };
    read_symbols(g, true, add_def, &r);
    ck_assert_uint_gt(defs.n, 100);
    read_symbols(g, false, add_use, &r);
    free(defs.at);
}

START_TEST(test_every_module_of_src_belongs_to_a_layer)
{
    static struct graph g;
    load(&g);
    for (size_t i = 0; i < g.n; i++)
        ck_assert_msg(g.layer[i] >= 0, "src/*/%s.[ch]: in no layer", g.name[i]);
}
END_TEST

typedef bool edges[MODULES][MODULES];

/* Writes the first edge from a layer to one above it into what; verb says
 * what an edge is ("includes", "calls"). */
static bool upward(const struct graph *g, const edges e, const char *verb, char *what,
                   size_t size)
{
    for (size_t a = 0; a < g->n; a++)
        for (size_t b = 0; b < g->n; b++)
            if (e[a][b] && g->layer[b] < g->layer[a]) {
                snprintf(what, size, "%s (%s layer) %s %s from the %s layer above it",
                         g->name[a], layers[g->layer[a]], verb, g->name[b],
                         layers[g->layer[b]]);
                return true;
            }
    return false;
}

/* Writes the first edge that one of nevers[] forbids into what. */
static bool never(const struct graph *g, const edges e, const char *verb, char *what,
                  size_t size)
{
    for (size_t i = 0; i < sizeof(nevers) / sizeof(nevers[0]); i++)
        for (size_t a = 0; a < g->n; a++)
            for (size_t b = 0; b < g->n; b++)
                if (e[a][b] && strcmp(layers[g->layer[a]], nevers[i].from) == 0 &&
                    strcmp(layers[g->layer[b]], nevers[i].to) == 0) {
                    snprintf(what, size, "%s (%s layer) %s %s (%s layer): %s", g->name[a],
                             nevers[i].from, verb, g->name[b], nevers[i].to, nevers[i].why);
                    return true;
                }
    return false;
}

START_TEST(test_no_module_includes_a_layer_above_its_own)
{
    static struct graph g;
    load(&g);
    char what[256];
    ck_assert_msg(!upward(&g, g.edge, "includes", what, sizeof(what)), "%s", what);
    ck_assert_msg(!never(&g, g.edge, "includes", what, sizeof(what)), "%s", what);
}
END_TEST

START_TEST(test_no_module_calls_a_layer_above_its_own)
{
    static struct graph g;
    load(&g);
    load_calls(&g);
    char what[512];
    ck_assert_msg(!upward(&g, g.call, "calls", what, sizeof(what)), "%s", what);
    ck_assert_msg(!never(&g, g.call, "calls", what, sizeof(what)), "%s", what);
}
END_TEST

/* Depth-first search; 1 = on the current path, 2 = done. */
static bool cycle_from(const struct graph *g, const edges e, size_t at, int *state, char *path,
                       size_t size)
{
    state[at] = 1;
    for (size_t next = 0; next < g->n; next++) {
        if (!e[at][next])
            continue;
        if (state[next] == 1 ||
            (state[next] == 0 && cycle_from(g, e, next, state, path, size))) {
            size_t len = strlen(path);
            snprintf(path + len, size - len, " <- %s", g->name[at]);
            return true;
        }
    }
    state[at] = 2;
    return false;
}

static bool any_cycle(const struct graph *g, const edges e, char *path, size_t size)
{
    int state[MODULES] = { 0 };
    path[0] = '\0';
    for (size_t i = 0; i < g->n; i++)
        if (state[i] == 0 && cycle_from(g, e, i, state, path, size))
            return true;
    return false;
}

START_TEST(test_no_include_cycle)
{
    static struct graph g;
    load(&g);
    char path[1024];
    ck_assert_msg(!any_cycle(&g, g.edge, path, sizeof(path)), "include cycle:%s", path);
}
END_TEST

START_TEST(test_no_call_cycle)
{
    static struct graph g;
    load(&g);
    load_calls(&g);
    char path[1024];
    ck_assert_msg(!any_cycle(&g, g.call, path, sizeof(path)), "modules calling each other:%s "
                  "(split the helpers both call from the dispatcher that calls them)", path);
}
END_TEST

/* The checks can fail: a made-up upward include and a made-up loop are seen. */
START_TEST(test_the_checks_see_an_upward_include_and_a_cycle)
{
    static struct graph g;
    load(&g);
    char what[1024];
    size_t pg = module(&g, "pg"), job = module(&g, "job"), links = module(&g, "links");
    g.edge[pg][job] = true;   /* an adapter including the pipeline */
    ck_assert(upward(&g, g.edge, "includes", what, sizeof(what)));
    ck_assert_msg(strstr(what, "pg (adapters layer) includes job from") != NULL, "%s", what);
    g.edge[pg][job] = false;
    g.edge[links][job] = g.edge[job][links] = true;   /* same layer, a loop */
    ck_assert(!upward(&g, g.edge, "includes", what, sizeof(what)));
    ck_assert(any_cycle(&g, g.edge, what, sizeof(what)));
}
END_TEST

/* The call checks can fail too: a made-up upward call, a call the nevers
 * forbid and a loop are each seen. */
START_TEST(test_the_call_checks_see_upward_calls_nevers_and_cycles)
{
    static struct graph g;
    load(&g);
    load_calls(&g);
    char what[1024];
    size_t pg = module(&g, "pg"), job = module(&g, "job"), span = module(&g, "span");
    size_t supervisor = module(&g, "supervisor");
    ck_assert(!upward(&g, g.call, "calls", what, sizeof(what)));
    g.call[pg][job] = true;   /* an adapter calling into the pipeline */
    ck_assert(upward(&g, g.call, "calls", what, sizeof(what)));
    ck_assert_msg(strstr(what, "pg (adapters layer) calls job from") != NULL, "%s", what);
    g.call[pg][job] = false;

    ck_assert(!never(&g, g.call, "calls", what, sizeof(what)));
    g.call[supervisor][pg] = true;   /* allowed by the order, not by the nevers */
    ck_assert(!upward(&g, g.call, "calls", what, sizeof(what)));
    ck_assert(never(&g, g.call, "calls", what, sizeof(what)));
    ck_assert_msg(strstr(what, "supervisor (supervisor layer) calls pg (adapters layer)") != NULL,
                  "%s", what);
    g.call[supervisor][pg] = false;

    /* job.c decides and span.c drives: a call back from job.c into the
     * driver is a loop. */
    g.call[job][span] = true;
    ck_assert(any_cycle(&g, g.call, what, sizeof(what)));
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_every_module_of_src_belongs_to_a_layer,
        test_no_module_includes_a_layer_above_its_own,
        test_no_include_cycle,
        test_the_checks_see_an_upward_include_and_a_cycle,
        test_no_module_calls_a_layer_above_its_own,
        test_no_call_cycle,
        test_the_call_checks_see_upward_calls_nevers_and_cycles,
        NULL,
    };
    Suite *s = suite_create("layers");
    h_tcase(s, "layers", 30, tests);
    return h_run_suite(s);
}
