/* headers_json.h - a message's AMQP headers as one JSON object, for
 * handlers that pass them on (the SQL handler's :headers). */
#ifndef SK_HEADERS_JSON_H
#define SK_HEADERS_JSON_H

#include <stddef.h>

#include "amqp_lib.h"

/* Writes headers as a JSON object into *buf (grown with realloc, *cap
 * bytes; kept by the caller for the next message), NUL-terminated.
 * Strings are escaped (invalid UTF-8 bytes become U+FFFD), byte arrays are
 * strings, decimals and timestamps numbers; nesting deeper than 8 becomes
 * null. The input is bounded by the queue's max_headers. Returns the
 * length, or -1 when out of memory. */
long sk_headers_json(const amqp_table_t *headers, char **buf, size_t *cap);

#endif
