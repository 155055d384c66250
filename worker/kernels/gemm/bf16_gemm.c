/* The bfloat16 projections' matmul on CPUs with AVX512-BF16: out = x . w^T (+ bias), with
 *
 *   x    [m, k] bfloat16, a step's activations
 *   w    [n, k] bfloat16, packed once at load in blocks of 16 output channels, one 64-byte vector
 *        holding 2 consecutive inputs of a block's 16 channels (the operand layout of vdpbf16ps),
 *        in one of two orders (the `flags` argument says which):
 *        - blocks:  [n / 16][k / 2][16][2], each block's k / 2 vectors in a row (AMX tiles' B);
 *        - grouped (GROUPED): the blocks in groups of 3 (the last group 1-3), each group
 *          [k / 2][blocks in it][16][2]: the vectors one step of a tile reads are adjacent, so a
 *          tile reads one stream, not three. Groups start where they do in the other order.
 *   bias [n] float32 or NULL
 *   out  [m, n] bfloat16: the float32 sums (+ bias) rounded to nearest even; or float32, the
 *        sums as they are (an LM head's logits: no rounding, and no conversion pass after)
 *
 * The same tiling as int8_gemm.c (8 rows x 3 blocks of 16 channels in registers, the threads
 * sharing the channels (tiles.h: share_next), the next group's weights prefetched while a tile
 * computes), with pairs of bfloat16 in place of quadruples of bytes. Every output element is
 * summed over k in the same order whatever m is, so a row's result does not depend on the rest
 * of its batch. Built at run time like paged_decode.c; without AVX512-BF16 the library loads
 * and bf16_gemm_available() says 0, and the caller keeps oneDNN's packed matmul.
 *
 * On a CPU with AMX (built with -march=native there, and the process granted the tile state by
 * the kernel), every call runs on the tiles instead (gemm_amx below): the packed layout above is
 * already the B operand of tdpbf16ps, 16 pairs of k by 16 channels in 1 KB. On a 2-core AMX VM
 * (Xeon, 2026-12-02; in one process, the paths alternated): SmolLM2's 120 layer matmuls at 32
 * rows took 48-60 ms on the AVX512-BF16 path and 15-20 ms on AMX, at 64 rows 108-127 against
 * 21-35, at one row 14.1-14.5 against 14.3-15.2 (with the prefetch below; 18 ms without). All
 * rows go to the tiles, one included, so a row's result still does not depend on its batch (the
 * two paths' sums differ in their last bits). Under 16 rows the tiles of x and of the sums are
 * only as tall as the rows (amx.h, amx_configure): one stream's step 12.4 -> 11.5 ms, 4 streams'
 * 14.4 -> 13.4 (2026-12-03, the same VM class; bench/results/2026-12-03-amx-short-tiles). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tiles.h"
#include "vec16.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define HAVE_BF16 1
#else
#define HAVE_BF16 0
#endif

#include "amx.h"
#if HAVE_BF16 && HAVE_AMX_TILE && defined(__AMX_BF16__)
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif

#define MR 8 /* tile_8x3 is written out for these */
#define NR 3
#define PARALLEL_MIN_MACS (1 << 18)

int bf16_gemm_available(void) { return HAVE_BF16; }

/* Whether the calls run on AMX tiles (1) or not (0). set: -1 only asks; 0 turns the tiles off
 * (the AVX512-BF16 path: for comparisons, or INTENTSERVE_AMX=0); 1 turns them on where this
 * build and the kernel allow (amx.h). */
int bf16_gemm_amx(int64_t set) { return amx_switch(set, HAVE_AMX); }

#if HAVE_BF16
/* out_f32 is 0 (bfloat16 out), 1 (float32) or STREAM_F32: float32 written with non-temporal
 * stores, for an output larger than a core's L2 (an LM head's logits at a batch: 6.3 MB at 32
 * rows of a 49152-token vocabulary). Ordinary stores first read each line they write; these
 * do not, which took the head and the sampler's read of its logits from 3.22 to 3.03 ms at 32
 * rows (cold weights, median of 15). */
#define STREAM_F32 2
#define STREAM_MIN_BYTES (2 << 20)

