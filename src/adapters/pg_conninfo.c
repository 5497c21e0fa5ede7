/* pg_conninfo.c - postgres.conninfo validated by libpq, its password moved
 * out, and errors that never echo the password (see pg_conninfo.h). */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libpq-fe.h>

#include "common.h"
#include "pg_conninfo.h"

static int describe(const char *s, char *msg, char *why, size_t why_size);
static bool could_hold_password(const char *s);
static bool uri_password(const char *s, size_t *at, size_t *len);
static char *without_password(PQconninfoOption *opts, const PQconninfoOption *pw);

int sk_pg_conninfo_split(const char *s, char **conninfo, char **password, char *why,
                         size_t why_size)
{
    char *msg = NULL;
    *conninfo = *password = NULL;
    PQconninfoOption *opts = PQconninfoParse(s, &msg);
    if (opts == NULL) {
        int rc = describe(s, msg, why, why_size);
        PQfreemem(msg);
        return rc;
    }
    PQconninfoOption *pw = NULL;
    for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
        if (strcmp(o->keyword, "password") == 0 && o->val != NULL)
            pw = o;
    int rc = SK_OK;
    if (pw == NULL) {
        *conninfo = strdup(s);
    } else {
        *conninfo = without_password(opts, pw);
        *password = strdup(pw->val);
        explicit_bzero(pw->val, strlen(pw->val));  /* PQconninfoFree() only frees */
    }
    if (*conninfo == NULL || (pw != NULL && *password == NULL)) {
        free(*conninfo);
        if (*password != NULL)
            explicit_bzero(*password, strlen(*password));
        free(*password);
        *conninfo = *password = NULL;
        snprintf(why, why_size, "out of memory");
        rc = SK_AGAIN;
    }
    PQconninfoFree(opts);
    return rc;
}

/* The other options as keyword='value' pairs, quoted as libpq reads them. */
static char *without_password(PQconninfoOption *opts, const PQconninfoOption *pw)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    for (PQconninfoOption *o = opts; f != NULL && o->keyword != NULL; o++) {
        if (o->val == NULL || o == pw)
            continue;
        fprintf(f, "%s%s='", ftell(f) > 0 ? " " : "", o->keyword);
        for (const char *c = o->val; *c != '\0'; c++)
            fprintf(f, "%s%c", *c == '\'' || *c == '\\' ? "\\" : "", *c);
        fputc('\'', f);
    }
    if (f == NULL || fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* libpq quotes the text it could not parse, and that text may be the
 * password, or the whole URI with the password in it. When the string could
 * hold a password, every quoted part of the message is left out but for a
 * quoted "=", "]", ":" or "/", libpq's own punctuation; for a URI the
 * password is swapped for a harmless one and parsed again, to say whether
 * the password itself is what is malformed; and a URI whose scheme is
 * mistyped (a leading space, capitals, one slash), which libpq reads as
 * keyword=value pairs, is named as such. */
static int describe(const char *s, char *msg, char *why, size_t why_size)
{
    char out[200];
    size_t at, len, n = 0;

    if (msg == NULL) {
        snprintf(why, why_size, "out of memory");
        return SK_AGAIN;
    }
    msg[strcspn(msg, "\n")] = '\0';
    bool in_uri = uri_password(s, &at, &len);
    if (!in_uri && !could_hold_password(s)) {
        snprintf(why, why_size, "%s", msg);
        return SK_ERR;
    }
    for (const char *p = msg; *p != '\0' && n + 5 < sizeof(out); p++) {
        const char *close = *p == '"' ? strchr(p + 1, '"') : NULL;
        if (close == NULL) {
            out[n++] = *p;
        } else if (close == p + 2 && strchr("=]:/", p[1]) != NULL) {
            memcpy(out + n, p, 3);
            n += 3;
            p = close;
        } else {
            memcpy(out + n, "\"...\"", 5);
            n += 5;
            p = close;
        }
    }
    out[n] = '\0';

    if (in_uri) {
        char *copy = malloc(strlen(s) + 2), *again = NULL;
        if (copy == NULL) {
            snprintf(why, why_size, "out of memory");
            return SK_AGAIN;
        }
        snprintf(copy, strlen(s) + 2, "%.*sx%s", (int)at, s, s + at + len);
        PQconninfoOption *opts = PQconninfoParse(copy, &again);
        free(copy);
        PQfreemem(again);
        if (opts != NULL) {
            PQconninfoFree(opts);
            snprintf(why, why_size, "the password in the URI is malformed (%s); "
                     "percent-encode it, or move it to password_file", out);
            return SK_ERR;
        }
    }
    const char *t = s + strspn(s, " \t");
    bool uri = strncmp(s, "postgresql://", 13) == 0 || strncmp(s, "postgres://", 11) == 0;
    if (!uri && strncasecmp(t, "postgres", 8) == 0 && strchr(t, ':') != NULL)
        snprintf(why, why_size, "%s (quoted text left out: conninfo holds a password); a URI "
                 "must start with exactly postgresql:// or postgres://, in lower case, "
                 "without leading spaces", out);
    else
        snprintf(why, why_size, "%s (quoted text left out: conninfo holds a password)", out);
    return SK_ERR;
}

/* Whether libpq's message could quote a password: the string names one, or
 * looks like a URI at all (a scheme, user info), however mistyped. */
static bool could_hold_password(const char *s)
{
    return strcasestr(s, "password") != NULL || strchr(s, '@') != NULL ||
           strchr(s, ':') != NULL;
}

/* Where the password of a postgres:// or postgresql:// URI is: between the
 * first ':' and the '@' of the user info, which, as libpq reads it, ends at
 * the first '@' or '/'. */
static bool uri_password(const char *s, size_t *at, size_t *len)
{
    static const char *const schemes[] = { "postgresql://", "postgres://" };
    const char *p = NULL;

    for (size_t i = 0; i < SK_ARRAY_LEN(schemes) && p == NULL; i++)
        if (strncmp(s, schemes[i], strlen(schemes[i])) == 0)
            p = s + strlen(schemes[i]);
    if (p == NULL)
        return false;
    const char *end = p + strcspn(p, "@/");
    const char *colon = memchr(p, ':', (size_t)(end - p));
    if (*end != '@' || colon == NULL)
        return false;
    *at = (size_t)(colon + 1 - s);
    *len = (size_t)(end - colon - 1);
    return true;
}
