/* The vectors of the interleaved kernel (gguf_x8.h): one int32 or float lane per output channel,
 * XV channels a vector. Where the build has AVX-512 BW and VNNI, XV = 16: a 512-bit register
 * holds two groups' tiles side by side (the low half group g's, the high half group g + 1's,
 * loaded from their two addresses), so each instruction serves twice the channels of a 256-bit
 * one (measured: on a 2-core Xeon with two 512-bit VNNI ports, ~1.8x the dot products a second;
 * on Zen 4, which splits a 512-bit operation in two, the same dot products with half the other
 * instructions). Elsewhere XV = 8, one group in 256 bits, and `b` (the second group) is unused.
 *
 * NOTE: included by gguf_x8.h, under HAVE_AVX2. */

/* u8 x s8 dot products of 4 bytes into eight int32 lanes, on every build (the K-quant kernels,
 * gguf_kx8.h, stay 256 bits wide). */
static inline __attribute__((always_inline)) __m256i dot_add256(__m256i acc, __m256i u, __m256i x,
                                                                const int vnni) {
#if HAVE_VNNI
    if (vnni) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
        return _mm256_dpbusd_epi32(acc, u, x);
#else
        return _mm256_dpbusd_avx_epi32(acc, u, x);
#endif
    }
#endif
    (void)vnni;
    const __m256i pairs = _mm256_maddubs_epi16(u, x);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define XV 16
typedef __m512i xvi;
typedef __m512 xvf;

/* 32 bytes at a (group g) and 32 at b (group g + 1) */
static inline xvi xv_tiles(const uint8_t *a, const uint8_t *b) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)a);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256((const __m256i *)b), 1);
}

/* 8 float16 at a and 8 at b, as 16 floats */
static inline xvf xv_halves(const uint8_t *a, const uint8_t *b) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)a);
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(lo), _mm_loadu_si128((const __m128i *)b), 1);
    return _mm512_cvtph_ps(both);
}

#define xv_and _mm512_and_si512
#define xv_or _mm512_or_si512
#define xv_xor _mm512_xor_si512
#define xv_abs8 _mm512_abs_epi8
#define xv_add32 _mm512_add_epi32
#define xv_mullo32 _mm512_mullo_epi32
#define xv_srli16 _mm512_srli_epi16
#define xv_srli32 _mm512_srli_epi32
#define xv_slli32 _mm512_slli_epi32
#define xv_set8 _mm512_set1_epi8
#define xv_set32 _mm512_set1_epi32
#define xv_zero _mm512_setzero_si512
#define xf_set _mm512_set1_ps
#define xf_zero _mm512_setzero_ps
#define xf_mul _mm512_mul_ps
#define xf_fmadd _mm512_fmadd_ps
#define xf_from32 _mm512_cvtepi32_ps
#define xf_store _mm512_storeu_ps

/* x with w's sign (0 where w is 0): AVX-512 has no vpsignb */
static inline xvi xv_sign8(xvi x, xvi w) {
    x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(w, w), x);
}

static inline __attribute__((always_inline)) xvi xv_dot_add(xvi acc, xvi u, xvi x, const int vnni) {
    if (vnni) return _mm512_dpbusd_epi32(acc, u, x);
    const __m512i pairs = _mm512_maddubs_epi16(u, x);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}
#else
#define XV 8
typedef __m256i xvi;
typedef __m256 xvf;

static inline xvi xv_tiles(const uint8_t *a, const uint8_t *b) {
    (void)b;
    return _mm256_loadu_si256((const __m256i *)a);
}

static inline xvf xv_halves(const uint8_t *a, const uint8_t *b) {
    (void)b;
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)a));
}

#define xv_and _mm256_and_si256
#define xv_or _mm256_or_si256
#define xv_xor _mm256_xor_si256
#define xv_abs8 _mm256_abs_epi8
#define xv_add32 _mm256_add_epi32
#define xv_mullo32 _mm256_mullo_epi32
#define xv_srli16 _mm256_srli_epi16
#define xv_srli32 _mm256_srli_epi32
#define xv_slli32 _mm256_slli_epi32
#define xv_set8 _mm256_set1_epi8
#define xv_set32 _mm256_set1_epi32
#define xv_zero _mm256_setzero_si256
#define xf_set _mm256_set1_ps
#define xf_zero _mm256_setzero_ps
#define xf_mul _mm256_mul_ps
#define xf_fmadd _mm256_fmadd_ps
#define xf_from32 _mm256_cvtepi32_ps
#define xf_store _mm256_storeu_ps
#define xv_sign8 _mm256_sign_epi8

#define xv_dot_add dot_add256
#endif