/* `flags` bit: the weight is packed grouped (above). One row's GEMV streams the weights, and a
 * tile's three blocks read as three streams 18 KB apart (SmolLM2, k = 576) ran slower than one:
 * SmolLM2's 120 layer GEMVs and its head at one row, cold, 2 threads (a C harness, five rounds
 * alternated, AMD EPYC without AMX, 2026-12-03): 6.65-7.80 ms in blocks against 6.21-7.44 ms
 * grouped, the software prefetch as here in both. AMX tiles read the blocks order (a tile's B
 * is 16 rows 64 bytes apart), so a grouped weight runs on AVX512-BF16 whatever the switch.
 * Tiles reading the grouped order (B rows a group's 3 x 64 bytes apart, a group's three blocks
 * in one pass up to 16 rows) were tried on the AMX VM and not kept: one row 0.99x, 32 and 64
 * rows 1.08x and 1.06x the blocks order's step time (bench/results/2026-12-03-amx-short-tiles). */
#define GROUPED 0x100

/* NOTE: not inlined: inlined into the tile loops, its rounding constants were hoisted into
 * vector registers, and the 8x3 tile had to keep one of its accumulators on the stack. */
static __attribute__((noinline)) void store_tile(__m512 acc[MR][NR], const float *bias,
                                                  void *out, int64_t n, const int mr,
                                                  const int nr, const int out_f32) {
    for (int j = 0; j < nr; ++j) {
        v16 b = {0};
        if (bias) memcpy(&b, bias + 16 * j, sizeof b);
        for (int i = 0; i < mr; ++i) {
            v16 y;
            memcpy(&y, &acc[i][j], sizeof y);
            if (bias) y += b;
            if (out_f32 == STREAM_F32) {
                __m512 z;
                memcpy(&z, &y, sizeof z);
                _mm512_stream_ps((float *)out + i * n + 16 * j, z);
            } else {
                store16(out, i * n + 16 * j, round16(y, !out_f32), !out_f32);
            }
        }
    }
}

/* Any tile up to MR x NR, rows read in place (row stride k). `cold`: the panel is read here
 * first (the batch's first rows), so each of its streams is prefetched AHEAD steps on, and past
 * its end the start of `next` (the group after, or NULL). A tile this short is bound by its
 * reads: a step has 1-7 rows of arithmetic for 3 lines, and prefetching the whole next group
 * alongside, as tile_8x3 does, doubled the lines in flight for nothing. On the AMD EPYC (2
 * cores, no AMX; 2026-12-02) the 120 layer matmuls of one row streamed at 31-35 GB/s with that
 * prefetch, 37-42 with this one (a C harness, median of 7); in a warmed engine, steps
 * alternated, one stream's step went 8.06 -> 7.54 ms and four streams' 7.61 -> 7.36. */
#define AHEAD 16
static inline __attribute__((always_inline)) void tile(const uint16_t *x, int64_t k,
                                                       const uint16_t *panel, int64_t k2n,
                                                       const int64_t stride, const int64_t boff,
                                                       const uint16_t *next, const int cold,
                                                       const float *bias, void *out, int64_t n,
                                                       const int mr, const int nr,
                                                       const int out_f32) {
    __m512 acc[MR][NR];
    for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nr; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k2 = 0; k2 < k2n; ++k2) {
        __m512bh b[NR];
        for (int j = 0; j < nr; ++j)
            b[j] = (__m512bh)_mm512_loadu_si512(panel + j * boff + k2 * stride);
        if (cold && k2 + AHEAD < k2n)
            for (int j = 0; j < nr; ++j)
                _mm_prefetch((const char *)(panel + j * boff + (k2 + AHEAD) * stride),
                             _MM_HINT_T0);
        else if (next) /* a full group, ordered as this one */
            for (int j = 0; j < nr; ++j)
                _mm_prefetch((const char *)(next + j * boff + (k2 + AHEAD - k2n) * stride),
                             _MM_HINT_T0);
        for (int i = 0; i < mr; ++i) {
            int32_t pair;
            memcpy(&pair, x + i * k + 2 * k2, sizeof pair);
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            for (int j = 0; j < nr; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, b[j]);
        }
    }
    store_tile(acc, bias, out, n, mr, nr, out_f32);
}

/* The main tile, written out so its 24 accumulators stay in registers; `xi` is the 8 rows
 * interleaved, [k / 2][8][2] bfloat16: one step's 8 broadcasts read 32 adjacent bytes. */
#define STEP(i)                                                                                 \
    {                                                                                           \
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(xk[i]);                                 \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, xv, b0);                                            \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, xv, b1);                                            \
        c##i##2 = _mm512_dpbf16_ps(c##i##2, xv, b2);                                            \
    }
#define ZERO3(i)                                                                                \
    __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps(),                        \
           c##i##2 = _mm512_setzero_ps();
#define ROW3(i) {c##i##0, c##i##1, c##i##2}

