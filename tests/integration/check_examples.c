/* check_examples.c - the README's producer example, run as written: the
 * Python block is taken out of README.md (only its queue renamed to one of
 * this run) and run with Debian's python3 and psycopg 3 against the test
 * database, while sekalid serves the queue with the example invoice handler.
 * So a README that drifts from sekali.enqueue() fails here.
 *
 * The Node.js block of docs/guarantees.md is run by check_node_producer.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

#define PYTHON "/usr/bin/python3"  /* Debian's, with python3-psycopg; not a pyenv shim */

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
    struct h_run r;
    h_run_open(&r, "example");
    char *invoices_sql = h_read_file("examples/invoice.sql");
    ck_assert_ptr_nonnull(invoices_sql);
    h_pg_exec(r.pg, invoices_sql);
    free(invoices_sql);
    /* The example's `orders` table, in a schema of its own on the search path. */
    h_pg_exec(r.pg, "CREATE SCHEMA IF NOT EXISTS sekali_example");
    h_pg_exec(r.pg, "CREATE TABLE IF NOT EXISTS sekali_example.orders "
                    "(id text PRIMARY KEY, amount_cents bigint NOT NULL)");
    h_pg_exec(r.pg, "DELETE FROM sekali_example.orders WHERE id = 'A-7'");
    h_run_start(&r, &(struct h_run_opts){ .handler = "handlers/invoice.so", .workers = 1,
                                          .queue_yaml = "    config: {table: invoices}\n",
                                          .top_yaml = H_RELAY });

    char *block = h_doc_block("README.md", "python");
    ck_assert_msg(block != NULL, "README.md has no ```python block");
    char *script = write_script(r.dir, block, r.queue);
    char dsn[1024];
    snprintf(dsn, sizeof(dsn), "%s options=-csearch_path=sekali_example", h_pg_conninfo());
    char job_id[256];
    ck_assert_msg(run_script(script, dsn, r.dir, job_id, sizeof(job_id)) == 0,
                  "%s failed: see %s/producer.err", script, r.dir);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_example.orders WHERE id = "
                                      "'A-7'"), 1);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM invoices WHERE job_id = '%s' AND order_id = "
                            "'A-7' AND amount_cents = 1250", job_id) == 1, 20000,
           "the invoice for job %s should be made", job_id);

    char again[256];
    ck_assert_msg(run_script(script, dsn, r.dir, again, sizeof(again)) != 0,
                  "the second run should fail on the order's primary key");
    char errors[1024];
    snprintf(errors, sizeof(errors), "%s/producer.err", r.dir);
    ck_assert_int_eq(h_count_lines(errors, "duplicate key value"), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.outbox WHERE queue = '%s'",
                                r.queue), 1);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali.idempotency_keys WHERE "
                                      "queue = '%s' AND key = 'order-A-7' AND "
                                      "status = 'completed'", r.queue), 1);

    h_run_stop(&r);
    h_run_close(&r);
    free(script);
    free(block);
}
END_TEST

/* The example's optional per-customer totals: jobs for one customer run on
 * two workers without the Redis lock, so their read-then-guarded-update
 * steps may interleave; whoever loses reports a conflict and runs again.
 * Every invoice is added to the total once: none is lost, none doubled. */
START_TEST(test_example_customer_total_is_the_sum_of_its_invoices_under_concurrent_jobs)
{
    struct h_run r;
    h_run_open(&r, "totals");
    char *invoices_sql = h_read_file("examples/invoice.sql");
    ck_assert_ptr_nonnull(invoices_sql);
    h_pg_exec(r.pg, invoices_sql);
    free(invoices_sql);
    char sql[512];
    snprintf(sql, sizeof(sql), "INSERT INTO customer_totals (customer) VALUES ('%s')", r.queue);
    h_pg_exec(r.pg, sql);
    h_run_start(&r, &(struct h_run_opts){
        .handler = "handlers/invoice.so", .workers = 2,
        .queue_yaml = "    lock: false\n    retry:\n      max_attempts: 50\n      initial: 10ms\n"
                      "      max: 20ms\n    config: {table: invoices, totals: customer_totals}\n" });
    long long sum = 0;
    for (int i = 1; i <= 40; i++) {
        char id[160], body[512];
        snprintf(id, sizeof(id), "%s-%d", r.queue, i);
        snprintf(body, sizeof(body), "{\"order_id\": \"%s\", \"amount_cents\": %d, "
                 "\"customer\": \"%s\"}", id, i, r.queue);
        h_publish(r.b, r.queue, "invoice", id, NULL, NULL, body);
        sum += i;
    }
    H_WAIT(h_completed(&r) == 40, 60000, "all 40 invoices should complete, %lld did",
           h_completed(&r));
    h_run_stop(&r);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM invoices WHERE order_id LIKE "
                                      "'%s-%%'", r.queue), 40);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT invoiced_cents FROM customer_totals WHERE "
                                      "customer = '%s'", r.queue), sum);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT version FROM customer_totals WHERE customer = "
                                      "'%s'", r.queue), 40);
    h_run_close(&r);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_readme_python_producer_enqueues_in_the_business_transaction,
        test_example_customer_total_is_the_sum_of_its_invoices_under_concurrent_jobs,
        NULL,
    };
    return h_run_suite(h_suite("examples", 120, tests));
}
