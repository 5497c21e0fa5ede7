/* check_plugin.c - the handler ABI checks, on descriptors built in place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <check.h>

#include "plugin.h"
#include "suite.h"

static int handle(void *state, const struct sekali_job *job, struct sekali_ctx *ctx)
{
    (void)state, (void)job, (void)ctx;
    return SEKALI_OK;
}

static struct sekali_handler good(void)
{
    return (struct sekali_handler){
        .abi_major = SEKALI_HANDLER_ABI_MAJOR, .abi_minor = SEKALI_HANDLER_ABI_MINOR,
        .struct_size = sizeof(struct sekali_handler), .name = "t", .handle = handle,
    };
}

START_TEST(test_current_descriptor_is_accepted)
{
    struct sekali_handler h = good();
    ck_assert_int_eq(sk_plugin_check(&h, "t.so", NULL), SK_OK);
}
END_TEST

START_TEST(test_other_major_version_is_refused_with_both_values)
{
    struct sekali_handler h = good();
    h.abi_major = 2;
    struct sk_err err;
    ck_assert_int_eq(sk_plugin_check(&h, "t.so", &err), SK_ERR);
    ck_assert_str_eq(err.msg, "handler t.so: incompatible ABI: abi_major is 2, sekalid needs 1 "
                              "(rebuild the handler against this sekali/handler.h)");
}
END_TEST

START_TEST(test_newer_minor_version_is_accepted)
{
    struct sekali_handler h = good();
    h.abi_minor = SEKALI_HANDLER_ABI_MINOR + 3;
    h.struct_size += 16;  /* members appended by a newer header */
    ck_assert_int_eq(sk_plugin_check(&h, "t.so", NULL), SK_OK);
}
END_TEST

START_TEST(test_descriptor_smaller_than_version_1_0_is_refused)
{
    struct sekali_handler h = good();
    h.struct_size = 16;
    struct sk_err err;
    ck_assert_int_eq(sk_plugin_check(&h, "t.so", &err), SK_ERR);
    ck_assert_ptr_nonnull(strstr(err.msg, "struct_size is 16"));
}
END_TEST

START_TEST(test_missing_handle_callback_is_refused)
{
    struct sekali_handler h = good();
    h.handle = NULL;
    struct sk_err err;
    ck_assert_int_eq(sk_plugin_check(&h, "t.so", &err), SK_ERR);
    ck_assert_str_eq(err.msg, "handler t.so: mandatory callback handle is NULL");
}
END_TEST

START_TEST(test_null_descriptor_is_refused)
{
    struct sk_err err;
    ck_assert_int_eq(sk_plugin_check(NULL, "t.so", &err), SK_ERR);
    ck_assert_str_eq(err.msg, "handler t.so: sekali_handler_v1() returned NULL");
}
END_TEST

START_TEST(test_missing_file_is_refused)
{
    struct sk_plugin p;
    struct sk_err err;
    ck_assert_int_eq(sk_plugin_load("/nonexistent/x.so", &p, &err), SK_ERR);
    ck_assert_ptr_nonnull(strstr(err.msg, "handler /nonexistent/x.so: cannot load"));
}
END_TEST

/* A copy of a real handler in a fresh directory, with the given modes. */
static void make_handler_copy(char *dir, size_t size, char *file, size_t file_size,
                              mode_t dir_mode, mode_t file_mode)
{
    snprintf(dir, size, "/tmp/check_plugin.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(file, file_size, "%s/h.so", dir);
    char cmd[2048];
    const char *build = getenv("SEKALI_BUILD") != NULL ? getenv("SEKALI_BUILD") : "build";
    snprintf(cmd, sizeof(cmd), "cp %s/handlers/invoice.so %s", build, file);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(chmod(file, file_mode), 0);
    ck_assert_int_eq(chmod(dir, dir_mode), 0);
}

START_TEST(test_handler_writable_by_others_is_refused)
{
    char dir[64], file[128];
    struct sk_plugin p;
    struct sk_err err;

    make_handler_copy(dir, sizeof(dir), file, sizeof(file), 0755, 0644);
    ck_assert_int_eq(sk_plugin_load(file, &p, &err), SK_OK);

    ck_assert_int_eq(chmod(file, 0666), 0);
    ck_assert_int_eq(sk_plugin_load(file, &p, &err), SK_ERR);
    ck_assert_msg(strstr(err.msg, "is writable by everyone") != NULL, "%s", err.msg);

    ck_assert_int_eq(chmod(file, 0664), 0);
    ck_assert_int_eq(sk_plugin_load(file, &p, &err), SK_ERR);
    ck_assert_msg(strstr(err.msg, "is writable by its group") != NULL, "%s", err.msg);

    ck_assert_int_eq(chmod(file, 0644), 0);
    ck_assert_int_eq(chmod(dir, 01777), 0);
    ck_assert_int_eq(sk_plugin_load(file, &p, &err), SK_ERR);
    char expected[128];
    snprintf(expected, sizeof(expected), "refusing it: %s is writable by everyone", dir);
    ck_assert_msg(strstr(err.msg, expected) != NULL, "%s", err.msg);

    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    const TTest *tests[] = {
        test_current_descriptor_is_accepted,
        test_other_major_version_is_refused_with_both_values,
        test_newer_minor_version_is_accepted,
        test_descriptor_smaller_than_version_1_0_is_refused,
        test_missing_handle_callback_is_refused,
        test_null_descriptor_is_refused,
        test_missing_file_is_refused,
        test_handler_writable_by_others_is_refused,
        NULL,
    };
    Suite *s = suite_create("plugin");
    h_tcase(s, "abi", 0, tests);
    return h_run_suite(s);
}
