/*
 * zk_bench's options and peers (zk_bench.c, zk_bench_opts.c): what the command line selects.
 */
#ifndef ZB_ZK_BENCH_H
#define ZB_ZK_BENCH_H

#include "zk/kernels.h"

#include <stddef.h>

#define ZB_MAX_LIST 8

typedef enum zb_kernel {
    ZB_K_ADAM,
    ZB_K_SUMSQ,
    ZB_K_ACCUMULATE,
    ZB_K_REDUCE,
    ZB_K_CAST,
    ZB_K_WIDEN,
    ZB_K_COPY,
    ZB_K_COUNT
} zb_kernel_t;

/* bench/zk_bench_opts.c: the kernels' names, as --kernels takes them */
extern const char *const zb_kernel_names[ZB_K_COUNT];

#define ZB_TARGET 0.9 /* each kernel at least this share of its streaming limit */

typedef struct zb_opts {
    size_t ns[ZB_MAX_LIST];
    unsigned n_ns;
    size_t n_max;
    int stores;   /* zk_stores_t */
    int prefetch; /* zk_exec_t.prefetch: 0 the plan's, > 0 elements ahead, < 0 none */
    unsigned threads[ZB_MAX_LIST];
    unsigned n_threads;
    unsigned reps;
    zs_dtype_t dtype;
    int variants[ZK_VARIANT_COUNT]; /* selected */
    int kernels[ZB_K_COUNT];
    const char *peer;
    int json;
    int limit_only; /* time the streaming limit alone, no kernel */
} zb_opts_t;

#define ZB_MAX_PEERS 32

typedef struct zb_peer {
    char name[32];
    unsigned threads;
    size_t n;   /* elements it was timed at (0: its line gave none) */
    double eps; /* elements/s */
} zb_peer_t;

/* The peers of bench/peers/torch_adamw.py's JSON lines (one per line) in `path`; the count
 * (exits 2 when the file cannot be read or holds more than ZB_MAX_PEERS lines). */
unsigned zb_peers_read(const char *path, zb_peer_t *peers);
/* The options of argv in o: 0, or -1 on a usage error (printed); --help prints the usage and
 * exits 0. */
int zb_parse(int argc, char **argv, zb_opts_t *o);

#endif
