/* The float32 projections' matmul on CPUs with AVX-512: out = x . w^T (+ bias), with
 *
 *   x    [m, k] float32, a step's activations
 *   w    [n, k] float32, packed once at load in blocks of 16 output channels, one 64-byte vector
 *        holding one input of a block's 16 channels, grouped as bf16_gemm.c's: each group of 3
 *        blocks (the last 1-3) is [k][blocks in it][16], so a step of a tile reads adjacent
 *        vectors (one stream of the memory, which a one-row GEMV is bound by)
 *   bias [n] float32 or NULL
 *   out  [m, n] float32
 *
 * bf16_gemm.c's tiling (8 rows x 3 blocks of 16 channels in registers, the threads sharing the
 * channels (tiles.h: share_next), the next group's weights prefetched while a tile computes)
 * with one float32 input a step and a fused multiply-add where that kernel has a pair and a
 * bf16 dot product. Every output element is summed over k in the same order whatever m is, so a
 * row's result does not depend on the rest of its batch. The rows are read in place (one
 * broadcast of a float32 from memory per row and step), so no scratch buffer.
 *
 * Why it exists: a one-stream float32 decode step reads 538 MB of weights, and oneDNN's packed
 * float32 matmul streamed them at ~13 GB/s where the machine reads ~20 (bench/engine.py,
 * single_stream). Built at run time like the other kernels; without AVX-512 the library loads,
 * f32_gemm_available() says 0 and the caller keeps oneDNN's packed matmul. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tiles.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_AVX512 1
#else
#define HAVE_AVX512 0
#endif

#define MR 8 /* tile_8x3 is written out for these */
#define NR 3
#define PARALLEL_MIN_MACS (1 << 18)

int f32_gemm_available(void) { return HAVE_AVX512; }

#if HAVE_AVX512
/* Logits larger than a core's L2 are written with non-temporal stores (bf16_gemm.c). */
#define STREAM_MIN_BYTES (2 << 20)

static __attribute__((noinline)) void store_tile(__m512 acc[MR][NR], const float *bias,
                                                  float *out, int64_t n, const int mr,
                                                  const int nr, const int stream) {
    for (int j = 0; j < nr; ++j) {
        const __m512 b = bias ? _mm512_loadu_ps(bias + 16 * j) : _mm512_setzero_ps();
        for (int i = 0; i < mr; ++i) {
            const __m512 y = bias ? _mm512_add_ps(acc[i][j], b) : acc[i][j];
            if (stream)
                _mm512_stream_ps(out + i * n + 16 * j, y);
            else
                _mm512_storeu_ps(out + i * n + 16 * j, y);
        }
    }
}

/* Any tile up to MR x NR; `cold` and the prefetch as bf16_gemm.c's tile (there measured; here,
 * in a warmed float32 engine, steps alternated: four streams' step 16.6 -> 15.6 ms, one
 * stream's 14.8 -> 14.3). */
#define AHEAD 16
static inline __attribute__((always_inline)) void tile(const float *x, int64_t k,
                                                       const float *panel, const int64_t stride,
                                                       const float *next,
                                                       const int cold, const float *bias,
                                                       float *out, int64_t n, const int mr,
                                                       const int nr, const int stream) {
    __m512 acc[MR][NR];
    for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nr; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; ++kk) {
        __m512 b[NR];
        for (int j = 0; j < nr; ++j) b[j] = _mm512_loadu_ps(panel + kk * stride + j * 16);
        if (cold && kk + AHEAD < k)
            for (int j = 0; j < nr; ++j)
                _mm_prefetch((const char *)(panel + (kk + AHEAD) * stride + j * 16),
                             _MM_HINT_T0);
        else if (next) /* a full group, as this one */
            for (int j = 0; j < nr; ++j)
                _mm_prefetch((const char *)(next + (kk + AHEAD - k) * stride + j * 16),
                             _MM_HINT_T0);
        for (int i = 0; i < mr; ++i) {
            const __m512 xv = _mm512_set1_ps(x[i * k + kk]);
            for (int j = 0; j < nr; ++j) acc[i][j] = _mm512_fmadd_ps(xv, b[j], acc[i][j]);
        }
    }
    store_tile(acc, bias, out, n, mr, nr, stream);
}

