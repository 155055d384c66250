"""Every decoder layer of a decode step in one compiled call, for bfloat16 and float32 models on
the CPU whose parts all run on the compiled kernels: Llama-family layers (decode_layers.c) and
Gemma 3's (gemma_layers.c), the projections on the dtype's GEMM (bf16_gemm.c, f32_gemm.c:
dequantized weights), on the int8 GEMM (w8a8) or on a GGUF file's own blocks (gguf_gemm.c:
native, the embedding's rows too).

The call runs the kernels the Python layers call, in the same order, on the same kind of
buffers, so its hidden states are bit for bit the Python path's (tests/worker/model/
test_decode_layers.py); what it removes is ~30 module calls, ~300 ctypes calls and ~500 small
tensors a step. Short prefill chunks count as decodes here: the attention backend makes each of
their tokens one more kernel row (torch_paged.py, SHORT_PREFILL_READS). A step with a longer
chunk (SDPA), or a model with a part the kernels do not cover, keeps the Python path;
`CompiledDecode.build` says why not.
"""

from __future__ import annotations

import ctypes

import torch
from intentserve.worker.kernels import (
    KernelUnavailable,
    bf16_gemm_kernel,
    decode_layers_kernel,
    f32_gemm_kernel,
    fused_ops,
    gemma_ops,
    gguf_gemm_kernel,
    int8_gemm_kernel,
    paged_decode_kernel,
)
from intentserve.worker.model.decode_abi import (
    PROJECTIONS,
    Dims,
    Ends,
    Kernels,
    Layer,
    address,
    kind,
    proj,
)
from intentserve.worker.model.gemma import GemmaModel, embedding_scale
from intentserve.worker.model.gguf_linear import NativeEmbedding
from intentserve.worker.model.llama import LlamaModel
from torch import Tensor, nn


def _why_not(model, attention) -> str:
    """ "" when every part of the model runs on the kernels the call drives, else why."""
    config = model.config
    dtype = _embedding_dtype(model.embed_tokens)
    if dtype not in (torch.bfloat16, torch.float32):
        return f"the model is {str(dtype).removeprefix('torch.')}, not bfloat16 or float32"
    gemma = isinstance(model, GemmaModel)
    if not gemma and type(model) is not LlamaModel:
        return (
            f"{type(model).__name__} layers differ from the Llama and Gemma 3 layers the call runs"
        )
    if getattr(attention, "kernel", None) is None:
        return "the decode attention is not the compiled kernel"
    if attention.pool.k[0].dtype != dtype:
        return "the KV cache's dtype is not the model's"
    tables = (model.rotary, model.rotary_local) if gemma else (model.rotary,)
    if not _table(model.embed_tokens).is_contiguous() or any(
        t.cos.dtype != torch.float32 for t in tables
    ):
        return "an embedding or rotary table the call does not read"
    if config.head_dim % 32 or config.hidden_size % 16 or config.intermediate_size % 16:
        return "widths the fused kernels do not take"
    kinds = set()
    for layer in model.layers:
        a, mlp = layer.self_attn, layer.mlp
        kinds |= {kind(p) for p in (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)}
        if "" in kinds or len(kinds) > 1:
            return "a projection is not on the dtype's GEMM kernel, the int8 one or the GGUF one"
        if any(p.bias is not None for p in (a.o_proj, mlp.gate_up_proj, mlp.down_proj)):
            return "biases the call does not add"
    return _gemma_why_not(model) if gemma else _llama_why_not(model)


def _llama_why_not(model: LlamaModel) -> str:
    eps = model.config.rms_norm_eps
    if model.norm.fused is None or model.norm.eps != eps:
        return "the final norm is not the fused one with the layers' epsilon"
    for layer in model.layers:
        a, mlp = layer.self_attn, layer.mlp
        if a.q_norm is not None:
            return "per-head q/k norms"
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if a.fused is None or mlp.fused is None or any(n.fused is None for n in norms):
            return "the fused norms and activations are not on"
        if any(n.eps != eps for n in norms):
            return "norms with different epsilons"
    return ""


