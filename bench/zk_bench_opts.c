/*
 * zk_bench's command line (zk_bench.h): the options, and the peers' figures of --peer.
 */
#define _GNU_SOURCE
#include "zk_bench.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const zb_kernel_names[ZB_K_COUNT] = {"adam_step", "sumsq", "accumulate", "reduce",
                                                 "cast",      "widen", "copy"};

/* The peers of bench/peers/torch_adamw.py's JSON lines (one per line); the count. */
unsigned zb_peers_read(const char *path, zb_peer_t *peers)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    unsigned n = 0;

    if (f == NULL) {
        fprintf(stderr, "zk_bench: --peer %s: %m\n", path);
        exit(2);
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "\"elements_per_s\":");
        const char *t = strstr(line, "\"threads\":");
        const char *ne = strstr(line, "\"n\":");
        const char *nm = strstr(line, "\"peer\": \"");
        if (p == NULL) {
            continue;
        }
        if (n == ZB_MAX_PEERS) { /* dropping lines would drop sizes silently */
            fprintf(stderr, "zk_bench: --peer %s: more than %d peer lines\n", path, ZB_MAX_PEERS);
            fclose(f);
            exit(2);
        }
        peers[n].eps = strtod(p + strlen("\"elements_per_s\":"), NULL);
        peers[n].threads = t != NULL ? (unsigned)strtoul(t + strlen("\"threads\":"), NULL, 10) : 1;
        peers[n].n = ne != NULL ? (size_t)strtoull(ne + strlen("\"n\":"), NULL, 10) : 0;
        snprintf(peers[n].name, sizeof(peers[n].name), "%s", "peer");
        if (nm != NULL) {
            sscanf(nm + strlen("\"peer\": \""), "%31[A-Za-z0-9_]", peers[n].name);
        }
        n++;
    }
    fclose(f);
    return n;
}

static int zb_parse_list(const char *arg, const char *const *names, int count, int *sel)
{
    char buf[256];
    char *save = NULL;

    snprintf(buf, sizeof(buf), "%s", arg);
    memset(sel, 0, sizeof(int) * (size_t)count);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int i;
        for (i = 0; i < count && strcmp(tok, names[i]) != 0; i++) {
        }
        if (i == count) {
            fprintf(stderr, "zk_bench: unknown name '%s'\n", tok);
            return -1;
        }
        sel[i] = 1;
    }
    return 0;
}

static int zb_parse_sizes(const char *arg, zb_opts_t *o)
{
    char buf[256];
    char *save = NULL, *end = NULL;

    snprintf(buf, sizeof(buf), "%s", arg);
    o->n_ns = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        unsigned long long n = strtoull(tok, &end, 0);
        if (*end != '\0' || n == 0 || n > ((size_t)1 << 32) || o->n_ns == ZB_MAX_LIST) {
            fprintf(stderr, "zk_bench: --n wants up to %d positive counts, got '%s'\n", ZB_MAX_LIST,
                    arg);
            return -1;
        }
        o->ns[o->n_ns++] = (size_t)n;
    }
    return o->n_ns > 0 ? 0 : -1;
}

static void zb_usage(FILE *out)
{
    fprintf(out,
            "usage: zk_bench [options]\n"
            "  --n LIST         elements per call (default 65536,1048576,16777216,67108864:\n"
            "                   64 Ki to 64 Mi; 268435456 = 256 Mi needs ~5 GiB)\n"
            "  --threads LIST   thread counts, e.g. 1,2 (default 1)\n"
            "  --reps R         timed runs per measurement at 64 Mi, best kept (default 5;\n"
            "                   more at smaller sizes, as many as take the same time)\n"
            "  --dtype T        param dtype: bf16 (default), fp16, fp32\n"
            "  --variants LIST  scalar,avx2,avx512 (default: all this CPU supports)\n"
            "  --kernels LIST   adam_step,sumsq,accumulate,reduce,cast,widen,copy (default\n"
            "                   all; cast: fp32 to --dtype, widen: --dtype to fp32, reduce:\n"
            "                   fp32 as the daemon's reduce-scatter, copy: --dtype to --dtype\n"
            "                   as the all-gather)\n"
            "  --stores S       auto (default: the measured plan), regular or nt\n"
            "  --prefetch D     software prefetch D elements ahead of each read stream,\n"
            "                   none (-1) or the plan's (0, default)\n"
            "  --peer FILE      JSON lines of bench/peers/torch_adamw.py: adam_step's speedup\n"
            "                   over each at the peer line's own size and thread count (one\n"
            "                   that --n and --threads do not run is not compared, and said)\n"
            "  --limit-only     time each kernel's streaming limit alone, no kernel (one line\n"
            "                   per kernel, size and thread count; variant \"limit\")\n"
            "  --json           one JSON object per line\n"
            "  --help           this text\n");
}

