/*
 * zeroctl checkpoint ls|verify|export, and zeroctl export (docs/checkpoints.md): commands on
 * checkpoint directories, no daemon involved. They read the format through zs/ckpt.h.
 *
 *   zeroctl [--json] checkpoint ls DIR
 *   zeroctl [--json] checkpoint verify CKPT [--tag TAG]
 *   zeroctl checkpoint export CKPT [--tag TAG] [--dtype fp32|bf16] [--state STATE] -o OUT
 *   zeroctl checkpoint seal CKPT     (fills in the manifest's sizes and checksums)
 *   zeroctl export --checkpoint CKPT [...] OUT
 *
 * CKPT is a checkpoint (a directory with manifest.json) or a checkpoint directory whose
 * `latest` (or --tag) names one. Exit status: 0 ok, 1 the checkpoint is missing, unreadable or
 * corrupt (the message names the file and what is wrong), 2 usage.
 */
#define _GNU_SOURCE
#include "ckpt_cmd.h"
#include "ckpt_export_cmd.h"

#include "cli.h"
#include "zerod/zc.h"
#include "zs/ckpt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void ckpt_usage(FILE *out)
{
    fprintf(out,
            "Usage: zeroctl [--json] checkpoint ls DIR\n"
            "       zeroctl [--json] checkpoint verify CKPT [--tag TAG]\n"
            "       zeroctl checkpoint export CKPT [--tag TAG] [--dtype fp32|bf16]\n"
            "               [--state master|exp_avg|exp_avg_sq] [--format safetensors] -o OUT\n"
            "       zeroctl export --checkpoint CKPT [same options] OUT\n"
            "       zeroctl [-s SOCKET] export [--dtype fp32|bf16] OUT   (the daemon's live\n"
            "               job; OUT new, in a directory you own)\n"
            "       zeroctl checkpoint seal CKPT   (write its files' sizes and checksums into\n"
            "               its manifest: for checkpoints made by other tools)\n"
            "\n"
            "CKPT: a checkpoint (DIR/TAG, holding manifest.json), or DIR (its `latest`, or\n"
            "--tag). export writes one safetensors file with the model's state_dict() names\n"
            "(default: the fp32 master weights), reading one parameter at a time.\n"
            "Exit status: 0 ok, 1 missing, unreadable or corrupt checkpoint, 2 usage error.\n");
}

/* CKPT (+ tag): the checkpoint's directory (*ckpt, to close) and its verified manifest. */
static int ckpt_open(const char *arg, const char *tag, zs_dir_t *ckpt, zs_ckpt_manifest_t **m_p)
{
    char err[1024];
    zs_dir_t d = ZS_DIR_INIT;
    zs_status_t st = zs_dir_open(&d, arg, err, sizeof(err));

    *ckpt = (zs_dir_t)ZS_DIR_INIT;
    if (st == ZS_OK && tag == NULL && zs_dir_has(&d, ZS_CKPT_MANIFEST, NULL)) {
        *ckpt = d; /* CKPT is a checkpoint */
        d = (zs_dir_t)ZS_DIR_INIT;
    } else if (st == ZS_OK) {
        st = zs_ckpt_open(&d, tag, ckpt, NULL, 0, err, sizeof(err));
    }
    zs_dir_close(&d);
    if (st == ZS_OK) {
        st = zs_ckpt_manifest_read(ckpt, m_p, err, sizeof(err));
    }
    if (st != ZS_OK) {
        zs_dir_close(ckpt);
        zctl_error(st, "%s", err);
        return ZC_EXIT_BAD;
    }
    return ZC_EXIT_OK;
}

static uint64_t ckpt_bytes(const zs_ckpt_manifest_t *m)
{
    uint64_t b = 0;
    for (uint32_t i = 0; i < m->n_files; i++) {
        b += m->files[i].bytes;
    }
    return b;
}

/* ---- ls -------------------------------------------------------------------------------- */

/* What `checkpoint ls` finds in a directory: a table row each on stdout as it goes, and the
 * lists of the --json answer. */
