/* zerod: the ZeRO optimizer-state daemon (docs/architecture.md). Runs in the foreground. */
#define _GNU_SOURCE
#include "config/daemon_config.h"
#include "config/train_config.h"
#include "mesh/mesh.h"
#include "obs/metrics.h"
#include "server/metrics_http.h"
#include "server/server.h"
#include "zk/kernels.h"
#include "zk/kernels_cuda.h"
#include "zs/log.h"
#include "zs/version.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ZD_EXIT_USAGE 2

enum {
    OPT_CONFIG = 'c',
    OPT_TEST = 't',
    OPT_HELP = 'h',
    OPT_PRINT = 1000,
    OPT_VERSION,
    OPT_TRAIN_KEYS,
    OPT_TRAIN_CONFIG,
    OPT_WORLD,
    OPT_KEY_BASE = 2000,
};

static void zd_usage(FILE *out)
{
    fprintf(
        out,
        "Usage: zerod [OPTIONS]\n"
        "Serve ZeRO optimizer state for one accelerator (or CPU slot) over a Unix socket.\n"
        "\n"
        "  -c, --config FILE     config file (default %s if it exists; $ZEROD_CONFIG)\n"
        "      --print-config    print the effective config and exit\n"
        "  -t, --test-config     check the config and exit\n"
        "      --print-training-keys[=text|markdown]\n"
        "                        list the DeepSpeed training-config keys zerod knows and exit\n"
        "      --print-training-config FILE [--world N]\n"
        "                        resolve a DeepSpeed JSON config as a job of N ranks (default 1)\n"
        "                        would: every key's value and source (config, default, derived)\n"
        "      --version         print the version and exit\n"
        "  -h, --help            this help\n"
        "\n"
        "Every config key is also a flag (--job-linger 5min) and a variable\n"
        "(ZEROD_JOB_LINGER=5min); precedence: file < environment < flag.\n"
        "Logging: ZEROD_LOG_LEVEL=error|warn|info|debug|trace, ZEROD_LOG_SUBSYS=ipc,engine,...\n"
        "\nKeys:\n",
        ZD_DEFAULT_CONFIG_PATH);
    for (size_t i = 0; i < zd_config_table.n_rows; i++) {
        const zs_config_row_t *row = &zd_config_table.rows[i];
        char flag[64], allowed[256];
        snprintf(flag, sizeof(flag), "--%s", row->name);
        for (char *p = flag + 2; *p; p++) {
            if (*p == '_') {
                *p = '-';
            }
        }
        zs_config_allowed(row, allowed, sizeof(allowed));
        if (strlen(flag) > 22) { /* its text on the next line, as man pages read it (gen_man.c) */
            fprintf(out, "  %s\n%25s", flag, "");
        } else {
            fprintf(out, "  %-22s ", flag);
        }
        fprintf(out, "%s (default %s%s%s)\n", row->doc, row->def[0] ? row->def : "\"\"",
                allowed[0] ? "; " : "", allowed);
    }
    fprintf(out, "\nSignals: SIGTERM/SIGINT stop cleanly; SIGHUP reloads job_linger, "
                 "max_shard_bytes, frame_timeout.\n");
}

/* cuda:N on this machine: 0, or why not (printed) and the exit code. */
static int zd_check_cuda(const char *dev, long n)
{
    int count;

#if !defined(ZD_HAVE_NCCL)
    fprintf(stderr,
            "zerod: device '%s': this zerod was built without CUDA (nvcc and NCCL were not "
            "found at build time); use --device cpu\n",
            dev);
    return ZD_EXIT_USAGE;
#endif
    count = zk_cuda_device_count();
    if (count == 0) {
        fprintf(stderr,
                "zerod: device '%s': this machine has no CUDA device (no GPU, or no NVIDIA "
                "driver); use --device cpu\n",
                dev);
        return ZD_EXIT_USAGE;
    }
    if (n >= count) {
        fprintf(stderr,
                "zerod: device '%s': this machine has %d CUDA device(s), cuda:0 to cuda:%d\n", dev,
                count, count - 1);
        return ZD_EXIT_USAGE;
    }
    return 0;
}

