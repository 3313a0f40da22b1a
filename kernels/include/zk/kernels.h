/*
 * zk: the compute kernels of a zerod step (docs/semantics.md §4). No dependency on daemon or
 * client; never prints; every function returns a zs_status_t.
 *
 * Variants: scalar (portable reference), avx2 (AVX2+FMA+F16C), avx512 (F/DQ/BW/VL, BF16 where
 * present). zk_init() picks the best one the CPU supports, or the one named by
 * ZEROD_KERNELS=scalar|avx2|avx512 (an unavailable choice is an error).
 * All kernels accept any length (including 0) and unaligned pointers. Results are bit-identical
 * for every variant, thread count and alignment (zk/elem.h, "Rounding recipe").
 *
 * Thread-safety: kernels are reentrant. A zk_pool_t splits one call over its workers; one
 * pool runs one call at a time (calls on the same pool from two threads serialize).
 */
#ifndef ZK_KERNELS_H
#define ZK_KERNELS_H

#include "zs/dtype.h"
#include "zs/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zk_variant {
    ZK_VARIANT_SCALAR = 0,
    ZK_VARIANT_AVX2 = 1,
    ZK_VARIANT_AVX512 = 2,
    ZK_VARIANT_COUNT
} zk_variant_t;

const char *zk_variant_name(zk_variant_t v);
/* Whether this CPU (cpuid + OS xsave state) can run the variant. */
int zk_variant_supported(zk_variant_t v);
/* Pick the default variant: ZEROD_KERNELS if set, else the best supported. Idempotent.
 * ZS_ERR_UNSUPPORTED (with a message from zk_last_error()) when ZEROD_KERNELS names a
 * variant this CPU cannot run; ZS_ERR_INVALID when it names no variant. */
zs_status_t zk_init(void);
/* Force a variant for later calls with variant ZK_VARIANT_DEFAULT. */
zs_status_t zk_set_default_variant(zk_variant_t v);
zk_variant_t zk_default_variant(void);
/* Message of the last failed zk_ call in this thread. */
const char *zk_last_error(void);

/* Optional worker pool: large calls are split into cache-friendly chunks over `threads`. */
typedef struct zk_pool zk_pool_t;
zs_status_t zk_pool_create(unsigned threads, zk_pool_t **pool_p);
void zk_pool_destroy(zk_pool_t *pool);
unsigned zk_pool_threads(const zk_pool_t *pool);
/* Run fn over [0, n) split into one contiguous chunk per thread (worker 0 is the calling
 * thread), chunk starts multiples of `grain` elements; empty chunks are not called. pool NULL:
 * fn(arg, 0, 0, n) on the calling thread. Returns when every chunk is done. */
typedef void (*zk_pool_fn_t)(void *arg, unsigned worker, size_t begin, size_t end);
zs_status_t zk_pool_run(zk_pool_t *pool, size_t n, size_t grain, zk_pool_fn_t fn, void *arg);

/* Execution context for one call: NULL = default variant, calling thread only. */
typedef struct zk_exec {
    int variant;     /* zk_variant_t, or ZK_VARIANT_DEFAULT */
    zk_pool_t *pool; /* NULL: run on the calling thread */
    int stores;      /* zk_stores_t: 0 (AUTO) follows the variant's zk_store_plan_variant() */
    int prefetch;    /* 0: the plan's (AUTO stores only); > 0: that many elements ahead of each
                        read stream, whatever the size; < 0: no software prefetch */
} zk_exec_t;

/* The stores of one call; any choice writes the same bits. */
typedef enum zk_stores {
    ZK_STORES_AUTO = 0,    /* zk_store_plan(): measured, or ZEROD_KERNEL_STORES */
    ZK_STORES_REGULAR = 1, /* regular stores whatever the size */
    ZK_STORES_NT = 2,      /* non-temporal stores where the pointers allow, whatever the size
                              (the sum of squares: one super-block at a time) */
} zk_stores_t;

