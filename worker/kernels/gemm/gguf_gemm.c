/* Matmuls on a GGUF file's own quantized blocks ("native" weights): out = x . w^T with w [n, k]
 * held as the file stores it, one row of blocks per output channel, and x quantized per row,
 * 32 values at a time, to int8 with one float scale per 32 (llama.cpp's Q8_0 activations):
 *
 *   gguf_quantize_rows  x [m, k] float32 / bfloat16 -> q int8 [m, k], d [m, k / 32] (the scales),
 *                       s [m, k / 32] = d * sum(q) (what a block's offset or min multiplies)
 *   gguf_gemm           out[i, j] (row stride ldo, float32 or bfloat16) from q, d, s and the
 *                       blocks of rows [0, n) of w
 *   gguf_dequantize     rows of w to float32 / bfloat16 (embedding lookups; tests)
 *
 * Types (ggml's numbers): Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14
 * (llama.cpp's Q4_K_M files mix Q4_K, Q6_K and Q5_0, Q8_0 where a K-type does not fit a row).
 * Every one is read
 * as sub-blocks of 32 weights: 32 small integers (one 256-bit vector, byte i = weight i) with a
 * float scale (two for Q6_K, one per 16) and, for the types with a min (Q4_1, Q4_K, Q5_K), a
 * float added per 32 weights. Unsigned weights (0..15, 0..31) meet the signed activations in
 * u8 x s8 dot products directly, the min times s added after; signed ones (Q4_0: q - 8, Q5_0:
 * q - 16, Q8_0, Q6_K: q - 32) go through the sign trick (|w| times x with w's sign; gguf_x8.h
 * turns Q4_0 / Q5_0's offsets, and Q8_0's with VNNI, into mins instead). The dot products are
 * vpdpbusd (AVX512-VNNI on 256-bit vectors, or AVX-VNNI) or, on AVX2 alone, vpmaddubsw +
 * vpmaddwd (pairs summed in int16 first: at most 2 * 127 * 127, no saturation); both give the
 * same int32 sums (but for interleaved Q8_0, whose VNNI path adds its offset as a float min,
 * within float32 rounding of the other). `gguf_gemm_vnni(set)` switches between
 * them where both exist (tests run each), as bf16_gemm_amx does for the tiles.
 *
 * Rows are taken RT at a time for each output channel: a sub-block is decoded once and meets
 * RT rows of activations, so larger batches spend less per weight on decoding. Output channels
 * are shared out to the threads. Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 tensors whose channels come
 * in groups of 8 are read interleaved instead (`gguf_interleave`, rearranged once at load:
 * gguf_x8.h), 8 channels a vector, 16 in 512 bits where AVX-512 VNNI is built. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif
#if HAVE_AVX2 && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif

#define Q4_0 2
#define Q4_1 3
#define Q5_0 6
#define Q5_1 7
#define Q8_0 8
#define Q4_K 12
#define Q5_K 13
#define Q6_K 14
#define RT 8 /* activation rows per pass over a channel's blocks */
/* Under this many multiply-adds a call runs on its thread alone. With the file's order and the
 * Python layers, one parallel region per one-row projection took SmolLM2's one stream from 30 to
 * 1.7 tok/s (2 threads, a loaded host), so it was 4M (only the LM head shared out); interleaved
 * and in the one-call step, SmolLM2's one-row projections (0.33M-1.8M) shared out took it from
 * 142.5 to 198.6 tok/s on a quiet host, and from 86.8 to 93.4 beside a busy process (the Python
 * layers, which still run Gemma's, from 56.7 to 33.2 there; docs/engine.md). */
#define PARALLEL_MIN_MACS (1 << 18)

static int use_vnni = HAVE_VNNI;

/* 2 with VNNI dot products, 1 with AVX2 ones, 0 where this build has neither (nothing runs). */
int gguf_gemm_isa(void) { return HAVE_AVX2 ? 1 + use_vnni : 0; }

/* Switch the VNNI path on (1) or off (0) where the build has it; -1 asks. Returns the state. */
int gguf_gemm_vnni(int64_t set) {
    if (set >= 0) use_vnni = HAVE_VNNI && set;
    return use_vnni;
}

/* Bytes of one block and weights in it, per type; 0 for a type not served here. */
static int64_t block_bytes(int type) {
    switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    }
    return 0;
}

static int64_t block_size(int type) { return type >= Q4_K ? 256 : 32; }