typedef struct ckpt_ls {
    zs_dir_t top;
    char latest[ZS_CKPT_TAG_MAX]; /* the tag `latest` names; "" when none */
    int json;
    cJSON *root, *list, *left, *bad;
} ckpt_ls_t;

/* A checkpoint whose manifest was read: its row and its object of "checkpoints". */
static void ckpt_ls_row(ckpt_ls_t *ls, const char *name, const zs_ckpt_manifest_t *m)
{
    int latest = strcmp(ls->latest, name) == 0;
    cJSON *o = cJSON_CreateObject();

    cJSON_AddStringToObject(o, "tag", name);
    cJSON_AddNumberToObject(o, "step", (double)m->step);
    cJSON_AddNumberToObject(o, "world", m->world);
    cJSON_AddNumberToObject(o, "n_params", m->n_params);
    cJSON_AddNumberToObject(o, "bytes", (double)ckpt_bytes(m));
    cJSON_AddStringToObject(o, "job_id", m->job_id);
    cJSON_AddBoolToObject(o, "latest", latest);
    cJSON_AddItemToArray(ls->list, o);
    if (!ls->json) {
        printf("%-24s %10" PRIu64 " %6u %9u %14" PRIu64 " %s\n", name, m->step, m->world,
               m->n_params, ckpt_bytes(m), latest ? "latest" : "");
    }
}

/* One entry of the directory: a leftover of an unfinished save, a checkpoint (its manifest
 * trusted or not), or something else, left out. */
static void ckpt_ls_entry(ckpt_ls_t *ls, const char *name)
{
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t sub = ZS_DIR_INIT;
    char err[1024];
    zs_status_t st;

    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
        return;
    }
    if (strncmp(name, ZS_CKPT_TMP_PREFIX, strlen(ZS_CKPT_TMP_PREFIX)) == 0 ||
        strncmp(name, ZS_CKPT_OLD_PREFIX, strlen(ZS_CKPT_OLD_PREFIX)) == 0) {
        cJSON_AddItemToArray(ls->left, cJSON_CreateString(name));
        if (!ls->json) {
            printf("%-24s (left by an unfinished save; the next save removes it)\n", name);
        }
        return;
    }
    if (zs_dir_sub(&ls->top, name, ZS_MAY_READ | ZS_MAY_EXEC, &sub, err, sizeof(err)) != ZS_OK ||
        !zs_dir_has(&sub, ZS_CKPT_MANIFEST, NULL)) {
        zs_dir_close(&sub);
        return; /* not a checkpoint */
    }
    st = zs_ckpt_manifest_read(&sub, &m, err, sizeof(err));
    zs_dir_close(&sub);
    if (st != ZS_OK) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "tag", name);
        cJSON_AddStringToObject(o, "error", err);
        cJSON_AddItemToArray(ls->bad, o);
        if (!ls->json) {
            printf("%-24s (not trusted: %s)\n", name, err);
        }
        return;
    }
    ckpt_ls_row(ls, name, m);
    zs_ckpt_manifest_free(m);
}

static int ckpt_ls(const char *dir, int json)
{
    ckpt_ls_t ls = {.top = ZS_DIR_INIT, .latest = "", .json = json};
    char err[1024];
    DIR *d = zs_dir_open(&ls.top, dir, err, sizeof(err)) == ZS_OK ? opendir(dir) : NULL;
    struct dirent *e;

    ls.root = cJSON_CreateObject();
    ls.list = cJSON_AddArrayToObject(ls.root, "checkpoints");
    ls.left = cJSON_AddArrayToObject(ls.root, "leftovers");
    ls.bad = cJSON_AddArrayToObject(ls.root, "unverified");
    if (d == NULL) {
        zctl_error(errno == ENOENT ? ZC_ERR_NOT_FOUND : ZC_ERR_IO, "checkpoint dir %s: %s", dir,
                   strerror(errno));
        zs_dir_close(&ls.top);
        cJSON_Delete(ls.root);
        return ZC_EXIT_BAD;
    }
    if (zs_ckpt_resolve(&ls.top, NULL, ls.latest, sizeof(ls.latest), err, sizeof(err)) != ZS_OK) {
        ls.latest[0] = '\0';
    }
    if (!json) {
        printf("%-24s %10s %6s %9s %14s %s\n", "TAG", "STEP", "WORLD", "PARAMS", "BYTES", "");
    }
    while ((e = readdir(d)) != NULL) {
        ckpt_ls_entry(&ls, e->d_name);
    }
    closedir(d);
    zs_dir_close(&ls.top);
    if (json) {
        cJSON_AddNumberToObject(ls.root, "schema_version", 1);
        cJSON_AddStringToObject(ls.root, "command", "checkpoint ls");
        cJSON_AddStringToObject(ls.root, "dir", dir);
        cJSON_AddStringToObject(ls.root, "latest", ls.latest);
        return zctl_print_json(ls.root, 0) == ZCTL_EXIT_OK ? ZC_EXIT_OK : ZC_EXIT_BAD;
    }
    cJSON_Delete(ls.root);
    return ZC_EXIT_OK;
}

