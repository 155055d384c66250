/* The K-quants (Q4_K, Q5_K, Q6_K) interleaved eight output channels at a time, as gguf_x8.h
 * does for the 32-weight types: a group's super-block b (256 weights of each of its 8
 * channels) is one tile of the same bytes as the 8 file blocks, rearranged, so a tensor keeps
 * its bytes and its [rows, row bytes] shape (resident bytes are the file's).
 *
 * Each block is three fields, each interleaved by its own unit: byte `at` of channel c's
 * block goes to byte 8 at + c unit of the tile (unit-sized pieces, channel by channel):
 *
 *   Q4_K  d, dmin (float16, unit 2) | scales[12] (unit 1) | qs[128] (unit 4)
 *   Q5_K  d, dmin (unit 2)          | scales[12] (unit 1) | qh[32], qs[128] (unit 4)
 *   Q6_K  ql[128], qh[64] (unit 4)  | scales[16] int8 (unit 1) | d (unit 2)
 *
 * so 8 channels' float16 scales convert in one instruction, a scale byte's 8 channels load as
 * 8 bytes (the 6-bit scales and mins of Q4_K / Q5_K unpack for 8 channels at once, once per
 * tile and sub-block, shared by every row), and a 256-bit load of quants holds 4 bytes of each
 * channel in its eight 32-bit lanes: 4 weights of each channel (after the nibble and the high
 * bits are put together) that one u8 x s8 dot product meets with the activations' 4 matching
 * bytes, broadcast. All three types stay unsigned (Q6_K's q - 32 becomes 32 times the sum of
 * the activations' 16 integers that meet one scale, taken once a call); the dot products of a
 * sub-block's 32 weights are two chains of four, weights 0-15 and 16-31 (Q6_K's two scales).
 *
 * NOTE: included by gguf_kquant.c after gguf_gemm.c and gguf_x8.h (block_bytes, decode_sub,
 * store, X8, RX, dot_add256); its broadcast is its own (gguf_x8.h's is as wide as the build's
 * vectors). */

static inline int kx8_type(int type) { return type == Q4_K || type == Q5_K || type == Q6_K; }

/* The fields of a block: [start, end) of the file's bytes, interleaved by `unit` bytes. */
struct kx8_field {
    int start, end, unit;
};
static const struct kx8_field KX8_FIELDS[3][3] = {
    {{0, 4, 2}, {4, 16, 1}, {16, 144, 4}},     /* Q4_K */
    {{0, 4, 2}, {4, 16, 1}, {16, 176, 4}},     /* Q5_K */
    {{0, 192, 4}, {192, 208, 1}, {208, 210, 2}}, /* Q6_K */
};

/* Channel c's block between the file's order (`file`) and its group's tile; `to_tile` says
 * which way the bytes go. */
static void kx8_move(int type, uint8_t *file, uint8_t *tile, int c, int to_tile) {
    for (int f = 0; f < 3; ++f) {
        const struct kx8_field field = KX8_FIELDS[type - Q4_K][f];
        for (int at = field.start; at < field.end; at += field.unit)
            if (to_tile)
                memcpy(tile + X8 * at + field.unit * c, file + at, field.unit);
            else
                memcpy(file + at, tile + X8 * at + field.unit * c, field.unit);
    }
}

/* Rows [0, n) of w (the file's order) -> out, interleaved. -1 (nothing written) for a type
 * other than the K-quants, n not whole groups or k not whole blocks. */
static int kx8_interleave(int type, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    const int64_t row_bytes = gguf_row_bytes(type, k), bytes = block_bytes(type);
    if (!row_bytes || !kx8_type(type) || n % X8) return -1;
    const int64_t supers = k / 256;
#pragma omp parallel for if (n * k >= (1 << 20))
    for (int64_t j = 0; j < n; ++j)
        for (int64_t b = 0; b < supers; ++b)
            kx8_move(type, (uint8_t *)(w + j * row_bytes + b * bytes),
                     out + ((j / X8) * supers + b) * X8 * bytes, (int)(j % X8), 1);
    return 0;
}

/* rows[r] of an interleaved w (all rows where rows is NULL) to out [count, k]: each block put
 * back in the file's order, then decoded as gguf_dequantize decodes the file's. */
