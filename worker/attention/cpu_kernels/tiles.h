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

#endif