/* ---- verify ---------------------------------------------------------------------------- */

static int ckpt_verify(const char *arg, const char *tag, int json)
{
    char err[1024];
    const char *path;
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t ckpt;
    int rc = ckpt_open(arg, tag, &ckpt, &m);
    zs_status_t st;

    if (rc != ZC_EXIT_OK) {
        return rc;
    }
    path = ckpt.shown;
    st = zs_ckpt_verify(&ckpt, m, NULL, err, sizeof(err));
    if (json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddNumberToObject(root, "schema_version", 1);
        cJSON_AddStringToObject(root, "command", "checkpoint verify");
        cJSON_AddStringToObject(root, "path", path);
        cJSON_AddBoolToObject(root, "ok", st == ZS_OK);
        cJSON_AddStringToObject(root, "error", st == ZS_OK ? "" : err);
        cJSON_AddNumberToObject(root, "step", (double)m->step);
        cJSON_AddNumberToObject(root, "world", m->world);
        cJSON_AddNumberToObject(root, "files", m->n_files);
        cJSON_AddNumberToObject(root, "bytes", (double)ckpt_bytes(m));
        (void)zctl_print_json(root, 0);
    } else if (st == ZS_OK) {
        printf("%s: ok (step %" PRIu64 ", world %u, %u files, %" PRIu64 " bytes checked)\n", path,
               m->step, m->world, m->n_files, ckpt_bytes(m));
    }
    if (st != ZS_OK) {
        zctl_error(st, "%s", err);
    }
    zs_ckpt_manifest_free(m);
    zs_dir_close(&ckpt);
    return st == ZS_OK ? ZC_EXIT_OK : ZC_EXIT_BAD;
}

/* ---- seal ------------------------------------------------------------------------------ */

/* Sizes and checksums of every file the manifest lists, the layout hash its fields give and
 * this format's version, into the manifest, and the manifest's own checksum beside it: for
 * checkpoints written by other tools (zerod.import_deepspeed) or by an older zerod. What the
 * manifest says is trusted as it is: seal only what you made. */
static int ckpt_seal(const char *path)
{
    char err[1024];
    zs_ckpt_manifest_t *m = NULL;
    zs_layout_t *layout = NULL;
    zs_dir_t d = ZS_DIR_INIT;
    zs_status_t st = zs_dir_open(&d, path, err, sizeof(err));

    if (st == ZS_OK) {
        st = zs_ckpt_manifest_read_unsealed(&d, &m, err, sizeof(err));
    }
    for (uint32_t i = 0; st == ZS_OK && i < m->n_files; i++) {
        st = zs_ckpt_hash_file(&d, m->files[i].name, UINT64_MAX >> 11, NULL, &m->files[i].bytes,
                               &m->files[i].xxh3, err, sizeof(err));
    }
    if (st == ZS_OK) {
        st = zs_ckpt_layout(m, &layout, err, sizeof(err));
    }
    if (st == ZS_OK) {
        m->layout_hash = layout->hash;
        m->version = ZS_CKPT_VERSION;
        st = zs_ckpt_manifest_write(&d, m, err, sizeof(err));
    }
    zs_layout_destroy(layout);
    zs_ckpt_manifest_free(m);
    zs_dir_close(&d);
    if (st != ZS_OK) {
        zctl_error(st, "checkpoint seal: %s", err);
        return ZC_EXIT_BAD;
    }
    printf("%s: sealed\n", path);
    return ZC_EXIT_OK;
}

