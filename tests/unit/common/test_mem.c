#define _GNU_SOURCE
#include "zs/mem.h"
#include "zs/time.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef ZS_ASAN
#include <sanitizer/asan_interface.h>
#endif

Test(zs_region, memfd_is_sealed_cloexec_and_shared)
{
    zs_region_t r = ZS_REGION_INIT, r2 = ZS_REGION_INIT;
    int seals, dupfd;

    cr_assert_eq(zs_region_create("zs-test", 1 << 20, &r), ZS_OK);
    cr_assert_eq(((unsigned char *)r.addr)[12345], 0);
    cr_assert(fcntl(r.fd, F_GETFD) & FD_CLOEXEC);
    seals = fcntl(r.fd, F_GET_SEALS);
    cr_assert(seals & F_SEAL_SHRINK);
    cr_assert(seals & F_SEAL_GROW);
    cr_assert_neq(ftruncate(r.fd, 10), 0, "a sealed region cannot shrink");

    dupfd = fcntl(r.fd, F_DUPFD_CLOEXEC, 0);
    cr_assert_eq(zs_region_map_fd(dupfd, 1 << 20, &r2), ZS_OK);
    ((char *)r.addr)[777] = 42;
    cr_assert_eq(((char *)r2.addr)[777], 42, "both mappings see the same memory");
    zs_region_cleanup(&r2);

    dupfd = fcntl(r.fd, F_DUPFD_CLOEXEC, 0);
    cr_assert_eq(zs_region_map_fd(dupfd, 2 << 20, &r2), ZS_ERR_INVALID, "fd smaller than asked");
    close(dupfd);
    zs_region_cleanup(&r);
    zs_region_cleanup(&r); /* idempotent */
    cr_assert_eq(r.fd, -1);
}

Test(zs_mem, aligned_alloc_and_overflow_checks)
{
    void *p = NULL;
    uint64_t v;

    cr_assert_eq(zs_aligned_alloc(1000, 64, &p), ZS_OK);
    cr_assert_eq((uintptr_t)p % 64, 0);
    zs_aligned_free(p);
    cr_assert_eq(zs_aligned_alloc(1000, 48, &p), ZS_ERR_INVALID);
    cr_assert_eq(zs_mul_u64(UINT64_MAX / 2, 3, &v), ZS_ERR_OVERFLOW);
    cr_assert_eq(zs_add_u64(UINT64_MAX, 1, &v), ZS_ERR_OVERFLOW);
    cr_assert_eq(zs_align_up_u64(UINT64_MAX - 3, 16, &v), ZS_ERR_OVERFLOW);
    cr_assert_eq(zs_align_up_u64(33, 48, &v), ZS_OK);
    cr_assert_eq(v, 48);
}

/* Both halves of a large fill are zeroed (one by a thread of its own), and so is a small one;
 * nothing past the end is touched. */
Test(zs_mem, zero_fill_clears_every_byte_of_large_and_small_buffers)
{
    size_t sizes[] = {ZS_ZERO_PARALLEL_MIN + 4099, 4097, ZS_ZERO_PARALLEL_MIN};

    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        unsigned char *p = malloc(n + 1);
        size_t nonzero = 0;

        cr_assert_not_null(p);
        memset(p, 0xab, n + 1);
        zs_zero_fill(p, n);
        for (size_t i = 0; i < n; i++) {
            nonzero += p[i] != 0;
        }
        cr_assert_eq(nonzero, 0, "%zu of %zu bytes left", nonzero, n);
        cr_assert_eq(p[n], 0xab, "the byte after the end was touched");
        free(p);
    }
}

/* A large allocation is a mapping of its own, faulted in without a write: every byte reads zero,
 * every page is resident once it returns, and it frees as a small one does. */