int64_t gguf_row_bytes(int64_t type, int64_t k) {
    const int64_t bytes = block_bytes((int)type);
    return bytes && k % block_size((int)type) == 0 ? k / block_size((int)type) * bytes : 0;
}

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if HAVE_AVX2
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f = exp == 0 ? ldexpf((float)man, -24) : exp == 31 ? (man ? NAN : INFINITY)
                                                             : ldexpf((float)(man | 0x400), (int)exp - 25);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= sign;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* Q4_K / Q5_K: sub-block j's 6-bit scale and min, packed in 12 bytes. */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One sub-block of 32 weights as integers: w[i] = scale[i / 16] * v[i] + min. */
struct sub {
    int8_t v[32];
    float scale[2];
    float min;
};

static inline int is_signed_type(int type) {
    return type == Q4_0 || type == Q5_0 || type == Q8_0 || type == Q6_K;
}

/* Sub-block `t` of a row (t < k / 32), in scalar code: the reference the vector code follows,
 * and the dequantizer. Q4_0 / Q5_0 / Q8_0 / Q6_K values are signed, the others 0..31. */
static void decode_sub(int type, const uint8_t *row, int64_t t, struct sub *o) {
    o->min = 0.0f;
    if (type == Q5_0 || type == Q5_1) { /* d, (m), qh: bit j is weight j's fifth bit, qs[16] */
        const uint8_t *b = row + t * block_bytes(type);
        const int with_min = type == Q5_1;
        uint32_t qh;
        memcpy(&qh, b + 2 + 2 * with_min, 4);
        const uint8_t *qs = b + 6 + 2 * with_min;
        const int off = with_min ? 0 : 16;
        for (int i = 0; i < 16; ++i) {
            o->v[i] = (int8_t)(((qs[i] & 0xF) | ((qh >> i) & 1) << 4) - off);
            o->v[i + 16] = (int8_t)(((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - off);
        }
        o->scale[0] = o->scale[1] = half(b);
        if (with_min) o->min = half(b + 2);
        return;
    }
    if (type == Q4_0 || type == Q4_1 || type == Q8_0) {
        const uint8_t *b = row + t * block_bytes(type);
        const float d = half(b);
        o->scale[0] = o->scale[1] = d;
        if (type == Q8_0) {
            memcpy(o->v, b + 2, 32);
            return;
        }
        const uint8_t *qs = b + (type == Q4_1 ? 4 : 2);
        const int off = type == Q4_0 ? 8 : 0;
        for (int i = 0; i < 16; ++i) {
            o->v[i] = (int8_t)((qs[i] & 0xF) - off);
            o->v[i + 16] = (int8_t)((qs[i] >> 4) - off);
        }
        if (type == Q4_1) o->min = half(b + 2);
        return;
    }
    const uint8_t *b = row + t / 8 * block_bytes(type);
    const int j = (int)(t % 8);
    if (type == Q6_K) { /* ql[128], qh[64], scales[16] int8, d */
        const int h = j / 4, u = j % 4;
        const uint8_t *ql = b + 64 * h + 32 * (u & 1), *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * u;
        const float d = half(b + 208);
        for (int i = 0; i < 32; ++i) {
            const int lo = u < 2 ? ql[i] & 0xF : ql[i] >> 4;
            o->v[i] = (int8_t)((lo | ((qh[i] >> (2 * u)) & 3) << 4) - 32);
        }
        o->scale[0] = d * sc[0];
        o->scale[1] = d * sc[1];
        return;
    }
    /* Q4_K: d, dmin, scales[12], qs[128]; Q5_K: the same, then qh[32] before qs. */
    int sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    o->scale[0] = o->scale[1] = half(b) * sc;
    o->min = -half(b + 2) * m;
    const uint8_t *qs = b + (type == Q5_K ? 48 : 16) + 32 * (j / 2);
    for (int i = 0; i < 32; ++i) {
        int v = j % 2 ? qs[i] >> 4 : qs[i] & 0xF;
        if (type == Q5_K) v |= ((b[16 + i] >> j) & 1) << 4;
        o->v[i] = (int8_t)v;
    }
}

static inline uint16_t to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffff) > 0x7f800000) return (uint16_t)((bits >> 16) | 0x40);
    return (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

static inline void store(void *out, int64_t at, float v, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)out)[at] = to_bf16(v);
    else
        ((float *)out)[at] = v;
}

#include "gguf_x8.h"

/* rows[r] of w (all rows where rows is NULL; w `interleaved` as gguf_x8.h lays it out, or as
 * the file does) to out [count, k]. Returns -1 for a type not served here, a k that is not
 * whole blocks, or a layout the type does not have. */
