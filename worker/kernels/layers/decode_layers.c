/* Every decoder layer of a Llama-family model for one decode step, in one call: bfloat16 (the
 * projections on bf16 weights, on w8a8 ones or on a GGUF file's own blocks) or float32 (on
 * float32 weights or GGUF blocks).
 *
 * A decode step (every sequence adds one token) runs the same ten kernels per layer: add +
 * RMSNorm, the q|k|v matmul, rotary, the K/V store, paged decode attention, the o matmul,
 * add + RMSNorm, the gate|up matmul, SiLU * up, the down matmul. From Python each is a module
 * call, a ctypes call and a few tensors, ~2.5 ms of a ~10 ms one-stream step on SmolLM2
 * (docs/engine.md). Here the same kernels run in the same order on the same buffers: the
 * result is bit for bit the Python path's (tested). The kernels stay in their own libraries and
 * come as function pointers (the caller picks each dtype's), so this file holds only the order;
 * activations are `elem_bytes` wide (2: bfloat16, 4: float32).
 *
 * The step's two ends are here too: the token embeddings and the rows of the rotary tables
 * before the first layer, the model's final norm after the last (from Python they were three
 * module calls and ~0.2 ms of a ~8 ms one-stream step, run with the caches cold after the
 * layers' weights had streamed through them). */
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

/* Filled by worker/model/decode_layers.py (ctypes.Structure of the same layout). */
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
};

enum projections { DTYPE_GEMM = 0, W8A8 = 1, GGUF_BLOCKS = 2 };

struct dims {
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    float eps, scale;
    int64_t projections; /* enum projections: the dtype's GEMM (bf16_gemm.c, f32_gemm.c), w8a8
                            (int8_gemm.c) or the file's blocks (gguf_gemm.c) */
    int64_t elem_bytes; /* the activations' and the KV cache's: 2 (bfloat16) or 4 (float32) */
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
 * table [vocab, hidden] (elem_bytes, or GGUF blocks of type embed_type: its rows dequantized)
 * and the final norm's weight (elem_bytes), the rotary tables [max_pos, head_dim / 2] float32,
 * rounded to the activations' dtype as the Python path's `.to`. */
struct ends {
    const int64_t *input_ids, *positions;
    const void *embed, *final_norm;
    const float *cos, *sin;
    int64_t vocab, max_pos;
    int64_t embed_type, embed_interleaved; /* 0: a plain table */
};

struct layer {
    const void *input_norm, *post_norm;
    struct proj qkv, o, gate_up, down;
    void *k_cache, *v_cache;
    int64_t window;
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

/* out [m, hidden]: the final hidden states of the step's m tokens (every layer, then the final
 * norm), as the Python path's model forward returns them. Returns 0, or the first failing
 * kernel's code (nonzero), -1 when memory ran out, -2 for a token id or position out of range
 * (nothing written), -3 for embedding blocks the GGUF kernel does not read. */
int decode_layers(const struct kernels *kern, const struct dims *d, const struct layer *layers,
                  int64_t num_layers, const struct ends *ends, int64_t m, const int64_t *slots,
                  const int64_t *tables, int64_t table_width, const int64_t *context_lens,
                  void *out) {
    const int64_t q_size = d->num_heads * d->head_dim, kv_size = d->num_kv_heads * d->head_dim;
    const int64_t width = q_size + 2 * kv_size, inter = d->intermediate, hidden = d->hidden;
    const int64_t half = d->head_dim / 2;
    for (int64_t r = 0; r < m; ++r)
        if (ends->input_ids[r] < 0 || ends->input_ids[r] >= ends->vocab ||
            ends->positions[r] < 0 || ends->positions[r] >= ends->max_pos)
            return -2;
    /* x (the residual stream) | h | qkv | attention out | gate|up | act | cos | sin, then the
     * GGUF matmuls' quantized activations (widest input: d | s | q), one allocation */
    const int64_t elems = m * (2 * hidden + width + q_size + 2 * inter + inter + 2 * half);
    const int64_t e = d->elem_bytes;
    int64_t widest = hidden > q_size ? hidden : q_size;
    widest = widest > inter ? widest : inter;
    const int64_t quantized_bytes = d->projections == GGUF_BLOCKS ? m * widest * 5 / 4 : 0;
    const int64_t act_bytes = (elems * e + 63) / 64 * 64;
    int owned = 0; /* the thread's kept buffer: a step's size recurs */
    char *x = kept_scratch(act_bytes + quantized_bytes, &owned);
    if (!x) return -1;
    char *h = x + m * hidden * e, *qkv = h + m * hidden * e, *att = qkv + m * width * e;
    char *gate_up = att + m * q_size * e, *act = gate_up + m * 2 * inter * e;
    char *cos = act + m * inter * e, *sin = cos + m * half * e;
    struct quantized qx = {NULL, NULL, NULL};
    if (quantized_bytes) { /* 2 floats per 32 values, then the values' int8 */
        qx.d = (float *)(x + act_bytes);
        qx.s = qx.d + m * widest / 32;
        qx.q = (int8_t *)(qx.s + m * widest / 32);
    }
    if (ends->embed_type && kern->gguf_dequantize(ends->embed_type, ends->embed, hidden,
                                                  ends->input_ids, m, x, e == 2,
                                                  ends->embed_interleaved)) {
        if (owned) free(x);
        return -3;
    }
    for (int64_t r = 0; r < m; ++r) {
        if (!ends->embed_type)
            memcpy(x + r * hidden * e,
                   (const char *)ends->embed + ends->input_ids[r] * hidden * e, hidden * e);
        const float *c = ends->cos + ends->positions[r] * half;
        const float *s = ends->sin + ends->positions[r] * half;
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
    void *residual = x, *mlp_out = out;
    int code = 0;
    for (int64_t i = 0; i < num_layers && !code; ++i) {
        const struct layer *l = &layers[i];
        /* layer 0: norm(x), the residual stream is x; then norm(mlp_out + residual) */
        kern->add_rmsnorm(i ? mlp_out : x, i ? residual : NULL, l->input_norm, h, m, hidden,
                          d->eps);
        if ((code = project(kern, d, &l->qkv, h, m, hidden, width, qkv, &qx))) break;
        kern->rotary(qkv, width, cos, sin, m, d->num_heads + d->num_kv_heads, d->head_dim);
        kern->kv_store(qkv + q_size * e, qkv + (q_size + kv_size) * e, width * e,
                       (char *)l->k_cache, (char *)l->v_cache, slots, m, kv_size * e);
        if ((code = kern->decode(qkv, width, l->k_cache, l->v_cache, tables, table_width,
                                 context_lens, m, d->num_heads, d->num_kv_heads, d->head_dim,
                                 d->block_size, l->window, d->scale, att)))
            break;
        /* o_proj's output goes through the norm with the residual: mlp_out is free here */
        if ((code = project(kern, d, &l->o, att, m, q_size, hidden, mlp_out, &qx))) break;
        kern->add_rmsnorm(mlp_out, residual, l->post_norm, h, m, hidden, d->eps);
        if ((code = project(kern, d, &l->gate_up, h, m, hidden, 2 * inter, gate_up, &qx))) break;
        kern->silu_mul(gate_up, act, m, inter);
        if ((code = project(kern, d, &l->down, act, m, inter, hidden, mlp_out, &qx))) break;
    }
    /* the final norm of the last MLP's output plus the stream, in place (the kernel reads a
     * row's x before it writes that row's out) */
    if (!code)
        kern->add_rmsnorm(mlp_out, residual, ends->final_norm, out, m, hidden, d->eps);
    if (owned) free(x);
    return code;
}