/* Kernels by the mix of streams they read and store: in-place Adam (4 fp32 streams and the
 * cast copy), in-place accumulate, the out-of-place reduce, the narrowing casts (to 16 bits),
 * the widening ones (to fp32: they write twice what they read), the same-type copies (zk_cast
 * with dst_dtype == src_dtype: the all-gather's copy of a peer's slice), and the sum of
 * squares (reads only: its plan is a prefetch distance and, for a variant that can read two
 * super-blocks at once (AVX-512), whether to; its second kind (nt[], the second figures of
 * the plan) is one super-block at a time). */
typedef enum zk_store_family {
    ZK_STORE_ADAM,
    ZK_STORE_ACCUMULATE,
    ZK_STORE_OUT,
    ZK_STORE_CAST,
    ZK_STORE_WIDEN,
    ZK_STORE_COPY,
    ZK_STORE_READ,
    ZK_STORE_FAMILIES
} zk_store_family_t;

/* The software prefetch distances a plan tries, in elements ahead of each read stream. */
#define ZK_PREFETCH_CHOICES 4
unsigned zk_prefetch_choice(int i); /* 0 (none), 512, 1024, 2048 */
/* The longest of them family f may take with an L1 data cache of `l1` bytes: the lines its
 * streams prefetch fit in half of it (the shortest is always allowed). */
unsigned zk_plan_pf_max(zk_store_family_t f, size_t l1);
/* Where a distance that won at half a plan's measured size stops: the footprint as far on a
 * log scale from both (measured / sqrt 2), in whole MiB. */
size_t zk_plan_pf_band(size_t measured);
/* The size family f counts as measured at, for that second look, in a plan measured at
 * `plan_bytes`: its own footprint on the plan's scratch where that is at most half of
 * plan_bytes (the cast and the widen), else plan_bytes. */
size_t zk_plan_pf_measured(zk_store_family_t f, size_t plan_bytes);
/* What timings say of an option against the current choice (zk_plan_decide). */
typedef enum zk_plan_verdict {
    ZK_PLAN_LOSES = -1,
    ZK_PLAN_TIES = 0,
    ZK_PLAN_WINS = 1,
} zk_plan_verdict_t;
/* The smallest margin zk_plan_decide asks for, however steady the timings. */
#define ZK_PLAN_MARGIN_MIN 0.01
/* n GB/s samples each of the current choice (base) and an option, one per round, the rounds
 * alternated: the option WINS where its best beats base's best by more than the margin and its
 * median beats base's median, LOSES where base's beat its own so, and TIES otherwise. The
 * margin (*margin_p) is the larger spread of the two sides, the best's distance from the
 * median as a fraction of the best, and at least ZK_PLAN_MARGIN_MIN: a noisy tie stays a tie,
 * one round that caught the machine quiet does not win alone, a steady gain of 2 % wins. */
zk_plan_verdict_t zk_plan_decide(const double *base, const double *opt, int n, double *margin_p);
/* Whether non-temporal stores chosen at a larger size carry down to a footprint of `bytes`
 * where the timings there said v: a win always, a tie from ZK_STORES_PLAN_MIN_BYTES on (data
 * that large streams past the caches either way), or from ZK_PREFETCH_MIN_BYTES on for a
 * family that writes apart (`apart`: zk_plan_writes_apart, the same lean as at the size
 * measured), a loss never. */
int zk_plan_nt_extends(zk_plan_verdict_t v, size_t bytes, int apart);
/* Whether family f stores into lines its call does not read (the reduce, the casts, the
 * copies): regular stores read each such line first (a read for ownership) and non-temporal
 * ones do not, 25-40 % of their traffic, so a tie goes to non-temporal stores there, and a
 * software prefetch next to them must win to be taken (the hardware prefetcher streams their
 * sources; in-place families and the sum of squares read every line they touch). */
int zk_plan_writes_apart(zk_store_family_t f);