int gguf_dequantize(int64_t type, const uint8_t *w, int64_t k, const int64_t *rows, int64_t count,
                    void *out, int64_t is_bf16, int64_t interleaved) {
    const int64_t row_bytes = gguf_row_bytes(type, k);
    if (!row_bytes || (interleaved && !interleaves((int)type))) return -1;
#pragma omp parallel for if (count * k >= (1 << 20))
    for (int64_t r = 0; r < count; ++r) {
        const int64_t j = rows ? rows[r] : r;
        struct sub s;
        for (int64_t t = 0; t < k / 32; ++t) {
            if (interleaved)
                decode_sub_x8((int)type, w, k, j, t, &s);
            else
                decode_sub((int)type, w + j * row_bytes, t, &s);
            for (int i = 0; i < 32; ++i)
                store(out, r * k + 32 * t + i, s.scale[i / 16] * s.v[i] + s.min, (int)is_bf16);
        }
    }
    return 0;
}

#if HAVE_AVX2
/* Elements [at, at + 8) of x (float32 or bfloat16) as floats. */
static inline __m256 load8(const void *x, int64_t at, int is_bf16) {
    if (!is_bf16) return _mm256_loadu_ps((const float *)x + at);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline int hsum_i32(__m256i v) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i t = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 1)));
}

/* One block of 32 values at x + at -> q[0 .. 32), *d, *s. */
static inline __attribute__((always_inline)) void quantize_block(const void *x, int64_t at,
                                                                 int is_bf16, int8_t *q, float *d,
                                                                 float *s) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
        v[j] = load8(x, at + 8 * j, is_bf16);
        amax = _mm256_max_ps(amax, _mm256_and_ps(v[j], magnitude));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float scale = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4))) / 127.0f;
    const __m256 inv = _mm256_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
    __m256i i[4]; /* rounded to nearest, ties to even (the MXCSR default), as torch.round */
    for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));
    const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]),
                                              _mm256_add_epi32(i[2], i[3])));
    /* |i| <= 127: the packs do not saturate; they interleave 128-bit lanes, the permute undoes it */
    const __m256i words = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]),
                                             _mm256_packs_epi32(i[2], i[3]));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(words, order));
    *d = scale;
    *s = scale * (float)sum;
}
#endif

/* x [m, k] -> q, d, s (above): d = max|x| / 127 per 32, q = x / d rounded to the nearest
 * (ties to even). k % 32 == 0. Nothing is written in a build without AVX2 (gguf_gemm_isa 0). */
void gguf_quantize_rows(const void *x, int64_t m, int64_t k, int64_t is_bf16, int8_t *q, float *d,
                        float *s) {
#if HAVE_AVX2
    const int64_t subs = k / 32;
#pragma omp parallel for if (m * k >= (1 << 16))
    for (int64_t i = 0; i < m; ++i)
        for (int64_t t = 0; t < subs; ++t)
            quantize_block(x, i * k + 32 * t, (int)is_bf16, q + i * k + 32 * t, d + i * subs + t,
                           s + i * subs + t);
#else
    (void)x, (void)m, (void)k, (void)is_bf16, (void)q, (void)d, (void)s;
#endif
}

#if HAVE_AVX2
static inline __attribute__((always_inline)) __m256i dot(__m256i u, __m256i x, const int vnni) {
#if HAVE_VNNI
    if (vnni) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#else
        return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x);
#endif
    }
#endif
    (void)vnni;
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