static int kx8_dequantize(int type, const uint8_t *w, int64_t k, const int64_t *rows,
                          int64_t count, void *out, int is_bf16) {
    if (!gguf_row_bytes(type, k) || !kx8_type(type)) return -1;
    const int64_t bytes = block_bytes(type), supers = k / 256;
#pragma omp parallel for if (count * k >= (1 << 20))
    for (int64_t r = 0; r < count; ++r) {
        const int64_t j = rows ? rows[r] : r;
        uint8_t block[210]; /* the largest K-quant block (Q6_K) */
        struct sub o;
        for (int64_t b = 0; b < supers; ++b) {
            kx8_move(type, block, (uint8_t *)(w + ((j / X8) * supers + b) * X8 * bytes),
                     (int)(j % X8), 0);
            for (int t = 0; t < 8; ++t) {
                decode_sub(type, block, t, &o);
                for (int i = 0; i < 32; ++i)
                    store(out, r * k + 256 * b + 32 * t + i, o.scale[i / 16] * o.v[i] + o.min,
                          is_bf16);
            }
        }
    }
    return 0;
}

#if HAVE_AVX2
static inline __m256i kx8_broadcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

/* 8 channels' float16 scales at p as 8 float lanes. */
static inline __m256 halves_x8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Q6_K: 8 channels' int8 scales at p as 8 float lanes. */
static inline __m256 int8s_x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Byte row `row` of a tile's scales (one byte of each of 8 channels) as 8 int32 lanes. */
static inline __m256i bytes_x8(const uint8_t *scales, int row) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(scales + X8 * row)));
}

/* Q4_K / Q5_K: sub-block j's 6-bit scale (mins = 0) or min (mins = 1) of 8 channels, from the
 * tile's 12 scale rows, as scale_min_k4 unpacks one channel's. */
static inline __m256 scales6_x8(const uint8_t *scales, int j, int mins) {
    __m256i v;
    if (j < 4) {
        v = _mm256_and_si256(bytes_x8(scales, j + 4 * mins), _mm256_set1_epi32(63));
    } else {
        const __m256i low = bytes_x8(scales, j + 4);
        const __m256i high = _mm256_srli_epi32(bytes_x8(scales, j - 4 + 4 * mins), 6);
        v = _mm256_or_si256(mins ? _mm256_srli_epi32(low, 4)
                                 : _mm256_and_si256(low, _mm256_set1_epi32(0xF)),
                            _mm256_slli_epi32(high, 4));
    }
    return _mm256_cvtepi32_ps(v);
}

/* Sub-block j of a tile: u[v] = weights 4v..4v+3 of each channel (0..15, 0..31, 0..63). */
static inline __attribute__((always_inline)) void kx8_decode(const int type, const uint8_t *tile,
                                                             int j, __m256i u[8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    if (type == Q6_K) { /* ql: 4 runs of 32 bytes a channel, qh: 2 */
        const int h = j / 4, part = j % 4;
        const uint8_t *ql = tile + X8 * (64 * h + 32 * (part & 1));
        const uint8_t *qh = tile + X8 * (128 + 32 * h);
        for (int v = 0; v < 8; ++v) {
            const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * v));
            const __m256i b = _mm256_loadu_si256((const __m256i *)(qh + 32 * v));
            /* bits 2 part, 2 part + 1 of qh -> bits 4, 5 (shifts within each byte's 16 bits) */
            const __m256i hb = part < 2 ? _mm256_slli_epi16(b, 4 - 2 * part)
                                        : _mm256_srli_epi16(b, 2 * part - 4);
            u[v] = _mm256_or_si256(_mm256_and_si256(part < 2 ? l : _mm256_srli_epi16(l, 4), low4),
                                   _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
        }
        return;
    }
    const uint8_t *qs = tile + X8 * ((type == Q5_K ? 48 : 16) + 32 * (j / 2));
    for (int v = 0; v < 8; ++v) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * v));
        u[v] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(b, 4) : b, low4);
        if (type == Q5_K) { /* bit j of qh's byte -> 0x10 */
            const __m256i h = _mm256_loadu_si256((const __m256i *)(tile + X8 * 16 + 32 * v));
            const __m256i bit = j < 4 ? _mm256_slli_epi16(h, 4 - j) : _mm256_srli_epi16(h, j - 4);
            u[v] = _mm256_or_si256(u[v], _mm256_and_si256(bit, _mm256_set1_epi8(0x10)));
        }
    }
}

