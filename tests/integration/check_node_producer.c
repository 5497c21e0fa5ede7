/* check_node_producer.c - the Node.js producer of docs/guarantees.md, run as
 * written: the ```js block is taken out of it (only its queue renamed to one
 * of this run) and called with a node-postgres pool on the test database,
 * while sekalid serves the queue with the example invoice handler.
 *
 * node-postgres is not packaged by Debian, so this test, and only this
 * test, installs it from the npm registry (pg@8, whose engines field asks
 * for Node.js 16 or later; Debian 12 has 18) into $SEKALI_SCRATCH/npm,
 * once; tests/servers.sh stop --wipe removes it. Without the registry the
 * test fails and says so: the example is meant to run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define DOC "docs/guarantees.md"  /* "Enqueueing", where the block lives */

#define NODE "node"
#define NPM  "npm"
#define PG_PACKAGE "pg@8"

/* The directory holding node_modules/pg, installing it first if needed. */
static char *node_postgres(void)
{
    const char *scratch = getenv("SEKALI_SCRATCH");
    ck_assert_ptr_nonnull(scratch);
    char *dir = NULL, *marker = NULL;
    ck_assert(asprintf(&dir, "%s/npm", scratch) > 0);
    ck_assert(asprintf(&marker, "%s/node_modules/pg/package.json", dir) > 0);
    if (access(marker, R_OK) != 0) {
        mkdir(dir, 0755);
        char cmd[2048];
        snprintf(cmd, sizeof(cmd), "timeout 300 " NPM " install --prefix '%s' --no-save "
                 "--no-audit --no-fund --loglevel=error " PG_PACKAGE " >'%s/npm.log' 2>&1",
                 dir, dir);
        int status = system(cmd);
        ck_assert_msg(status == 0 && access(marker, R_OK) == 0,
                      "cannot install node-postgres (npm install " PG_PACKAGE ") from the npm "
                      "registry, so the Node.js producer of " DOC " cannot be run: see %s/npm.log",
                      dir);
    }
    free(marker);
    return dir;
}

/* Writes the block as a script that makes a pool on argv[2] with the
 * example's schema first on the search path, calls the block's
 * enqueueInvoice() and prints the job id; 'invoices' becomes queue. */
static char *write_script(const char *dir, const char *block, const char *queue)
{
    char *path = NULL;
    ck_assert(asprintf(&path, "%s/producer.js", dir) > 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("const { Pool } = require('pg');\n"
          "const pool = new Pool({ connectionString: process.argv[2],\n"
          "                        options: '-c search_path=sekali_example' });\n", f);
    const char *name = "'invoices'";
    const char *p = block;
    for (const char *hit; (hit = strstr(p, name)) != NULL; p = hit + strlen(name)) {
        fwrite(p, 1, (size_t)(hit - p), f);
        fprintf(f, "'%s'", queue);
    }
    fputs(p, f);
    fputs("enqueueInvoice(pool).then(\n"
          "  (id) => { console.log(id); return pool.end(); },\n"
          "  (e) => { console.error(e.message); process.exitCode = 1; return pool.end(); });\n",
          f);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

/* Runs the script with node; returns its exit status, and its first line of
 * output in out. */
static int run_script(const char *script, const char *modules, const char *url,
                      const char *dir, char *out, size_t size)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "NODE_PATH='%s/node_modules' timeout 60 " NODE " %s '%s' "
             "2>%s/producer.err", modules, script, url, dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    out[strcspn(out, "\n")] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The order and its invoice job commit together, and the invoice is made
 * once. Run again, the producer fails on the order's key and rolls back:
 * no second job exists. */
START_TEST(test_readme_node_producer_enqueues_in_the_business_transaction)
{
    struct h_run r;
    h_run_open(&r, "node_example");
    ck_assert_msg(system(NODE " --version >/dev/null 2>&1") == 0,
                  "node not found: tools/install-deps.sh installs nodejs");
    char *modules = node_postgres();
    const char *url = getenv("SEKALI_PG_URL");
    ck_assert_msg(url != NULL, "SEKALI_PG_URL is not set: run through tests/run.sh");

    char *invoices_sql = h_read_file("examples/invoice.sql");
    ck_assert_ptr_nonnull(invoices_sql);
    h_pg_exec(r.pg, invoices_sql);
    free(invoices_sql);
    h_pg_exec(r.pg, "CREATE SCHEMA IF NOT EXISTS sekali_example");
    h_pg_exec(r.pg, "CREATE TABLE IF NOT EXISTS sekali_example.orders "
                    "(id text PRIMARY KEY, amount_cents bigint NOT NULL)");
    h_pg_exec(r.pg, "DELETE FROM sekali_example.orders WHERE id = 'A-7'");
    h_run_start(&r, &(struct h_run_opts){ .handler = "handlers/invoice.so", .workers = 1,
                                          .queue_yaml = "    config: {table: invoices}\n",
                                          .top_yaml = H_RELAY });

    char *block = h_doc_block(DOC, "js");
    ck_assert_msg(block != NULL, DOC " has no ```js block");
    char *script = write_script(r.dir, block, r.queue);
    char job_id[256];
    ck_assert_msg(run_script(script, modules, url, r.dir, job_id, sizeof(job_id)) == 0,
                  "%s failed: see %s/producer.err", script, r.dir);
    ck_assert_int_eq(h_pg_count(r.pg, "SELECT count(*) FROM sekali_example.orders WHERE id = "
                                      "'A-7'"), 1);
    H_WAIT(h_pg_count(r.pg, "SELECT count(*) FROM invoices WHERE job_id = '%s' AND order_id = "
                            "'A-7' AND amount_cents = 1250", job_id) == 1, 20000,
           "the invoice for job %s should be made", job_id);

    char again[256];
    ck_assert_msg(run_script(script, modules, url, r.dir, again, sizeof(again)) != 0,
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
    free(modules);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_readme_node_producer_enqueues_in_the_business_transaction,
        NULL,
    };
    /* The first run downloads node-postgres: up to 300 s for npm. */
    return h_run_suite(h_suite("node_producer", 420, tests));
}
