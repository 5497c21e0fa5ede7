/* plugin.c - dlopen() a handler and refuse one built for another ABI.
 *
 * The checks follow the compatibility rules in sekali/handler.h: the major
 * version must match exactly; the descriptor must be at least as large as the
 * 1.0 layout (older minors are fine, their missing members read as absent);
 * and the mandatory callback must be present. Before any of that, the file
 * must be safe to load at all: nobody but root or us may be able to change
 * it. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plugin.h"

/* The size of the 1.0 descriptor: every member up to and including fini. */
#define DESCRIPTOR_V1_0_SIZE \
    (offsetof(struct sekali_handler, fini) + sizeof(((struct sekali_handler *)0)->fini))

/* Code that others can replace runs as sekali with its database
 * credentials: like sshd with a loose key file, refuse it. The file and its
 * directory must belong to root or to us, and be writable by nobody else. */
static int check_ownership(const char *path, struct sk_err *err)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';

    const char *paths[] = { path, dir };
    for (size_t i = 0; i < SK_ARRAY_LEN(paths); i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0)
            return sk_err_errno(err, SK_ERR, "handler %s: cannot stat %s", path, paths[i]);
        if (st.st_uid != 0 && st.st_uid != geteuid())
            return sk_err_set(err, SK_ERR, "handler %s: refusing it: %s is owned by uid %u, "
                              "not by root or by sekalid's user", path, paths[i],
                              (unsigned)st.st_uid);
        /* A sticky directory (like /tmp) still lets anyone add a file. */
        if (st.st_mode & (S_IWGRP | S_IWOTH))
            return sk_err_set(err, SK_ERR, "handler %s: refusing it: %s is writable by %s "
                              "(chmod go-w %s)", path, paths[i],
                              st.st_mode & S_IWOTH ? "everyone" : "its group", paths[i]);
    }
    return SK_OK;
}

int sk_plugin_load(const char *path, struct sk_plugin *out, struct sk_err *err)
{
    if (access(path, F_OK) == 0 && check_ownership(path, err) != SK_OK)
        return SK_ERR;
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL)
        return sk_err_set(err, SK_ERR, "handler %s: cannot load: %s", path, dlerror());

    dlerror();
    void *sym = dlsym(dl, SEKALI_HANDLER_SYMBOL);
    const char *why = dlerror();
    if (sym == NULL || why != NULL)
        return sk_err_set(err, SK_ERR,
                          "handler %s: no symbol %s (is it a sekali handler? define it with "
                          "SEKALI_HANDLER_DEFINE)", path, SEKALI_HANDLER_SYMBOL);

    const struct sekali_handler *(*get)(void);
    *(void **)&get = sym;
    const struct sekali_handler *h = get();
    if (sk_plugin_check(h, path, err) != SK_OK)
        return SK_ERR;
    out->path = path;
    out->handler = h;
    return SK_OK;
}

int sk_plugin_load_queues(const struct sk_conf *conf, struct sk_plugin **out,
                          struct sk_err *err)
{
    struct sk_plugin *plugins = calloc(conf->n_queues, sizeof(*plugins));
    if (plugins == NULL)
        return sk_err_errno(err, SK_ERR, "calloc(plugins)");
    for (size_t i = 0; i < conf->n_queues; i++) {
        struct sk_err why = { 0 };
        if (sk_plugin_load(conf->queues[i].handler, &plugins[i], &why) != SK_OK) {
            free(plugins);
            return sk_err_set(err, SK_ERR, "queue %s: %s", conf->queues[i].name, why.msg);
        }
    }
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
