/* Every decoder layer of a Gemma 3 model for one decode step, in one call: decode_layers.c's
 * step (the same projections, K/V store and paged decode attention, the same ends:
 * decode_step.h) with Gemma's layer between them, as worker/model/gemma.py runs it:
 *
 *   h = input_norm(x); q|k|v = qkv(h); q, k normed per head, rotated (the layer's table:
 *   local base on banded layers), q times q_multiplier; attend (the layer's band);
 *   x += post_norm(o(att)); h = pre_ff_norm(x); x += post_ff_norm(down(gelu(gate) * up)).
 *
 * Every norm is Gemma's (float32 weight 1 + w, gemma_ops.c), applied before its residual add;
 * the embeddings are scaled by sqrt(hidden) first (begin_step). The elementwise steps are the
 * gemma_ops.c functions the Python layers call, in the same order on the same kind of buffers,
 * so the result is theirs bit for bit (tests/worker/model/test_decode_layers.py). */
#include "decode_step.h"

/* out [m, hidden]: the final hidden states of the step's m tokens, as GemmaModel.forward
 * returns them; the codes are decode_layers.c's. */
int decode_gemma_layers(const struct kernels *kern, const struct dims *d,
                        const struct layer *layers, int64_t num_layers, const struct ends *ends,
                        int64_t m, const int64_t *slots, const int64_t *tables,
                        int64_t table_width, const int64_t *context_lens, void *out) {
    const int64_t q_size = d->num_heads * d->head_dim, kv_size = d->num_kv_heads * d->head_dim;
    const int64_t width = q_size + 2 * kv_size, inter = d->intermediate, hidden = d->hidden;
    const int64_t e = d->elem_bytes;
    struct step s;
    const int begun = begin_step(kern, d, ends, m, &s);
    if (begun) return begun;
    char *x = s.x, *h = s.h, *qkv = s.qkv, *att = s.att, *gate_up = s.gate_up, *act = s.act;
    const struct quantized qx = s.qx;
    void *projected = out; /* o's and down's outputs, each normed into x before the next */
    int code = 0;
    for (int64_t i = 0; i < num_layers && !code; ++i) {
        const struct layer *l = &layers[i];
        kern->gemma_norm(x, NULL, l->input_norm, h, m, hidden, d->eps);
        if ((code = project(kern, d, &l->qkv, h, m, hidden, width, qkv, &qx))) break;
        kern->qk_norm_rotary(qkv, width, l->q_norm, l->k_norm, l->local_rope ? s.cos_local : s.cos,
                             l->local_rope ? s.sin_local : s.sin, m, d->num_heads,
                             d->num_kv_heads, d->head_dim, d->eps, d->q_multiplier);
        kern->kv_store(qkv + q_size * e, qkv + (q_size + kv_size) * e, width * e,
                       (char *)l->k_cache, (char *)l->v_cache, slots, m, kv_size * e);
        if ((code = kern->decode(qkv, width, l->k_cache, l->v_cache, tables, table_width,
                                 context_lens, m, d->num_heads, d->num_kv_heads, d->head_dim,
                                 d->block_size, l->window, d->scale, att)))
            break;
        if ((code = project(kern, d, &l->o, att, m, q_size, hidden, projected, &qx))) break;
        kern->gemma_norm(projected, x, l->post_norm, NULL, m, hidden, d->eps);
        kern->gemma_norm(x, NULL, l->pre_ff_norm, h, m, hidden, d->eps);
        if ((code = project(kern, d, &l->gate_up, h, m, hidden, 2 * inter, gate_up, &qx))) break;
        kern->gelu_mul(gate_up, act, m, inter);
        if ((code = project(kern, d, &l->down, act, m, inter, hidden, projected, &qx))) break;
        kern->gemma_norm(projected, x, l->post_ff_norm, NULL, m, hidden, d->eps);
    }
    if (!code) kern->gemma_norm(x, NULL, ends->final_norm, out, m, hidden, d->eps);
    end_step(&s);
    return code;
}
