/*
 * zs_dir (zs/dir.h): a directory used with someone else's rights, relative to descriptors, no
 * link followed; and zs_ckpt's manifest, trusted only when all of it verifies (zs/ckpt.h).
 * The tests that need another uid use a made-up credential: the checks are emulated from the
 * owner, group and mode bits, whoever runs the test.
 */
#define _GNU_SOURCE
#include "zs/ckpt.h"
#include "zs/dir.h"
#include "zs/layout.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[] = "/tmp/zs-test-dir-XXXXXX";
static char err[1024];

static void setup(void)
{
    strcpy(tmp, "/tmp/zs-test-dir-XXXXXX");
    cr_assert_not_null(mkdtemp(tmp));
}

static void teardown(void)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

static void path_of(char *out, const char *name)
{
    snprintf(out, PATH_MAX, "%s/%s", tmp, name);
}

static void write_text(const char *name, const char *text)
{
    char p[PATH_MAX];
    FILE *f;

    path_of(p, name);
    f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs(text, f);
    fclose(f);
}

TestSuite(zs_dir, .init = setup, .fini = teardown);

Test(zs_dir, cred_may_follows_owner_then_group_then_other)
{
    zs_cred_t c = {.uid = 1000, .gid = 100, .n_groups = 1, .groups = {200}};
    zs_cred_t root = {.uid = 0};
    struct stat sb = {.st_uid = 1000, .st_gid = 300, .st_mode = S_IFDIR | 0077};

    cr_assert(!zs_cred_may(&c, &sb, ZS_MAY_READ), "the owner's bits decide, not other's");
    sb.st_mode = S_IFDIR | 0700;
    cr_assert(zs_cred_may(&c, &sb, ZS_MAY_READ | ZS_MAY_WRITE | ZS_MAY_EXEC));
    sb.st_uid = 1;
    sb.st_gid = 200; /* a supplementary group */
    sb.st_mode = S_IFDIR | 0750;
    cr_assert(zs_cred_may(&c, &sb, ZS_MAY_READ | ZS_MAY_EXEC));
    cr_assert(!zs_cred_may(&c, &sb, ZS_MAY_WRITE | ZS_MAY_EXEC));
    sb.st_gid = 300;
    sb.st_mode = S_IFDIR | 0755;
    cr_assert(zs_cred_may(&c, &sb, ZS_MAY_READ | ZS_MAY_EXEC));
    cr_assert(!zs_cred_may(&c, &sb, ZS_MAY_WRITE));
    sb.st_mode = S_IFDIR | 0;
    cr_assert(zs_cred_may(&root, &sb, ZS_MAY_READ | ZS_MAY_WRITE | ZS_MAY_EXEC));
}

Test(zs_dir, a_directory_the_cred_may_not_write_is_refused_naming_it)
{
    zs_cred_t other = {.uid = 54321, .gid = 54321};
    zs_dir_t d = ZS_DIR_INIT;
    int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    cr_assert_geq(fd, 0);
    cr_assert_eq(chmod(tmp, 0755), 0);
    cr_assert_eq(zs_dir_adopt(&d, fd, tmp, &other, ZS_MAY_WRITE | ZS_MAY_EXEC, err, sizeof(err)),
                 ZS_ERR_PERMISSION);
    cr_assert(strstr(err, tmp) != NULL && strstr(err, "uid 54321") != NULL, "%s", err);
    cr_assert_eq(d.fd, -1, "a refused descriptor is closed");
    fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_eq(zs_dir_adopt(&d, fd, tmp, &other, ZS_MAY_READ | ZS_MAY_EXEC, err, sizeof(err)),
                 ZS_OK, "%s", err);
    zs_dir_close(&d);
}

