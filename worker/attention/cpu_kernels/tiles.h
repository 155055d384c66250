/* What the GEMM kernels' 8-row tiles share (bf16_gemm.c, int8_gemm.c). */
#ifndef INTENTSERVE_TILES_H
#define INTENTSERVE_TILES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The first `rows` rows of src (a multiple of mr; each row_bytes long, a multiple of 4) with
 * their 4-byte words interleaved: [rows / mr][row_bytes / 4][mr]. One step of a tile then reads
 * its mr rows' operands side by side. NULL when rows is 0 or memory ran out (check rows). */
static inline int32_t *interleave_rows(const void *src, int64_t rows, int64_t row_bytes,
                                       int64_t mr) {
    if (!rows) return NULL;
    int32_t *out = malloc(rows * row_bytes);
    if (!out) return NULL;
    const int64_t words = row_bytes / 4;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t w = 0; w < words; ++w)
            memcpy(out + (r / mr) * words * mr + w * mr + r % mr,
                   (const char *)src + r * row_bytes + 4 * w, 4);
    return out;
}

#endif