static inline __m256i nibbles(const uint8_t *qs) { /* 16 bytes -> lows, then highs */
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* Bit i of 32 bits -> 0x10 in byte i, else 0 (Q5_0 / Q5_1's fifth bits). */
static inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    /* byte i takes byte i / 8 of the word, then keeps its bit i % 8 */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i mask = _mm256_set1_epi64x((int64_t)0x8040201008040201);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* Sub-block t decoded into a vector of its 32 integers (signed where `*is_signed`), its
 * per-lane scales (lanes 0-3 cover weights 0-15, 4-7 the rest) and its min. */
static inline __attribute__((always_inline)) __m256i
decode_vec(const int type, const uint8_t *row, int64_t t, __m256 *scale, float *min) {
    *min = 0.0f;
    if (type == Q5_0 || type == Q5_1) {
        const uint8_t *b = row + t * block_bytes(type);
        *scale = _mm256_set1_ps(half(b));
        if (type == Q5_1) {
            *min = half(b + 2);
            return _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4));
        }
        return _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2)),
                               _mm256_set1_epi8(16));
    }
    if (type == Q4_0 || type == Q4_1 || type == Q8_0) {
        const uint8_t *b = row + t * block_bytes(type);
        *scale = _mm256_set1_ps(half(b));
        if (type == Q8_0) return _mm256_loadu_si256((const __m256i *)(b + 2));
        if (type == Q4_1) {
            *min = half(b + 2);
            return nibbles(b + 4);
        }
        return _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
    }
    const uint8_t *b = row + t / 8 * block_bytes(type);
    const int j = (int)(t % 8);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    if (type == Q6_K) {
        const int h = j / 4, u = j % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (u & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        const __m256i lo = _mm256_and_si256(u < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * u), _mm256_set1_epi8(3));
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * u;
        const float d = half(b + 208);
        *scale = _mm256_setr_m128(_mm_set1_ps(d * sc[0]), _mm_set1_ps(d * sc[1]));
        return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)),
                               _mm256_set1_epi8(32));
    }
    int sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    *scale = _mm256_set1_ps(half(b) * sc);
    *min = -half(b + 2) * m;
    const __m256i qs = _mm256_loadu_si256((const __m256i *)(b + (type == Q5_K ? 48 : 16) + 32 * (j / 2)));
    __m256i v = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(qs, 4) : qs, low4);
    if (type == Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
        v = _mm256_or_si256(v, _mm256_slli_epi16(bit, 4));
    }
    return v;
}

static inline float hsum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* Output channels [j0, j1) for rows [r0, r0 + rows), rows <= RT. */
static inline __attribute__((always_inline)) void
channels(const int type, const int vnni, const uint8_t *w, int64_t row_bytes, int64_t j0,
         int64_t j1, int64_t k, const int8_t *q, const float *d, const float *s, int64_t r0,
         const int rows, void *out, int64_t ldo, const int is_bf16) {
    const int is_signed = is_signed_type(type);
    const int has_min = type == Q4_1 || type == Q5_1 || type == Q4_K || type == Q5_K;
    const int64_t subs = k / 32;
    for (int64_t j = j0; j < j1; ++j) {
        const uint8_t *row = w + j * row_bytes;
        __m256 acc[RT];
        float mins[RT];
        for (int i = 0; i < rows; ++i) {
            acc[i] = _mm256_setzero_ps();
            mins[i] = 0.0f;
        }
        for (int64_t t = 0; t < subs; ++t) {
            __m256 scale;
            float min;
            const __m256i v = decode_vec(type, row, t, &scale, &min);
            const __m256i u = is_signed ? _mm256_sign_epi8(v, v) : v;
            for (int i = 0; i < rows; ++i) {
                const int64_t r = r0 + i;
                __m256i x = _mm256_loadu_si256((const __m256i *)(q + r * k + 32 * t));
                if (is_signed) x = _mm256_sign_epi8(x, v);
                const __m256 p = _mm256_cvtepi32_ps(dot(u, x, vnni));
                const __m256 ds = _mm256_mul_ps(scale, _mm256_set1_ps(d[r * subs + t]));
                acc[i] = _mm256_fmadd_ps(p, ds, acc[i]);
                if (has_min) mins[i] += min * s[r * subs + t];
            }
        }
        for (int i = 0; i < rows; ++i)
            store(out, (r0 + i) * ldo + j, hsum(acc[i]) + mins[i], is_bf16);
    }
}

/* One share of the output channels, [j0, j1), for every row, by a kernel specialized for one
 * type and dot product (the compiler then drops the other types' branches from its loops). */
typedef void (*share_fn)(const uint8_t *w, int64_t j0, int64_t j1, int64_t k, const int8_t *q,
                         const float *d, const float *s, int64_t m, void *out, int64_t ldo,
                         int is_bf16);

#define SHARES(T, V)                                                                            \
    static void share_##T##_##V(const uint8_t *w, int64_t j0, int64_t j1, int64_t k,            \
                                const int8_t *q, const float *d, const float *s, int64_t m,     \
                                void *out, int64_t ldo, int is_bf16) {                          \
        for (int64_t r0 = 0; r0 < m; r0 += RT)                                                  \
            channels(T, V, w, gguf_row_bytes(T, k), j0, j1, k, q, d, s, r0,                     \
                     m - r0 < RT ? (int)(m - r0) : RT, out, ldo, is_bf16);                      \
    }
