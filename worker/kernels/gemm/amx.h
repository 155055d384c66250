/* What the GEMM kernels need to run on AMX tiles (bf16_gemm.c, int8_gemm.c): the process's
 * permission for the tile state, the one tile shape they use, a switch, and the pass over k
 * that both run. HAVE_AMX_TILE says whether this build can use the tiles at all (-march=native
 * on a CPU with AMX). Each library has its own switch. */
#ifndef INTENTSERVE_AMX_H
#define INTENTSERVE_AMX_H

#include <stdint.h>
#include <string.h>

#if defined(__AMX_TILE__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_AMX_TILE 1
#else
#define HAVE_AMX_TILE 0
#endif

/* -1: not asked yet; 0: off (no AMX in this build, the kernel refused the tile state, or turned
 * off); 1: on. */
static int amx_state = -1;

static inline int amx_request(void) {
#if HAVE_AMX_TILE
    /* Linux hands a process the 8 KB tile state only when asked (arch_prctl, once a process:
     * every thread then has it); using the tiles before that is a SIGILL. */
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

/* Whether the library's calls run on the tiles (1) or not (0). set: -1 only asks; 0 turns the
 * tiles off; 1 turns them on where `built` (this library's build has the AMX instructions it
 * uses) and the kernel allow. Not for use while another thread is inside the library. */
static inline int amx_switch(int64_t set, const int built) {
    if (!built || set == 0) amx_state = 0;
    else if (set == 1 || amx_state < 0) amx_state = amx_request();
    return amx_state;
}

#if HAVE_AMX_TILE
/* Every tile 16 rows of 64 bytes: the sums (16 x 16 float32 or int32), 16 rows of 32 bfloat16
 * or 64 bytes of x, 16 pairs or quadruples of k by 16 channels of weights. */
struct amx_tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* The tile configuration is a thread's own: each thread loads it before its first tile op.
 * `rows` (1-16): how many rows of x the call has, where under 16; else 16. With fewer, the
 * tiles that hold x and the sums of a pass over one slice of rows (0-1 and 4, amx_pass) are
 * that many rows tall: a pass then loads, multiplies and stores only the rows there are, while
 * the weights' tiles stay 16 rows (of pairs or quadruples of k). A row's sums do not depend on
 * the tile's height (tested: a row alone gives the bits it gets in a batch). On the 2-core AMX
 * VM (2026-12-03, one process, alternated, medians of the decode steps, the greedy tokens the
 * same) one stream's step went 12.4 -> 11.5 ms in bf16 and 7.7 -> 7.0 ms in w8a8. */
static inline void amx_configure(const int rows) {
    struct amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    if (rows < 16) cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = (uint8_t)rows;
    _tile_loadconfig(&cfg);
}

#define AMX_AHEAD 4096 /* bytes of weights prefetched ahead of the tile loads */
#define AMX_BF16 0     /* amx_pass's dot products: bfloat16 pairs into float32 (tdpbf16ps) */
#define AMX_INT8 1     /* or unsigned x signed bytes into int32 (tdpbusd) */

/* One pass of a GEMM over all of k: 16 or 32 rows (two_rows) by 16 or 32 channels (two_blocks).
 * Tiles 0-3 hold the sums (row slice i, block j in tile 2i + j; stored to sums[2i + j], 16 x 16
 * 4-byte values), 4-5 two 16-row slices of x (a0, a1: 64 bytes of each row a step, rows
 * row_bytes apart), 6-7 the two blocks' weights for the same step (w0, w1: their panels, 1 KB a
 * step, the packed layouts of bf16_gemm.c and int8_gemm.c). `ahead`: prefetch each panel
 * AMX_AHEAD bytes ahead of its loads (past a panel's end that is the next group's, which follows
 * it in memory); on a group's first pass over the rows, where the weights come from DRAM.
 * `kind` (AMX_BF16 or AMX_INT8) is a constant wherever this is inlined. */
static inline __attribute__((always_inline)) void amx_pass(const char *a0, const char *a1,
                                                           int64_t row_bytes, const char *w0,
                                                           const char *w1, char sums[4][1024],
                                                           const int two_rows,
                                                           const int two_blocks,
                                                           const int ahead, const int kind) {
#if defined(__AMX_BF16__) && defined(__AMX_INT8__)
#define AMX_DOT(c, a, b)                                                                        \
    do {                                                                                        \
        if (kind == AMX_INT8) _tile_dpbusd(c, a, b);                                            \
        else _tile_dpbf16ps(c, a, b);                                                           \
    } while (0)
#elif defined(__AMX_INT8__)
#define AMX_DOT(c, a, b) _tile_dpbusd(c, a, b)
#else
#define AMX_DOT(c, a, b) _tile_dpbf16ps(c, a, b)
#endif
    _tile_zero(0);
    if (two_blocks) _tile_zero(1);
    if (two_rows) _tile_zero(2);
    if (two_rows && two_blocks) _tile_zero(3);
    for (int64_t step = 0; step < row_bytes; step += 64) {
        const char *b0 = w0 + step * 16, *b1 = w1 + step * 16;
        if (ahead)
            for (int line = 0; line < 1024; line += 64) {
                _mm_prefetch(b0 + AMX_AHEAD + line, _MM_HINT_T0);
                if (two_blocks) _mm_prefetch(b1 + AMX_AHEAD + line, _MM_HINT_T0);
            }
        _tile_loadd(4, a0 + step, row_bytes);
        _tile_loadd(6, b0, 64);
        AMX_DOT(0, 4, 6);
        if (two_blocks) {
            _tile_loadd(7, b1, 64);
            AMX_DOT(1, 4, 7);
        }
        if (two_rows) {
            _tile_loadd(5, a1 + step, row_bytes);
            AMX_DOT(2, 5, 6);
            if (two_blocks) AMX_DOT(3, 5, 7);
        }
    }
#undef AMX_DOT
    _tile_stored(0, sums[0], 64);
    if (two_blocks) _tile_stored(1, sums[1], 64);
    if (two_rows) _tile_stored(2, sums[2], 64);
    if (two_rows && two_blocks) _tile_stored(3, sums[3], 64);
}

/* amx_pass with its flags as constants, for the four shapes a pass can have. */
static inline __attribute__((always_inline)) void amx_pass_any(const char *a0, const char *a1,
                                                               int64_t row_bytes,
                                                               const char *w0, const char *w1,
                                                               char sums[4][1024],
                                                               int two_rows, int two_blocks,
                                                               int ahead, const int kind) {
    if (two_rows && two_blocks) amx_pass(a0, a1, row_bytes, w0, w1, sums, 1, 1, ahead, kind);
    else if (two_rows) amx_pass(a0, a1, row_bytes, w0, w1, sums, 1, 0, ahead, kind);
    else if (two_blocks) amx_pass(a0, a1, row_bytes, w0, w1, sums, 0, 1, ahead, kind);
    else amx_pass(a0, a1, row_bytes, w0, w1, sums, 0, 0, ahead, kind);
}
#endif

#endif