def _gemma_why_not(model: GemmaModel) -> str:
    takers = [m for m in model.modules() if hasattr(m, "gemma_ops")]
    if any(m.gemma_ops is None for m in takers):
        return "the fused Gemma norms and activations are not on"
    if any(n.eps != model.config.rms_norm_eps for n in takers if hasattr(n, "eps")):
        return "norms with different epsilons"
    return ""


def _table(embedding: nn.Module) -> Tensor:
    """The embedding's table: its weight, or its GGUF blocks."""
    return embedding.blocks if isinstance(embedding, NativeEmbedding) else embedding.weight


def _embedding_dtype(embedding: nn.Module) -> torch.dtype:
    """The dtype the embedding gives the layers (the model's activations)."""
    return embedding.dtype if isinstance(embedding, NativeEmbedding) else embedding.weight.dtype


def _kernels(model, bf16: bool, projections: str) -> Kernels:
    """The kernels' addresses for the call: the elementwise ones of the model's family, the
    projections' for their kind, the GGUF ones where anything is held as blocks."""
    decode = paged_decode_kernel()
    gemm = linear = None
    if projections == "w8a8":
        int8 = int8_gemm_kernel()
        linear = int8.linear_bf16 if bf16 else int8.linear_f32
    elif projections == "gemm":
        gemm = (bf16_gemm_kernel() if bf16 else f32_gemm_kernel()).gemm
    native = projections == "native" or isinstance(model.embed_tokens, NativeEmbedding)
    gguf = gguf_gemm_kernel() if native else None
    llama = gemma = (None, None, None)
    if isinstance(model, GemmaModel):
        ops = gemma_ops()
        gemma = (
            (ops.gemma_norm_bf16, ops.qk_norm_rotary_bf16, ops.gelu_mul_bf16)
            if bf16
            else (ops.gemma_norm_f32, ops.qk_norm_rotary_f32, ops.gelu_mul_f32)
        )
    else:
        ops = fused_ops()
        llama = (
            (ops.add_rmsnorm_bf16, ops.rotary_bf16, ops.silu_mul_bf16)
            if bf16
            else (ops.add_rmsnorm_f32, ops.rotary_f32, ops.silu_mul_f32)
        )
    gguf_fns = (None,) * 3 if gguf is None else (gguf.quantize_rows, gguf.gemm, gguf.dequantize)
    fns = (llama[0], gemm, llama[1], decode.kv_store, decode.bf16 if bf16 else decode.f32)
    fns += (llama[2], linear, *gguf_fns, *gemma)
    return Kernels(*(None if fn is None else address(fn) for fn in fns))


def _layer(model, i: int, attention, keep: list) -> Layer:
    """Layer i's struct: its norms' weights, projections, caches, band and rotary table."""
    layer = model.layers[i]
    a, mlp = layer.self_attn, layer.mlp
    k_cache, v_cache = attention.pool.flat(i)
    projections = (proj(p, keep) for p in (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj))
    caches_and_band = (k_cache.data_ptr(), v_cache.data_ptr(), attention.layer_windows[i] or 0)
    if not isinstance(model, GemmaModel):
        norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
        return Layer(*(n.data_ptr() for n in norms), *projections, *caches_and_band)
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    extra = (layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm, a.q_norm, a.k_norm)
    return Layer(
        *(n.scale.data_ptr() for n in norms),
        *projections,
        *caches_and_band,
        *(n.scale.data_ptr() for n in extra),
        int(layer.is_local),
    )


