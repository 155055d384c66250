/* Gemma 3's elementwise steps of a decoder layer on the CPU, as fused_ops.c is Llama's: one pass
 * over each row instead of the torch ops of worker/model/gemma.py. The Python layers call them
 * where this library loads, and the one-call decode step (layers/gemma_layers.c) calls the same
 * functions, so the two paths agree bit for bit.
 *
 *   gemma_norm:     y = (s * rsqrt(mean(s^2) + eps)) * w, w float32 (1 + the checkpoint's
 *                   weight), rounded once to the dtype; with a residual r, r <- r + y (rounded)
 *                   and out is not written: `x = x + norm(h)`, the sum in place.
 *   qk_norm_rotary: each q and k head of a fused q|k|v row normed over head_dim (gemma_norm,
 *                   q's weight and k's), rotated in place (rotate-half, fused_ops.c's rotary),
 *                   then each q head times q_multiplier where that is not 1.
 *   gelu_mul:       y = gelu_tanh(gate) * up, for rows laid out [gate | up], gelu_tanh rounded
 *                   to the dtype before the product; gelu_tanh(g) = 0.5 g (1 + tanh(u)),
 *                   u = sqrt(2 / pi) (g + 0.044715 g^3), tanh through exp16.
 *
 * They round where the torch ops round, so against torch they differ only where float32
 * summation order (the norms' mean) or the exp inside GELU (relative error ~2e-7, against
 * torch's tanh) lands on the other side of a rounding boundary (tests/worker/model/
 * test_gemma_cpu_ops.py bounds it). Row widths (hidden, head_dim / 2, intermediate) must be
 * multiples of 16 (the caller checks). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vec16.h"

#define PARALLEL_MIN_ELEMENTS 16384 /* below this, a fork and join of the threads costs more */
/* NOTE: each product is rounded before a sum, as torch's separate ops round; the compiler must
 * not contract them into one fused multiply-add (that would differ in float32). */
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))

/* 1 / rms of `n` values at x + at (n a multiple of 16). */
static inline __attribute__((always_inline)) NO_CONTRACT float inv_rms(const void *x,
                                                                       int64_t at, int64_t n,
                                                                       float eps,
                                                                       const int is_bf16) {
    v16 squares = {0};
    for (int64_t i = 0; i < n; i += 16) {
        const v16 s = load16(x, at + i, is_bf16);
        squares += s * s;
    }
    return 1.0f / sqrtf(hsum16(squares) / (float)n + eps);
}

static inline __attribute__((always_inline)) NO_CONTRACT void gemma_norm(
    const void *x, void *residual, const float *weight, void *out, int64_t rows, int64_t hidden,
    float eps, const int is_bf16) {
#pragma omp parallel for schedule(static) if (rows * hidden >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = r * hidden;
        const float inv = inv_rms(x, base, hidden, eps, is_bf16);
        for (int64_t i = 0; i < hidden; i += 16) {
            const v16 y = round16((load16(x, base + i, is_bf16) * inv) * load16(weight, i, 0),
                                  is_bf16);
            if (residual)
                store16(residual, base + i, round16(load16(residual, base + i, is_bf16) + y,
                                                    is_bf16), is_bf16);
            else
                store16(out, base + i, y, is_bf16);
        }
    }
}

