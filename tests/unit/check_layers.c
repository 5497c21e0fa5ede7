/* check_layers.c - the layering docs/internals.md states, kept true: every
 * file of src/ sits in a layer's folder, includes only from its own layer or
 * the layers below, and no two modules include each other through any path.
 * An adapter that starts reading the configuration schema, or a pipeline
 * file that calls back into the process that runs it, fails here before it
 * reaches a review. Run from the repository root, as tests/run.sh does. */
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suite.h"

/* The folders of src/, top to bottom; a module may include its own layer and
 * any layer below. Within a layer, the cycle test below still forbids loops.
 * Keep in step with SRC_DIRS in the Makefile. */
static const char *const layers[] = {
    "ctl", "supervisor", "worker", "producer", "shared", "config", "adapters", "base",
};
enum { LAYERS = sizeof(layers) / sizeof(layers[0]), MODULES = 96, NAME = 32 };

struct graph {
    size_t n;
    char   name[MODULES][NAME];
    int    layer[MODULES];         /* index into layers, 0 = top */
    bool   edge[MODULES][MODULES]; /* edge[a][b]: a includes b.h */
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

START_TEST(test_every_module_of_src_belongs_to_a_layer)
{
    static struct graph g;
    load(&g);
    for (size_t i = 0; i < g.n; i++)
        ck_assert_msg(g.layer[i] >= 0, "src/*/%s.[ch]: in no layer", g.name[i]);
}
END_TEST

/* Writes the first include from a layer to one above it into what. */
static bool upward_include(const struct graph *g, char *what, size_t size)
{
    for (size_t a = 0; a < g->n; a++)
        for (size_t b = 0; b < g->n; b++)
            if (g->edge[a][b] && g->layer[b] < g->layer[a]) {
                snprintf(what, size, "%s (%s layer) includes %s.h from the %s layer above it",
                         g->name[a], layers[g->layer[a]], g->name[b],
                         layers[g->layer[b]]);
                return true;
            }
    return false;
}

START_TEST(test_no_module_includes_a_layer_above_its_own)
{
    static struct graph g;
    load(&g);
    char what[256];
    ck_assert_msg(!upward_include(&g, what, sizeof(what)), "%s", what);
}
END_TEST

/* Depth-first search; 1 = on the current path, 2 = done. */
static bool cycle_from(const struct graph *g, size_t at, int *state, char *path, size_t size)
{
    state[at] = 1;
    for (size_t next = 0; next < g->n; next++) {
        if (!g->edge[at][next])
            continue;
        if (state[next] == 1 || (state[next] == 0 && cycle_from(g, next, state, path, size))) {
            size_t len = strlen(path);
            snprintf(path + len, size - len, " <- %s", g->name[at]);
            return true;
        }
    }
    state[at] = 2;
    return false;
}

static bool any_cycle(const struct graph *g, char *path, size_t size)
{
    int state[MODULES] = { 0 };
    path[0] = '\0';
    for (size_t i = 0; i < g->n; i++)
        if (state[i] == 0 && cycle_from(g, i, state, path, size))
            return true;
    return false;
}

START_TEST(test_no_include_cycle)
{
    static struct graph g;
    load(&g);
    char path[1024];
    ck_assert_msg(!any_cycle(&g, path, sizeof(path)), "include cycle:%s", path);
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
    ck_assert(upward_include(&g, what, sizeof(what)));
    ck_assert_msg(strstr(what, "pg (adapters layer) includes job.h") != NULL, "%s", what);
    g.edge[pg][job] = false;
    g.edge[links][job] = g.edge[job][links] = true;   /* same layer, a loop */
    ck_assert(!upward_include(&g, what, sizeof(what)));
    ck_assert(any_cycle(&g, what, sizeof(what)));
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_every_module_of_src_belongs_to_a_layer,
        test_no_module_includes_a_layer_above_its_own,
        test_no_include_cycle,
        test_the_checks_see_an_upward_include_and_a_cycle,
        NULL,
    };
    Suite *s = suite_create("layers");
    h_tcase(s, "layers", 30, tests);
    return h_run_suite(s);
}
