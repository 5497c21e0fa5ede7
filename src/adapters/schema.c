/* schema.c - the migrations of this build, and a database's state against
 * them. sekalid asks before it starts workers (a batch queue on an old
 * schema would hand its jobs back for ever, because the claim functions it
 * calls do not exist); sekalictl doctor reports the same state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema.h"

#define SCHEMA_DIAL_TIMEOUT_S 5

const char *const sk_schema_migrations[] = {
    "001_idempotency_keys.sql",
    "002_external_mode.sql",
    "003_replies.sql",
    "004_outbox.sql",
    "005_outbox_indexes.sql",
    "006_job_crashes.sql",
    "007_dead_letters.sql",
    "008_enqueue_checks.sql",
    "011_status.sql",
    "012_relay_functions.sql",
    "014_dedupe_release_when.sql",
    "015_claim_batch.sql",
    "016_claim_completing.sql",
};
const size_t sk_schema_n_migrations = SK_ARRAY_LEN(sk_schema_migrations);

static void add_name(char *list, size_t size, const char *name);
static bool known(const char *name);

int sk_schema_read(PGconn *pg, struct sk_schema_state *st, struct sk_err *err)
{
    memset(st, 0, sizeof(*st));
    const struct sk_pg_stmt exists = {
        .sql = "SELECT to_regclass('sekali.schema_migrations') IS NOT NULL",
        .one_row = true, .what = "looking for sekali.schema_migrations",
    };
    PGresult *res;
    int rc = sk_pg_exec(pg, &exists, &res, err);
    if (rc != SK_OK)
        return rc;
    st->table = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (!st->table) {
        for (size_t i = 0; i < sk_schema_n_migrations; i++)
            add_name(st->missing, sizeof(st->missing), sk_schema_migrations[i]);
        st->n_missing = sk_schema_n_migrations;
        return SK_OK;
    }
    const struct sk_pg_stmt applied = {
        .sql = "SELECT version FROM sekali.schema_migrations ORDER BY version",
        .what = "reading sekali.schema_migrations",
    };
    rc = sk_pg_exec(pg, &applied, &res, err);
    if (rc != SK_OK)
        return rc;
    int n = PQntuples(res);
    for (size_t i = 0; i < sk_schema_n_migrations; i++) {
        bool found = false;
        for (int r = 0; r < n && !found; r++)
            found = strcmp(PQgetvalue(res, r, 0), sk_schema_migrations[i]) == 0;
        if (!found) {
            st->n_missing++;
            add_name(st->missing, sizeof(st->missing), sk_schema_migrations[i]);
        }
    }
    for (int r = 0; r < n; r++) {
        if (!known(PQgetvalue(res, r, 0))) {
            st->n_unknown++;
            add_name(st->unknown, sizeof(st->unknown), PQgetvalue(res, r, 0));
        }
    }
    PQclear(res);
    return SK_OK;
}

int sk_schema_require(const struct sk_postgres_conf *conf, struct sk_err *err)
{
    /* The supervisor asks from its loop: a server that never answers must
     * not hold it longer than a few seconds (the user's own bound wins). */
    struct sk_postgres_conf bounded = *conf;
    char *conninfo = NULL;
    if (strstr(conf->conninfo, "connect_timeout") == NULL &&
        asprintf(&conninfo, "%s connect_timeout=%d", conf->conninfo, SCHEMA_DIAL_TIMEOUT_S) > 0)
        bounded.conninfo = conninfo;
    PGconn *pg = sk_pg_dial(&bounded, "sekalid schema check", err);
    free(conninfo);
    if (pg == NULL)
        return SK_AGAIN;
    struct sk_schema_state st;
    int rc = sk_schema_read(pg, &st, err);
    PQfinish(pg);
    if (rc != SK_OK)
        return SK_AGAIN;  /* a server error is no proof of an old schema */
    if (st.n_missing > 0)
        return sk_err_set(err, SK_ERR, "the database lacks %zu migration%s of this build: run "
                          "sekalictl migrate (%s)", st.n_missing, st.n_missing == 1 ? "" : "s",
                          st.missing);
    return SK_OK;
}

/* Appends ", name" (or name) to list; the end of a list too long is "...". */
static void add_name(char *list, size_t size, const char *name)
{
    size_t len = strlen(list);
    if (len + strlen(name) + 6 >= size) {
        if (len + 4 < size && (len < 3 || strcmp(list + len - 3, "...") != 0))
            snprintf(list + len, size - len, "...");
        return;
    }
    snprintf(list + len, size - len, "%s%s", len > 0 ? ", " : "", name);
}

static bool known(const char *name)
{
    for (size_t i = 0; i < sk_schema_n_migrations; i++)
        if (strcmp(sk_schema_migrations[i], name) == 0)
            return true;
    return false;
}
