/* zerod: the ZeRO optimizer-state daemon (design.md §1). Runs in the foreground. */
#define _GNU_SOURCE
#include "dconfig.h"
#include "mesh.h"
#include "server.h"
#include "zk/kernels.h"
#include "zs/log.h"

#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef ZEROD_VERSION
#define ZEROD_VERSION "0.0.0"
#endif

#define ZD_EXIT_USAGE 2

enum {
    OPT_CONFIG = 'c',
    OPT_TEST = 't',
    OPT_HELP = 'h',
    OPT_PRINT = 1000,
    OPT_VERSION,
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
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s", row->name);
        for (char *p = flag + 2; *p; p++) {
            if (*p == '_') {
                *p = '-';
            }
        }
        fprintf(out, "  %-22s %s (default %s)\n", flag, row->doc, row->def[0] ? row->def : "\"\"");
    }
    fprintf(out, "\nSignals: SIGTERM/SIGINT stop cleanly; SIGHUP reloads job_linger, "
                 "max_shard_bytes, frame_timeout.\n");
}

/* cpu | cpu:N | cuda:N | auto -> normalized name; 0 on success. */
static int zd_resolve_device(const char *dev, char *out, size_t len)
{
    char *end;
    long n = 0;

    if (strcmp(dev, "auto") == 0 || strcmp(dev, "cpu") == 0) {
        /* the CUDA backend is not in this build: auto is the CPU */
        snprintf(out, len, "cpu:0");
        return 0;
    }
    if (strncmp(dev, "cpu:", 4) == 0) {
        n = strtol(dev + 4, &end, 10);
        if (dev[4] == '\0' || *end != '\0' || n < 0 || n > 65535) {
            fprintf(stderr,
                    "zerod: config key 'device': invalid value '%s': expected cpu, "
                    "cpu:N, cuda:N or auto\n",
                    dev);
            return ZD_EXIT_USAGE;
        }
        snprintf(out, len, "cpu:%ld", n);
        return 0;
    }
    if (strncmp(dev, "cuda:", 5) == 0) {
        fprintf(stderr,
                "zerod: device '%s': the CUDA backend is not available in this build yet; "
                "use --device cpu\n",
                dev);
        return 1;
    }
    fprintf(stderr,
            "zerod: config key 'device': invalid value '%s': expected cpu, cpu:N, cuda:N or "
            "auto\n",
            dev);
    return ZD_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    size_t n_keys = zd_config_table.n_rows;
    struct option *opts;
    char(*names)[64];
    zs_config_flag_t *flags;
    size_t n_flags = 0, n_opts = 0;
    const char *config_path = NULL;
    bool print = false, test = false, explicit_config = false;
    zd_config_t cfg;
    char err[ZS_CONFIG_ERRLEN];
    char device[64], socket_path[256];
    zd_server_params_t sp;
    int c, rc;

    zs_log_init_from_env();
    /* A client or peer that closes its end while a reply is being written must cost that
     * connection, never the daemon (libuv writes streams with write(2), which has no
     * MSG_NOSIGNAL): EPIPE comes back as an ordinary write error instead. */
    {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = SIG_IGN;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGPIPE, &sa, NULL);
    }
    opts = calloc(n_keys + 8, sizeof(*opts));
    names = calloc(n_keys, sizeof(*names));
    flags = calloc((size_t)argc + 1, sizeof(*flags));
    if (opts == NULL || names == NULL || flags == NULL) {
        fprintf(stderr, "zerod: out of memory\n");
        return 1;
    }
    opts[n_opts++] = (struct option){"config", required_argument, NULL, OPT_CONFIG};
    opts[n_opts++] = (struct option){"test-config", no_argument, NULL, OPT_TEST};
    opts[n_opts++] = (struct option){"print-config", no_argument, NULL, OPT_PRINT};
    opts[n_opts++] = (struct option){"version", no_argument, NULL, OPT_VERSION};
    opts[n_opts++] = (struct option){"help", no_argument, NULL, OPT_HELP};
    for (size_t i = 0; i < n_keys; i++) {
        snprintf(names[i], sizeof(names[i]), "%s", zd_config_table.rows[i].name);
        for (char *p = names[i]; *p; p++) {
            if (*p == '_') {
                *p = '-';
            }
        }
        opts[n_opts++] = (struct option){names[i], required_argument, NULL, OPT_KEY_BASE + (int)i};
    }
    while ((c = getopt_long(argc, argv, "c:th", opts, NULL)) != -1) {
        switch (c) {
        case OPT_CONFIG:
            config_path = optarg;
            explicit_config = true;
            break;
        case OPT_TEST:
            test = true;
            break;
        case OPT_PRINT:
            print = true;
            break;
        case OPT_VERSION:
            printf("zerod %s\n", ZEROD_VERSION);
            return 0;
        case OPT_HELP:
            zd_usage(stdout);
            return 0;
        default:
            if (c >= OPT_KEY_BASE && c < OPT_KEY_BASE + (int)n_keys) {
                flags[n_flags].name = names[c - OPT_KEY_BASE]; /* as typed: --job-linger */
                flags[n_flags].value = optarg;
                n_flags++;
                break;
            }
            fprintf(stderr, "Try 'zerod --help'.\n");
            return ZD_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zerod: unexpected argument '%s'\nTry 'zerod --help'.\n", argv[optind]);
        return ZD_EXIT_USAGE;
    }
    if (config_path == NULL && getenv("ZEROD_CONFIG") != NULL) {
        config_path = getenv("ZEROD_CONFIG");
        explicit_config = true;
    }
    if (config_path == NULL && access(ZD_DEFAULT_CONFIG_PATH, F_OK) == 0) {
        config_path = ZD_DEFAULT_CONFIG_PATH;
    }
    (void)explicit_config;

    memset(&cfg, 0, sizeof(cfg));
    if (zs_config_load(&zd_config_table, &cfg, config_path, NULL, zd_config_env_ignore, flags,
                       n_flags, err, sizeof(err)) != ZS_OK) {
        fprintf(stderr, "zerod: %s\n", err);
        return ZD_EXIT_USAGE;
    }
    rc = zd_resolve_device(cfg.device, device, sizeof(device));
    if (rc != 0) {
        zs_config_cleanup(&zd_config_table, &cfg);
        return rc;
    }
    if (strcmp(cfg.socket, "auto") == 0) {
        char compact[64];
        size_t k = 0;
        for (const char *p = device; *p && k + 1 < sizeof(compact); p++) {
            if (*p != ':') {
                compact[k++] = *p;
            }
        }
        compact[k] = '\0';
        snprintf(socket_path, sizeof(socket_path), "/run/zerod/zerod-%s.sock", compact);
    } else {
        snprintf(socket_path, sizeof(socket_path), "%s", cfg.socket);
    }
    if (print) {
        zs_config_print(&zd_config_table, &cfg, stdout);
        zs_config_cleanup(&zd_config_table, &cfg);
        return 0;
    }
    if (zd_config_check(&cfg, err, sizeof(err)) != ZS_OK) {
        fprintf(stderr, "zerod: %s\n", err);
        zs_config_cleanup(&zd_config_table, &cfg);
        return ZD_EXIT_USAGE;
    }
    if (cfg.token_file[0] != '\0') {
        /* a job of world > 1 may be attached any time: a token that cannot be used fails now,
         * not at the first multi-rank attach */
        uint8_t token[ZD_TOKEN_MAX];
        size_t token_len = 0;
        zs_status_t st = zd_mesh_read_token(cfg.token_file, token, &token_len, err, sizeof(err));

        explicit_bzero(token, sizeof(token));
        if (st != ZS_OK) {
            fprintf(stderr, "zerod: %s\n", err);
            zs_config_cleanup(&zd_config_table, &cfg);
            return ZD_EXIT_USAGE;
        }
    }
    if (zk_init() != ZS_OK) {
        fprintf(stderr, "zerod: kernels: %s\n", zk_last_error());
        zs_config_cleanup(&zd_config_table, &cfg);
        return 1;
    }
    if (test) {
        printf("zerod: config OK (device %s, socket %s, kernels %s)\n", device, socket_path,
               zk_variant_name(zk_default_variant()));
        zs_config_cleanup(&zd_config_table, &cfg);
        return 0;
    }
    zs_info(ZS_SUB_MAIN, "kernels: %s", zk_variant_name(zk_default_variant()));
    if (cfg.token_file[0] == '\0') {
        zs_info(ZS_SUB_MAIN, "no token_file: this daemon serves jobs of world 1 only");
    }

    memset(&sp, 0, sizeof(sp));
    sp.config = &cfg;
    sp.socket_path = socket_path;
    sp.device = device;
    sp.config_path = config_path;
    sp.flags = flags;
    sp.n_flags = n_flags;
    rc = zd_server_run(&sp);
    zs_config_cleanup(&zd_config_table, &cfg);
    free(flags);
    free(names);
    free(opts);
    return rc;
}