static inline __attribute__((always_inline)) NO_CONTRACT void qk_norm_rotary(
    void *qkv, int64_t row_stride, const float *q_weight, const float *k_weight, const void *cos,
    const void *sin, int64_t rows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    float eps, float q_multiplier, const int is_bf16) {
    const int64_t half = head_dim / 2, heads = num_heads + num_kv_heads;
#pragma omp parallel for schedule(static) if (rows * heads * head_dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < heads; ++h) {
            const int64_t at = r * row_stride + h * head_dim;
            const float *w = h < num_heads ? q_weight : k_weight;
            const int scaled = h < num_heads && q_multiplier != 1.0f;
            const float inv = inv_rms(qkv, at, head_dim, eps, is_bf16);
            for (int64_t i = 0; i < half; i += 16) {
                const v16 c = load16(cos, r * half + i, is_bf16);
                const v16 s = load16(sin, r * half + i, is_bf16);
                const v16 x1 = round16((load16(qkv, at + i, is_bf16) * inv) * load16(w, i, 0),
                                       is_bf16);
                const v16 x2 = round16(
                    (load16(qkv, at + half + i, is_bf16) * inv) * load16(w, half + i, 0),
                    is_bf16);
                v16 a = round16(round16(x1 * c, is_bf16) - round16(x2 * s, is_bf16), is_bf16);
                v16 b = round16(round16(x2 * c, is_bf16) + round16(x1 * s, is_bf16), is_bf16);
                if (scaled) {
                    a = round16(a * q_multiplier, is_bf16);
                    b = round16(b * q_multiplier, is_bf16);
                }
                store16(qkv, at + i, a, is_bf16);
                store16(qkv, at + half + i, b, is_bf16);
            }
        }
    }
}

/* NOTE: not NO_CONTRACT: its formula is not torch's anyway, and exp16 must inline. */
static inline __attribute__((always_inline)) void gelu_mul(const void *gate_up, void *out,
                                                           int64_t rows, int64_t inter,
                                                           const int is_bf16) {
#pragma omp parallel for schedule(static) if (rows * inter >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < inter; i += 16) {
            const v16 g = load16(gate_up, r * 2 * inter + i, is_bf16);
            const v16 u = load16(gate_up, r * 2 * inter + inter + i, is_bf16);
            const v16 inner = (g + (g * g * g) * 0.044715f) * 0.7978845608028654f;
            /* tanh(u) = sign(u) (1 - 2e / (1 + e)), e = exp(-2|u|): rounded to float32 as
             * torch's (near correctly rounded) tanh is, so 1 + tanh loses what torch's loses
             * where tanh is near -1 (and is 0 where it saturates) */
            const v16i negative = (v16i)(inner < 0.0f);
            const v16 e = exp16(select16(negative, inner, -inner) * 2.0f);
            const v16 magnitude = 1.0f - (2.0f * e) / (1.0f + e);
            const v16 t = select16(negative, -magnitude, magnitude);
            const v16 act = round16((g * 0.5f) * (1.0f + t), is_bf16);
            store16(out, r * inter + i, round16(act * u, is_bf16), is_bf16);
        }
    }
}

NO_CONTRACT void gemma_norm_f32(const float *x, float *residual, const float *weight,
                                float *out, int64_t rows, int64_t hidden, float eps) {
    gemma_norm(x, residual, weight, out, rows, hidden, eps, 0);
}

NO_CONTRACT void gemma_norm_bf16(const uint16_t *x, uint16_t *residual, const float *weight,
                                 uint16_t *out, int64_t rows, int64_t hidden, float eps) {
    gemma_norm(x, residual, weight, out, rows, hidden, eps, 1);
}

NO_CONTRACT void qk_norm_rotary_f32(float *qkv, int64_t row_stride, const float *q_weight,
                                    const float *k_weight, const float *cos, const float *sin,
                                    int64_t rows, int64_t num_heads, int64_t num_kv_heads,
                                    int64_t head_dim, float eps, float q_multiplier) {
    qk_norm_rotary(qkv, row_stride, q_weight, k_weight, cos, sin, rows, num_heads, num_kv_heads,
                   head_dim, eps, q_multiplier, 0);
}

NO_CONTRACT void qk_norm_rotary_bf16(uint16_t *qkv, int64_t row_stride, const float *q_weight,
                                     const float *k_weight, const uint16_t *cos,
                                     const uint16_t *sin, int64_t rows, int64_t num_heads,
                                     int64_t num_kv_heads, int64_t head_dim, float eps,
                                     float q_multiplier) {
    qk_norm_rotary(qkv, row_stride, q_weight, k_weight, cos, sin, rows, num_heads, num_kv_heads,
                   head_dim, eps, q_multiplier, 1);
}

void gelu_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t inter) {
    gelu_mul(gate_up, out, rows, inter, 0);
}

void gelu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter) {
    gelu_mul(gate_up, out, rows, inter, 1);
}
