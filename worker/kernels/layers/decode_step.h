/* What a decode step in one call shares, whatever its layers (decode_layers.c: Llama's,
 * gemma_layers.c: Gemma 3's): the layout of what Python passes (decode_abi.py mirrors it), one
 * projection on whichever kernel holds its weight, and the step's two ends before the first
 * layer: its buffers, the token embeddings and the rows of the rotary tables. */
#ifndef INTENTSERVE_DECODE_STEP_H
#define INTENTSERVE_DECODE_STEP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tiles.h"
#include "vec16.h"

typedef void (*add_rmsnorm_fn)(const void *x, void *residual, const void *weight, void *out,
                               int64_t rows, int64_t hidden, float eps);
typedef int (*gemm_fn)(const void *x, int64_t m, int64_t k, const void *packed,
                       const float *bias, int64_t n, void *out, int64_t out_f32);
typedef void (*rotary_fn)(void *qkv, int64_t row_stride, const void *cos, const void *sin,
                          int64_t rows, int64_t num_heads, int64_t head_dim);
typedef void (*kv_store_fn)(const char *k, const char *v, int64_t src_stride_bytes,
                            char *k_cache, char *v_cache, const int64_t *slots, int64_t rows,
                            int64_t row_bytes);
typedef int (*decode_fn)(const void *q, int64_t q_seq_stride, const void *k_cache,
                         const void *v_cache, const int64_t *block_tables, int64_t table_width,
                         const int64_t *context_lens, int64_t num_seqs, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                         int64_t window, float scale, void *out);
typedef void (*silu_mul_fn)(const void *gate_up, void *out, int64_t rows, int64_t inter);
/* gemma_ops.c's: gemma_norm has add_rmsnorm's form (its weight float32), gelu_mul silu_mul's */
typedef void (*qk_norm_rotary_fn)(void *qkv, int64_t row_stride, const float *q_weight,
                                  const float *k_weight, const void *cos, const void *sin,
                                  int64_t rows, int64_t num_heads, int64_t num_kv_heads,
                                  int64_t head_dim, float eps, float q_multiplier);
typedef int (*w8a8_fn)(const void *x, const float *inv_smooth, int64_t m, int64_t k,
                       const int8_t *packed, const int32_t *comp, int64_t n,
                       const float *col_scales, void *out);
/* gguf_gemm.c's three */
typedef void (*gguf_quantize_fn)(const void *x, int64_t m, int64_t k, int64_t is_bf16, int8_t *q,
                                 float *d, float *s);
typedef int (*gguf_gemm_fn)(int64_t type, const uint8_t *w, int64_t n, int64_t k,
                            const int8_t *q, const float *d, const float *s, int64_t m, void *out,
                            int64_t ldo, int64_t is_bf16, int64_t interleaved);
typedef int (*gguf_dequantize_fn)(int64_t type, const uint8_t *w, int64_t k, const int64_t *rows,
                                  int64_t count, void *out, int64_t is_bf16, int64_t interleaved);

/* Filled by worker/model/decode_abi.py (ctypes.Structure of the same layout). A Llama step
 * calls add_rmsnorm, rotary and silu_mul (fused_ops.c), a Gemma step gemma_norm,
 * qk_norm_rotary and gelu_mul (gemma_ops.c); the other three are NULL. */
struct kernels {
    add_rmsnorm_fn add_rmsnorm;
    gemm_fn gemm;
    rotary_fn rotary;
    kv_store_fn kv_store;
    decode_fn decode;
    silu_mul_fn silu_mul;
    w8a8_fn w8a8_linear; /* NULL unless the projections are w8a8 */
    gguf_quantize_fn gguf_quantize; /* these three NULL unless something is held as GGUF blocks */
    gguf_gemm_fn gguf_gemm;
    gguf_dequantize_fn gguf_dequantize;
    add_rmsnorm_fn gemma_norm;
    qk_norm_rotary_fn qk_norm_rotary;
    silu_mul_fn gelu_mul;
};

enum projections { DTYPE_GEMM = 0, W8A8 = 1, GGUF_BLOCKS = 2 };

