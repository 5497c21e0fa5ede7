/* plugin.c - dlopen() a handler and refuse one built for another ABI.
 *
 * The checks follow the compatibility rules in sekali/handler.h: the major
 * version must match exactly; the descriptor must be at least as large as the
 * 1.0 layout (older minors are fine, their missing members read as absent);
 * and the mandatory callback must be present. Before any of that, the file
 * must be safe to load at all: nobody but root or us may be able to change
 * it, or any directory on its way from /. */
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pg.h"
#include "plugin.h"

/* The size of the 1.0 descriptor: every member up to and including fini. */
#define DESCRIPTOR_V1_0_SIZE \
    (offsetof(struct sekali_handler, fini) + sizeof(((struct sekali_handler *)0)->fini))
/* ... and of the 1.3 one, which added check. */
#define DESCRIPTOR_V1_3_SIZE \
    (offsetof(struct sekali_handler, check) + sizeof(((struct sekali_handler *)0)->check))

/* ... and of the 1.4 one, which added ready. */
#define DESCRIPTOR_V1_4_SIZE \
    (offsetof(struct sekali_handler, ready) + sizeof(((struct sekali_handler *)0)->ready))

bool sk_plugin_has_ready(const struct sekali_handler *h)
{
    return h->struct_size >= DESCRIPTOR_V1_4_SIZE && h->ready != NULL;
}

/* Code that others can replace runs as sekali with its database
 * credentials: like sshd with a loose key file, refuse it. What is loaded is
 * the file that was checked: the path is resolved once (symlinks included),
 * every directory from / down to the file's own is checked, the file is
 * opened and checked through its descriptor, and dlopen() is given that
 * descriptor, so nothing can be swapped in between the check and the load.
 *
 * check_dir(): dir is resolved; own says whether the handler sits in it. */
static int check_dir(const char *path, const char *dir, bool own, struct sk_err *err)
{
    struct stat st;

    if (stat(dir, &st) != 0)
        return sk_err_errno(err, SK_ERR, "handler %s: cannot stat %s", path, dir);
    if (st.st_uid != 0 && st.st_uid != geteuid())
        return sk_err_set(err, SK_ERR, "handler %s: refusing it: directory %s is owned by "
                          "uid %u, not by root or by sekalid's user", path, dir,
                          (unsigned)st.st_uid);
    if (!(st.st_mode & (S_IWGRP | S_IWOTH)))
        return SK_OK;
    /* Above the handler's own directory a sticky one (like /tmp) is safe:
     * nobody else may rename or remove the entry below it, which is ours.
     * As the handler's own directory it is not: anyone may add a file. */
    if ((st.st_mode & S_ISVTX) && !own)
        return SK_OK;
    return sk_err_set(err, SK_ERR, "handler %s: refusing it: directory %s is writable by %s "
                      "(mode %04o; chmod go-w %s)", path, dir,
                      st.st_mode & S_IWOTH ? "everyone" : "its group",
                      (unsigned)(st.st_mode & 07777), dir);
}