int zb_parse(int argc, char **argv, zb_opts_t *o)
{
    static const struct option longopts[] = {{"n", required_argument, NULL, 'n'},
                                             {"threads", required_argument, NULL, 't'},
                                             {"reps", required_argument, NULL, 'r'},
                                             {"dtype", required_argument, NULL, 'd'},
                                             {"variants", required_argument, NULL, 'v'},
                                             {"kernels", required_argument, NULL, 'k'},
                                             {"peer", required_argument, NULL, 'p'},
                                             {"json", no_argument, NULL, 'j'},
                                             {"stores", required_argument, NULL, 's'},
                                             {"limit-only", no_argument, NULL, 'l'},
                                             {"prefetch", required_argument, NULL, 'f'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    static const char *const vnames[ZK_VARIANT_COUNT] = {"scalar", "avx2", "avx512"};
    int c;

    *o = (zb_opts_t){.ns = {(size_t)64 << 10, (size_t)1 << 20, (size_t)16 << 20, (size_t)64 << 20},
                     .n_ns = 4,
                     .threads = {1},
                     .n_threads = 1,
                     .reps = 5,
                     .dtype = ZS_DTYPE_BF16};
    for (int v = 0; v < ZK_VARIANT_COUNT; v++) {
        o->variants[v] = 1;
    }
    for (int k = 0; k < ZB_K_COUNT; k++) {
        o->kernels[k] = 1;
    }
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'n':
            if (zb_parse_sizes(optarg, o) != 0) {
                return -1;
            }
            break;
        case 's':
            if (strcmp(optarg, "auto") == 0 || strcmp(optarg, "regular") == 0 ||
                strcmp(optarg, "nt") == 0) {
                o->stores = optarg[0] == 'a'   ? ZK_STORES_AUTO
                            : optarg[0] == 'r' ? ZK_STORES_REGULAR
                                               : ZK_STORES_NT;
            } else {
                fprintf(stderr, "zk_bench: --stores wants auto, regular or nt, got '%s'\n", optarg);
                return -1;
            }
            break;
        case 'f':
            o->prefetch = (int)strtol(optarg, &end, 10);
            if (*end != '\0' || o->prefetch > 65536 || o->prefetch < -1) {
                fprintf(stderr, "zk_bench: --prefetch wants -1, 0 or a distance, got '%s'\n",
                        optarg);
                return -1;
            }
            break;
        case 't': {
            char buf[128];
            char *save = NULL;
            snprintf(buf, sizeof(buf), "%s", optarg);
            o->n_threads = 0;
            for (char *tok = strtok_r(buf, ",", &save); tok != NULL;
                 tok = strtok_r(NULL, ",", &save)) {
                unsigned long t = strtoul(tok, &end, 10);
                if (*end != '\0' || t == 0 || t > 1024 || o->n_threads == ZB_MAX_LIST) {
                    fprintf(stderr, "zk_bench: bad --threads '%s'\n", optarg);
                    return -1;
                }
                o->threads[o->n_threads++] = (unsigned)t;
            }
            if (o->n_threads == 0) {
                fprintf(stderr, "zk_bench: empty --threads\n");
                return -1;
            }
            break;
        }
        case 'r':
            o->reps = (unsigned)strtoul(optarg, &end, 10);
            if (*end != '\0' || o->reps == 0) {
                fprintf(stderr, "zk_bench: --reps wants a positive count, got '%s'\n", optarg);
                return -1;
            }
            break;
        case 'd':
            if (strcmp(optarg, "bf16") == 0) {
                o->dtype = ZS_DTYPE_BF16;
            } else if (strcmp(optarg, "fp16") == 0) {
                o->dtype = ZS_DTYPE_F16;
            } else if (strcmp(optarg, "fp32") == 0) {
                o->dtype = ZS_DTYPE_F32;
            } else {
                fprintf(stderr, "zk_bench: --dtype wants bf16, fp16 or fp32, got '%s'\n", optarg);
                return -1;
            }
            break;
        case 'v':
            if (zb_parse_list(optarg, vnames, ZK_VARIANT_COUNT, o->variants) != 0) {
                return -1;
            }
            break;
        case 'k':
            if (zb_parse_list(optarg, zb_kernel_names, ZB_K_COUNT, o->kernels) != 0) {
                return -1;
            }
            break;
        case 'p':
            o->peer = optarg;
            break;
        case 'j':
            o->json = 1;
            break;
        case 'l':
            o->limit_only = 1;
            break;
        case 'h':
            zb_usage(stdout);
            exit(0);
        default:
            zb_usage(stderr);
            return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "zk_bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    return 0;
}
