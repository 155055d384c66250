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
 * The step's two ends are in the call too: the token embeddings and the rows of the rotary
 * tables before the first layer (decode_step.h, shared with gemma_layers.c), the model's final
 * norm after the last (from Python they were three module calls and ~0.2 ms of a ~8 ms
 * one-stream step, run with the caches cold after the layers' weights had streamed through
 * them). */
#include "decode_step.h"

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
    const int64_t e = d->elem_bytes;
    struct step s;
    const int begun = begin_step(kern, d, ends, m, &s);
    if (begun) return begun;
    char *x = s.x, *h = s.h, *qkv = s.qkv, *att = s.att, *gate_up = s.gate_up, *act = s.act;
    const struct quantized qx = s.qx;
    void *residual = x, *mlp_out = out;
    int code = 0;
    for (int64_t i = 0; i < num_layers && !code; ++i) {
        const struct layer *l = &layers[i];
        /* layer 0: norm(x), the residual stream is x; then norm(mlp_out + residual) */
        kern->add_rmsnorm(i ? mlp_out : x, i ? residual : NULL, l->input_norm, h, m, hidden,
                          d->eps);
        if ((code = project(kern, d, &l->qkv, h, m, hidden, width, qkv, &qx))) break;
        kern->rotary(qkv, width, s.cos, s.sin, m, d->num_heads + d->num_kv_heads, d->head_dim);
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
    end_step(&s);
    return code;
}