static inline __attribute__((always_inline)) void tile_8x3(const int32_t *xi,
                                                           const uint16_t *panel, int64_t k2n,
                                                           const int64_t stride,
                                                           const int64_t boff,
                                                           const uint16_t *next,
                                                           const float *bias, void *out,
                                                           int64_t n, const int out_f32) {
    ZERO3(0) ZERO3(1) ZERO3(2) ZERO3(3) ZERO3(4) ZERO3(5) ZERO3(6) ZERO3(7)
    const uint16_t *p0 = panel, *p1 = panel + boff, *p2 = panel + 2 * boff;
    /* NOTE: no branch in the loop (with one, GCC spilled the accumulators on one path and the
     * tile ran ~20% slower): with nothing to fetch ahead, it prefetches its own lines. */
    if (!next) next = panel;
    for (int64_t k2 = 0; k2 < k2n; ++k2) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(p0 + k2 * stride);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(p1 + k2 * stride);
        const __m512bh b2 = (__m512bh)_mm512_loadu_si512(p2 + k2 * stride);
        const int32_t *xk = xi + k2 * 8;
        /* the next group's weights (one span in either order), 3 lines a step, while these
         * compute */
        _mm_prefetch((const char *)(next + k2 * 96), _MM_HINT_T0);
        _mm_prefetch((const char *)(next + k2 * 96 + 32), _MM_HINT_T0);
        _mm_prefetch((const char *)(next + k2 * 96 + 64), _MM_HINT_T0);
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7)
    }
    __m512 acc[MR][NR] = {ROW3(0), ROW3(1), ROW3(2), ROW3(3),
                          ROW3(4), ROW3(5), ROW3(6), ROW3(7)};
    store_tile(acc, bias, out, n, 8, 3, out_f32);
}

#define TILE(R, C)                                                                              \
    tile(x + r0 * k, k, panel, k2n, stride, boff, r0 ? NULL : next, !r0,                        \
         bias ? bias + 16 * blk : NULL,                                                         \
         (char *)out + (r0 * n + 16 * blk) * (out_f32 ? 4 : 2), n, R, C, out_f32)

#if HAVE_AMX
/* The sums of one tile (16 x 16 float32, from tile memory) + bias, to rows [0, rows) of out. */
static void amx_store(const float *sums, const float *bias, void *out, int64_t n, int64_t rows,
                      const int out_f32) {
    const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int64_t i = 0; i < rows; ++i) {
        const __m512 y = _mm512_add_ps(_mm512_load_ps(sums + 16 * i), b);
        if (out_f32 == STREAM_F32)
            _mm512_stream_ps((float *)out + i * n, y);
        else if (out_f32)
            _mm512_storeu_ps((float *)out + i * n, y);
        else /* round to nearest even, as round16 */
            _mm256_storeu_si256((__m256i *)((uint16_t *)out + i * n),
                                (__m256i)_mm512_cvtneps_pbh(y));
    }
}

/* Groups of 2 blocks of 16 channels shared out to the threads; in each, passes over 32 rows
 * at a time (amx.h, amx_pass). Needs k % 32 == 0. Under 16 rows in all, the tiles are as
 * short as the rows and read x in place (amx_configure); else rows past the last full 16 come
 * from a zero-padded copy of them. */
static int gemm_amx(const uint16_t *x, int64_t m, int64_t k, const uint16_t *packed,
                    const float *bias, int64_t n, void *out, const int float32_out) {
    const int64_t blocks = n / 16, k2n = k / 2, groups = (blocks + 1) / 2;
    const int64_t full = m / 16 * 16, slices = (m + 15) / 16;
    int owned = 0;
    uint16_t *tail = NULL;
    if (full < m && full) { /* under 16 rows in all, the tiles are as short (amx.h) */
        tail = kept_scratch(16 * k * 2, &owned);
        if (!tail) return -1;
        memset(tail, 0, 16 * k * 2);
        memcpy(tail, x + full * k, (m - full) * k * 2);
    }
    const int out_f32 = float32_out && m * n * 4 >= STREAM_MIN_BYTES && !((uintptr_t)out & 63)
                            ? STREAM_F32
                            : float32_out;
    const size_t esize = out_f32 ? 4 : 2;
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
        const uint16_t *w0 = packed + blk * k2n * 32, *w1 = w0 + k2n * 32;
        for (int64_t s = 0; s < slices; s += 2) {
            const int two_rows = s + 1 < slices;
            const uint16_t *a0 = 16 * s < full || !full ? x + 16 * s * k : tail;
            const uint16_t *a1 = 16 * (s + 1) < full ? x + 16 * (s + 1) * k : tail;
            const int ahead = s == 0 && !stolen;
            amx_pass_any((const char *)a0, (const char *)a1, k * 2, (const char *)w0,
                         (const char *)w1, sums, two_rows, two_blocks, ahead, AMX_BF16);
            for (int i = 0; i < 1 + two_rows; ++i) {
                const int64_t r0 = 16 * (s + i), rows = m - r0 < 16 ? m - r0 : 16;
                for (int j = 0; j < 1 + two_blocks; ++j)
                    amx_store((const float *)sums[2 * i + j], bias ? bias + 16 * (blk + j) : NULL,
                              (char *)out + (r0 * n + 16 * (blk + j)) * esize, n, rows,
                              out_f32);
            }
        }
    }
    _tile_release();
    if (out_f32 == STREAM_F32) _mm_sfence();
    }
    if (owned) free(tail);
    return 0;
}
#endif

