/* plugin.c - dlopen() a handler and refuse one built for another ABI.
 *
 * The checks follow the compatibility rules in sekali/handler.h: the major
 * version must match exactly; the descriptor must be at least as large as the
 * 1.0 layout (older minors are fine, their missing members read as absent);
 * and the mandatory callback must be present. */
#include <dlfcn.h>
#include <stddef.h>

#include "plugin.h"

/* The size of the 1.0 descriptor: every member up to and including fini. */
#define DESCRIPTOR_V1_0_SIZE \
    (offsetof(struct sekali_handler, fini) + sizeof(((struct sekali_handler *)0)->fini))

int sk_plugin_load(const char *path, struct sk_plugin *out, struct sk_err *err)
{
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
