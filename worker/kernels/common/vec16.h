/* What the CPU kernels share: 16 float32 lanes as GCC vector extensions (the compiler picks the
 * host's widest registers under -march=native, without intrinsics; aligned(4), so any row address
 * works), loads that widen float32 or bfloat16 storage, a horizontal sum, a select, rounding
 * and storing to the storage dtype, and exp (SiLU's and GELU's). */
#ifndef INTENTSERVE_VEC16_H
#define INTENTSERVE_VEC16_H

#include <stdint.h>
#include <string.h>
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef uint16_t v16h __attribute__((vector_size(32), aligned(2)));
typedef uint32_t v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4)));

/* One float32 to bfloat16, round to nearest even, NaN kept NaN, denormals kept: torch's
 * `.to(torch.bfloat16)`, bit for bit. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* Elements [i, i + 16) of a float32 or bfloat16 array, widened to float32. */
static inline __attribute__((always_inline)) v16 load16(const void *base, int64_t i,
                                                        const int is_bf16) {
    v16 f;
    if (is_bf16) {
        v16h h;
        memcpy(&h, (const uint16_t *)base + i, sizeof h);
        const v16u u = __builtin_convertvector(h, v16u) << 16;
        memcpy(&f, &u, sizeof f);
    } else {
        memcpy(&f, (const float *)base + i, sizeof f);
    }
    return f;
}

static inline float hsum16(v16 v) {
    v8 lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    const v8 s = lo + hi;
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* Lane by lane: yes where mask is set, else no. */
static inline v16 select16(v16i mask, v16 yes, v16 no) {
    v16i a, b;
    memcpy(&a, &yes, sizeof a);
    memcpy(&b, &no, sizeof b);
    const v16i r = (a & mask) | (b & ~mask);
    v16 out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* The value each lane has once stored in the dtype (round to nearest even; NaN stays NaN).
 * With AVX512-BF16 that is one vcvtneps2bf16, which reads a float32 denormal as a zero of its
 * sign (torch keeps it, as the portable steps below do); everything else rounds the same, bit
 * for bit. On the 2-core Xeon (alternated in one process): silu_mul at 64 rows x 1536 87-107 ->
 * 74-75 us, add_rmsnorm at 64 x 576 25.2 -> 24.3 us. */
static inline __attribute__((always_inline)) v16 round16(v16 f, const int is_bf16) {
    if (!is_bf16) return f;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
    const __m256i h = (__m256i)_mm512_cvtneps_pbh((__m512)f);
    return (v16)_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
#else
    v16u b;
    memcpy(&b, &f, sizeof b);
    const v16u rounded = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    const v16i is_nan = (v16i)((b & 0x7fffffffu) > 0x7f800000u);
    v16 r, q;
    const v16u quiet = (b | 0x400000u) & 0xffff0000u;
    memcpy(&r, &rounded, sizeof r);
    memcpy(&q, &quiet, sizeof q);
    return select16(is_nan, q, r);
#endif
}

/* f must already be rounded to the dtype (round16). */
static inline __attribute__((always_inline)) void store16(void *base, int64_t i, v16 f,
                                                          const int is_bf16) {
    if (is_bf16) {
        v16u u;
        memcpy(&u, &f, sizeof u);
        const v16h h = __builtin_convertvector(u >> 16, v16h);
        memcpy((uint16_t *)base + i, &h, sizeof h);
    } else {
        memcpy((float *)base + i, &f, sizeof f);
    }
}

/* exp over the float range, 16 lanes: 2^n * p(r), r = x - n ln 2; relative error ~2e-7. */
static inline v16 exp16(v16 x) {
    const v16 zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f;
    x = select16((v16i)(x < lo), lo, x);
    x = select16((v16i)(x > hi), hi, x);
    const v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const v16 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    v16 p = r * 1.38888889e-3f + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* 2^n in two halves, so n = 128 does not overflow the exponent field. */
    const v16i ni = __builtin_convertvector(n, v16i);
    const v16i half = ni >> 1;
    const v16i a = (half + 127) << 23, b = (ni - half + 127) << 23;
    v16 fa, fb;
    memcpy(&fa, &a, sizeof fa);
    memcpy(&fb, &b, sizeof fb);
    return p * fa * fb;
}

#endif
