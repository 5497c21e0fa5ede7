/* null_handle.c - a handler without its mandatory handle callback: must be refused. */
#include <sekali/handler.h>

SEKALI_HANDLER_DEFINE(.name = "null_handle", .version = "test")
