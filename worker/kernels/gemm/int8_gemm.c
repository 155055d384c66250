/* The w8a8 projections' matmul on CPUs with AVX512-VNNI: out = dequantize(a . w^T), with
 *
 *   a    [m, k] uint8: a step's activations quantized per row, stored with +128 (quantize_rows_u8)
 *   w    [n, k] int8, packed once at load as [n / 16][k / 4][16][4]: one 64-byte vector holds
 *        4 consecutive inputs of 16 output channels, the operand layout of vpdpbusd
 *   comp [n] int32: 128 * sum_k w[j, k], which takes the +128 back out of every sum
 *   out  [m, n] float32 or bfloat16: ((float)(sum - comp[j]) * row_scales[i]) * col_scales[j]
 *
 * The integer sums are exact, so out is bit for bit what torch._int_mm followed by the torch
 * dequantize computes (quant_linear.py), for any m. Why not torch._int_mm: it goes through
 * oneDNN's packing-free gemm, which re-packs the weight on every call; with the weights coming
 * from DRAM that made the projections take about twice their cache-hot time (docs/engine.md).
 *
 * Tiles of up to MR rows x NR blocks of 16 channels keep MR * NR accumulators in registers; the
 * threads share the channel blocks (tiles.h: share_next). Built at run time like paged_decode.c;
 * without VNNI the library still loads and int8_gemm_vnni() says 0, and the caller keeps
 * torch._int_mm.
 *
 * On a CPU with AMX-INT8 (and the tile state granted, amx.h) every call runs on the tiles
 * instead (gemm_amx): the packed layout is tdpbusd's B operand as it is (16 quadruples of k by
 * 16 channels in 1 KB), and the sums are the same exact integers, so the output is bit for bit
 * the VNNI path's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tiles.h"
#include "vec16.h"
#include "w8a8.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif

#include "amx.h"
#if HAVE_VNNI && HAVE_AMX_TILE && defined(__AMX_INT8__)
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif

#define MR 8 /* tile_8x3 is written out for these */
#define NR 3
#define PARALLEL_MIN_MACS (1 << 18)

int int8_gemm_vnni(void) { return HAVE_VNNI; }

/* Whether the calls run on AMX tiles (1) or not (0); set as bf16_gemm_amx (amx.h). */
int int8_gemm_amx(int64_t set) { return amx_switch(set, HAVE_AMX); }

#if HAVE_VNNI
/* acc - comp, to float, times the row's and the channel's scale, rounded and stored. */
static inline __attribute__((always_inline)) __attribute__((optimize("fp-contract=off"))) void
store_tile(__m512i acc[MR][NR], const int32_t *comp, const float *row_scales,
           const float *col_scales, void *out, int64_t n, const int mr, const int nr,
           const int is_bf16) {
    for (int j = 0; j < nr; ++j) {
        const __m512i c = _mm512_loadu_si512(comp + 16 * j);
        v16 cs;
        memcpy(&cs, col_scales + 16 * j, sizeof cs);
        for (int i = 0; i < mr; ++i) {
            const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], c));
            v16 y;
            memcpy(&y, &sum, sizeof y);
            store16(out, i * n + 16 * j, round16((y * row_scales[i]) * cs, is_bf16), is_bf16);
        }
    }
}

static inline __attribute__((always_inline)) __attribute__((optimize("fp-contract=off"))) void
tile(const uint8_t *a, int64_t k, const int8_t *panel, int64_t k4n, const int32_t *comp,
     const float *row_scales, const float *col_scales, void *out, int64_t n, const int mr,
     const int nr, const int is_bf16) {
    __m512i acc[MR][NR];
    for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nr; ++j) acc[i][j] = _mm512_setzero_si512();
    for (int64_t k4 = 0; k4 < k4n; ++k4) {
        __m512i b[NR];
        for (int j = 0; j < nr; ++j) b[j] = _mm512_loadu_si512(panel + (j * k4n + k4) * 64);
        for (int i = 0; i < mr; ++i) {
            int32_t four;
            memcpy(&four, a + i * k + 4 * k4, sizeof four);
            const __m512i av = _mm512_set1_epi32(four);
            for (int j = 0; j < nr; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, b[j]);
        }
    }
    store_tile(acc, comp, row_scales, col_scales, out, n, mr, nr, is_bf16);
}

