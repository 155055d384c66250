/* What the GEMM kernels' 8-row tiles share (bf16_gemm.c, int8_gemm.c). */
#ifndef INTENTSERVE_TILES_H
#define INTENTSERVE_TILES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rows [tile * mr, tile * mr + mr) of src (each row_bytes long, a multiple of 4) with their
 * 4-byte words interleaved, at their place in out: [rows / mr][row_bytes / 4][mr]. One step of
 * a tile then reads its mr rows' operands side by side. Tiles are independent: threads may each
 * write their own. */
static inline void interleave_tile(const void *src, int64_t row_bytes, int64_t mr, int64_t tile,
                                   int32_t *out) {
    const int64_t words = row_bytes / 4;
    int32_t *dst = out + tile * words * mr;
    for (int64_t i = 0; i < mr; ++i) {
        const char *row = (const char *)src + (tile * mr + i) * row_bytes;
        for (int64_t w = 0; w < words; ++w) memcpy(dst + w * mr + i, row + 4 * w, 4);
    }
}

/* In a GEMM's row loop: the rows [r0, m) left after its full 8-row tiles, as tiles of 4, 2 and
 * 1, each by the including file's TILE(rows, blocks) macro. */
#define TILE_TAILS(C)                                                                           \
    for (; r0 + 4 <= m; r0 += 4) TILE(4, C);                                                    \
    for (; r0 + 2 <= m; r0 += 2) TILE(2, C);                                                    \
    for (; r0 < m; r0 += 1) TILE(1, C);

/* The first `rows` rows of src (a multiple of mr) interleaved (interleave_tile) into a new
 * buffer; NULL when rows is 0 or memory ran out (check rows). */
static inline int32_t *interleave_rows(const void *src, int64_t rows, int64_t row_bytes,
                                       int64_t mr) {
    if (!rows) return NULL;
    int32_t *out = malloc(rows * row_bytes);
    if (!out) return NULL;
    for (int64_t t = 0; t < rows / mr; ++t) interleave_tile(src, row_bytes, mr, t, out);
    return out;
}

/* A call's scratch buffer (a GEMM's interleaved rows, the decode step's activations): the
 * calling thread's own, kept from call to call up to SCRATCH_KEEP_BYTES (for the thread's life:
 * at most that much per library for each thread that calls it); above that a malloc of its own
 * (*owned = 1: the caller frees it). One per library and thread: a library holds at most
 * one at a time (each kernel is its own library, so the decode step's and its GEMMs' differ).
 * NOTE: a fresh malloc of a decode step's size each call was over glibc's mmap threshold at 64
 * rows x 1536: each call mapped, faulted in and unmapped its pages. */
#define SCRATCH_KEEP_BYTES (4 << 20)
static inline void *kept_scratch(size_t bytes, int *owned) {
    static __thread void *kept;
    static __thread size_t kept_bytes;
    *owned = 0;
    if (bytes > SCRATCH_KEEP_BYTES) {
        *owned = 1;
        return malloc(bytes);
    }
    if (bytes > kept_bytes) {
        void *grown = realloc(kept, bytes);
        if (!grown) return NULL;
        kept = grown, kept_bytes = bytes;
    }
    return kept;
}

/* A loop's iterations [0, n) shared out in a parallel region: each thread walks a contiguous
 * share of them from the front (schedule(static)'s order, so its weights stream in sequence and
 * its prefetches land), and a thread whose share is done takes what is left of another's, one
 * iteration at a time from the back. On 2 cores shared with the controller and its clients, a
 * thread the OS stops for a while then holds the region up by the iteration it was in, not by
 * the rest of its share (with the static split, its partner waited out the whole stop).
 *
 *     struct share shares[SHARES_MAX];       // outside the region: every thread sees them
 *     #pragma omp parallel
 *     {   share_init(shares, n);
 *         #pragma omp barrier                  // (or any implicit one) before the first take
 *         for (int64_t i, stolen; (i = share_next(shares, &stolen)) >= 0;) ...
 *     }
 */
#include <omp.h>
#include <stdatomic.h>

#define SHARES_MAX 64
struct share {
    _Atomic uint64_t range; /* (next << 32) | end: the iterations [next, end) still untaken */
    char pad[56];           /* a cache line each: the owner takes from it at every iteration */
};

static inline int shares_in_use(void) {
    const int threads = omp_get_num_threads();
    return threads < SHARES_MAX ? threads : SHARES_MAX;
}

/* The calling thread's share of [0, n) (threads beyond SHARES_MAX have none: they only take
 * from the others'); n < 2^32. */
static inline void share_init(struct share *shares, int64_t n) {
    const int t = omp_get_thread_num(), count = shares_in_use();
    if (t >= count) return;
    const uint64_t first = (uint64_t)(n * t / count), end = (uint64_t)(n * (t + 1) / count);
    atomic_store_explicit(&shares[t].range, first << 32 | end, memory_order_relaxed);
}

/* An untaken iteration of one share, from its front (the owner) or its back (another thread);
 * -1 when it has none left. */
static inline int64_t share_take(struct share *share, const int from_back) {
    uint64_t v = atomic_load_explicit(&share->range, memory_order_relaxed);
    while ((v >> 32) < (v & 0xffffffffu))
        if (atomic_compare_exchange_weak_explicit(&share->range, &v,
                                                  from_back ? v - 1 : v + (1ull << 32),
                                                  memory_order_relaxed, memory_order_relaxed))
            return from_back ? (int64_t)(v & 0xffffffffu) - 1 : (int64_t)(v >> 32);
    return -1;
}

/* The calling thread's next iteration: the front of its own share, else the back of another's
 * (*stolen = 1); -1 when none is left. */
static inline int64_t share_next(struct share *shares, int64_t *stolen) {
    const int t = omp_get_thread_num(), count = shares_in_use();
    int64_t i = t < count ? share_take(&shares[t], 0) : -1;
    *stolen = i < 0;
    for (int other = 1; i < 0 && other <= count; ++other) /* every share, its own last */
        i = share_take(&shares[(t + other) % count], 1);
    return i;
}

#endif