/* Opens the resolved path and returns its descriptor, or -1 with err set. */
static int open_checked(const char *path, const char *real, struct sk_err *err)
{
    char dir[PATH_MAX];
    struct stat st;
    int fd;

    /* Each prefix of real ending before a '/' is a directory: "/", "/usr", ... */
    for (const char *slash = real; (slash = strchr(slash, '/')) != NULL; slash++) {
        size_t n = slash == real ? 1 : (size_t)(slash - real);
        memcpy(dir, real, n);
        dir[n] = '\0';
        if (check_dir(path, dir, strchr(slash + 1, '/') == NULL, err) != SK_OK)
            return -1;
    }
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer, and
     * hang sekalid -t, start and reload; it is refused just below. */
    if ((fd = open(real, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0) {
        sk_err_errno(err, SK_ERR, "handler %s: cannot load: open %s", path, real);
        return -1;
    }
    const char *why = NULL;
    if (fstat(fd, &st) != 0)
        sk_err_errno(err, SK_ERR, "handler %s: cannot stat %s", path, real);
    else if (!S_ISREG(st.st_mode))
        why = "is not a regular file";
    else if (st.st_uid != 0 && st.st_uid != geteuid())
        sk_err_set(err, SK_ERR, "handler %s: refusing it: %s is owned by uid %u, not by root "
                   "or by sekalid's user", path, real, (unsigned)st.st_uid);
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        sk_err_set(err, SK_ERR, "handler %s: refusing it: %s is writable by %s (mode %04o; "
                   "chmod go-w %s)", path, real, st.st_mode & S_IWOTH ? "everyone" : "its group",
                   (unsigned)(st.st_mode & 07777), real);
    else
        return fd;
    if (why != NULL)
        sk_err_set(err, SK_ERR, "handler %s: refusing it: %s %s", path, real, why);
    close(fd);
    return -1;
}

/* dlopen() takes a name, and glibc hands back an already loaded object whose
 * name matches: "/proc/self/fd/N" must therefore name one file for as long
 * as an object was loaded under it, so the descriptor stays open while the
 * object is loaded (for ever, once accepted: handlers in use are never
 * unloaded). A file loaded again (a reload of an unchanged handler) must not
 * reach dlopen() under a new name either: glibc would recognise the file by
 * device and inode, return the loaded object, and file the new name under
 * it, and once that descriptor is closed the next handler opened there
 * would get the old object back. So this table finds such a file first, and
 * takes a reference on its object under the object's own name. */
struct loaded {
    dev_t dev;
    ino_t ino;
    int   fd;   /* the descriptor whose /proc name the object has */
};
static struct loaded *table;
static size_t n_table, table_cap;

static void *load_fd(int fd, int *kept)
{
    char name[64];
    struct link_map *map = NULL;
    struct stat st;

    *kept = -1;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return NULL;
    }
    for (size_t i = 0; i < n_table; i++) {
        if (table[i].dev != st.st_dev || table[i].ino != st.st_ino)
            continue;
        snprintf(name, sizeof(name), "/proc/self/fd/%d", table[i].fd);
        void *dl = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (dl != NULL) {
            close(fd);
            return dl;
        }
    }
    if (n_table == table_cap) {
        size_t cap = table_cap > 0 ? table_cap * 2 : 8;
        struct loaded *grown = realloc(table, cap * sizeof(*grown));
        if (grown == NULL) {
            close(fd);
            return NULL;
        }
        table = grown;
        table_cap = cap;
    }
    snprintf(name, sizeof(name), "/proc/self/fd/%d", fd);
    void *dl = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        close(fd);
        return NULL;
    }
    /* An object glibc knew by other means (never one of ours): the name
     * now points at it too, so the descriptor stays open, untracked. */
    if (dlinfo(dl, RTLD_DI_LINKMAP, &map) != 0 || map == NULL || strcmp(map->l_name, name) != 0)
        return dl;
    table[n_table++] = (struct loaded){ .dev = st.st_dev, .ino = st.st_ino, .fd = fd };
    *kept = fd;
    return dl;
}

/* A refused object is unloaded, as PostgreSQL's loader does: otherwise each
 * failed reload would leave one more mapping behind. dlclose() only drops
 * a reference, so an object that a running generation also loaded stays. */
static void unload(void *dl, int kept)
{
    if (dl != NULL)
        dlclose(dl);
    if (kept < 0)
        return;
    for (size_t i = 0; i < n_table; i++) {
        if (table[i].fd == kept) {
            table[i] = table[--n_table];
            break;
        }
    }
    close(kept);
}

int sk_plugin_load(const char *path, struct sk_plugin *out, struct sk_err *err)
{
    char *real = realpath(path, NULL);
    if (real == NULL)
        return sk_err_errno(err, SK_ERR, "handler %s: cannot load", path);
    int fd = open_checked(path, real, err);
    free(real);
    if (fd < 0)
        return SK_ERR;
    int kept;
    void *dl = load_fd(fd, &kept);
    if (dl == NULL) {
        const char *why = dlerror();
        return sk_err_set(err, SK_ERR, "handler %s: cannot load: %s", path,
                          why != NULL ? why : "out of memory");
    }

    dlerror();
    void *sym = dlsym(dl, SEKALI_HANDLER_SYMBOL);
    const char *why = dlerror();
    if (sym == NULL || why != NULL) {
        sk_err_set(err, SK_ERR, "handler %s: no symbol %s (is it a sekali handler? define it "
                   "with SEKALI_HANDLER_DEFINE)", path, SEKALI_HANDLER_SYMBOL);
        unload(dl, kept);
        return SK_ERR;
    }

    const struct sekali_handler *(*get)(void);
    *(void **)&get = sym;
    const struct sekali_handler *h = get();
    if (sk_plugin_check(h, path, err) != SK_OK) {
        unload(dl, kept);
        return SK_PLUGIN_ABI;
    }
    out->path = path;
    out->handler = h;
    out->dl = dl;
    out->fd = kept;
    return SK_OK;
}

