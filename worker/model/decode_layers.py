"""Every decoder layer of a decode step in one compiled call (decode_layers.c), for bfloat16 and
float32 Llama-family models on the CPU whose parts all run on the compiled kernels: the
projections on the dtype's GEMM (bf16_gemm.c, f32_gemm.c: dequantized weights), on the int8
GEMM (w8a8) or on a GGUF file's own blocks (gguf_gemm.c: native, the embedding's rows too).

The call runs the kernels the Python layers call, in the same order, on the same kind of
buffers, so its hidden states are bit for bit the Python path's (tests/worker/model/
test_decode_layers.py); what it removes is ~30 module calls, ~300 ctypes calls and ~500 small
tensors a step. Short prefill chunks count as decodes here: the attention backend makes each of
their tokens one more kernel row (torch_paged.py, SHORT_PREFILL_READS). A step with a longer
chunk (SDPA) or a sliding window, or a model with a part the kernels do not cover, keeps the
Python path; `CompiledDecode.build` says why not.
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
    gguf_gemm_kernel,
    int8_gemm_kernel,
    paged_decode_kernel,
)
from intentserve.worker.model.gguf_linear import NativeEmbedding, NativeLinear
from intentserve.worker.model.packed_linear import Bf16Linear, F32Linear
from intentserve.worker.model.quant_linear import W8A8Linear
from torch import Tensor, nn

_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Kernels(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("add_rmsnorm", "gemm", "rotary", "kv_store", "decode")]
    _fields_ += [("silu_mul", _P), ("w8a8_linear", _P)]
    _fields_ += [("gguf_quantize", _P), ("gguf_gemm", _P), ("gguf_dequantize", _P)]


class _Dims(ctypes.Structure):
    _fields_ = [
        *((name, _I64) for name in ("hidden", "num_heads", "num_kv_heads", "head_dim")),
        ("intermediate", _I64),
        ("block_size", _I64),
        ("eps", _F32),
        ("scale", _F32),
        ("projections", _I64),
        ("elem_bytes", _I64),
    ]


# decode_layers.c's enum projections, by _kind
_PROJECTIONS = {"gemm": 0, "w8a8": 1, "native": 2}


class _Ends(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("input_ids", "positions", "embed", "final_norm")]
    _fields_ += [("cos", _P), ("sin", _P), ("vocab", _I64), ("max_pos", _I64)]
    _fields_ += [("embed_type", _I64), ("embed_interleaved", _I64)]


class _GgufPart(ctypes.Structure):
    _fields_ = [("blocks", _P), ("type", _I64), ("rows", _I64), ("interleaved", _I64)]


class _Proj(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("weight", "bias_or_comp", "scales", "inv_smooth")]
    _fields_ += [("gemm_flags", _I64), ("parts", ctypes.POINTER(_GgufPart)), ("num_parts", _I64)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _P),
        ("post_norm", _P),
        *((name, _Proj) for name in ("qkv", "o", "gate_up", "down")),
        ("k_cache", _P),
        ("v_cache", _P),
        ("window", _I64),
    ]


def _ptr(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _proj(module, keep: list) -> _Proj:
    """The projection's struct; a NativeLinear's array of parts goes into `keep`, which must
    outlive the struct."""
    if isinstance(module, NativeLinear):
        parts = [
            _GgufPart(part.data.data_ptr(), part.qtype.value, part.rows, int(part.interleaved))
            for part in module.parts
        ]
        keep.append((_GgufPart * len(parts))(*parts))
        return _Proj(None, None, None, None, 0, keep[-1], len(parts))
    if isinstance(module, W8A8Linear):
        return _Proj(
            module.packed.data_ptr(),
            module.comp.data_ptr(),
            module.scales.data_ptr(),
            _ptr(module.inv_smooth),
            0,
        )
    return _Proj(module.packed.data_ptr(), _ptr(module.bias), None, None, module.gemm_flags)


def _kind(module) -> str:
    """ "gemm" (the dtype's GEMM kernel), "w8a8" or "native" (GGUF blocks) where the projection
    runs on a kernel the call can drive, else ""."""
    if isinstance(module, NativeLinear) and module.bias is None and module.out_dtype is None:
        return "native"
    if isinstance(module, F32Linear):
        return "gemm"
    if isinstance(module, Bf16Linear) and module.out_dtype == torch.bfloat16:
        return "gemm"
    if isinstance(module, W8A8Linear) and module.gemm is not None and module.bias is None:
        return "w8a8"
    return ""


def _address(fn) -> int:
    return ctypes.cast(fn, _P).value


def _why_not(model, attention) -> str:
    """ "" when every part of the model runs on the kernels decode_layers.c calls, else why."""
    config = model.config
    dtype = _embedding_dtype(model.embed_tokens)
    if dtype not in (torch.bfloat16, torch.float32):
        return f"the model is {str(dtype).removeprefix('torch.')}, not bfloat16 or float32"
    if type(model).__name__ != "LlamaModel":
        return f"{type(model).__name__} layers differ from the Llama layer the call runs"
    if getattr(attention, "kernel", None) is None:
        return "the decode attention is not the compiled kernel"
    if any(w is not None for w in attention.layer_windows):
        return "sliding-window layers"
    if attention.pool.k[0].dtype != dtype:
        return "the KV cache's dtype is not the model's"
    if model.norm.fused is None or model.norm.eps != config.rms_norm_eps:
        return "the final norm is not the fused one with the layers' epsilon"
    if not _table(model.embed_tokens).is_contiguous() or model.rotary.cos.dtype != torch.float32:
        return "an embedding or rotary table the call does not read"
    if config.head_dim % 32 or config.hidden_size % 16 or config.intermediate_size % 16:
        return "widths the fused kernels do not take"
    kinds = set()
    for layer in model.layers:
        a, mlp = layer.self_attn, layer.mlp
        kinds |= {_kind(p) for p in (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)}
        if "" in kinds or len(kinds) > 1:
            return "a projection is not on the dtype's GEMM kernel, the int8 one or the GGUF one"
        if a.q_norm is not None:
            return "per-head q/k norms"
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if a.fused is None or mlp.fused is None or any(n.fused is None for n in norms):
            return "the fused norms and activations are not on"
        if any(n.eps != config.rms_norm_eps for n in norms):
            return "norms with different epsilons"
        if any(p.bias is not None for p in (a.o_proj, mlp.gate_up_proj, mlp.down_proj)):
            return "biases the call does not add"
    return ""


def _table(embedding: nn.Module) -> Tensor:
    """The embedding's table: its weight, or its GGUF blocks."""
    return embedding.blocks if isinstance(embedding, NativeEmbedding) else embedding.weight


def _embedding_dtype(embedding: nn.Module) -> torch.dtype:
    """The dtype the embedding gives the layers (the model's activations)."""
    return embedding.dtype if isinstance(embedding, NativeEmbedding) else embedding.weight.dtype


class CompiledDecode:
    """Built once per engine (weights and caches do not move); `run` per step."""

    def __init__(self, model, attention, fn) -> None:
        config = model.config
        ops, decode = fused_ops(), paged_decode_kernel()
        kind = _kind(model.layers[0].mlp.down_proj)  # every projection's (_why_not)
        embedding = model.embed_tokens
        bf16 = _embedding_dtype(embedding) == torch.bfloat16
        self.fn, self.attention = fn, attention
        gemm = linear = None
        if kind == "w8a8":
            int8 = int8_gemm_kernel()
            linear = int8.linear_bf16 if bf16 else int8.linear_f32
        elif kind == "gemm":
            gemm = (bf16_gemm_kernel() if bf16 else f32_gemm_kernel()).gemm
        native = kind == "native" or isinstance(embedding, NativeEmbedding)
        gguf = gguf_gemm_kernel() if native else None
        self.kernels = _Kernels(
            _address(ops.add_rmsnorm_bf16 if bf16 else ops.add_rmsnorm_f32),
            None if gemm is None else _address(gemm),
            _address(ops.rotary_bf16 if bf16 else ops.rotary_f32),
            _address(decode.kv_store),
            _address(decode.bf16 if bf16 else decode.f32),
            _address(ops.silu_mul_bf16 if bf16 else ops.silu_mul_f32),
            None if linear is None else _address(linear),
            *(
                (None, None, None)
                if gguf is None
                else (_address(gguf.quantize_rows), _address(gguf.gemm), _address(gguf.dequantize))
            ),
        )
        self.dims = _Dims(
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.intermediate_size,
            attention.pool.block_size,
            config.rms_norm_eps,
            config.head_dim**-0.5,
            _PROJECTIONS[kind],
            2 if bf16 else 4,
        )
        layers, self._parts = [], []
        for i, layer in enumerate(model.layers):
            a, mlp = layer.self_attn, layer.mlp
            k_cache, v_cache = attention.pool.flat(i)
            layers.append(
                _Layer(
                    layer.input_layernorm.weight.data_ptr(),
                    layer.post_attention_layernorm.weight.data_ptr(),
                    *(
                        _proj(p, self._parts)
                        for p in (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)
                    ),
                    k_cache.data_ptr(),
                    v_cache.data_ptr(),
                    0,
                )
            )
        self.layers = (_Layer * len(layers))(*layers)
        self.dtype, self.hidden = _embedding_dtype(embedding), config.hidden_size
        self.embed, self.final_norm = _table(embedding), model.norm.weight
        held = isinstance(embedding, NativeEmbedding)
        self.embed_type = embedding.qtype.value if held else 0
        self.embed_interleaved = int(held and embedding.interleaved)
        self.cos, self.sin = model.rotary.cos.contiguous(), model.rotary.sin.contiguous()
        # NOTE: the buffers the pointers above point into must outlive this object.
        self._keep = (model, attention)

    @classmethod
    def build(cls, model, attention) -> tuple[CompiledDecode | None, str]:
        """(the compiled step, "") or (None, why the Python layers stay)."""
        why = _why_not(model, attention)
        if why:
            return None, why
        try:
            return cls(model, attention, decode_layers_kernel()), ""
        except KernelUnavailable as exc:
            return None, exc.reason

    def run(self, input_ids: Tensor, positions: Tensor, attention, meta) -> Tensor | None:
        """The final-normed hidden states [T, hidden] of a step whose every token is a kernel row
        (decodes and short prefill chunks), as the Python layers return them; None (nothing run)
        for any other step. input_ids, positions: [T] int64."""
        if attention is not self.attention or set(meta.plans) != {None}:
            return None
        plan = meta.plans[None]
        d = plan.decode
        if plan.prefills or d is None or d.tables is None or d.rows is not None:
            return None
        rows = input_ids.shape[0]
        if d.context_lens.shape[0] != rows or positions.shape != input_ids.shape:
            return None
        if input_ids.dtype != torch.int64 or positions.dtype != torch.int64:
            return None
        input_ids, positions = input_ids.contiguous(), positions.contiguous()
        ends = _Ends(
            input_ids.data_ptr(),
            positions.data_ptr(),
            self.embed.data_ptr(),
            self.final_norm.data_ptr(),
            self.cos.data_ptr(),
            self.sin.data_ptr(),
            self.embed.shape[0],
            self.cos.shape[0],
            self.embed_type,
            self.embed_interleaved,
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