static int gemm(const uint16_t *x, int64_t m, int64_t k, const uint16_t *packed,
                const float *bias, int64_t n, void *out, const int float32_out,
                const int grouped) {
    const int64_t blocks = n / 16, k2n = k / 2, groups = (blocks + NR - 1) / NR;
    const int64_t full_rows = m / MR * MR;
    int owned = 0;
    int32_t *interleaved = full_rows ? kept_scratch(full_rows * k * 2, &owned) : NULL;
    if (full_rows && !interleaved) return -1;
    const int out_f32 = float32_out && m * n * 4 >= STREAM_MIN_BYTES && !((uintptr_t)out & 63)
                            ? STREAM_F32
                            : float32_out;
    struct share shares[SHARES_MAX];
#pragma omp parallel if (m * n * k >= PARALLEL_MIN_MACS)
    {
    share_init(shares, groups); /* taken from after the interleave loop's barrier */
    /* The rows interleaved first, each thread its share of the 8-row tiles (serial, this was
     * 2.5% of a 64-stream step's samples with the other core waiting), then all of them wait
     * for all of it (every thread's tiles read every row). */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < full_rows / MR; ++t) interleave_tile(x, k * 2, MR, t, interleaved);
    for (int64_t g, stolen; (g = share_next(shares, &stolen)) >= 0;) {
        /* a group of NR blocks (the last may have fewer), where it starts in either order; a
         * step's vectors of its blocks are `stride` apart, and a block's from the next `boff` */
        const int64_t blk = g * NR, nb = blk + NR <= blocks ? NR : blocks - blk;
        const uint16_t *panel = packed + blk * k2n * 32;
        const int64_t stride = grouped ? nb * 32 : 32, boff = grouped ? 32 : k2n * 32;
        const uint16_t *next = !stolen && blk + 2 * NR <= blocks ? panel + NR * k2n * 32 : NULL;
        int64_t r0 = 0;
        if (nb == NR) {
            for (; r0 < full_rows; r0 += MR)
                tile_8x3(interleaved + r0 * k2n, panel, k2n, stride, boff, r0 ? NULL : next,
                         bias ? bias + 16 * blk : NULL,
                         (char *)out + (r0 * n + 16 * blk) * (out_f32 ? 4 : 2), n, out_f32);
            TILE_TAILS(NR)
        } else if (nb == 2) {
            TILE_TAILS(2)
        } else {
            TILE_TAILS(1)
        }
    }
    if (out_f32 == STREAM_F32) _mm_sfence(); /* this thread's streamed stores, before the join */
    }
    if (owned) free(interleaved);
    return 0;
}
#endif

/* flags: 1 for float32 out (else bfloat16), | GROUPED for a weight packed grouped. Returns 0,
 * or -1 (nothing written) where this build has no AVX512-BF16 or memory ran out;
 * k % 2 == 0, n % 16 == 0. */
int bf16_gemm(const uint16_t *x, int64_t m, int64_t k, const uint16_t *packed, const float *bias,
              int64_t n, void *out, int64_t flags) {
#if HAVE_BF16
    const int float32_out = (int)(flags & 1), grouped = (flags & GROUPED) != 0;
#if HAVE_AMX
    if (!grouped && k % 32 == 0 && bf16_gemm_amx(-1) == 1)
        return gemm_amx(x, m, k, packed, bias, n, out, float32_out);
#endif
    return gemm(x, m, k, packed, bias, n, out, float32_out, grouped);
#else
    return -1;
#endif
}