/* cpu | cpu:N | cuda:N | auto -> normalized name; 0 on success. auto: cuda:0 when this zerod has
 * the CUDA backend and the machine a GPU, else cpu:0. */
static int zd_resolve_device(const char *dev, char *out, size_t len)
{
    const char *num = NULL;
    char *end = NULL;
    long n = 0;

    if (strcmp(dev, "auto") == 0) {
#if defined(ZD_HAVE_NCCL)
        snprintf(out, len, zk_cuda_available() ? "cuda:0" : "cpu:0");
#else
        snprintf(out, len, "cpu:0");
#endif
        return 0;
    }
    if (strcmp(dev, "cpu") == 0) {
        snprintf(out, len, "cpu:0");
        return 0;
    }
    if (strncmp(dev, "cpu:", 4) == 0) {
        num = dev + 4;
    } else if (strncmp(dev, "cuda:", 5) == 0) {
        num = dev + 5;
    }
    if (num != NULL) {
        n = strtol(num, &end, 10);
    }
    if (num == NULL || end == NULL || *num == '\0' || *end != '\0' || n < 0 || n > 65535) {
        fprintf(stderr,
                "zerod: config key 'device': invalid value '%s': expected cpu, cpu:N, cuda:N or "
                "auto\n",
                dev);
        return ZD_EXIT_USAGE;
    }
    if (num == dev + 5) {
        int rc = zd_check_cuda(dev, n);
        if (rc != 0) {
            return rc;
        }
    }
    snprintf(out, len, "%s:%ld", num == dev + 4 ? "cpu" : "cuda", n);
    return 0;
}

/* The command line: getopt's table (one flag per config key) and what it said. */
typedef struct zd_args {
    struct option *opts;
    char (*names)[64];
    zs_config_flag_t *flags;
    size_t n_flags;
    const char *config_path;
    const char *train_config; /* --print-training-config FILE */
    const char *world;        /* --world N, with it */
    bool print, test;
} zd_args_t;

static void zd_args_free(zd_args_t *a)
{
    free(a->opts);
    free(a->names);
    free(a->flags);
}

/* getopt_long's table: the fixed options, then --<key-with-dashes> for every config key. */
static int zd_args_table(zd_args_t *a, int argc)
{
    size_t n_keys = zd_config_table.n_rows, n = 0;

    a->opts = calloc(n_keys + 10, sizeof(*a->opts));
    a->names = calloc(n_keys, sizeof(*a->names));
    a->flags = calloc((size_t)argc + 1, sizeof(*a->flags));
    if (a->opts == NULL || a->names == NULL || a->flags == NULL) {
        fprintf(stderr, "zerod: out of memory\n");
        return 1;
    }
    a->opts[n++] = (struct option){"config", required_argument, NULL, OPT_CONFIG};
    a->opts[n++] = (struct option){"test-config", no_argument, NULL, OPT_TEST};
    a->opts[n++] = (struct option){"print-config", no_argument, NULL, OPT_PRINT};
    a->opts[n++] = (struct option){"version", no_argument, NULL, OPT_VERSION};
    a->opts[n++] = (struct option){"print-training-keys", optional_argument, NULL, OPT_TRAIN_KEYS};
    a->opts[n++] =
        (struct option){"print-training-config", required_argument, NULL, OPT_TRAIN_CONFIG};
    a->opts[n++] = (struct option){"world", required_argument, NULL, OPT_WORLD};
    a->opts[n++] = (struct option){"help", no_argument, NULL, OPT_HELP};
    for (size_t i = 0; i < n_keys; i++) {
        snprintf(a->names[i], sizeof(a->names[i]), "%s", zd_config_table.rows[i].name);
        for (char *p = a->names[i]; *p; p++) {
            *p = *p == '_' ? '-' : *p;
        }
        a->opts[n++] = (struct option){a->names[i], required_argument, NULL, OPT_KEY_BASE + (int)i};
    }
    return -1;
}

