/* check_schema.c - the list of migrations sekalid requires (schema.c) is
 * the list of files in sql/: a migration added to one and not the other
 * would make sekalid refuse a migrated database, or run on a schema that
 * lacks what it calls. Run from the repository root, as tests/run.sh does. */
/* links: core schema pg */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema.h"
#include "suite.h"

static int only_sql(const struct dirent *d)
{
    size_t len = strlen(d->d_name);
    return len > 4 && strcmp(d->d_name + len - 4, ".sql") == 0 && d->d_name[0] != '.';
}

START_TEST(test_required_migrations_are_the_files_of_sql_in_order)
{
    struct dirent **files = NULL;
    int n = scandir("sql", &files, only_sql, alphasort);
    ck_assert_msg(n > 0, "sql/ not found: run from the repository root");
    for (int i = 0; i < n; i++) {
        ck_assert_msg((size_t)i < sk_schema_n_migrations,
                      "sql/%s is not in schema.c's sk_schema_migrations", files[i]->d_name);
        ck_assert_msg(strcmp(files[i]->d_name, sk_schema_migrations[i]) == 0,
                      "sql/ has %s where schema.c lists %s", files[i]->d_name,
                      sk_schema_migrations[i]);
        free(files[i]);
    }
    free(files);
    ck_assert_msg((size_t)n == sk_schema_n_migrations,
                  "schema.c lists %zu migrations, sql/ holds %d", sk_schema_n_migrations, n);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_required_migrations_are_the_files_of_sql_in_order,
        NULL,
    };
    return h_run_suite(h_suite("schema", 0, tests));
}