int sk_plugin_check_config(const struct sk_plugin *p, const struct sekali_host *host,
                           const char *config, struct sk_err *err)
{
    const struct sekali_handler *h = p->handler;
    if (h->struct_size < DESCRIPTOR_V1_3_SIZE || h->check == NULL)
        return SK_OK;
    char why[512] = "";
    if (h->check(host, config, why, sizeof(why)) == SEKALI_OK)
        return SK_OK;
    why[sizeof(why) - 1] = '\0';
    return sk_err_set(err, SK_ERR, "handler %s rejects its config: %s", p->path,
                      why[0] != '\0' ? why : "(no reason given)");
}

int sk_plugin_load_queues(const struct sk_conf *conf, const struct sekali_host *host,
                          struct sk_plugin **out, struct sk_err *err)
{
    struct sk_plugin *plugins = calloc(conf->n_queues, sizeof(*plugins));
    if (plugins == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(plugins)");
    /* check() may ask where a value was written (host->config_where()). */
    sk_conf_where_begin(conf);
    for (size_t i = 0; i < conf->n_queues; i++) {
        struct sk_err why = { 0 };
        size_t loaded = i;
        int rc = sk_plugin_load(conf->queues[i].handler, &plugins[i], &why);
        if (rc == SK_OK) {
            loaded = i + 1;
            rc = sk_plugin_check_config(&plugins[i], host, conf->queues[i].handler_config,
                                        &why);
        }
        if (rc != SK_OK) {
            /* Nothing of a refused set runs: drop the references it took. */
            for (size_t j = 0; j < loaded; j++)
                unload(plugins[j].dl, plugins[j].fd);
            free(plugins);
            sk_conf_where_begin(NULL);
            return sk_err_set(err, rc, "queue %s: %s", conf->queues[i].name, why.msg);
        }
    }
    sk_conf_where_begin(NULL);
    *out = plugins;
    return SK_OK;
}

int sk_plugin_check(const struct sekali_handler *h, const char *path, struct sk_err *err)
{
    if (h == NULL)
        return sk_err_set(err, SK_ERR, "handler %s: %s() returned NULL", path,
                          SEKALI_HANDLER_SYMBOL);
    if (h->abi_major != SEKALI_HANDLER_ABI_MAJOR)
        return sk_err_set(err, SK_ERR,
                          "handler %s: incompatible ABI: abi_major is %u, sekalid needs %u "
                          "(rebuild the handler against this sekali/handler.h)",
                          path, h->abi_major, SEKALI_HANDLER_ABI_MAJOR);
    if (h->struct_size < DESCRIPTOR_V1_0_SIZE)
        return sk_err_set(err, SK_ERR,
                          "handler %s: incompatible ABI: struct_size is %u, at least %zu "
                          "expected for ABI 1.0", path, h->struct_size, DESCRIPTOR_V1_0_SIZE);
    if (h->handle == NULL)
        return sk_err_set(err, SK_ERR, "handler %s: mandatory callback handle is NULL", path);
    return SK_OK;
}

void sk_plugin_try_ready(const struct sk_conf *conf, const struct sk_plugin *plugins,
                         const struct sekali_host *host,
                         void (*say)(const char *text, void *arg), void *arg)
{
    for (size_t i = 0; i < conf->n_queues; i++) {
        const struct sekali_handler *h = plugins[i].handler;
        const struct sk_queue_conf *q = &conf->queues[i];
        if (!sk_plugin_has_ready(h))
            continue;
        char text[1200];
        void *state = NULL;
        if (h->init != NULL && h->init(host, q->handler_config, &state) != SEKALI_OK) {
            snprintf(text, sizeof(text), "queue %s: the handler's init() failed, so whether "
                     "it is ready was not checked", q->name);
            say(text, arg);
            continue;
        }
        struct sk_err err = { 0 };
        PGconn *pg = sk_pg_dial(&conf->postgres, "sekalid -t", &err);
        char why[512] = "";
        if (pg == NULL)
            snprintf(text, sizeof(text), "queue %s: whether the handler is ready was not "
                     "checked: %s", q->name, err.msg);
        else if (h->ready(state, pg, why, sizeof(why)) != SEKALI_OK)
            snprintf(text, sizeof(text), "queue %s: the handler is not ready against the "
                     "database now, and its workers will take no job until it is: %.512s",
                     q->name, why[0] != '\0' ? why : "(no reason given)");
        else
            text[0] = '\0';
        PQfinish(pg);
        if (h->fini != NULL)
            h->fini(state);
        if (text[0] != '\0')
            say(text, arg);
    }
}