/* --print-training-keys[=FORMAT]: the exit code. */
static int zd_print_training_keys(const char *format)
{
    if (format != NULL && strcmp(format, "text") != 0 && strcmp(format, "markdown") != 0) {
        fprintf(stderr, "zerod: --print-training-keys: unknown format '%s' (text or markdown)\n",
                format);
        return ZD_EXIT_USAGE;
    }
    zd_train_config_print_keys(stdout, format != NULL && strcmp(format, "markdown") == 0
                                           ? ZD_TC_FORMAT_MARKDOWN
                                           : ZD_TC_FORMAT_TEXT);
    return 0;
}

/* --print-training-config FILE [--world N]: the exit code. */
static int zd_print_training_config(const char *path, const char *world_arg)
{
    char err[512], ignored[512], *end = NULL, *json = NULL, *explained;
    long world = world_arg != NULL ? strtol(world_arg, &end, 10) : 1;
    zd_train_config_t cfg;
    size_t len = 0;
    FILE *f;
    zs_status_t st;

    if (world_arg != NULL && (end == world_arg || *end != '\0' || world < 1 || world > 65536)) {
        fprintf(stderr, "zerod: --world: '%s' is not a world size in 1..65536\n", world_arg);
        return ZD_EXIT_USAGE;
    }
    f = fopen(path, "r");
    if (f == NULL || getdelim(&json, &len, '\0', f) < 0) {
        fprintf(stderr, "zerod: --print-training-config: cannot read %s: %s\n", path,
                strerror(errno));
        if (f != NULL) {
            fclose(f);
        }
        free(json);
        return ZD_EXIT_USAGE;
    }
    fclose(f);
    st = zd_train_config_parse(json, &cfg, ignored, sizeof(ignored), err, sizeof(err));
    if (st == ZS_OK) {
        st = zd_train_config_resolve_batch(&cfg, (uint32_t)world, err, sizeof(err));
    }
    if (st != ZS_OK) {
        fprintf(stderr, "zerod: %s: %s\n", path, err);
        free(json);
        return ZD_EXIT_USAGE;
    }
    explained = zd_train_config_explain(json, &cfg);
    printf("%s as a job of %ld rank%s:\n", path, world, world == 1 ? "" : "s");
    zd_train_config_print_explained(stdout, explained);
    if (ignored[0] != '\0') {
        printf("ignored (they change nothing here): %s\n", ignored);
    }
    free(explained);
    free(json);
    return 0;
}

