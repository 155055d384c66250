/* What the GEMM kernels need to run on AMX tiles (bf16_gemm.c, int8_gemm.c): the process's
 * permission for the tile state, the one tile shape they use, and a switch.
 *
 * A library includes this after <immintrin.h>; HAVE_AMX_TILE says whether this build can use
 * the tiles at all (-march=native on a CPU with AMX). Each library has its own switch. */
#ifndef INTENTSERVE_AMX_H
#define INTENTSERVE_AMX_H

#include <stdint.h>
#include <string.h>

#if defined(__AMX_TILE__) && defined(__linux__)
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

/* The tile configuration is a thread's own: each thread loads it before its first tile op. */
static inline void amx_configure(void) {
    struct amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
}
#endif

#endif