struct dims {
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    float eps, scale;
    int64_t projections; /* enum projections: the dtype's GEMM (bf16_gemm.c, f32_gemm.c), w8a8
                            (int8_gemm.c) or the file's blocks (gguf_gemm.c) */
    int64_t elem_bytes; /* the activations' and the KV cache's: 2 (bfloat16) or 4 (float32) */
    float q_multiplier; /* Gemma: q's heads times this after rotary (1: not scaled) */
};

/* One GGUF tensor: its blocks, type (ggml's number), output channels and layout. */
struct gguf_part {
    const uint8_t *blocks;
    int64_t type, rows, interleaved;
};

/* One projection: bf16 or float32: weight (packed), bias or NULL, the GEMM's flags (bf16_gemm.c:
 * how the weight is packed); w8a8: weight (packed int8), the channels' compensation (comp), their
 * scales, the inputs' 1 / smoothing factor or NULL; GGUF blocks: its parts (a fused q|k|v or
 * gate|up keeps the file's tensors apart), their outputs side by side. */
struct proj {
    const void *weight, *bias_or_comp, *scales, *inv_smooth;
    int64_t gemm_flags;
    const struct gguf_part *parts;
    int64_t num_parts;
};

/* The step's activations quantized for the GGUF matmuls (gguf_gemm.c): q [m, k], d and s
 * [m, k / 32]. */
struct quantized {
    int8_t *q;
    float *d, *s;
};

/* The model's ends: token ids [m] and positions [m] (int64, bounds checked here), the embedding
 * table [vocab, hidden] (elem_bytes, or GGUF blocks of type embed_type: its rows dequantized),
 * its rows times embed_scale (rounded to the dtype; 0: not scaled), and the final norm's weight
 * (elem_bytes; Gemma's float32), the rotary tables [max_pos, head_dim / 2] float32, rounded to
 * the activations' dtype as the Python path's `.to`; a second pair for the banded layers
 * (Gemma's local base; NULL without). */
struct ends {
    const int64_t *input_ids, *positions;
    const void *embed, *final_norm;
    const float *cos, *sin, *cos_local, *sin_local;
    int64_t vocab, max_pos;
    int64_t embed_type, embed_interleaved; /* 0: a plain table */
    float embed_scale;
};

/* Llama: input_norm, post_norm (post-attention); Gemma adds the pre- and post-feedforward
 * norms and q's and k's (every Gemma norm's weight is float32: 1 + w). local_rope: the layer
 * rotates with ends' local tables. window: its band (0: the whole context). */
struct layer {
    const void *input_norm, *post_norm;
    struct proj qkv, o, gate_up, down;
    void *k_cache, *v_cache;
    int64_t window;
    const float *pre_ff_norm, *post_ff_norm, *q_norm, *k_norm;
    int64_t local_rope;
};

static inline int project(const struct kernels *kern, const struct dims *d,
                          const struct proj *p, const void *x, int64_t m, int64_t in,
                          int64_t out_features, void *out, const struct quantized *qx) {
    if (d->projections == W8A8)
        return kern->w8a8_linear(x, p->inv_smooth, m, in, p->weight, p->bias_or_comp,
                                 out_features, p->scales, out);
    if (d->projections == DTYPE_GEMM)
        return kern->gemm(x, m, in, p->weight, p->bias_or_comp, out_features, out,
                          p->gemm_flags);
    const int64_t e = d->elem_bytes;
    kern->gguf_quantize(x, m, in, e == 2, qx->q, qx->d, qx->s);
    int64_t column = 0;
    for (int64_t i = 0; i < p->num_parts; ++i) {
        const struct gguf_part *part = &p->parts[i];
        const int code = kern->gguf_gemm(part->type, part->blocks, part->rows, in, qx->q, qx->d,
                                         qx->s, m, (char *)out + column * e, out_features,
                                         e == 2, part->interleaved);
        if (code) return code;
        column += part->rows;
    }
    return 0;
}


/* The step's buffers, one allocation (the thread's kept one: a step's size recurs):
 * x (the residual stream) | h | qkv | attention out | gate|up | act | cos | sin | local cos |
 * local sin, [m, width] each in the activations' dtype, then the GGUF matmuls' quantized
 * activations (widest input: d | s | q). */
struct step {
    char *x, *h, *qkv, *att, *gate_up, *act, *cos, *sin, *cos_local, *sin_local;
    struct quantized qx;
    int owned;
};