/* -1 to go on, else the exit code (--help, --version, a usage error). */
static int zd_args_parse(zd_args_t *a, int argc, char **argv)
{
    int n_keys = (int)zd_config_table.n_rows, c, rc;

    memset(a, 0, sizeof(*a));
    rc = zd_args_table(a, argc);
    if (rc >= 0) {
        return rc;
    }
    while ((c = getopt_long(argc, argv, "c:th", a->opts, NULL)) != -1) {
        if (c == OPT_CONFIG) {
            a->config_path = optarg;
        } else if (c == OPT_TEST) {
            a->test = true;
        } else if (c == OPT_PRINT) {
            a->print = true;
        } else if (c == OPT_VERSION) {
            printf("zerod %s\n", ZS_VERSION);
            return 0;
        } else if (c == OPT_TRAIN_KEYS) {
            return zd_print_training_keys(optarg);
        } else if (c == OPT_TRAIN_CONFIG) {
            a->train_config = optarg;
        } else if (c == OPT_WORLD) {
            a->world = optarg;
        } else if (c == OPT_HELP) {
            zd_usage(stdout);
            return 0;
        } else if (c >= OPT_KEY_BASE && c < OPT_KEY_BASE + n_keys) {
            a->flags[a->n_flags].name = a->names[c - OPT_KEY_BASE]; /* as typed: --job-linger */
            a->flags[a->n_flags++].value = optarg;
        } else {
            fprintf(stderr, "Try 'zerod --help'.\n");
            return ZD_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zerod: unexpected argument '%s'\nTry 'zerod --help'.\n", argv[optind]);
        return ZD_EXIT_USAGE;
    }
    if (a->train_config != NULL) {
        return zd_print_training_config(a->train_config, a->world);
    }
    if (a->config_path == NULL && getenv("ZEROD_CONFIG") != NULL) {
        a->config_path = getenv("ZEROD_CONFIG");
    }
    if (a->config_path == NULL && access(ZD_DEFAULT_CONFIG_PATH, F_OK) == 0) {
        a->config_path = ZD_DEFAULT_CONFIG_PATH;
    }
    return -1;
}

/* socket = auto: /run/zerod/zerod-<device without ':'>.sock */
static void zd_socket_path(const zd_config_t *cfg, const char *device, char *out, size_t len)
{
    char compact[64];
    size_t k = 0;

    if (strcmp(cfg->socket, "auto") != 0) {
        snprintf(out, len, "%s", cfg->socket);
        return;
    }
    for (const char *p = device; *p && k + 1 < sizeof(compact); p++) {
        if (*p != ':') {
            compact[k++] = *p;
        }
    }
    compact[k] = '\0';
    snprintf(out, len, "/run/zerod/zerod-%s.sock", compact);
}

/* metrics_listen = auto becomes the unix socket beside the daemon socket (obs/metrics.h), so that
 * exactly who may talk to the daemon may read its metrics; in a zerod built without
 * libmicrohttpd it becomes off (an explicit value there still refuses to start, saying so);
 * off and none become "". `shown` says what -t reports. 0 or the exit code. */
static int zd_metrics_resolve(zd_config_t *cfg, const char *socket_path, char *shown,
                              size_t shown_len)
{
    char err[ZS_CONFIG_ERRLEN], path[sizeof(((zd_listen_t *)NULL)->path)];
    const char *value = "";
    zd_listen_t l;

    if (zd_listen_parse(cfg->metrics_listen, &l, err, sizeof(err)) != ZS_OK) {
        fprintf(stderr, "zerod: %s\n", err); /* zd_config_check passed it: not reached */
        return ZD_EXIT_USAGE;
    }
    if (l.kind == ZD_LISTEN_TCP || l.kind == ZD_LISTEN_UNIX) {
        snprintf(shown, shown_len, "%s", cfg->metrics_listen);
        return 0;
    }
    if (l.kind == ZD_LISTEN_OFF) { /* "off" and "none" become "": the server makes no snapshot */
        snprintf(shown, shown_len, "off");
    } else if (!zd_metrics_http_available()) {
        snprintf(shown, shown_len, "off (auto; built without libmicrohttpd)");
    } else if (zd_listen_auto_path(socket_path, path, sizeof(path), err, sizeof(err)) != ZS_OK) {
        fprintf(stderr, "zerod: %s\n", err);
        return ZD_EXIT_USAGE;
    } else {
        value = path;
        snprintf(shown, shown_len, "%s", path);
    }
    if (zs_config_set(&zd_config_table, cfg, "metrics_listen", value, ZS_CONFIG_SRC_DEFAULT, err,
                      sizeof(err)) != ZS_OK) {
        fprintf(stderr, "zerod: %s\n", err);
        return 1;
    }
    return 0;
}

/* Rules between keys, and a token_file that is set must be usable now: a job of world > 1 may
 * be attached any time, and it should not fail only then. 0 or the exit code. */
static int zd_config_validate(const zd_config_t *cfg)
{
    char err[ZS_CONFIG_ERRLEN];
    uint8_t token[ZD_TOKEN_MAX];
    size_t token_len = 0;
    zs_status_t st;

    if (zd_config_check(cfg, err, sizeof(err)) != ZS_OK) {
        fprintf(stderr, "zerod: %s\n", err);
        return ZD_EXIT_USAGE;
    }
    if (cfg->token_file[0] == '\0') {
        return 0;
    }
    st = zd_mesh_read_token(cfg->token_file, token, &token_len, err, sizeof(err));
    explicit_bzero(token, sizeof(token));
    if (st != ZS_OK) {
        fprintf(stderr, "zerod: %s\n", err);
        return ZD_EXIT_USAGE;
    }
    return 0;
}

/* A client or peer that closes its end while a reply is being written must cost that
 * connection, never the daemon (libuv writes streams with write(2), which has no MSG_NOSIGNAL):
 * EPIPE comes back as an ordinary write error instead. Likewise a checkpoint file that reaches
 * RLIMIT_FSIZE fails that save with EFBIG instead of killing the daemon (SIGXFSZ). */
static void zd_ignore_sigpipe(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
    sigaction(SIGXFSZ, &sa, NULL);
}

/* The store plan an earlier daemon on this socket measured in this boot, if there is one for
 * this build and machine: this daemon then does not measure it again at its first large job
 * (seconds of a core, while a job whose daemon died recovers). */
static void zd_load_stores(const char *file)
{
    char why[512];
    int rc;

    rc = zk_store_plan_load(file, "zerod " ZS_VERSION, why, sizeof(why));
    if (rc > 0) {
        zs_info(ZS_SUB_MAIN, "kernel stores: %s (kept by an earlier daemon of this boot in %s)",
                zk_store_plan_measured()->how, file);
    } else if (rc < 0) {
        zs_warn(ZS_SUB_MAIN, "kernel stores: %s; measured again at the first large job", why);
    } else if (why[0] != '\0') {
        zs_info(ZS_SUB_MAIN, "kernel stores: %s; measured again at the first large job", why);
    }
}

/* Load, check, then print (--print-config), check only (-t) or serve. */
static int zd_main_config(const zd_args_t *a)
{
    char err[ZS_CONFIG_ERRLEN], device[64], socket_path[256], metrics[160], stores_file[272];
    zd_server_params_t sp;
    zd_config_t cfg;
    int rc;

    memset(&cfg, 0, sizeof(cfg));
    if (zs_config_load(&zd_config_table, &cfg, a->config_path, NULL, zd_config_env_ignore, a->flags,
                       a->n_flags, err, sizeof(err)) != ZS_OK) {
        fprintf(stderr, "zerod: %s\n", err);
        return ZD_EXIT_USAGE;
    }
    rc = zd_resolve_device(cfg.device, device, sizeof(device));
    if (rc == 0 && a->print) {
        zs_config_print(&zd_config_table, &cfg, stdout);
        goto out;
    }
    if (rc == 0) {
        rc = zd_config_validate(&cfg);
    }
    if (rc == 0 && zk_init() != ZS_OK) {
        fprintf(stderr, "zerod: kernels: %s\n", zk_last_error());
        rc = 1;
    }
    if (rc != 0) {
        goto out;
    }
    zd_socket_path(&cfg, device, socket_path, sizeof(socket_path));
    rc = zd_metrics_resolve(&cfg, socket_path, metrics, sizeof(metrics));
    if (rc != 0) {
        goto out;
    }
    if (a->test) {
        printf("zerod: config OK (device %s, socket %s, metrics %s, kernels %s)\n", device,
               socket_path, metrics, zk_variant_name(zk_default_variant()));
        goto out;
    }
    zs_info(ZS_SUB_MAIN, "kernels: %s", zk_variant_name(zk_default_variant()));
    if (cfg.token_file[0] == '\0') {
        zs_info(ZS_SUB_MAIN, "no token_file: this daemon serves jobs of world 1 only");
    }
    memset(&sp, 0, sizeof(sp));
    sp.config = &cfg;
    sp.socket_path = socket_path;
    snprintf(stores_file, sizeof(stores_file), "%s.stores", socket_path);
    zd_load_stores(stores_file);
    sp.stores_file = stores_file;
    sp.device = device;
    sp.config_path = a->config_path;
    sp.flags = a->flags;
    sp.n_flags = a->n_flags;
    rc = zd_server_run(&sp);
out:
    zs_config_cleanup(&zd_config_table, &cfg);
    return rc;
}

int main(int argc, char **argv)
{
    zd_args_t args;
    int rc;

    zs_log_init_from_env();
    zd_ignore_sigpipe();
    rc = zd_args_parse(&args, argc, argv);
    if (rc < 0) {
        rc = zd_main_config(&args);
    }
    zd_args_free(&args);
    return rc;
}