/* How calls beyond the caches stream through memory on this machine, decided once per
 * process and variant: by ZEROD_KERNEL_STORES=regular|nt (no prefetch then), else measured
 * (each family's kernel on scratch buffers of twice the last-level cache, 32-256 MiB: each
 * store kind with each prefetch distance, the stores chosen on the best figure of each;
 * 3.7-4.1 s on the Xeon VM with three rounds, 2.5 s on an AMD EPYC VM with five, on the first call
 * of at least 32 MiB or the first zk_store_plan()). Calls whose footprint is at least
 * nt_from[family] use non-temporal stores where nt[family] (that is nt_min_bytes, the size
 * measured, or down to ZK_NT_MIN_BYTES where they did not lose on the way: zk_plan_nt_extends);
 * calls of at least pf_from[family] prefetch prefetch[family][stores] elements ahead
 * (ZK_PREFETCH_MIN_BYTES, or half ZK_STORES_PLAN_MIN_BYTES, or that size, where the distance
 * chosen lost at the smaller sizes, with regular stores); nt_from may be ZK_PREFETCH_MIN_BYTES too.
 * Where non-temporal stores lost at the size measured, they may still win from
 * ZK_PREFETCH_MIN_BYTES to ZK_STORES_PLAN_MIN_BYTES (timed at the smaller size): nt_from and nt_to.
 * Non-temporal stores are chosen where their best beats the best of regular ones by more than
 * the timings' own spread (zk_plan_decide), and on a tie that a second timing leaves one, for
 * the families that write apart (zk_plan_writes_apart); the fastest prefetch distance up to
 * pf_max is kept, or the longest the timings cannot tell from it, none only where it is 3 %
 * faster than the fastest (kinds and distances alternated over five rounds). */
typedef struct zk_store_plan {
    int variant; /* zk_variant_t the plan was measured with */
    int nt[ZK_STORE_FAMILIES];
    unsigned prefetch[ZK_STORE_FAMILIES][2]; /* with regular, with non-temporal stores */
    /* GB/s without prefetch: regular, non-temporal (0: not measured); pf_gbps's none */
    double gbps[ZK_STORE_FAMILIES][2];
    /* [family][stores][distance]: GB/s with each prefetch distance, the kinds alternated (0:
     * not measured; the second row for every family but the read-only one of a variant that
     * reads one way only) */
    double pf_gbps[ZK_STORE_FAMILIES][2][ZK_PREFETCH_CHOICES];
    /* the margin non-temporal stores had to beat (zk_plan_decide on the rounds of each kind's
     * best distance) before a tie was timed again */
    double nt_margin[ZK_STORE_FAMILIES];
    size_t nt_min_bytes;
    /* non-temporal stores for footprints in [nt_from, nt_to): nt_to is SIZE_MAX where
     * nt[family]; where not, nt_from is SIZE_MAX (never), or the band ZK_PREFETCH_MIN_BYTES to
     * ZK_STORES_PLAN_MIN_BYTES where they won there */
    size_t nt_from[ZK_STORE_FAMILIES];
    size_t nt_to[ZK_STORE_FAMILIES];
    size_t pf_from[ZK_STORE_FAMILIES]; /* SIZE_MAX where no prefetch */
    /* the longest distance each family may take: its streams' prefetched lines fit in half
     * the L1 */
    unsigned pf_max[ZK_STORE_FAMILIES];
    /* [family][stores]: calls of this footprint or more take no prefetch (SIZE_MAX but where
     * none won at the size measured and a distance won at half of it: from
     * zk_plan_pf_band(zk_plan_pf_measured(family, nt_min_bytes)) on, the footprints nearer
     * the size measured) */
    size_t pf_to[ZK_STORE_FAMILIES][2];
    char how[4096]; /* one line for a log or a benchmark */
} zk_store_plan_t;
/* The default variant's plan, and any supported variant's (NULL for one this CPU lacks). */
const zk_store_plan_t *zk_store_plan(void);
/* The default variant's plan if it has been measured, else NULL: never measures, and never
 * waits for a measurement under way (a daemon hands it to its trainers this way). */