/* The main tile, 8 rows x 3 blocks, written out so that its 24 accumulators stay in registers
 * (as an indexed array GCC kept them on the stack: 970 against ~1,700 GOP/s, measured). `ai` is
 * the 8 rows interleaved, [k / 4][8][4] bytes: one step's 8 broadcasts read 32 adjacent bytes. */
#define STEP(i)                                                                                 \
    {                                                                                           \
        const __m512i av = _mm512_set1_epi32(ak[i]);                                            \
        c##i##0 = _mm512_dpbusd_epi32(c##i##0, av, b0);                                         \
        c##i##1 = _mm512_dpbusd_epi32(c##i##1, av, b1);                                         \
        c##i##2 = _mm512_dpbusd_epi32(c##i##2, av, b2);                                         \
    }
#define ZERO3(i) __m512i c##i##0 = _mm512_setzero_si512(), c##i##1 = c##i##0, c##i##2 = c##i##0;
#define ROW3(i) {c##i##0, c##i##1, c##i##2}

static inline __attribute__((always_inline)) void tile_8x3(
    const int32_t *ai, const int8_t *panel, int64_t k4n, const int8_t *next,
    const int32_t *comp, const float *row_scales, const float *col_scales, void *out, int64_t n,
    const int is_bf16) {
    ZERO3(0) ZERO3(1) ZERO3(2) ZERO3(3) ZERO3(4) ZERO3(5) ZERO3(6) ZERO3(7)
    const int8_t *p0 = panel, *p1 = panel + k4n * 64, *p2 = panel + 2 * k4n * 64;
    for (int64_t k4 = 0; k4 < k4n; ++k4) {
        const __m512i b0 = _mm512_loadu_si512(p0 + k4 * 64);
        const __m512i b1 = _mm512_loadu_si512(p1 + k4 * 64);
        const __m512i b2 = _mm512_loadu_si512(p2 + k4 * 64);
        const int32_t *ak = ai + k4 * 8;
        if (next) { /* the next group's weights, 3 lines a step, while these compute */
            _mm_prefetch((const char *)next + k4 * 192, _MM_HINT_T0);
            _mm_prefetch((const char *)next + k4 * 192 + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)next + k4 * 192 + 128, _MM_HINT_T0);
        }
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7)
    }
    __m512i acc[MR][NR] = {ROW3(0), ROW3(1), ROW3(2), ROW3(3),
                           ROW3(4), ROW3(5), ROW3(6), ROW3(7)};
    store_tile(acc, comp, row_scales, col_scales, out, n, 8, 3, is_bf16);
}

#define TILE(R, C)                                                                              \
    tile(a + r0 * k, k, panel, k4n, comp + 16 * blk, row_scales + r0, col_scales + 16 * blk,    \
         (char *)out + (r0 * n + 16 * blk) * (is_bf16 ? 2 : 4), n, R, C, is_bf16)

/* A full tile of MR rows, or the rest of the rows as tiles of 4, 2 and 1 (MR >= 4). */
#define ROWS(C)                                                                                 \
    if (mr == MR) {                                                                             \
        TILE(MR, C);                                                                            \
    } else {                                                                                    \
        const int64_t end = r0 + mr;                                                            \
        for (; r0 + 4 <= end; r0 += 4) TILE(4, C);                                              \
        for (; r0 + 2 <= end; r0 += 2) TILE(2, C);                                              \
        for (; r0 < end; r0 += 1) TILE(1, C);                                                   \
    }

#if HAVE_AMX
/* One tile's int32 sums (16 x 16), dequantized as store_tile does, to rows [0, rows) of out. */
static __attribute__((optimize("fp-contract=off"))) void
amx_store(const int32_t *sums, const int32_t *comp, const float *row_scales,
          const float *col_scales, void *out, int64_t n, int64_t rows, const int is_bf16) {
    const __m512i c = _mm512_loadu_si512(comp);
    v16 cs;
    memcpy(&cs, col_scales, sizeof cs);
    for (int64_t i = 0; i < rows; ++i) {
        const __m512 sum =
            _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(sums + 16 * i), c));
        v16 y;
        memcpy(&y, &sum, sizeof y);
        store16(out, i * n, round16((y * row_scales[i]) * cs, is_bf16), is_bf16);
    }
}