/* Groups [g0, g1) of 8 channels for rows [r0, r0 + rows), rows <= RX. x32: Q6_K's offsets,
 * 32 times the sum of each 16 activation integers, [m, k / 16]. */
static inline __attribute__((always_inline)) void
kgroups_x8(const int type, const int vnni, const uint8_t *w, int64_t g0, int64_t g1, int64_t k,
           const int8_t *q, const float *d, const float *s, const int32_t *x32, int64_t r0,
           const int rows, void *out, int64_t ldo, const int is_bf16) {
    const int64_t supers = k / 256, subs = k / 32, tile_bytes = X8 * block_bytes(type);
    for (int64_t g = g0; g < g1; ++g) {
        __m256 acc[RX];
        for (int i = 0; i < rows; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t b = 0; b < supers; ++b) {
            const uint8_t *tile = w + (g * supers + b) * tile_bytes;
            const int is_q6 = type == Q6_K;
            const __m256 dw = halves_x8(tile + (is_q6 ? X8 * 208 : 0));
            const __m256 mw = is_q6 ? dw : halves_x8(tile + 16);
            for (int j = 0; j < 8; ++j) {
                const int64_t t = 8 * b + j;
                __m256i u[8];
                kx8_decode(type, tile, j, u);
                __m256 sa, sb, mn = _mm256_setzero_ps(); /* weights 0-15's, 16-31's scales; min */
                if (is_q6) {
                    const uint8_t *sc = tile + X8 * (192 + 2 * j);
                    sa = _mm256_mul_ps(dw, int8s_x8(sc));
                    sb = _mm256_mul_ps(dw, int8s_x8(sc + X8));
                } else {
                    sa = sb = _mm256_mul_ps(dw, scales6_x8(tile + X8 * 4, j, 0));
                    mn = _mm256_mul_ps(mw, scales6_x8(tile + X8 * 4, j, 1));
                }
                for (int i = 0; i < rows; ++i) {
                    const int64_t r = r0 + i;
                    const int8_t *x = q + r * k + 32 * t;
                    __m256i sum0 = _mm256_setzero_si256(), sum1 = _mm256_setzero_si256();
                    for (int v = 0; v < 4; ++v) { /* weights 0-15, 16-31: two chains */
                        sum0 = dot_add256(sum0, u[v], kx8_broadcast4(x + 4 * v), vnni);
                        sum1 = dot_add256(sum1, u[v + 4], kx8_broadcast4(x + 16 + 4 * v), vnni);
                    }
                    const __m256 dx = _mm256_set1_ps(d[r * subs + t]);
                    if (is_q6) { /* (q - 32) . x = q . x - 32 sum(x), per 16 */
                        const int32_t *off = x32 + r * (k / 16) + 2 * t;
                        sum0 = _mm256_sub_epi32(sum0, _mm256_set1_epi32(off[0]));
                        sum1 = _mm256_sub_epi32(sum1, _mm256_set1_epi32(off[1]));
                        const __m256 p0 = _mm256_mul_ps(_mm256_cvtepi32_ps(sum0), sa);
                        const __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum1), sb, p0);
                        acc[i] = _mm256_fmadd_ps(y, dx, acc[i]);
                    } else { /* d sc (q . x) - dmin m sum(x) */
                        const __m256 p = _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1));
                        acc[i] = _mm256_fmadd_ps(p, _mm256_mul_ps(sa, dx), acc[i]);
                        acc[i] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(s[r * subs + t]), acc[i]);
                    }
                }
            }
        }
        for (int i = 0; i < rows; ++i) {
            float v[X8];
            _mm256_storeu_ps(v, acc[i]);
            for (int c = 0; c < X8; ++c) store(out, (r0 + i) * ldo + g * X8 + c, v[c], is_bf16);
        }
    }
}
#endif