/* One rotary table's rows at the step's positions, rounded to the activations' dtype. */
static void gather_rope(const float *cos_table, const float *sin_table, const int64_t *positions,
                        int64_t m, int64_t half, int64_t e, char *cos, char *sin) {
    for (int64_t r = 0; r < m; ++r) {
        const float *c = cos_table + positions[r] * half, *s = sin_table + positions[r] * half;
        if (e == 2) {
            for (int64_t i = 0; i < half; ++i) {
                ((uint16_t *)cos)[r * half + i] = f32_to_bf16(c[i]);
                ((uint16_t *)sin)[r * half + i] = f32_to_bf16(s[i]);
            }
        } else {
            memcpy(cos + r * half * e, c, half * e);
            memcpy(sin + r * half * e, s, half * e);
        }
    }
}

static void end_step(struct step *s) {
    if (s->owned) free(s->x);
}

/* Checks the ids and positions, lays out the buffers, writes the embeddings (scaled where
 * ends->embed_scale is set) into x and the rotary rows. Returns 0, -1 when memory ran out, -2
 * for a token id or position out of range, -3 for embedding blocks the GGUF kernel does not
 * read (nothing kept). */
static int begin_step(const struct kernels *kern, const struct dims *d, const struct ends *ends,
                      int64_t m, struct step *s) {
    const int64_t q_size = d->num_heads * d->head_dim, kv_size = d->num_kv_heads * d->head_dim;
    const int64_t width = q_size + 2 * kv_size, inter = d->intermediate, hidden = d->hidden;
    const int64_t half = d->head_dim / 2, e = d->elem_bytes;
    for (int64_t r = 0; r < m; ++r)
        if (ends->input_ids[r] < 0 || ends->input_ids[r] >= ends->vocab ||
            ends->positions[r] < 0 || ends->positions[r] >= ends->max_pos)
            return -2;
    const int64_t tables = ends->cos_local ? 4 : 2;
    const int64_t elems = m * (2 * hidden + width + q_size + 2 * inter + inter + tables * half);
    int64_t widest = hidden > q_size ? hidden : q_size;
    widest = widest > inter ? widest : inter;
    const int64_t quantized_bytes = d->projections == GGUF_BLOCKS ? m * widest * 5 / 4 : 0;
    const int64_t act_bytes = (elems * e + 63) / 64 * 64;
    s->x = kept_scratch(act_bytes + quantized_bytes, &s->owned);
    if (!s->x) return -1;
    s->h = s->x + m * hidden * e;
    s->qkv = s->h + m * hidden * e;
    s->att = s->qkv + m * width * e;
    s->gate_up = s->att + m * q_size * e;
    s->act = s->gate_up + m * 2 * inter * e;
    s->cos = s->act + m * inter * e;
    s->sin = s->cos + m * half * e;
    s->cos_local = ends->cos_local ? s->sin + m * half * e : NULL;
    s->sin_local = ends->cos_local ? s->cos_local + m * half * e : NULL;
    s->qx = (struct quantized){NULL, NULL, NULL};
    if (quantized_bytes) { /* 2 floats per 32 values, then the values' int8 */
        s->qx.d = (float *)(s->x + act_bytes);
        s->qx.s = s->qx.d + m * widest / 32;
        s->qx.q = (int8_t *)(s->qx.s + m * widest / 32);
    }
    if (ends->embed_type && kern->gguf_dequantize(ends->embed_type, ends->embed, hidden,
                                                  ends->input_ids, m, s->x, e == 2,
                                                  ends->embed_interleaved)) {
        end_step(s);
        return -3;
    }
    if (!ends->embed_type)
        for (int64_t r = 0; r < m; ++r)
            memcpy(s->x + r * hidden * e,
                   (const char *)ends->embed + ends->input_ids[r] * hidden * e, hidden * e);
    if (ends->embed_scale != 0.0f) /* Gemma: x * sqrt(hidden), the factor rounded first */
        for (int64_t i = 0; i < m * hidden; i += 16)
            store16(s->x, i, round16(load16(s->x, i, e == 2) * ends->embed_scale, e == 2), e == 2);
    gather_rope(ends->cos, ends->sin, ends->positions, m, half, e, s->cos, s->sin);
    if (ends->cos_local)
        gather_rope(ends->cos_local, ends->sin_local, ends->positions, m, half, e, s->cos_local,
                    s->sin_local);
    return 0;
}

#endif