Test(zs_mem, large_aligned_alloc_is_zero_resident_and_freed)
{
    size_t sizes[] = {ZS_ZERO_PARALLEL_MIN + 4099, ZS_ZERO_PARALLEL_MIN, 4097};

    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k], nonzero = 0, pages = (n + 4095) / 4096, resident = 0;
        unsigned char *p = NULL, *vec = malloc(pages + 1);

        cr_assert_not_null(vec);
        cr_assert_eq(zs_aligned_alloc(n, 64, (void **)&p), ZS_OK);
        cr_assert_eq((uintptr_t)p % 64, 0);
        if (n >= ZS_ZERO_PARALLEL_MIN) {
            cr_assert_eq((uintptr_t)p % 4096, 0, "a mapping of its own");
            cr_assert_eq(mincore(p, n, vec), 0);
            for (size_t i = 0; i < pages; i++) {
                resident += vec[i] & 1;
            }
            cr_assert_eq(resident, pages, "%zu of %zu pages faulted in", resident, pages);
        }
        for (size_t i = 0; i < n; i++) {
            nonzero += p[i] != 0;
        }
        cr_assert_eq(nonzero, 0, "%zu of %zu bytes not zero", nonzero, n);
        memset(p, 0xcd, n);
        zs_aligned_free(p);
        free(vec);
    }
    zs_aligned_free(NULL);
}

/* Under AddressSanitizer the header before an allocation is poisoned, small or large, so a
 * write before the caller's first byte is reported as it would be without the header; every
 * byte of the allocation itself is addressable. */
Test(zs_mem, aligned_alloc_header_is_poisoned_under_asan)
{
#ifdef ZS_ASAN
    size_t sizes[] = {1000, ZS_ZERO_PARALLEL_MIN};
    size_t aligns[] = {16, 64, 4096};

    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        for (size_t a = 0; a < sizeof(aligns) / sizeof(aligns[0]); a++) {
            unsigned char *p = NULL;

            cr_assert_eq(zs_aligned_alloc(sizes[k], aligns[a], (void **)&p), ZS_OK);
            for (size_t back = 1; back <= 16; back++) {
                cr_assert(__asan_address_is_poisoned(p - back),
                          "%zu bytes (align %zu): byte -%zu is addressable", sizes[k], aligns[a],
                          back);
            }
            cr_assert_null(__asan_region_is_poisoned(p, sizes[k]), "%zu bytes (align %zu)",
                           sizes[k], aligns[a]);
            zs_aligned_free(p);
        }
    }
#else
    cr_skip("built without AddressSanitizer: the header is not poisoned");
#endif
}

/* zs_prefault faults in a memfd region's whole pages and changes no byte. */
Test(zs_mem, prefault_faults_in_a_region_and_keeps_its_bytes)
{
    zs_region_t r = ZS_REGION_INIT;
    size_t n = ZS_ZERO_PARALLEL_MIN + 8192, resident = 0;
    unsigned char *vec = malloc(n / 4096);

    cr_assert_not_null(vec);
    cr_assert_eq(zs_region_create("zs-prefault", n, &r), ZS_OK);
    ((unsigned char *)r.addr)[5] = 7;
    ((unsigned char *)r.addr)[n - 1] = 9;
    zs_prefault(r.addr, n);
    cr_assert_eq(mincore(r.addr, n, vec), 0);
    for (size_t i = 0; i < n / 4096; i++) {
        resident += vec[i] & 1;
    }
    cr_assert_eq(resident, n / 4096);
    cr_assert_eq(((unsigned char *)r.addr)[5], 7);
    cr_assert_eq(((unsigned char *)r.addr)[n - 1], 9);
    cr_assert_eq(((unsigned char *)r.addr)[n / 2], 0);
    zs_region_cleanup(&r);
    free(vec);
}

Test(zs_deadline, expires_and_counts_down)
{
    zs_deadline_t d = zs_deadline_in_ms(50);
    zs_deadline_t never = zs_deadline_in_ns(UINT64_MAX);

    cr_assert(!zs_deadline_expired(d));
    cr_assert_leq(zs_deadline_poll_ms(d), 50);
    usleep(60000);
    cr_assert(zs_deadline_expired(d));
    cr_assert_eq(zs_deadline_remaining_ns(d), 0);
    cr_assert_eq(zs_deadline_poll_ms(d), 0);
    cr_assert(!zs_deadline_expired(never));
    cr_assert_eq(zs_deadline_remaining_ns(never), UINT64_MAX);
}
