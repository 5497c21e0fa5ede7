/* old_abi.c - a handler built for another ABI major version: must be refused. */
#include <sekali/handler.h>

static int handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    (void)state, (void)job, (void)ctx;
    return SEKALI_OK;
}

__attribute__((visibility("default"))) const struct sekali_handler *sekali_handler_v1(void);
const struct sekali_handler *sekali_handler_v1(void)
{
    static const struct sekali_handler h = {
        .abi_major = 0, .abi_minor = 9, .struct_size = sizeof(struct sekali_handler),
        .name = "old_abi", .handle = handle,
    };
    return &h;
}