const zk_store_plan_t *zk_store_plan_measured(void);
/* How a call of family `fam` touching `footprint` bytes streams under `plan` (the choice the
 * kernels make with ZK_STORES_AUTO; NULL or a footprint below ZK_NT_MIN_BYTES: regular
 * stores, no prefetch; below ZK_PREFETCH_MIN_BYTES no prefetch). For a plan another process
 * measured and sent (zc_session_slot_fill). */
void zk_store_plan_choice(const zk_store_plan_t *plan, zk_store_family_t fam, size_t footprint,
                          int *nt, unsigned *pf);
const zk_store_plan_t *zk_store_plan_variant(zk_variant_t v);
/* Measure the default variant's plan on a thread of its own, and call done(plan, arg) there
 * when it is ready; calls of the kernels meanwhile use regular stores and no prefetch rather
 * than wait (a daemon starts it at the attach of a large shard). Returns 1 if started, 0 if
 * the plan is there already or on its way, -1 if no thread could start. */
typedef void (*zk_store_plan_done_fn)(const zk_store_plan_t *plan, void *arg);
int zk_store_plan_start(zk_store_plan_done_fn done, void *arg);
/* A plan kept for a later process of this machine, so that a restarted daemon does not measure
 * again (a core for seconds, while its job recovers): zk_store_plan_save writes `plan` to `path`
 * (a temporary file renamed over it) after a line naming the machine -- the build's `tag`, the
 * variant, the CPU's model and caches and the boot's id -- and returns 0, or -1 with errno.
 * zk_store_plan_load takes the plan in `path` as the default variant's when that line matches
 * this machine, this boot and `tag` (a reboot or another build measures again) and no plan is
 * measured or being measured yet: 1 when taken; 0 when not, with why ("" when there is no file;
 * another machine, build or boot; a file of another size); -1 when the file cannot be read. */
int zk_store_plan_save(const zk_store_plan_t *plan, const char *path, const char *tag);
int zk_store_plan_load(const char *path, const char *tag, char *why, size_t whylen);
/* Calls smaller than this use regular stores and no prefetch without measuring the plan;
 * from ZK_PREFETCH_MIN_BYTES on, they prefetch as a plan already measured says (pf_from),
 * beyond the caches closest to the core, where a kernel with many instructions per line can
 * still outrun the hardware prefetcher. */
#define ZK_STORES_PLAN_MIN_BYTES ((size_t)32 << 20)
#define ZK_PREFETCH_MIN_BYTES    ((size_t)4 << 20)
/* The smallest footprint a plan may give non-temporal stores (beyond an L2 of 1 MiB, half
 * beyond; only where they also won at every larger size the plan tried, 2 MiB included, for
 * an L2 of 2 MiB): below it, regular stores. */
#define ZK_NT_MIN_BYTES ((size_t)3 << 19)
const char *zk_store_family_name(zk_store_family_t f);
/* Whether a call of family `fam` touching `footprint` bytes (read and written) uses
 * non-temporal stores, and how far ahead it prefetches: exec, else the plan of exec's variant
 * (measuring it if need be). */
int zk_store_nt(const zk_exec_t *exec, zk_store_family_t fam, size_t footprint);
unsigned zk_store_prefetch(const zk_exec_t *exec, zk_store_family_t fam, size_t footprint);
#define ZK_VARIANT_DEFAULT (-1)

/* Hyper-parameters of one fused step over one param-group segment. */
typedef struct zk_adam_params {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    int adam_w_mode;     /* 1: decoupled (AdamW), 0: L2 (g += wd * p) */
    int bias_correction; /* 1: divide by (1 - beta^t) */
    uint64_t step;       /* t, the step count after increment (>= 1) */
    float grad_scale; /* g = acc * grad_scale: 1 / (N_avg * G * c) of docs/semantics.md §4 step 5 */
    int keep_acc;     /* 1: acc is left as it is instead of zeroed (one write stream fewer) */
} zk_adam_params_t;

