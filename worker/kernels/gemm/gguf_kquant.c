/* The GGUF-block matmuls with the K-quants interleaved too: gguf_gemm.c (every type in the
 * file's order; Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 interleaved, gguf_x8.h) plus Q4_K, Q5_K and
 * Q6_K interleaved 8 channels at a time (gguf_kx8.h), behind three entry points of gguf_gemm.c's
 * signatures that route an interleaved K-quant here and everything else to gguf_gemm.c:
 *
 *   gguf_native_interleave   as gguf_interleave, for the K-quants too
 *   gguf_native_gemm         as gguf_gemm (so the one-call step's gguf_gemm_fn serves both)
 *   gguf_native_dequantize   as gguf_dequantize
 *
 * An interleaved K-quant tile is decoded once for up to RX rows (its 8 vectors in registers),
 * each row keeping 8 float accumulators; a sub-block's integers meet the row's in int32 (two
 * chains of 4 dot products), then one scale per sub-block (Q6_K: two) turns them into floats,
 * as gguf_x8.h's kernel does. The activations are gguf_quantize_rows's (int8, one scale per 32). */
#include <stdlib.h>

#include "gguf_gemm.c"
#include "gguf_kx8.h"

#if HAVE_AVX2
typedef void (*kshare_fn)(const uint8_t *w, int64_t g0, int64_t g1, int64_t k, const int8_t *q,
                          const float *d, const float *s, const int32_t *x32, int64_t m,
                          void *out, int64_t ldo, int is_bf16);

#define KSHARES(T, V)                                                                           \
    static void kshare_##T##_##V(const uint8_t *w, int64_t g0, int64_t g1, int64_t k,           \
                                 const int8_t *q, const float *d, const float *s,               \
                                 const int32_t *x32, int64_t m, void *out, int64_t ldo,         \
                                 int is_bf16) {                                                 \
        /* whole passes, and one row (a decode's) with its count known, in registers */        \
        int64_t r0 = 0;                                                                         \
        for (; r0 + RX <= m; r0 += RX)                                                          \
            kgroups_x8(T, V, w, g0, g1, k, q, d, s, x32, r0, RX, out, ldo, is_bf16);            \
        if (m - r0 == 1)                                                                        \
            kgroups_x8(T, V, w, g0, g1, k, q, d, s, x32, r0, 1, out, ldo, is_bf16);             \
        else if (m > r0)                                                                        \
            kgroups_x8(T, V, w, g0, g1, k, q, d, s, x32, r0, (int)(m - r0), out, ldo, is_bf16); \
    }
KSHARES(Q4_K, 0) KSHARES(Q5_K, 0) KSHARES(Q6_K, 0)
KSHARES(Q4_K, 1) KSHARES(Q5_K, 1) KSHARES(Q6_K, 1)

static kshare_fn kpick(int type, int vnni) {
    switch (type) {
        PICK(kshare_, Q4_K) PICK(kshare_, Q5_K) PICK(kshare_, Q6_K)
    }
    return NULL;
}

/* An interleaved K-quant w [n, k] (n whole groups): out as gguf_gemm's. -1 where it cannot
 * (nothing written): the offsets Q6_K needs could not be allocated. */
static int kx8_gemm(int type, const uint8_t *w, int64_t n, int64_t k, const int8_t *q,
                    const float *d, const float *s, int64_t m, void *out, int64_t ldo,
                    int is_bf16) {
    const kshare_fn share = kpick(type, use_vnni);
    int32_t *x32 = NULL; /* Q6_K: [m, k / 16], 32 times the sums of the activations' integers */
    if (type == Q6_K && m > 0) {
        x32 = malloc((size_t)(m * (k / 16)) * sizeof(int32_t));
        if (!x32) return -1;
        for (int64_t e = 0; e < m * (k / 16); ++e) {
            int32_t sum = 0;
            for (int i = 0; i < 16; ++i) sum += q[16 * e + i];
            x32[e] = 32 * sum;
        }
    }
#pragma omp parallel for schedule(static) if (m * n * k >= PARALLEL_MIN_MACS)
    for (int64_t g = 0; g < n / X8; ++g) share(w, g, g + 1, k, q, d, s, x32, m, out, ldo, is_bf16);
    free(x32);
    return 0;
}
#endif

int gguf_native_interleave(int64_t type, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    return kx8_type((int)type) ? kx8_interleave((int)type, w, n, k, out)
                               : gguf_interleave(type, w, n, k, out);
}

int gguf_native_gemm(int64_t type, const uint8_t *w, int64_t n, int64_t k, const int8_t *q,
                     const float *d, const float *s, int64_t m, void *out, int64_t ldo,
                     int64_t is_bf16, int64_t interleaved) {
    if (!(interleaved && kx8_type((int)type)))
        return gguf_gemm(type, w, n, k, q, d, s, m, out, ldo, is_bf16, interleaved);
#if HAVE_AVX2
    if (!gguf_row_bytes(type, k) || n % X8) return -1;
    return kx8_gemm((int)type, w, n, k, q, d, s, m, out, ldo, (int)is_bf16);
#else
    return -1;
#endif
}

int gguf_native_dequantize(int64_t type, const uint8_t *w, int64_t k, const int64_t *rows,
                           int64_t count, void *out, int64_t is_bf16, int64_t interleaved) {
    return interleaved && kx8_type((int)type)
               ? kx8_dequantize((int)type, w, k, rows, count, out, (int)is_bf16)
               : gguf_dequantize(type, w, k, rows, count, out, is_bf16, interleaved);
}