#define SHARES_X8(T, V)                                                                         \
    static void share_x8_##T##_##V(const uint8_t *w, int64_t j0, int64_t j1, int64_t k,         \
                                   const int8_t *q, const float *d, const float *s, int64_t m,  \
                                   void *out, int64_t ldo, int is_bf16) {                       \
        /* whole passes and one row (a decode's) with the count known: accumulators in registers */ \
        int64_t r0 = 0;                                                                         \
        for (; r0 + RX <= m; r0 += RX)                                                          \
            groups_x8(T, V, w, j0 / X8, j1 / X8, k, q, d, s, r0, RX, out, ldo, is_bf16);        \
        if (m - r0 == 1)                                                                        \
            groups_x8(T, V, w, j0 / X8, j1 / X8, k, q, d, s, r0, 1, out, ldo, is_bf16);         \
        else if (m > r0)                                                                        \
            groups_x8(T, V, w, j0 / X8, j1 / X8, k, q, d, s, r0, (int)(m - r0), out, ldo,       \
                      is_bf16);                                                                 \
    }
SHARES(Q4_0, 0) SHARES(Q4_1, 0) SHARES(Q5_0, 0) SHARES(Q5_1, 0) SHARES(Q8_0, 0)
SHARES(Q4_K, 0) SHARES(Q5_K, 0) SHARES(Q6_K, 0)
SHARES(Q4_0, 1) SHARES(Q4_1, 1) SHARES(Q5_0, 1) SHARES(Q5_1, 1) SHARES(Q8_0, 1)
SHARES(Q4_K, 1) SHARES(Q5_K, 1) SHARES(Q6_K, 1)
SHARES_X8(Q4_0, 0) SHARES_X8(Q4_1, 0) SHARES_X8(Q5_0, 0) SHARES_X8(Q5_1, 0) SHARES_X8(Q8_0, 0)
SHARES_X8(Q4_0, 1) SHARES_X8(Q4_1, 1) SHARES_X8(Q5_0, 1) SHARES_X8(Q5_1, 1) SHARES_X8(Q8_0, 1)

#define PICK(P, T)                                                                              \
    case T:                                                                                     \
        return vnni ? P##T##_1 : P##T##_0;

static share_fn pick(int type, int vnni, int interleaved) {
    if (interleaved) {
        switch (type) {
            PICK(share_x8_, Q4_0) PICK(share_x8_, Q4_1) PICK(share_x8_, Q5_0)
            PICK(share_x8_, Q5_1) PICK(share_x8_, Q8_0)
        }
        return NULL;
    }
    switch (type) {
        PICK(share_, Q4_0) PICK(share_, Q4_1) PICK(share_, Q5_0) PICK(share_, Q5_1)
        PICK(share_, Q8_0) PICK(share_, Q4_K) PICK(share_, Q5_K) PICK(share_, Q6_K)
    }
    return NULL;
}

/* The output channels shared out to the threads, XV at a time (one interleaved vector's). */
static void share_out(share_fn share, const uint8_t *w, int64_t n, int64_t k, const int8_t *q,
                      const float *d, const float *s, int64_t m, void *out, int64_t ldo,
                      int is_bf16) {
    const int64_t chunk = XV;
#pragma omp parallel for schedule(static) if (m * n * k >= PARALLEL_MIN_MACS)
    for (int64_t j0 = 0; j0 < n; j0 += chunk)
        share(w, j0, j0 + chunk < n ? j0 + chunk : n, k, q, d, s, m, out, ldo, is_bf16);
}
#endif

/* w in the file's order, or `interleaved` (gguf_x8.h). Returns 0, or -1 (nothing written) for
 * a type not served here, a k that is not whole blocks, a layout the type (or n) does not
 * have, or a build without AVX2. */
int gguf_gemm(int64_t type, const uint8_t *w, int64_t n, int64_t k, const int8_t *q,
              const float *d, const float *s, int64_t m, void *out, int64_t ldo, int64_t is_bf16,
              int64_t interleaved) {
#if HAVE_AVX2
    const share_fn share = pick((int)type, use_vnni, (int)interleaved);
    if (!gguf_row_bytes(type, k) || !share || (interleaved && n % X8)) return -1;
    share_out(share, w, n, k, q, d, s, m, out, ldo, (int)is_bf16);
    return 0;
#else
    (void)type, (void)w, (void)n, (void)k, (void)q, (void)d, (void)s, (void)m, (void)out;
    (void)ldo, (void)is_bf16, (void)interleaved;
    return -1;
#endif
}
