/* Fused elementwise steps of a decoder layer on the CPU: one pass over each row instead of the
 * eight or so torch ops (each with its own pass, thread fork and Python call) it replaces. Built
 * at run time like paged_decode.c. The norm, SiLU, rotary and dequantize split rows over the
 * threads where a step has enough of them (a row's result never depends on which thread ran it).
 *
 *   add_rmsnorm: s = x + r; y = w * (s * rsqrt(mean(s^2) + eps)); r <- s.  Without r, s = x.
 *   silu_mul:    y = silu(gate) * up, for rows laid out [gate | up].
 *   rotary:      the first num_heads heads of each row rotated in place (rotate-half layout):
 *                x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, for the halves x1 | x2 of a head.
 *   quantize_rows:   the activations of a w8a8 matmul, one int8 scale per row:
 *                xs = x * inv_smooth (float32), scale = max(max|xs|, FLT_MIN) / 127,
 *                q = round-half-even(xs / scale); the _u8 forms store q + 128 (int8_gemm.c).
 *   dequantize_rows: its int32 products back to the dtype: y = (acc * row_scale) * col_scale.
 *
 * They round where the torch ops they replace round (s, the normalized row and the product with
 * w are each rounded to the dtype; silu(gate) is rounded before the product), so in bfloat16 the
 * results match torch bit for bit except where float32 summation order or the exp inside SiLU
 * (a polynomial, relative error ~2e-7 against torch's ~1e-7) lands on the other side of a
 * rounding boundary, and where a float32 denormal is rounded on a CPU with AVX512-BF16 (to zero:
 * vec16.h, round16). Row widths must be multiples of 16 (the caller checks).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vec16.h"
#include "w8a8.h"

#define PARALLEL_MIN_ELEMENTS 16384 /* below this, a fork and join of the threads costs more */

static inline __attribute__((always_inline)) void add_rmsnorm(
    const void *x, void *residual, const void *weight, void *out, int64_t rows, int64_t hidden,
    float eps, const int is_bf16) {
    /* NOTE: serial, the norm left the other core waiting: 1.9% of a 64-stream step's samples
     * (perf), 60 calls a step. */
#pragma omp parallel for schedule(static) if (rows * hidden >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = r * hidden;
        v16 squares = {0};
        for (int64_t i = 0; i < hidden; i += 16) {
            v16 s = load16(x, base + i, is_bf16);
            if (residual) {
                s = round16(s + load16(residual, base + i, is_bf16), is_bf16);
                store16(residual, base + i, s, is_bf16);
            }
            squares += s * s;
        }
        const float inv = 1.0f / sqrtf(hsum16(squares) / (float)hidden + eps);
        const void *src = residual ? residual : x;
        for (int64_t i = 0; i < hidden; i += 16) {
            const v16 normed = round16(load16(src, base + i, is_bf16) * inv, is_bf16);
            store16(out, base + i, round16(load16(weight, i, is_bf16) * normed, is_bf16), is_bf16);
        }
    }
}

static inline __attribute__((always_inline)) void silu_mul(const void *gate_up, void *out,
                                                           int64_t rows, int64_t inter,
                                                           const int is_bf16) {
    /* NOTE: unlike the norm, SiLU (a divide and an exp per element) is worth both cores: serial,
     * 32 rows x 1536 took 47 us against 27 us for torch's two threaded ops. */
#pragma omp parallel for schedule(static) if (rows * inter >= 16384)
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < inter; i += 16) {
            const v16 g = load16(gate_up, r * 2 * inter + i, is_bf16);
            const v16 u = load16(gate_up, r * 2 * inter + inter + i, is_bf16);
            const v16 act = round16(g / (1.0f + exp16(-g)), is_bf16);
            store16(out, r * inter + i, round16(act * u, is_bf16), is_bf16);
        }
    }
}

static inline __attribute__((always_inline)) __attribute__((optimize("fp-contract=off"))) void
dequantize_rows(const int32_t *acc, const float *row_scales, const float *col_scales, void *out,
                int64_t rows, int64_t cols, const int is_bf16) {
#pragma omp parallel for schedule(static) if (rows * cols >= 65536)
    for (int64_t r = 0; r < rows; ++r) {
        const float rs = row_scales[r];
        for (int64_t j = 0; j < cols; j += 16) {
            v16i a;
            memcpy(&a, acc + r * cols + j, sizeof a);
            const v16 y = (__builtin_convertvector(a, v16) * rs) * load16(col_scales, j, 0);
            store16(out, r * cols + j, round16(y, is_bf16), is_bf16);
        }
    }
}

void quantize_rows_f32(const float *x, const float *inv_smooth, uint8_t *q, float *scales,
                       int64_t rows, int64_t width, int64_t offset) {
    quantize_rows(x, inv_smooth, q, scales, rows, width, (int)offset, 0);
}

void quantize_rows_bf16(const uint16_t *x, const float *inv_smooth, uint8_t *q, float *scales,
                        int64_t rows, int64_t width, int64_t offset) {
    quantize_rows(x, inv_smooth, q, scales, rows, width, (int)offset, 1);
}

void dequantize_rows_f32(const int32_t *acc, const float *row_scales, const float *col_scales,
                         float *out, int64_t rows, int64_t cols) {
    dequantize_rows(acc, row_scales, col_scales, out, rows, cols, 0);
}

