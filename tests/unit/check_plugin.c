/* check_plugin.c - the handler ABI checks, on descriptors built in place. */
/* links: core plugin pg */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <valgrind/valgrind.h>

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
    snprintf(expected, sizeof(expected), "refusing it: directory %s is writable by everyone", dir);
    ck_assert_msg(strstr(err.msg, expected) != NULL, "%s", err.msg);

    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A scratch tree for the bypasses: root is a fresh 0700 directory under /tmp
 * (sticky, so safe above us); each test builds what it needs below it. */
static void scratch(char *root, size_t size)
{
    snprintf(root, size, "/tmp/check_plugin.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
}

static void mkdir_mode(const char *root, const char *sub, mode_t mode)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", root, sub);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    ck_assert_int_eq(chmod(path, mode), 0);  /* mkdir() goes through the umask */
}

static void copy_handler(const char *root, const char *sub, const char *plugin)
{
    char cmd[2048];
    const char *build = getenv("SEKALI_BUILD") != NULL ? getenv("SEKALI_BUILD") : "build";
    snprintf(cmd, sizeof(cmd), "cp %s/%s %s/%s && chmod 0644 %s/%s", build, plugin, root, sub,
             root, sub);
    ck_assert_int_eq(system(cmd), 0);
}

static void remove_tree(const char *root)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
}

/* Nobody writes to the FIFO: loading it must not wait for a writer (it
 * hung sekalid -t, start and reload), and it is not a handler. */
START_TEST(test_handler_that_is_a_fifo_is_refused_without_blocking)
{
    char root[64], fifo[128];
    scratch(root, sizeof(root));
    ck_assert_int_eq(chmod(root, 0700), 0);
    snprintf(fifo, sizeof(fifo), "%s/handler.so", root);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    struct sk_plugin p;
    struct sk_err err;
    ck_assert_int_eq(sk_plugin_load(fifo, &p, &err), SK_ERR);
    ck_assert_msg(strstr(err.msg, "is not a regular file") != NULL, "%s", err.msg);
    remove_tree(root);
}
END_TEST

/* The message names the directory at fault and how it is loose. */
static void assert_refused(const char *file, const char *root, const char *dir, const char *how)
{
    struct sk_plugin p;
    struct sk_err err;
    char expected[512];

    ck_assert_int_eq(sk_plugin_load(file, &p, &err), SK_ERR);
    snprintf(expected, sizeof(expected), "handler %s: refusing it: directory %s/%s %s", file,
             root, dir, how);
    ck_assert_msg(strstr(err.msg, expected) != NULL, "expected \"%s\" in \"%s\"", expected,
                  err.msg);
}

/* The link sits in a safe directory; the code it points at does not. */
START_TEST(test_symlink_to_a_handler_in_a_world_writable_directory_is_refused)
{
    char root[64], link[128], target[128];

    scratch(root, sizeof(root));
    mkdir_mode(root, "safe", 0755);
    mkdir_mode(root, "open", 0755);
    copy_handler(root, "open/h.so", "handlers/invoice.so");
    snprintf(link, sizeof(link), "%s/safe/h.so", root);
    snprintf(target, sizeof(target), "%s/open/h.so", root);
    ck_assert_int_eq(symlink(target, link), 0);
    struct sk_plugin p;
    ck_assert_int_eq(sk_plugin_load(link, &p, NULL), SK_OK);

    snprintf(target, sizeof(target), "%s/open", root);
    ck_assert_int_eq(chmod(target, 0777), 0);
    assert_refused(link, root, "open", "is writable by everyone (mode 0777");
    remove_tree(root);
}
END_TEST

/* Whoever can write to the parent can rename the handler's directory away
 * and put one of their own in its place. */
START_TEST(test_handler_whose_parent_directory_is_world_writable_is_refused)
{
    char root[64], file[128], dir[128];

    scratch(root, sizeof(root));
    mkdir_mode(root, "parent", 0755);
    mkdir_mode(root, "parent/handlers", 0755);
    copy_handler(root, "parent/handlers/h.so", "handlers/invoice.so");
    snprintf(file, sizeof(file), "%s/parent/handlers/h.so", root);
    struct sk_plugin p;
    ck_assert_int_eq(sk_plugin_load(file, &p, NULL), SK_OK);

    snprintf(dir, sizeof(dir), "%s/parent", root);
    ck_assert_int_eq(chmod(dir, 0777), 0);
    assert_refused(file, root, "parent", "is writable by everyone (mode 0777");
    ck_assert_int_eq(chmod(dir, 0775), 0);
    assert_refused(file, root, "parent", "is writable by its group (mode 0775");
    remove_tree(root);
}
END_TEST

START_TEST(test_handler_under_a_directory_of_another_user_is_refused)
{
    char root[64], file[128], dir[128];

    scratch(root, sizeof(root));
    mkdir_mode(root, "theirs", 0755);
    mkdir_mode(root, "theirs/handlers", 0755);
    copy_handler(root, "theirs/handlers/h.so", "handlers/invoice.so");
    snprintf(file, sizeof(file), "%s/theirs/handlers/h.so", root);
    snprintf(dir, sizeof(dir), "%s/theirs", root);
    ck_assert_int_eq(chown(dir, 65534, 65534), 0);
    assert_refused(file, root, "theirs", "is owned by uid 65534");
    remove_tree(root);
}
END_TEST