/* ---- export ---------------------------------------------------------------------------- */

static int ckpt_export(const ckpt_export_t *x)
{
    zs_dir_t ckpt;
    zs_ckpt_manifest_t *m = NULL;
    unsigned tensor = ZS_CKPT_N_TENSORS;
    const char *dup;
    int rc;

    for (unsigned t = 0; t < ZS_CKPT_N_TENSORS; t++) {
        if (strcmp(x->state, zs_ckpt_tensor_names[t]) == 0) {
            tensor = t;
        }
    }
    if (tensor == ZS_CKPT_N_TENSORS ||
        (strcmp(x->dtype, "fp32") != 0 && strcmp(x->dtype, "bf16") != 0) ||
        strcmp(x->format, "safetensors") != 0 || x->out == NULL) {
        zctl_error(ZC_ERR_INVALID,
                   "export: --state '%s' (master, exp_avg, exp_avg_sq), --dtype '%s' (fp32, "
                   "bf16), --format '%s' (safetensors) and OUT (%s) are needed",
                   x->state, x->dtype, x->format, x->out != NULL ? x->out : "missing");
        return ZC_EXIT_USAGE;
    }
    rc = ckpt_open(x->ckpt, x->tag, &ckpt, &m);
    if (rc != ZC_EXIT_OK) {
        return rc;
    }
    dup = zs_ckpt_duplicate_name(m->params, m->n_params);
    if (dup != NULL) {
        zctl_error(ZC_ERR_INVALID, "export: %s names two parameters '%s'", ckpt.shown, dup);
        rc = ZC_EXIT_BAD;
    } else {
        rc = ckpt_export_run(x, &ckpt, m, tensor, strcmp(x->dtype, "bf16") == 0);
    }
    zs_ckpt_manifest_free(m);
    zs_dir_close(&ckpt);
    return rc;
}

/* ---- the command line ------------------------------------------------------------------- */