class CompiledDecode:
    """Built once per engine (weights and caches do not move); `run` per step."""

    def __init__(self, model, attention, fn) -> None:
        config = model.config
        gemma = isinstance(model, GemmaModel)
        projections = kind(model.layers[0].mlp.down_proj)  # every projection's (_why_not)
        embedding = model.embed_tokens
        self.dtype = _embedding_dtype(embedding)
        bf16 = self.dtype == torch.bfloat16
        self.fn, self.attention = fn, attention
        self.kernels = _kernels(model, bf16, projections)
        self.dims = Dims(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.intermediate_size,
            attention.pool.block_size,
            config.rms_norm_eps,
            config.head_dim**-0.5,
            PROJECTIONS[projections],
            2 if bf16 else 4,
            model.layers[0].self_attn.q_multiplier if gemma else 1.0,
        )
        self._parts = []
        layers = [_layer(model, i, attention, self._parts) for i in range(len(model.layers))]
        self.layers = (Layer * len(layers))(*layers)
        self.hidden = config.hidden_size
        self.embed = _table(embedding)
        self.final_norm = model.norm.scale if gemma else model.norm.weight
        held = isinstance(embedding, NativeEmbedding)
        self.embed_type = embedding.qtype.value if held else 0
        self.embed_interleaved = int(held and embedding.interleaved)
        self.embed_scale = float(embedding_scale(config, self.dtype)) if gemma else 0.0
        rotaries = (model.rotary, model.rotary_local) if gemma else (model.rotary,)
        self.tables = [t.contiguous() for r in rotaries for t in (r.cos, r.sin)]
        # NOTE: the buffers the pointers above point into must outlive every `run`. The model's
        # own are safe: the model owns this object (`model.compiled_decode`) and only its forward
        # calls `run`. Holding the model here too would be a reference cycle that keeps a dropped
        # engine's weights until the garbage collector next runs.
        self._keep = attention

    @classmethod
    def build(cls, model, attention) -> tuple[CompiledDecode | None, str]:
        """(the compiled step, "") or (None, why the Python layers stay)."""
        why = _why_not(model, attention)
        if why:
            return None, why
        try:
            return cls(model, attention, decode_layers_kernel(isinstance(model, GemmaModel))), ""
        except KernelUnavailable as exc:
            return None, exc.reason

    def run(self, input_ids: Tensor, positions: Tensor, attention, meta) -> Tensor | None:
        """The final-normed hidden states [T, hidden] of a step whose every token is a kernel row
        (decodes and short prefill chunks), as the Python layers return them; None (nothing run)
        for any other step. input_ids, positions: [T] int64."""
        if attention is not self.attention:
            return None
        # NOTE: every band's plan shares the step's one kernel group (torch_paged.py).
        plans = list(meta.plans.values())
        d = plans[0].decode
        if any(p.prefills or p.decode is not d for p in plans):
            return None
        if d is None or d.tables is None or d.rows is not None:
            return None
        rows = input_ids.shape[0]
        if d.context_lens.shape[0] != rows or positions.shape != input_ids.shape:
            return None
        if input_ids.dtype != torch.int64 or positions.dtype != torch.int64:
            return None
        input_ids, positions = input_ids.contiguous(), positions.contiguous()
        tables = [t.data_ptr() for t in self.tables] + [None] * (4 - len(self.tables))
        ends = Ends(
            input_ids.data_ptr(),
            positions.data_ptr(),
            self.embed.data_ptr(),
            self.final_norm.data_ptr(),
            *tables,
            self.embed.shape[0],
            self.tables[0].shape[0],
            self.embed_type,
            self.embed_interleaved,
            self.embed_scale,
        )
        out = torch.empty(rows, self.hidden, dtype=self.dtype)
        code = self.fn(
            ctypes.byref(self.kernels),
            ctypes.byref(self.dims),
            self.layers,
            len(self.layers),
            ctypes.byref(ends),
            rows,
            meta.slot_mapping.data_ptr(),
            d.tables.data_ptr(),
            d.tables.shape[1],
            d.context_lens.data_ptr(),
            out.data_ptr(),
        )
        if code == -2:
            raise IndexError("a token id or position is out of range for the model's tables")
        if code == -3:
            raise RuntimeError("the GGUF kernel does not read the embedding's blocks")
        if code != 0:
            raise RuntimeError(f"the compiled decode layers failed (code {code})")
        return out
