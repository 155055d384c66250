/* A w8a8 matmul's activations, one int8 scale per row (shared by fused_ops.c and int8_gemm.c):
 * xs = x * inv_smooth (float32), scale = max(max|xs|, FLT_MIN) / 127,
 * q = round-half-even(xs / scale), stored plus `offset` (0, or 128 for vpdpbusd's unsigned side).
 *
 * NOTE: this computes exactly what its torch form in quant_linear.py computes (a correctly
 * rounded divide, no contraction), so the kernels and the fallback agree bit for bit. */
#ifndef INTENTSERVE_W8A8_H
#define INTENTSERVE_W8A8_H

#include "vec16.h"

static inline __attribute__((always_inline)) __attribute__((optimize("fp-contract=off"))) void
quantize_rows(const void *x, const float *inv_smooth, uint8_t *q, float *scales, int64_t rows,
              int64_t width, const int offset, const int is_bf16) {
    const v16 zero = {0}, magic = zero + 12582912.0f; /* 1.5 * 2^23: adding it rounds half-even */
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = r * width;
        v16 peak = zero;
        for (int64_t i = 0; i < width; i += 16) {
            v16 xs = load16(x, base + i, is_bf16);
            if (inv_smooth) xs *= load16(inv_smooth, i, 0);
            const v16 a = select16((v16i)(xs < zero), -xs, xs);
            peak = select16((v16i)(a > peak), a, peak);
        }
        float amax = 0.0f;
        for (int l = 0; l < 16; ++l) amax = peak[l] > amax ? peak[l] : amax;
        const float scale = (amax > 1.17549435e-38f ? amax : 1.17549435e-38f) / 127.0f;
        scales[r] = scale;
        for (int64_t i = 0; i < width; i += 16) {
            v16 xs = load16(x, base + i, is_bf16);
            if (inv_smooth) xs *= load16(inv_smooth, i, 0);
            const v16 rounded = (xs / scale + magic) - magic;
            const v16i qi = __builtin_convertvector(rounded, v16i);
            for (int l = 0; l < 16; ++l) q[base + i + l] = (uint8_t)(qi[l] + offset);
        }
    }
}

#endif