static int ckpt_parse_export(int argc, char **argv, bool top, ckpt_export_t *x)
{
    static const struct option longopts[] = {
        {"tag", required_argument, NULL, 'T'},    {"dtype", required_argument, NULL, 'd'},
        {"state", required_argument, NULL, 'S'},  {"format", required_argument, NULL, 'f'},
        {"output", required_argument, NULL, 'o'}, {"checkpoint", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    int c;

    optind = 1;
    opterr = 0; /* zctl_getopt_error says it, under --json as JSON too */
    while ((c = getopt_long(argc, argv, ":o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'T':
            x->tag = optarg;
            break;
        case 'd':
            x->dtype = optarg;
            break;
        case 'S':
            x->state = optarg;
            break;
        case 'f':
            x->format = optarg;
            break;
        case 'o':
            x->out = optarg;
            break;
        case 'c':
            x->ckpt = optarg;
            break;
        case 'h':
            ckpt_usage(stdout);
            return ZC_EXIT_OK;
        default:
            return zctl_getopt_error(c, argv, "zeroctl checkpoint --help");
        }
    }
    for (; optind < argc; optind++) { /* positionals: CKPT then OUT (OUT only for `export`) */
        if (!top && x->ckpt == NULL) {
            x->ckpt = argv[optind];
        } else if (x->out == NULL) {
            x->out = argv[optind];
        } else {
            zctl_error(ZC_ERR_INVALID, "export: unexpected argument '%s'", argv[optind]);
            return ZC_EXIT_USAGE;
        }
    }
    if (x->ckpt == NULL && top) {
        return -2; /* the daemon's live job */
    }
    if (x->ckpt == NULL) {
        zctl_error(ZC_ERR_INVALID, "checkpoint export needs CKPT");
        return ZC_EXIT_USAGE;
    }
    return -1;
}

/* `zeroctl export` without --checkpoint: the daemon writes its live job's parameters. */
static int ckpt_export_live(const ckpt_export_t *x, const char *socket_path, int timeout_ms)
{
    zc_open_params_t op;
    zc_session_t *s = NULL;
    uint64_t step = 0;
    int status;

    if ((strcmp(x->dtype, "fp32") != 0 && strcmp(x->dtype, "bf16") != 0) ||
        strcmp(x->state, "master") != 0 || strcmp(x->format, "safetensors") != 0 ||
        x->out == NULL || x->tag != NULL) {
        zctl_error(ZC_ERR_INVALID, "export of a live job: --dtype fp32|bf16 and OUT only (the "
                                   "moments and tags are a checkpoint's: --checkpoint CKPT)");
        return ZC_EXIT_USAGE;
    }
    memset(&op, 0, sizeof(op));
    op.field_mask = ZC_OPEN_FIELD_TIMEOUT_MS | ZC_OPEN_FIELD_CONTROL;
    op.timeout_ms = timeout_ms;
    op.control = 1;
    if (socket_path != NULL) {
        op.field_mask |= ZC_OPEN_FIELD_SOCKET_PATH;
        op.socket_path = socket_path;
    }
    status = zc_session_open(&op, &s);
    if (status == ZC_OK) {
        status = zc_session_export(s, x->out,
                                   strcmp(x->dtype, "bf16") == 0 ? ZC_DTYPE_BF16 : ZC_DTYPE_F32,
                                   timeout_ms, &step);
    }
    if (status != ZC_OK) {
        zctl_error(status, "%s", zc_last_error());
        zc_session_close(s);
        return status == ZC_ERR_UNREACHABLE ? 7 : ZC_EXIT_BAD;
    }
    zc_session_close(s);
    printf("%s: the live job's parameters at step %" PRIu64 " (%s)\n", x->out, step, x->dtype);
    return ZC_EXIT_OK;
}

/* The JSON output's "command": "checkpoint SUB" for a known SUB. */
static void ckpt_command(const char *sub)
{
    static const char *const names[] = {"checkpoint ls", "checkpoint verify", "checkpoint export",
                                        "checkpoint seal"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(sub, names[i] + strlen("checkpoint ")) == 0) {
            zctl_set_command(names[i]);
        }
    }
}

int zeroctl_checkpoint_main(int argc, char **argv, int json, const char *socket_path,
                            int timeout_ms)
{
    ckpt_export_t x = {NULL, NULL, NULL, "master", "fp32", "safetensors"};
    const char *sub = argc > 1 ? argv[1] : NULL;
    int rc;

    if (strcmp(argv[0], "export") == 0) {
        zctl_set_command("export");
        rc = ckpt_parse_export(argc, argv, true, &x);
        if (rc == -2) {
            return ckpt_export_live(&x, socket_path, timeout_ms);
        }
        return rc >= 0 ? rc : ckpt_export(&x);
    }
    if (sub == NULL || strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
        if (sub == NULL) {
            zctl_error(ZC_ERR_INVALID, "checkpoint: missing COMMAND (ls, verify, export or seal)");
        }
        ckpt_usage(sub == NULL ? stderr : stdout);
        return sub == NULL ? ZC_EXIT_USAGE : ZC_EXIT_OK;
    }
    ckpt_command(sub);
    if (strcmp(sub, "ls") == 0 && argc == 3) {
        return ckpt_ls(argv[2], json);
    }
    if (strcmp(sub, "verify") == 0 && (argc == 3 || (argc == 5 && strcmp(argv[3], "--tag") == 0))) {
        return ckpt_verify(argv[2], argc == 5 ? argv[4] : NULL, json);
    }
    if (strcmp(sub, "seal") == 0 && argc == 3) {
        return ckpt_seal(argv[2]);
    }
    if (strcmp(sub, "export") == 0) {
        rc = ckpt_parse_export(argc - 1, argv + 1, false, &x);
        return rc >= 0 ? rc : ckpt_export(&x);
    }
    zctl_error(ZC_ERR_INVALID, "checkpoint %s: unknown subcommand or wrong arguments", sub);
    ckpt_usage(stderr);
    return ZC_EXIT_USAGE;
}