/* The main tile, written out so its 24 accumulators stay in registers. */
#define STEP(i)                                                                                 \
    {                                                                                           \
        const __m512 xv = _mm512_set1_ps(x[i * k + kk]);                                        \
        c##i##0 = _mm512_fmadd_ps(xv, b0, c##i##0);                                             \
        c##i##1 = _mm512_fmadd_ps(xv, b1, c##i##1);                                             \
        c##i##2 = _mm512_fmadd_ps(xv, b2, c##i##2);                                             \
    }
#define ZERO3(i)                                                                                \
    __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps(),                        \
           c##i##2 = _mm512_setzero_ps();
#define ROW3(i) {c##i##0, c##i##1, c##i##2}

static inline __attribute__((always_inline)) void tile_8x3(const float *x, int64_t k,
                                                           const float *panel,
                                                           const float *next, const float *bias,
                                                           float *out, int64_t n,
                                                           const int stream) {
    ZERO3(0) ZERO3(1) ZERO3(2) ZERO3(3) ZERO3(4) ZERO3(5) ZERO3(6) ZERO3(7)
    const float *p0 = panel, *p1 = panel + 16, *p2 = panel + 32; /* a full group: 48 a step */
    /* NOTE: no branch in the loop (bf16_gemm.c): with nothing to fetch ahead, it prefetches
     * its own lines. */
    if (!next) next = panel;
    for (int64_t kk = 0; kk < k; ++kk) {
        const __m512 b0 = _mm512_loadu_ps(p0 + kk * 48);
        const __m512 b1 = _mm512_loadu_ps(p1 + kk * 48);
        const __m512 b2 = _mm512_loadu_ps(p2 + kk * 48);
        _mm_prefetch((const char *)(next + kk * 48), _MM_HINT_T0);
        _mm_prefetch((const char *)(next + kk * 48 + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(next + kk * 48 + 32), _MM_HINT_T0);
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7)
    }
    __m512 acc[MR][NR] = {ROW3(0), ROW3(1), ROW3(2), ROW3(3),
                          ROW3(4), ROW3(5), ROW3(6), ROW3(7)};
    store_tile(acc, bias, out, n, 8, 3, stream);
}

#define TILE(R, C)                                                                              \
    tile(x + r0 * k, k, panel, stride, r0 ? NULL : next, !r0, bias ? bias + 16 * blk : NULL,    \
         out + r0 * n + 16 * blk, n, R, C, stream)

static void gemm(const float *x, int64_t m, int64_t k, const float *packed, const float *bias,
                 int64_t n, float *out) {
    const int64_t blocks = n / 16, groups = (blocks + NR - 1) / NR;
    const int64_t full_rows = m / MR * MR;
    const int stream = m * n * 4 >= STREAM_MIN_BYTES && !((uintptr_t)out & 63);
    struct share shares[SHARES_MAX];
#pragma omp parallel if (m * n * k >= PARALLEL_MIN_MACS)
    {
    share_init(shares, groups);
#pragma omp barrier
    for (int64_t g, stolen; (g = share_next(shares, &stolen)) >= 0;) {
        /* a group of NR blocks (the last may have fewer), its step's vectors `stride` apart */
        const int64_t blk = g * NR, nb = blk + NR <= blocks ? NR : blocks - blk;
        const float *panel = packed + blk * k * 16;
        const int64_t stride = nb * 16;
        const float *next = !stolen && blk + 2 * NR <= blocks ? panel + NR * k * 16 : NULL;
        int64_t r0 = 0;
        if (nb == NR) {
            for (; r0 < full_rows; r0 += MR)
                tile_8x3(x + r0 * k, k, panel, r0 ? NULL : next, bias ? bias + 16 * blk : NULL,
                         out + r0 * n + 16 * blk, n, stream);
            TILE_TAILS(NR)
        } else if (nb == 2) {
            TILE_TAILS(2)
        } else {
            TILE_TAILS(1)
        }
    }
    if (stream) _mm_sfence(); /* this thread's streamed stores, before the join */
    }
}
#endif

/* bf16_gemm()'s signature, so the decode step can call either; out is always float32 here
 * (out_f32 is not read). Returns 0, or -1 (nothing written) where this build has no AVX-512;
 * n % 16 == 0. */
int f32_gemm(const float *x, int64_t m, int64_t k, const float *packed, const float *bias,
             int64_t n, void *out, int64_t out_f32) {
    (void)out_f32;
#if HAVE_AVX512
    gemm(x, m, k, packed, bias, n, (float *)out);
    return 0;
#else
    return -1;
#endif
}