/*
 * One pass of docs/semantics.md §4 step 6 + §3.7 over n elements:
 *   g = acc[i] * grad_scale; (L2: g += wd * p); m, v update; p update (AdamW: decoupled wd);
 *   master[i] = p; dst[i] = cast(p, dst_dtype) (RNE); acc[i] = 0 unless params->keep_acc.
 * dst may be NULL (no cast written). Bias corrections are computed once per call in double.
 */
zs_status_t zk_adam_step(const zk_exec_t *exec, const zk_adam_params_t *params, float *master,
                         float *m, float *v, float *acc, void *dst, zs_dtype_t dst_dtype, size_t n);

/*
 * Sum of squares in double and a non-finite flag (any inf or NaN), in one read pass.
 * The result depends only on the values of x[0..n): not on the variant, the pool, the thread
 * count or the address of x. Each square is exact in double; the additions follow one order:
 *   - x is cut into super-blocks of ZK_SUMSQ_BLOCK elements (the last one shorter);
 *   - in a super-block, lane l (0..15) sums the squares of the elements whose index (from
 *     the super-block start) mod 16 is l, in increasing index, starting from +0;
 *   - the 16 lanes are combined by a fixed tree: a[i] = l[i] + l[i+8] (i < 8),
 *     b[i] = a[i] + a[i+4] (i < 4), c[i] = b[i] + b[i+2] (i < 2), c[0] + c[1];
 *   - the super-block sums are added in order, starting from +0.
 * A pool splits a call only at super-block boundaries. A NaN result is the canonical NaN.
 */
#define ZK_SUMSQ_BLOCK 16384
#define ZK_SUMSQ_LANES 16
zs_status_t zk_sumsq(const zk_exec_t *exec, const float *x, size_t n, double *sumsq_p,
                     int *nonfinite_p);

/* zk_sumsq's super-block sums of x[0..n) into part[0 .. ceil(n / ZK_SUMSQ_BLOCK)), x at a
 * super-block start of the whole being summed: for a caller that cuts a sum at super-block
 * starts itself (a collective's chunks). zk_sumsq_total adds them as zk_sumsq does. */
zs_status_t zk_sumsq_parts(const zk_exec_t *exec, const float *x, size_t n, double *part);

/* zk_sumsq's result and flag from its super-block sums part[0..nparts), added in order. */
double zk_sumsq_total(const double *part, size_t nparts, int *nonfinite_p);

/* zk_reduce of fp32 (dst = a + b) and zk_sumsq_parts of the new dst in the same pass, with the
 * bits of the two calls one after the other: the reduce-scatter of a gradient's last
 * contribution takes the norm's share without reading the result again. */
zs_status_t zk_reduce_sumsq_parts(const zk_exec_t *exec, float *dst, const float *a, const float *b,
                                  size_t n, double *part);

/* acc[i] += (float)src[i] * s, src of any dtype. */
zs_status_t zk_accumulate(const zk_exec_t *exec, float *acc, const void *src, zs_dtype_t src_dtype,
                          float s, size_t n);

/* dst[i] = a[i] + b[i] computed in fp32, all three of `dtype` (dst may alias a or b). */
zs_status_t zk_reduce(const zk_exec_t *exec, void *dst, const void *a, const void *b,
                      zs_dtype_t dtype, size_t n);

/* dst[i] = (dst_dtype)src[i]: fp32<->fp16, fp32<->bf16, and same-type copies. RNE; NaN stays
 * NaN, inf stays inf, subnormals handled. */
zs_status_t zk_cast(const zk_exec_t *exec, void *dst, zs_dtype_t dst_dtype, const void *src,
                    zs_dtype_t src_dtype, size_t n);

#ifdef __cplusplus
}
#endif
#endif