/* /tmp is sticky: nobody else may rename or remove root's directory in it,
 * so it is safe above the handler, but not as the handler's own directory. */
START_TEST(test_sticky_directory_is_refused_only_as_the_handlers_own)
{
    char root[64], file[128];
    struct sk_plugin p;
    struct sk_err err;

    scratch(root, sizeof(root));
    mkdir_mode(root, "sticky", 01777);
    mkdir_mode(root, "sticky/mine", 0755);
    copy_handler(root, "sticky/mine/h.so", "handlers/invoice.so");
    snprintf(file, sizeof(file), "%s/sticky/mine/h.so", root);
    ck_assert_msg(sk_plugin_load(file, &p, &err) == SK_OK, "%s", err.msg);

    copy_handler(root, "sticky/h.so", "handlers/invoice.so");
    snprintf(file, sizeof(file), "%s/sticky/h.so", root);
    assert_refused(file, root, "sticky", "is writable by everyone (mode 1777");
    remove_tree(root);
}
END_TEST

/* Each load goes through its own descriptor's /proc name; a name reused for
 * another file must not hand back the first one. */
START_TEST(test_two_handlers_loaded_in_turn_are_each_their_own)
{
    char root[64], a[128], b[128];
    struct sk_plugin pa, pb, again;
    struct sk_err err;

    scratch(root, sizeof(root));
    mkdir_mode(root, "h", 0755);
    copy_handler(root, "h/a.so", "handlers/invoice.so");
    copy_handler(root, "h/b.so", "tests/plugins/effect.so");
    snprintf(a, sizeof(a), "%s/h/a.so", root);
    snprintf(b, sizeof(b), "%s/h/b.so", root);
    ck_assert_msg(sk_plugin_load(a, &pa, &err) == SK_OK, "%s", err.msg);
    ck_assert_msg(sk_plugin_load(b, &pb, &err) == SK_OK, "%s", err.msg);
    ck_assert_ptr_ne(pa.handler, pb.handler);
    ck_assert_str_ne(pa.handler->name, pb.handler->name);
    ck_assert_msg(sk_plugin_load(a, &again, &err) == SK_OK, "%s", err.msg);
    ck_assert_ptr_eq(again.handler, pa.handler);
    remove_tree(root);
}
END_TEST

/* A reload of an unchanged handler loads the same file again. glibc then
 * returns the loaded object, and files the new descriptor's /proc name
 * under it; that descriptor is closed, so the next file opened gets its
 * number, and thus the same name: it must still be its own object, not the
 * first handler under a name glibc has seen. */
START_TEST(test_file_loaded_after_a_reload_of_an_unchanged_handler_is_its_own)
{
    char root[64], a[128], b[128];
    struct sk_plugin pa, again, pb;
    struct sk_err err;

    scratch(root, sizeof(root));
    mkdir_mode(root, "h", 0755);
    copy_handler(root, "h/a.so", "handlers/invoice.so");
    copy_handler(root, "h/b.so", "tests/plugins/abi_1_2.so");
    snprintf(a, sizeof(a), "%s/h/a.so", root);
    snprintf(b, sizeof(b), "%s/h/b.so", root);
    ck_assert_msg(sk_plugin_load(a, &pa, &err) == SK_OK, "%s", err.msg);
    ck_assert_msg(sk_plugin_load(a, &again, &err) == SK_OK, "%s", err.msg);
    ck_assert_ptr_eq(again.handler, pa.handler);
    ck_assert_msg(sk_plugin_load(b, &pb, &err) == SK_OK, "%s", err.msg);
    ck_assert_str_eq(pb.handler->name, "abi_1_2");
    remove_tree(root);
}
END_TEST

/* The check and the load must be one lookup: the object glibc mapped is
 * named by the descriptor that was checked, not by the path, which someone
 * could have pointed elsewhere in between. */
START_TEST(test_handler_is_loaded_through_the_descriptor_that_was_checked)
{
    /* Valgrind loads objects through descriptors of its own: the name
     * glibc keeps then says nothing of ours. */
    if (RUNNING_ON_VALGRIND)
        return;
    char root[64], file[128];
    struct sk_plugin p;
    struct sk_err err;

    scratch(root, sizeof(root));
    mkdir_mode(root, "h", 0755);
    copy_handler(root, "h/h.so", "handlers/invoice.so");
    snprintf(file, sizeof(file), "%s/h/h.so", root);
    ck_assert_msg(sk_plugin_load(file, &p, &err) == SK_OK, "%s", err.msg);

    Dl_info info;
    ck_assert_int_ne(dladdr(*(void **)&p.handler->handle, &info), 0);
    ck_assert_msg(strncmp(info.dli_fname, "/proc/self/fd/", 14) == 0,
                  "loaded from %s, not from a descriptor", info.dli_fname);
    struct stat loaded, checked;
    ck_assert_int_eq(stat(info.dli_fname, &loaded), 0);
    ck_assert_int_eq(stat(file, &checked), 0);
    ck_assert(loaded.st_dev == checked.st_dev && loaded.st_ino == checked.st_ino);
    remove_tree(root);
}
END_TEST

