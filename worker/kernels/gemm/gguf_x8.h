/* GGUF blocks interleaved eight output channels at a time (gguf_gemm.c's `interleaved` layout),
 * for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, where a tensor's channels come in whole groups of 8.
 *
 * Why: read as the file stores them, one channel at a time, each 32 weights cost ~15
 * instructions of decoding and scaling (two float16 conversions, the nibble unpack, a float
 * conversion and multiply per row, a scalar min term), so a one-row matmul was compute-bound at
 * ~2x the time the bf16 kernel takes to stream twice the bytes. Interleaved, one vector load
 * serves eight channels: a group's sub-block t (32 weights of each of its 8 channels) is one
 * tile of the same bytes as the 8 file blocks, rearranged,
 *
 *   Q4_0: d[8] (float16), qs[128]          Q4_1: d[8], m[8], qs[128]          Q8_0: d[8], qs[256]
 *   Q5_0: d[8], qh[8] (32 bits), qs[128]   Q5_1: d[8], m[8], qh[8], qs[128]
 *
 * where qs is the 8 blocks' quants as 32-bit words, word w of channel c at word 8 * w + c. A
 * 256-bit load of qs then holds four weights of each channel in its eight 32-bit lanes (Q4: the
 * low nibbles weights 4v..4v+3, the high ones 16+4v.., of load v; Q8: weights 4v..4v+3), and
 * one u8 x s8 dot product against the activations' matching 4 bytes, broadcast, adds them into
 * each channel's own int32 lane. The scales convert 8 at a time. Q4's nibbles stay unsigned
 * (0..15; Q5's 0..31 with the fifth bits, 4 of each lane's 32 moved into its 4 bytes): Q4_0's
 * offset of 8 (Q5_0's 16) becomes a min of -8 d (-16 d) that multiplies s = d_x * sum(q), as
 * Q4_1's min does. Q8_0 with VNNI reads w + 128 (w ^ 0x80, unsigned) and a min of -128 d;
 * without VNNI it goes through the sign trick (vpmaddubsw would saturate on 255 x 127 pairs).
 * Per 32 weights of 8 channels and one row: 4 or 8 loads, 8 dot products and 4 float
 * operations, so one row is bound by reading the bytes. A tile is decoded once for up to RX
 * rows (its 8 vectors stay in registers), every row keeping one float accumulator, one scale
 * per sub-block and row. With AVX-512 VNNI two groups' tiles share each 512-bit vector
 * (gguf_lanes.h), so every instruction serves 16 channels.
 *
 * NOTE: included by gguf_gemm.c after its block helpers (block_bytes, decode_sub, store); a
 * tile's size is 8 blocks', so a tensor keeps its bytes and its [rows, row bytes] shape. */

#define X8 8 /* channels per group */
#if defined(__AVX512VL__)
#define RX 8 /* rows per pass over a group's tiles: 8 vectors + 2 scales + RX accumulators */
#else
#define RX 4 /* AVX2's 16 registers */
#endif

static inline int interleaves(int type) {
    return type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1 || type == Q8_0;
}

/* A block's bytes before its quants, per channel: the scale (2), Q4_1 / Q5_1's min (2), Q5's
 * fifth bits (4); a tile holds the 8 channels' of each side by side, in that order. */
static inline int64_t x8_head(int type) {
    return 2 + 2 * (type == Q4_1 || type == Q5_1) + 4 * (type == Q5_0 || type == Q5_1);
}

/* Where channel c's block of sub-block t lives in both layouts: file block at `file`, tile at
 * `tile`; `to_tile` says which way its bytes go. */
static void x8_move(int type, uint8_t *file, uint8_t *tile, int c, int to_tile) {
    const int64_t head = x8_head(type), words = type == Q8_0 ? 8 : 4; /* of quants */
    for (int64_t at = 0; at < head;) { /* d, (m), (qh): 2, 2, 4 bytes a channel */
        const int64_t size = at == head - 4 && head > 4 ? 4 : 2; /* qh, the last, is 4 */
        if (to_tile)
            memcpy(tile + X8 * at + size * c, file + at, size);
        else
            memcpy(file + at, tile + X8 * at + size * c, size);
        at += size;
    }
    for (int64_t w = 0; w < words; ++w)
        if (to_tile)
            memcpy(tile + X8 * head + 4 * (X8 * w + c), file + head + 4 * w, 4);
        else
            memcpy(file + head + 4 * w, tile + X8 * head + 4 * (X8 * w + c), 4);
}

/* Rows [0, n) of w (the file's order) -> out, interleaved. Returns -1 (nothing written) for a
 * type without the layout, n not whole groups or k not whole blocks. */
int gguf_interleave(int64_t type, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    const int64_t row_bytes = gguf_row_bytes(type, k), bytes = block_bytes((int)type);
    if (!row_bytes || !interleaves((int)type) || n % X8) return -1;
    const int64_t subs = k / 32;
#pragma omp parallel for if (n * k >= (1 << 20))
    for (int64_t j = 0; j < n; ++j)
        for (int64_t t = 0; t < subs; ++t) {
            uint8_t *tile = out + ((j / X8) * subs + t) * X8 * bytes;
            x8_move((int)type, (uint8_t *)(w + j * row_bytes + t * bytes), tile, (int)(j % X8), 1);
        }
    return 0;
}

