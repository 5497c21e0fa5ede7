/* schema.c - the migrations of this build, and a database's state against
 * them. Each worker asks on every new PostgreSQL connection (a batch queue
 * on an old schema would hand its jobs back for ever, because the claim
 * functions it calls do not exist); sekalictl doctor reports the same
 * state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema.h"

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
    "017_claim_completed.sql",
    "018_cancel.sql",
    "019_pause_priority.sql",
    "020_schedules.sql",
    "021_unclaim_many.sql",
    "022_schedule_runners.sql",
    "023_dead_letter_store.sql",
    "027_history_indexes.sql",
    "028_history_reads.sql",
    "029_counts.sql",
    "030_count_bases.sql",
    "031_trace_context.sql",
    "032_outbox_content_type.sql",
    "033_purge_indexes.sql",
    "034_purge_by_index.sql",
    "035_purge_custom_plans.sql",
    "036_dead_letter_pages.sql",
    "037_history.sql",
    "038_history_order.sql",
    "039_outbox_tenant.sql",
    "040_finished_keys.sql",
    "041_janitor_marks.sql",
    "042_key_functions_by_index.sql",
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