/* Groups of 2 blocks of 16 channels shared out to the threads; in each, passes over 32 rows
 * at a time (amx.h, amx_pass). Needs k % 64 == 0. Under 16 rows in all, the tiles are as
 * short as the rows and read x in place (amx_configure); else rows past the last full 16 come
 * from a zero-padded copy of them. */
static int gemm_amx(const uint8_t *a, int64_t m, int64_t k, const int8_t *packed,
                    const int32_t *comp, int64_t n, const float *row_scales,
                    const float *col_scales, void *out, const int is_bf16) {
    const int64_t blocks = n / 16, k4n = k / 4, groups = (blocks + 1) / 2;
    const int64_t full = m / 16 * 16, slices = (m + 15) / 16;
    int owned = 0;
    uint8_t *tail = NULL;
    if (full < m && full) { /* under 16 rows in all, the tiles are as short (amx.h) */
        tail = kept_scratch(16 * k, &owned);
        if (!tail) return -1;
        memset(tail, 0, 16 * k);
        memcpy(tail, a + full * k, (m - full) * k);
    }
    const size_t esize = is_bf16 ? 2 : 4;
    struct share shares[SHARES_MAX];
#pragma omp parallel if (m * n * k >= PARALLEL_MIN_MACS)
    {
    char sums[4][1024] __attribute__((aligned(64)));
    amx_configure(m < 16 ? (int)m : 16); /* the tile configuration is a thread's own */
    share_init(shares, groups);
#pragma omp barrier
    for (int64_t g, stolen; (g = share_next(shares, &stolen)) >= 0;) {
        const int64_t blk = 2 * g;
        const int two_blocks = blk + 1 < blocks;
        const int8_t *w0 = packed + blk * k4n * 64, *w1 = w0 + k4n * 64;
        for (int64_t s = 0; s < slices; s += 2) {
            const int two_rows = s + 1 < slices, ahead = s == 0 && !stolen;
            const uint8_t *a0 = 16 * s < full || !full ? a + 16 * s * k : tail;
            const uint8_t *a1 = 16 * (s + 1) < full ? a + 16 * (s + 1) * k : tail;
            amx_pass_any((const char *)a0, (const char *)a1, k, (const char *)w0,
                         (const char *)w1, sums, two_rows, two_blocks, ahead, AMX_INT8);
            for (int i = 0; i < 1 + two_rows; ++i) {
                const int64_t r0 = 16 * (s + i), rows = m - r0 < 16 ? m - r0 : 16;
                for (int j = 0; j < 1 + two_blocks; ++j)
                    amx_store((const int32_t *)sums[2 * i + j], comp + 16 * (blk + j), row_scales + r0,
                              col_scales + 16 * (blk + j),
                              (char *)out + (r0 * n + 16 * (blk + j)) * esize, n, rows, is_bf16);
            }
        }
    }
    _tile_release();
    }
    if (owned) free(tail);
    return 0;
}
#endif

