/* console_http.c - one request of the console (struct sk_console_call):
 * reading its query arguments, form fields and headers, and setting its
 * answer. Apart from console.c, which routes requests, so that the API,
 * the sessions and the rates (console_api.c, console_auth.c,
 * console_rates.c) call down into this file and never back into their
 * dispatcher. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "console.h"
#include "ctl_out.h"

static void reply(struct sk_console_call *c, unsigned status, const char *type, char *out,
                  size_t len);
static void form_decode(char *s);

const char *sk_console_arg(struct sk_console_call *c, const char *name)
{
    if (!c->post)
        return MHD_lookup_connection_value(c->conn, MHD_GET_ARGUMENT_KIND, name);
    for (size_t i = 0; i < c->n_fields; i++)
        if (strcmp(c->fields[i].name, name) == 0)
            return c->fields[i].value;
    return NULL;
}

size_t sk_console_args(struct sk_console_call *c, const char *name, const char **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_fields && n < max; i++)
        if (strcmp(c->fields[i].name, name) == 0)
            out[n++] = c->fields[i].value;
    return n;
}

const char *sk_console_header(struct sk_console_call *c, const char *name)
{
    return MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, name);
}

static void reply(struct sk_console_call *c, unsigned status, const char *type, char *out,
                  size_t len)
{
    free(c->out);
    c->status = status;
    c->type = type;
    c->out = out;
    c->out_len = len;
}

void sk_console_json(struct sk_console_call *c, unsigned status, char *doc, size_t len)
{
    reply(c, status, "application/json; charset=utf-8", doc, len);
}

void sk_console_fail(struct sk_console_call *c, unsigned status, const char *why)
{
    char *doc = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&doc, &len);
    if (f == NULL)
        return sk_console_json(c, 500, NULL, 0);
    fputs("{\"error\":", f);
    sk_ctl_put_jstr(f, why);
    fputs("}\n", f);
    fclose(f);
    sk_console_json(c, status, doc, len);
}

/* %XX and + of a form; a %00 stays in as a NUL, so the value ends there:
 * no key PostgreSQL holds has one. */
static void form_decode(char *s)
{
    char *w = s;
    for (char *r = s; *r != '\0'; r++) {
        if (*r == '+') {
            *w++ = ' ';
        } else if (*r == '%' && r[1] != '\0' && r[2] != '\0') {
            char hex[3] = { r[1], r[2], '\0' };
            char *end;
            long v = strtol(hex, &end, 16);
            if (*end != '\0') {
                *w++ = *r;
                continue;
            }
            *w++ = (char)v;
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

bool sk_console_read_form(struct sk_console_call *c)
{
    const char *type = sk_console_header(c, "Content-Type");
    if (type == NULL || strncasecmp(type, "application/x-www-form-urlencoded", 33) != 0)
        return false;
    char *save = NULL;
    for (char *pair = strtok_r(c->body, "&", &save); pair != NULL;
         pair = strtok_r(NULL, "&", &save)) {
        if (c->n_fields == SK_CONSOLE_FIELDS)
            return false;
        char *eq = strchr(pair, '=');
        char *value = eq != NULL ? eq + 1 : pair + strlen(pair);
        if (eq != NULL)
            *eq = '\0';
        form_decode(pair);
        form_decode(value);
        c->fields[c->n_fields++] = (struct sk_console_field){ pair, value };
    }
    return true;
}