Test(zs_dir, only_regular_files_of_the_expected_size_are_read)
{
    char p[PATH_MAX], target[PATH_MAX];
    zs_dir_t d = ZS_DIR_INIT;
    uint64_t size = 0;
    char *buf = NULL;
    size_t len = 0;
    int fd = -1;

    write_text("ok", "hello");
    path_of(p, "fifo");
    cr_assert_eq(mkfifo(p, 0600), 0);
    path_of(p, "dir");
    cr_assert_eq(mkdir(p, 0700), 0);
    path_of(p, "link");
    path_of(target, "ok");
    cr_assert_eq(symlink(target, p), 0);
    path_of(p, "zero");
    cr_assert_eq(symlink("/dev/zero", p), 0);
    cr_assert_eq(zs_dir_open(&d, tmp, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(zs_dir_read_file(&d, "ok", 64, &buf, &len, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(len, 5u);
    cr_assert_str_eq(buf, "hello");
    free(buf);
    cr_assert_eq(zs_dir_open_file(&d, "fifo", 64, false, &fd, &size, err, sizeof(err)), ZS_ERR_IO);
    cr_assert(strstr(err, "a FIFO") != NULL, "%s", err);
    cr_assert_eq(zs_dir_open_file(&d, "dir", 64, false, &fd, &size, err, sizeof(err)), ZS_ERR_IO);
    cr_assert(strstr(err, "a directory") != NULL, "%s", err);
    cr_assert_neq(zs_dir_open_file(&d, "link", 64, false, &fd, &size, err, sizeof(err)), ZS_OK);
    cr_assert(strstr(err, "symbolic link") != NULL, "%s", err);
    cr_assert_neq(zs_dir_open_file(&d, "zero", 64, false, &fd, &size, err, sizeof(err)), ZS_OK);
    cr_assert_eq(zs_dir_open_file(&d, "ok", 4, false, &fd, &size, err, sizeof(err)), ZS_ERR_IO);
    cr_assert(strstr(err, "more than") != NULL, "%s", err);
    cr_assert_eq(zs_dir_open_file(&d, "ok", 6, true, &fd, &size, err, sizeof(err)), ZS_ERR_IO);
    cr_assert(strstr(err, "truncated or replaced") != NULL, "%s", err);
    cr_assert_eq(zs_dir_open_file(&d, "../ok", 6, true, &fd, &size, err, sizeof(err)),
                 ZS_ERR_INVALID, "a name with '/' is refused");
    zs_dir_close(&d);
}

Test(zs_dir, what_another_uid_owns_is_never_replaced_or_removed)
{
    zs_cred_t other = {.uid = 54321, .gid = 54321};
    zs_dir_t d = ZS_DIR_INIT;
    char p[PATH_MAX];
    struct stat sb;
    int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (geteuid() == 54321) {
        cr_skip_test("the test runs as uid 54321, the made-up other user");
    }
    write_text("mine", "x");
    cr_assert_eq(chmod(tmp, 0777), 0); /* the other may write into it: ownership still decides */
    cr_assert_eq(zs_dir_adopt(&d, fd, tmp, &other, ZS_MAY_WRITE | ZS_MAY_EXEC, err, sizeof(err)),
                 ZS_OK, "%s", err);
    cr_assert_eq(zs_dir_unlink(&d, "mine", err, sizeof(err)), ZS_ERR_PERMISSION);
    cr_assert(strstr(err, "belongs to uid") != NULL, "%s", err);
    cr_assert_eq(zs_dir_rename(&d, "mine", "yours", 0, err, sizeof(err)), ZS_ERR_PERMISSION);
    path_of(p, "mine");
    cr_assert_eq(stat(p, &sb), 0, "the file is still there");
    zs_dir_close(&d);
}

static bool zs_test_only_a(const char *name)
{
    return strcmp(name, "a") == 0;
}

Test(zs_dir, remove_flat_removes_only_what_it_accepts)
{
    zs_dir_t d = ZS_DIR_INIT;
    char p[PATH_MAX];
    struct stat sb;

    path_of(p, "ck");
    cr_assert_eq(mkdir(p, 0700), 0);
    write_text("ck/a", "1");
    write_text("ck/b", "2");
    cr_assert_eq(zs_dir_open(&d, tmp, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(zs_dir_remove_flat(&d, "ck", zs_test_only_a, err, sizeof(err)), ZS_ERR_EXISTS);
    cr_assert(strstr(err, "ck/b") != NULL, "%s", err);
    path_of(p, "ck/a");
    cr_assert_eq(stat(p, &sb), 0, "nothing was removed when one entry was foreign");
    path_of(p, "ck/b");
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(zs_dir_remove_flat(&d, "ck", zs_test_only_a, err, sizeof(err)), ZS_OK, "%s", err);
    path_of(p, "ck");
    cr_assert_eq(stat(p, &sb), -1);
    cr_assert_eq(zs_dir_remove_flat(&d, "ck", zs_test_only_a, err, sizeof(err)), ZS_OK,
                 "absent is fine");
    zs_dir_close(&d);
}

Test(zs_dir, created_entries_are_handed_over_with_least_exposure)
{
    zs_cred_t me;
    zs_dir_t d = ZS_DIR_INIT, sub = ZS_DIR_INIT;
    struct stat sb;
    char p[PATH_MAX];
    int fd = -1;

    zs_cred_of_self(&me);
    cr_assert_eq(chmod(tmp, 0755), 0);
    fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_eq(zs_dir_adopt(&d, fd, tmp, &me, ZS_MAY_WRITE | ZS_MAY_EXEC, err, sizeof(err)),
                 ZS_OK, "%s", err);
    cr_assert_eq(zs_dir_mkdir(&d, "sub", &sub, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(zs_dir_write_file(&sub, "f", "xy", 2, NULL, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(zs_dir_write_file(&sub, "f", "xy", 2, NULL, err, sizeof(err)), ZS_ERR_EXISTS,
                 "a file is never created over another");
    path_of(p, "sub");
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0750u);
    path_of(p, "sub/f");
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 0640u);
    cr_assert_eq(sb.st_uid, geteuid());
    zs_dir_close(&sub);
    zs_dir_close(&d);
}

/* ---- manifests ----------------------------------------------------------------------------- */

/* A manifest of 2 parameters at world 1, written with its checksum into tmp/name. */
static void write_manifest(const char *name, uint64_t layout_hash_xor)
{
    static const uint32_t gnp[1] = {2};
    static const uint64_t numel[2] = {10, 30};
    zs_layout_spec_t spec = {.world = 1,
                             .bucket_size = 64,
                             .elem_align = 16,
                             .n_groups = 1,
                             .group_n_params = gnp,
                             .numel = numel};
    zs_layout_t *l = NULL;
    zs_ckpt_manifest_t m;
    zs_dir_t d = ZS_DIR_INIT;
    char p[PATH_MAX];

    memset(&m, 0, sizeof(m));
    cr_assert_eq(zs_layout_create(&spec, &l, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(zs_ckpt_manifest_alloc(&m, 1, 2, 1), ZS_OK);
    m.version = ZS_CKPT_VERSION;
    strcpy(m.job_id, "j");
    strcpy(m.tag, name);
    m.world = 1;
    m.stage = 2;
    m.bucket_size = 64;
    m.elem_align = 16;
    m.shard_numel = l->shard_numel;
    m.layout_hash = l->hash ^ layout_hash_xor;
    m.group_n_params[0] = 2;
    for (int i = 0; i < 2; i++) {
        m.params[i].name = strdup(i ? "w" : "b");
        m.params[i].numel = numel[i];
        m.params[i].ndim = 1;
        m.params[i].dims[0] = numel[i];
    }
    m.n_files = 0;
    path_of(p, name);
    cr_assert_eq(mkdir(p, 0700), 0);
    cr_assert_eq(zs_dir_open(&d, p, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(zs_ckpt_manifest_write(&d, &m, err, sizeof(err)), ZS_OK, "%s", err);
    zs_dir_close(&d);
    free(m.params[0].name);
    free(m.params[1].name);
    m.params[0].name = m.params[1].name = NULL;
    free(m.group_n_params);
    free(m.group_options);
    free(m.params);
    free(m.files);
    zs_layout_destroy(l);
}

static zs_status_t read_manifest(const char *name)
{
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t d = ZS_DIR_INIT;
    char p[PATH_MAX];
    zs_status_t st;

    path_of(p, name);
    cr_assert_eq(zs_dir_open(&d, p, err, sizeof(err)), ZS_OK, "%s", err);
    st = zs_ckpt_manifest_read(&d, &m, err, sizeof(err));
    zs_ckpt_manifest_free(m);
    zs_dir_close(&d);
    return st;
}

Test(zs_dir, a_manifest_is_trusted_only_when_it_verifies)
{
    char p[PATH_MAX];
    FILE *f;

    write_manifest("good", 0);
    cr_assert_eq(read_manifest("good"), ZS_OK, "%s", err);
    /* one byte of the manifest changed (a step, a dtype, a bucket size...) */
    path_of(p, "good/manifest.json");
    f = fopen(p, "r+");
    cr_assert_not_null(f);
    fseek(f, 10, SEEK_SET);
    fputc(' ', f);
    fclose(f);
    cr_assert_eq(read_manifest("good"), ZS_ERR_IO);
    cr_assert(strstr(err, "was changed or is corrupt") != NULL, "%s", err);
    /* a manifest whose checksum holds but whose layout_hash is not its layout's */
    write_manifest("inconsistent", 0x1);
    cr_assert_eq(read_manifest("inconsistent"), ZS_ERR_IO);
    cr_assert(strstr(err, "layout_hash") != NULL, "%s", err);
    /* no manifest.xxh3: not trusted */
    write_manifest("nosum", 0);
    path_of(p, "nosum/manifest.xxh3");
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(read_manifest("nosum"), ZS_ERR_IO);
    cr_assert(strstr(err, "manifest.xxh3 is missing") != NULL, "%s", err);
}