static inline __attribute__((always_inline)) int gemm(const uint8_t *a, int64_t m, int64_t k,
                                                       const int8_t *packed, const int32_t *comp,
                                                       int64_t n, const float *row_scales,
                                                       const float *col_scales, void *out,
                                                       const int is_bf16) {
#if HAVE_AMX
    if (k % 64 == 0 && int8_gemm_amx(-1) == 1)
        return gemm_amx(a, m, k, packed, comp, n, row_scales, col_scales, out, is_bf16);
#endif
    const int64_t blocks = n / 16, k4n = k / 4, groups = (blocks + NR - 1) / NR;
    const int64_t full_rows = m / MR * MR;
    /* Rows of the full 8-row tiles interleaved 4 bytes at a time (tile_8x3's operand). */
    int32_t *interleaved = interleave_rows(a, full_rows, k, MR);
    if (full_rows && !interleaved) return -1;
    struct share shares[SHARES_MAX];
#pragma omp parallel if (m * n * k >= PARALLEL_MIN_MACS)
    {
    share_init(shares, groups);
#pragma omp barrier
    for (int64_t g, stolen; (g = share_next(shares, &stolen)) >= 0;) {
        const int64_t first = g * NR, last = first + NR < blocks ? first + NR : blocks;
        /* A whole group of NR blocks at once; a short last group block by block. */
        for (int64_t blk = first; blk < last; blk += (last - first == NR ? NR : 1)) {
            const int8_t *panel = packed + blk * k4n * 64;
            int64_t r0 = 0;
            if (last - first == NR) {
                /* Weights come from DRAM once a step: without the prefetch, 32 rows ran at
                 * 128 us cold against 79 us cache-hot (576 x 3072). */
                const int8_t *next =
                    !stolen && blk + 2 * NR <= blocks ? panel + NR * k4n * 64 : NULL;
                for (; r0 < full_rows; r0 += MR)
                    tile_8x3(interleaved + r0 * k4n, panel, k4n, r0 ? NULL : next, comp + 16 * blk,
                             row_scales + r0,
                             col_scales + 16 * blk,
                             (char *)out + (r0 * n + 16 * blk) * (is_bf16 ? 2 : 4), n, is_bf16);
            }
            for (int64_t next = r0; next < m; next += MR) {
                r0 = next;
                const int mr = m - r0 < MR ? (int)(m - r0) : MR;
                if (last - first == NR) {
                    ROWS(NR)
                } else {
                    ROWS(1)
                }
            }
        }
    }
    }
    free(interleaved);
    return 0;
}
#endif

/* The whole w8a8 matmul in one call: x [m, k] (float32 or bfloat16) quantized per row into a
 * scratch buffer, then the GEMM into out [m, n] in x's dtype. */
static inline __attribute__((always_inline)) int linear(const void *x, const float *inv_smooth,
                                                        int64_t m, int64_t k, const int8_t *packed,
                                                        const int32_t *comp, int64_t n,
                                                        const float *col_scales, void *out,
                                                        const int is_bf16) {
#if HAVE_VNNI
    uint8_t *a = malloc(m * k + m * sizeof(float));
    if (!a) return -1;
    float *row_scales = (float *)(a + m * k); /* k % 4 == 0: aligned for float */
    quantize_rows(x, inv_smooth, a, row_scales, m, k, 128, is_bf16);
    const int status = gemm(a, m, k, packed, comp, n, row_scales, col_scales, out, is_bf16);
    free(a);
    return status;
#else
    return -1;
#endif
}

int w8a8_linear_f32(const float *x, const float *inv_smooth, int64_t m, int64_t k,
                    const int8_t *packed, const int32_t *comp, int64_t n, const float *col_scales,
                    float *out) {
    return linear(x, inv_smooth, m, k, packed, comp, n, col_scales, out, 0);
}

int w8a8_linear_bf16(const uint16_t *x, const float *inv_smooth, int64_t m, int64_t k,
                     const int8_t *packed, const int32_t *comp, int64_t n,
                     const float *col_scales, uint16_t *out) {
    return linear(x, inv_smooth, m, k, packed, comp, n, col_scales, out, 1);
}

/* Returns 0, or -1 (nothing written) where this build has no VNNI or memory ran out;
 * k % 4 == 0, n % 16 == 0. */
int int8_gemm_f32(const uint8_t *a, int64_t m, int64_t k, const int8_t *packed,
                  const int32_t *comp, int64_t n, const float *row_scales,
                  const float *col_scales, float *out) {
#if HAVE_VNNI
    return gemm(a, m, k, packed, comp, n, row_scales, col_scales, out, 0);
#else
    return -1;
#endif
}

int int8_gemm_bf16(const uint8_t *a, int64_t m, int64_t k, const int8_t *packed,
                   const int32_t *comp, int64_t n, const float *row_scales,
                   const float *col_scales, uint16_t *out) {
#if HAVE_VNNI
    return gemm(a, m, k, packed, comp, n, row_scales, col_scales, out, 1);
#else
    return -1;
#endif
}
