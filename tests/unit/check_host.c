/* check_host.c - the host functions a handler calls that need no server:
 * the config accessor, the body copy, enqueue_job()'s size check, conflict(). */
/* links: core host sqlq headers_json lease pg store */
#include <stdio.h>
#include <string.h>

#include <check.h>

#include "host.h"
#include "suite.h"

START_TEST(test_config_get_reads_flat_scalars_plain_or_quoted)
{
    const struct sekali_host *h = sk_host();
    const char *config = "table: invoices\nlabel: \"a: b # c\"\nempty: ''\n";
    char buf[64];
    ck_assert_int_eq(h->config_get(config, "table", buf, sizeof(buf)), 8);
    ck_assert_str_eq(buf, "invoices");
    ck_assert_int_eq(h->config_get(config, "label", buf, sizeof(buf)), 8);
    ck_assert_str_eq(buf, "a: b # c");
    ck_assert_int_eq(h->config_get(config, "empty", buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "");
}
END_TEST

START_TEST(test_config_get_says_not_found_for_absent_keys_lists_and_no_config)
{
    const struct sekali_host *h = sk_host();
    char buf[16] = "x";
    ck_assert_int_eq(h->config_get("table: t\n", "tab", buf, sizeof(buf)), -1);
    ck_assert_str_eq(buf, "");
    ck_assert_int_eq(h->config_get("hosts: [a, b]\n", "hosts", buf, sizeof(buf)), -1);
    ck_assert_int_eq(h->config_get("db:\n  table: t\n", "table", buf, sizeof(buf)), -1);
    ck_assert_int_eq(h->config_get(NULL, "table", buf, sizeof(buf)), -1);
    ck_assert_int_eq(h->config_get("[unclosed", "table", buf, sizeof(buf)), -1);
}
END_TEST

START_TEST(test_config_get_truncates_like_snprintf_and_returns_the_full_length)
{
    char buf[4];
    ck_assert_int_eq(sk_host_config_get("table: invoices\n", "table", buf, sizeof(buf)), 8);
    ck_assert_str_eq(buf, "inv");
}
END_TEST

START_TEST(test_body_copy_is_nul_terminated_and_keeps_embedded_nuls)
{
    static struct sekali_ctx ctx;
    const char body[] = { 'a', '\0', 'b' };
    const char *copy = sk_host_ctx_body(&ctx, body, sizeof(body));
    ck_assert_ptr_nonnull(copy);
    ck_assert_mem_eq(copy, body, sizeof(body));
    ck_assert_int_eq(copy[sizeof(body)], '\0');

    static char big[100000];
    memset(big, 'x', sizeof(big));
    copy = sk_host_ctx_body(&ctx, big, sizeof(big));
    ck_assert_ptr_nonnull(copy);
    ck_assert_int_eq(copy[sizeof(big) - 1], 'x');
    ck_assert_int_eq(copy[sizeof(big)], '\0');
    ck_assert_str_eq(sk_host_ctx_body(&ctx, "", 0), "");
    sk_host_ctx_free(&ctx);
}
END_TEST

/* A caller that forgot struct_size gets an error, not a read of garbage. */
START_TEST(test_enqueue_job_refuses_a_struct_without_its_size)
{
    static struct sekali_ctx ctx;
    struct sekali_enqueue e = { .queue = "q", .job_type = "t", .body = "b", .body_len = 1 };
    ck_assert_int_eq(sk_host()->enqueue_job(&ctx, &e, NULL, 0), -1);
    ck_assert_ptr_nonnull(strstr(ctx.error, "struct_size"));
}
END_TEST

START_TEST(test_conflict_marks_the_job_and_asks_for_a_retry)
{
    static struct sekali_ctx ctx;
    ck_assert_int_eq(sk_host()->conflict(&ctx, "row 7 changed"), SEKALI_RETRY);
    ck_assert(ctx.conflict);
    ck_assert_str_eq(ctx.error, "conflict: row 7 changed");
    sk_host_ctx_reset(&ctx);
    ck_assert(!ctx.conflict);
}
END_TEST

/* queue_sql() copies what it is given (the caller's buffers may change
 * after it returns), keeps NULL as SQL NULL, refuses past its bounds with
 * the reason as the job's error, and refuses in external mode. */
START_TEST(test_queue_sql_copies_and_bounds_the_statements)
{
    static struct sekali_ctx ctx;
    const struct sekali_host *h = sk_host();
    ck_assert_uint_ge(h->abi_minor, 8);
    char sql[] = "INSERT INTO t VALUES ($1, $2)", v1[] = "one";
    const char *values[] = { v1, NULL };
    ck_assert_int_eq(h->queue_sql(&ctx, sql, 2, values), 0);
    sql[0] = 'X';
    v1[0] = 'X';
    ck_assert_uint_eq(ctx.queued.n, 1);
    ck_assert_str_eq(ctx.queued.st[0]->sql, "INSERT INTO t VALUES ($1, $2)");
    ck_assert_str_eq(ctx.queued.st[0]->values[0], "one");
    ck_assert_ptr_null(ctx.queued.st[0]->values[1]);
    ck_assert_int_eq(h->queue_sql(&ctx, "SELECT 1", -1, NULL), -1);
    ck_assert_int_eq(h->queue_sql(&ctx, "SELECT $1", 1, NULL), -1);
    for (int i = 1; i < SK_SQLQ_MAX_STATEMENTS; i++)
        ck_assert_int_eq(h->queue_sql(&ctx, "SELECT 1", 0, NULL), 0);
    ck_assert_int_eq(h->queue_sql(&ctx, "SELECT 1", 0, NULL), -1);
    ck_assert_ptr_nonnull(strstr(ctx.error, "more than 64 statements"));
    sk_host_ctx_reset(&ctx);
    ck_assert_uint_eq(ctx.queued.n, 0);
    static char big[SK_SQLQ_MAX_BYTES];
    memset(big, 'a', sizeof(big) - 1);
    const char *bv[] = { big };
    ck_assert_int_eq(h->queue_sql(&ctx, "SELECT $1", 1, bv), -1);
    ck_assert_ptr_nonnull(strstr(ctx.error, "bytes"));
    ck_assert_uint_eq(ctx.queued.n, 0);
    ctx.external = true;
    ck_assert_int_eq(h->queue_sql(&ctx, "SELECT 1", 0, NULL), -1);
    ck_assert_uint_eq(ctx.queued.n, 0);
    sk_host_ctx_free(&ctx);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_config_get_reads_flat_scalars_plain_or_quoted,
        test_config_get_says_not_found_for_absent_keys_lists_and_no_config,
        test_config_get_truncates_like_snprintf_and_returns_the_full_length,
        test_body_copy_is_nul_terminated_and_keeps_embedded_nuls,
        test_enqueue_job_refuses_a_struct_without_its_size,
        test_conflict_marks_the_job_and_asks_for_a_retry,
        test_queue_sql_copies_and_bounds_the_statements,
        NULL,
    };
    return h_run_suite(h_suite("host", 0, tests));
}