static int reject(const struct sekali_host *host, const char *config, char *err, size_t size)
{
    (void)host;
    snprintf(err, size, "`table: %s` is not a table name", config != NULL ? config : "?");
    return SEKALI_FAIL;
}

START_TEST(test_config_rejected_by_check_is_refused_with_the_handlers_message)
{
    struct sekali_handler h = good();
    h.check = reject;
    struct sk_plugin p = { .path = "t.so", .handler = &h };
    struct sk_err err;
    ck_assert_int_eq(sk_plugin_check_config(&p, NULL, "1x", &err), SK_ERR);
    ck_assert_str_eq(err.msg, "handler t.so rejects its config: `table: 1x` is not a table name");
}
END_TEST

/* A 1.2 descriptor ends before check: whatever lies after it is not read. */
START_TEST(test_descriptor_of_abi_1_2_is_accepted_and_its_config_not_checked)
{
    struct sekali_handler h = good();
    h.abi_minor = 2;
    h.struct_size = (uint32_t)offsetof(struct sekali_handler, check);
    h.check = reject;  /* past struct_size: must not be called */
    ck_assert_int_eq(sk_plugin_check(&h, "t.so", NULL), SK_OK);
    struct sk_plugin p = { .path = "t.so", .handler = &h };
    ck_assert_int_eq(sk_plugin_check_config(&p, NULL, "1x", NULL), SK_OK);
}
END_TEST

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

/* Exit 3 is for a handler built for another ABI alone; a file that is no
 * sekali handler is a configuration mistake. Either way the refused object
 * is unloaded and its descriptor closed, so failed reloads leak nothing. */
static void assert_unloaded_after_refusal(const char *plugin, int code, const char *msg)
{
    char root[64], file[128];
    struct sk_plugin p;
    struct sk_err err;

    scratch(root, sizeof(root));
    mkdir_mode(root, "h", 0755);
    copy_handler(root, "h/h.so", plugin);
    snprintf(file, sizeof(file), "%s/h/h.so", root);
    int fds = open_fds();
    ck_assert_int_eq(sk_plugin_load(file, &p, &err), code);
    ck_assert_msg(strstr(err.msg, msg) != NULL, "%s: %s", plugin, err.msg);
    ck_assert_int_eq(open_fds(), fds);
    ck_assert_msg(dlopen(file, RTLD_NOW | RTLD_NOLOAD) == NULL, "%s is still loaded", plugin);
    remove_tree(root);
}

START_TEST(test_refused_handlers_are_unloaded_and_only_an_abi_mismatch_is_an_abi_error)
{
    assert_unloaded_after_refusal("tests/plugins/old_abi.so", SK_PLUGIN_ABI,
                                  "incompatible ABI: abi_major is 0");
    assert_unloaded_after_refusal("tests/plugins/null_handle.so", SK_PLUGIN_ABI,
                                  "mandatory callback handle is NULL");
    assert_unloaded_after_refusal("tests/plugins/no_symbol.so", SK_ERR,
                                  "no symbol sekali_handler_v1");
}
END_TEST

/* The control: an accepted handler stays loaded (RTLD_NOLOAD finds it). */
START_TEST(test_accepted_handler_stays_loaded)
{
    char root[64], file[128];
    struct sk_plugin p;
    struct sk_err err;

    scratch(root, sizeof(root));
    mkdir_mode(root, "h", 0755);
    copy_handler(root, "h/h.so", "tests/plugins/abi_1_2.so");
    snprintf(file, sizeof(file), "%s/h/h.so", root);
    ck_assert_msg(sk_plugin_load(file, &p, &err) == SK_OK, "%s", err.msg);
    ck_assert_uint_eq(p.handler->abi_minor, 2);
    ck_assert_ptr_nonnull(dlopen(file, RTLD_NOW | RTLD_NOLOAD));
    remove_tree(root);
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
        test_handler_that_is_a_fifo_is_refused_without_blocking,
        test_handler_writable_by_others_is_refused,
        test_symlink_to_a_handler_in_a_world_writable_directory_is_refused,
        test_handler_whose_parent_directory_is_world_writable_is_refused,
        test_handler_under_a_directory_of_another_user_is_refused,
        test_sticky_directory_is_refused_only_as_the_handlers_own,
        test_two_handlers_loaded_in_turn_are_each_their_own,
        test_file_loaded_after_a_reload_of_an_unchanged_handler_is_its_own,
        test_handler_is_loaded_through_the_descriptor_that_was_checked,
        test_config_rejected_by_check_is_refused_with_the_handlers_message,
        test_descriptor_of_abi_1_2_is_accepted_and_its_config_not_checked,
        test_refused_handlers_are_unloaded_and_only_an_abi_mismatch_is_an_abi_error,
        test_accepted_handler_stays_loaded,
        NULL,
    };
    Suite *s = suite_create("plugin");
    h_tcase(s, "abi", 0, tests);
    return h_run_suite(s);
}