/* Channel j's sub-block t of an interleaved tensor, as decode_sub reads the file's. */
static void decode_sub_x8(int type, const uint8_t *w, int64_t k, int64_t j, int64_t t,
                          struct sub *o) {
    const int64_t bytes = block_bytes(type), subs = k / 32;
    uint8_t block[34]; /* the largest of the interleaved types' blocks (Q8_0) */
    x8_move(type, block, (uint8_t *)(w + ((j / X8) * subs + t) * X8 * bytes), (int)(j % X8), 0);
    decode_sub(type, block, 0, o);
}

#if HAVE_AVX2
#include "gguf_lanes.h"

/* Bits [at, at + 4) of each 32-bit lane of qh -> 0x10 in the lane's bytes 0..3 (bit at + j in
 * byte j): x * 0x00204081 puts bit j of a 4-bit x at bit 8 j, with no carries. */
static inline xvi fifth_bits_x8(xvi qh, int at) {
    const xvi x = xv_and(xv_srli32(qh, at), xv_set32(0xF));
    const xvi spread = xv_mullo32(x, xv_set32(0x00204081));
    return xv_slli32(xv_and(spread, xv_set32(0x01010101)), 4);
}

static inline xvi broadcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return xv_set32(v);
}

/* Groups [g0, g1) of 8 channels for rows [r0, r0 + rows), rows <= RX, XV / 8 groups a pass (a
 * last odd group reads its own tile twice and stores the low half). */
static inline __attribute__((always_inline)) void
groups_x8(const int type, const int vnni, const uint8_t *w, int64_t g0, int64_t g1, int64_t k,
          const int8_t *q, const float *d, const float *s, int64_t r0, const int rows, void *out,
          int64_t ldo, const int is_bf16) {
    const int64_t subs = k / 32, tile_bytes = X8 * block_bytes(type), head = X8 * x8_head(type);
    const int per = XV / X8;
    /* Q8_0 with VNNI: w + 128 (w ^ 0x80) unsigned, and -128 d a min, as Q4_0's offset is; the
     * AVX2 sums would saturate on it (two products of 255 x 127), so they take the sign trick */
    const int offset8 = type == Q8_0 && vnni;
    const int with_min = type != Q8_0 || offset8;
    for (int64_t g = g0; g < g1; g += per) {
        const int64_t g_b = g + per - 1 < g1 ? g + per - 1 : g, lanes = (1 + (g_b != g)) * X8;
        xvf acc[RX];
        for (int i = 0; i < rows; ++i) acc[i] = xf_zero();
        for (int64_t t = 0; t < subs; ++t) {
            const uint8_t *a = w + (g * subs + t) * tile_bytes, *b = w + (g_b * subs + t) * tile_bytes;
            const uint8_t *qa = a + head, *qb = b + head;
            const xvf dw = xv_halves(a, b);
            const xvf mw = type == Q4_1 || type == Q5_1 ? xv_halves(a + 16, b + 16)
                           : type == Q4_0            ? xf_mul(dw, xf_set(-8.0f))
                           : type == Q5_0            ? xf_mul(dw, xf_set(-16.0f))
                           : offset8                 ? xf_mul(dw, xf_set(-128.0f))
                                                     : xf_zero();
            xvi u[8]; /* u[v]: 4 weights of each channel, meeting x[4v .. 4v + 3] */
            if (type == Q8_0) {
                for (int v = 0; v < 8; ++v) {
                    const xvi raw = xv_tiles(qa + 32 * v, qb + 32 * v);
                    u[v] = offset8 ? xv_xor(raw, xv_set8(-128)) : xv_abs8(raw);
                }
            } else {
                for (int v = 0; v < 4; ++v) {
                    const xvi both = xv_tiles(qa + 32 * v, qb + 32 * v);
                    u[v] = xv_and(both, xv_set8(0x0F));
                    u[v + 4] = xv_and(xv_srli16(both, 4), xv_set8(0x0F));
                }
                if (type == Q5_0 || type == Q5_1) { /* a lane's 32 fifth bits: weight i's, bit i */
                    const xvi qh = xv_tiles(qa - 32, qb - 32);
                    for (int v = 0; v < 8; ++v) /* bits 4v..4v+3 -> 0x10 in bytes 0..3 */
                        u[v] = xv_or(u[v], fifth_bits_x8(qh, 4 * v));
                }
            }
            for (int i = 0; i < rows; ++i) {
                const int64_t r = r0 + i;
                const int8_t *x = q + r * k + 32 * t;
                xvi sum0 = xv_zero(), sum1 = xv_zero();
                for (int v = 0; v < 8; v += 2) { /* two chains of dependent dot products */
                    xvi x0 = broadcast4(x + 4 * v), x1 = broadcast4(x + 4 * v + 4);
                    if (type == Q8_0 && !offset8) {
                        x0 = xv_sign8(x0, xv_tiles(qa + 32 * v, qb + 32 * v));
                        x1 = xv_sign8(x1, xv_tiles(qa + 32 * v + 32, qb + 32 * v + 32));
                    }
                    sum0 = xv_dot_add(sum0, u[v], x0, vnni);
                    sum1 = xv_dot_add(sum1, u[v + 1], x1, vnni);
                }
                const xvf p = xf_from32(xv_add32(sum0, sum1));
                acc[i] = xf_fmadd(p, xf_mul(dw, xf_set(d[r * subs + t])), acc[i]);
                if (with_min) acc[i] = xf_fmadd(mw, xf_set(s[r * subs + t]), acc[i]);
            }
        }
        for (int i = 0; i < rows; ++i) {
            float v[XV];
            xf_store(v, acc[i]);
            for (int c = 0; c < lanes; ++c) store(out, (r0 + i) * ldo + g * X8 + c, v[c], is_bf16);
        }
    }
}

#endif
