/* check_examples.c - the README's producer example, run as written: the
 * Python block is taken out of README.md (only its queue renamed to one of
 * this run) and run with Debian's python3 and psycopg 3 against the test
 * database, while sekalid serves the queue with the example invoice handler.
 * So a README that drifts from sekali.enqueue() fails here.
 *
 * The Node.js block is not run: node-postgres is not packaged for the
 * Node.js this project's machines have, and dependencies come from Debian. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

#define PYTHON "/usr/bin/python3"  /* Debian's, with python3-psycopg; not a pyenv shim */
#define RELAY  "outbox:\n  relays: 1\n  poll_interval: 200ms\n"

/* The first ```python block of README.md, or NULL; the caller frees. */
static char *readme_python(void)
{
    char *readme = h_read_file("README.md");
    ck_assert_msg(readme != NULL, "README.md not found: run from the repository root");
    const char *fence = "```python\n";
    char *start = strstr(readme, fence);
    char *end = start != NULL ? strstr(start + strlen(fence), "\n```") : NULL;
    char *block = NULL;
    if (end != NULL)
        block = strndup(start + strlen(fence), (size_t)(end - start) - strlen(fence) + 1);
    free(readme);
    return block;
}

/* Writes the block as a script: psycopg imported, dsn from argv, the job id
 * printed; "invoices" is replaced by queue. Returns the script's path. */
static char *write_script(const char *dir, const char *block, const char *queue)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/producer.py", dir) > 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("import sys\nimport psycopg\ndsn = sys.argv[1]\n", f);
    const char *name = "\"invoices\"";
    const char *p = block;
    for (const char *hit; (hit = strstr(p, name)) != NULL; p = hit + strlen(name)) {
        fwrite(p, 1, (size_t)(hit - p), f);
        fprintf(f, "\"%s\"", queue);
    }
    fputs(p, f);
    fputs("print(job_id)\n", f);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

/* Runs the script; returns its exit status, and its output in out. */
static int run_script(const char *script, const char *dsn, const char *dir, char *out,
                      size_t size)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), PYTHON " %s '%s' 2>%s/producer.err", script, dsn, dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    out[strcspn(out, "\n")] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The order and its invoice job commit together, and the invoice is made
 * once. Run again, a producer retrying the same order fails on the order's
 * key, and no second job exists. */
START_TEST(test_readme_python_producer_enqueues_in_the_business_transaction)
{
    h_init();
    char queue[128];
    h_unique_name(queue, sizeof(queue), "example");
    char *dir = h_tmpdir("example");
    PGconn *pg = h_pg();
    char *invoices_sql = h_read_file("examples/invoice.sql");
    ck_assert_ptr_nonnull(invoices_sql);
    h_pg_exec(pg, invoices_sql);
    free(invoices_sql);
    /* The example's `orders` table, in a schema of its own on the search path. */
    h_pg_exec(pg, "CREATE SCHEMA IF NOT EXISTS sekali_example");
    h_pg_exec(pg, "CREATE TABLE IF NOT EXISTS sekali_example.orders "
                  "(id text PRIMARY KEY, amount_cents bigint NOT NULL)");
    h_pg_exec(pg, "DELETE FROM sekali_example.orders WHERE id = 'A-7'");

    char *config = h_write_config_top(dir, queue, "handlers/invoice.so", 1,
                                      "    config: {table: invoices}\n", RELAY);
    struct sk_broker *b = h_broker();
    ck_assert_int_eq(sk_broker_declare(b, queue, NULL, NULL), SK_OK);
    pid_t sekalid = h_start_sekalid("sekalid", config, dir, NULL);
    H_WAIT(h_consumers(b, queue) == 1, 20000, "a worker should consume %s", queue);

    char *block = readme_python();
    ck_assert_msg(block != NULL, "README.md has no ```python block");
    char *script = write_script(dir, block, queue);
    char dsn[1024];
    snprintf(dsn, sizeof(dsn), "%s options=-csearch_path=sekali_example", h_pg_conninfo());
    char job_id[256];
    ck_assert_msg(run_script(script, dsn, dir, job_id, sizeof(job_id)) == 0,
                  "%s failed: see %s/producer.err", script, dir);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali_example.orders WHERE id = "
                                    "'A-7'"), 1);
    H_WAIT(h_pg_count(pg, "SELECT count(*) FROM invoices WHERE job_id = '%s' AND order_id = "
                          "'A-7' AND amount_cents = 1250", job_id) == 1, 20000,
           "the invoice for job %s should be made", job_id);

    char again[256];
    ck_assert_msg(run_script(script, dsn, dir, again, sizeof(again)) != 0,
                  "the second run should fail on the order's primary key");
    char errors[1024];
    snprintf(errors, sizeof(errors), "%s/producer.err", dir);
    ck_assert_int_eq(h_count_lines(errors, "duplicate key value"), 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                queue), 1);
    ck_assert_int_eq(h_pg_count(pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                    "queue = '%s' AND key = 'order-A-7' AND "
                                    "status = 'completed'", queue), 1);

    h_stop_sekalid(sekalid, dir);
    ck_assert_int_eq(h_queue_depth(b, queue), 0);
    sk_broker_close(b);
    PQfinish(pg);
    free(script);
    free(block);
    free(config);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("examples");
    TCase *tc = tcase_create("examples");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_readme_python_producer_enqueues_in_the_business_transaction);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