void dequantize_rows_bf16(const int32_t *acc, const float *row_scales, const float *col_scales,
                          uint16_t *out, int64_t rows, int64_t cols) {
    dequantize_rows(acc, row_scales, col_scales, out, rows, cols, 1);
}

/* NOTE: each product is rounded before the sum, as torch's separate mul and sub/add round; the
 * compiler must not contract them into one fused multiply-add (that would differ in float32). */
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))

static inline __attribute__((always_inline)) NO_CONTRACT void rotary(
    void *qkv, int64_t row_stride, const void *cos, const void *sin, int64_t rows,
    int64_t num_heads, int64_t head_dim, const int is_bf16) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (rows * num_heads * head_dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < half; i += 16) {
            const v16 c = load16(cos, r * half + i, is_bf16);
            const v16 s = load16(sin, r * half + i, is_bf16);
            for (int64_t h = 0; h < num_heads; ++h) {
                const int64_t at = r * row_stride + h * head_dim + i;
                const v16 x1 = load16(qkv, at, is_bf16), x2 = load16(qkv, at + half, is_bf16);
                const v16 a = round16(x1 * c, is_bf16) - round16(x2 * s, is_bf16);
                const v16 b = round16(x2 * c, is_bf16) + round16(x1 * s, is_bf16);
                store16(qkv, at, round16(a, is_bf16), is_bf16);
                store16(qkv, at + half, round16(b, is_bf16), is_bf16);
            }
        }
    }
}

NO_CONTRACT void rotary_f32(float *qkv, int64_t row_stride, const float *cos, const float *sin,
                            int64_t rows, int64_t num_heads, int64_t head_dim) {
    rotary(qkv, row_stride, cos, sin, rows, num_heads, head_dim, 0);
}

NO_CONTRACT void rotary_bf16(uint16_t *qkv, int64_t row_stride, const uint16_t *cos,
                             const uint16_t *sin, int64_t rows, int64_t num_heads,
                             int64_t head_dim) {
    rotary(qkv, row_stride, cos, sin, rows, num_heads, head_dim, 1);
}

void add_rmsnorm_f32(const float *x, float *residual, const float *weight, float *out,
                     int64_t rows, int64_t hidden, float eps) {
    add_rmsnorm(x, residual, weight, out, rows, hidden, eps, 0);
}

void add_rmsnorm_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *weight,
                      uint16_t *out, int64_t rows, int64_t hidden, float eps) {
    add_rmsnorm(x, residual, weight, out, rows, hidden, eps, 1);
}

void silu_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t inter) {
    silu_mul(gate_up, out, rows, inter, 0);
}

void silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter) {
    silu_mul(gate_up, out, rows, inter, 1);
}

/* One 16-lane running (maximum, index) pair: `v` (columns j..j+15) replaces a lane's pair
 * where it is greater; a lane keeps its first index on ties. NaN never compares greater: it is
 * counted in `nan` instead. */
static inline __attribute__((always_inline)) void max_step(v16 v, int32_t j, v16 *best,
                                                            v16i *at, v16i *nan, v16i lane) {
    const v16i greater = (v16i)(v > *best);
    *best = select16(greater, v, *best);
    *at = (greater & (lane + j)) | (~greater & *at);
    *nan |= (v16i)(v != v);
}

/* Row-wise maximum and argmax of float32 [rows, cols], 16 <= cols < 2^31, as torch's
 * `amax(-1)` and `argmax(-1)` give them: the first index of the maximum; a row holding a NaN
 * has the maximum NaN at its first NaN's index. One read of the logits, two running pairs per
 * row (even and odd vectors) so the compares do not wait on each other. */
void max_argmax_rows_f32(const float *x, int64_t rows, int64_t cols, float *row_max,
                         int64_t *index) {
#pragma omp parallel for schedule(static) if (rows * cols >= 262144)
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * cols;
        const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        v16 best0, best1;
        memcpy(&best0, row, sizeof best0);
        best1 = best0;
        v16i at0 = lane, at1 = lane, nan = (v16i)(best0 != best0);
        int64_t j = 16;
        for (; j + 32 <= cols; j += 32) {
            v16 v0, v1;
            memcpy(&v0, row + j, sizeof v0);
            memcpy(&v1, row + j + 16, sizeof v1);
            max_step(v0, (int32_t)j, &best0, &at0, &nan, lane);
            max_step(v1, (int32_t)(j + 16), &best1, &at1, &nan, lane);
        }
        for (; j + 16 <= cols; j += 16) {
            v16 v;
            memcpy(&v, row + j, sizeof v);
            max_step(v, (int32_t)j, &best0, &at0, &nan, lane);
        }
        float m = best0[0];
        int64_t k = at0[0];
        int has_nan = 0;
        for (int l = 0; l < 16; ++l) {
            has_nan |= nan[l] != 0;
            const float b[2] = {best0[l], best1[l]};
            const int64_t a[2] = {at0[l], at1[l]};
            for (int p = 0; p < 2; ++p)
                if (b[p] > m || (b[p] == m && a[p] < k)) {
                    m = b[p];
                    k = a[p];
                }
        }
        for (; j < cols; ++j) { /* past every index above: strictly greater only */
            const float v = row[j];
            has_nan |= v != v;
            if (v > m) {
                m = v;
                k = j;
            }
        }
        if (has_nan) {
            for (k = 0; row[k] == row[k]; ++k) {
            }
            m = row[k];
        }
        row_max[r] = m;
        index[r] = k;
    }
}
