"""Gemma 3 decoder over a flattened varlen batch, with the same interface as `LlamaModel`.

What differs from Llama: RMSNorm scales by (1 + weight) in float32 before rounding; the
embeddings are multiplied by sqrt(hidden_size); q and k are RMS-normed per head before RoPE;
the attention and MLP outputs are normed again before their residual adds; the MLP is
GELU(tanh)-gated; and layers interleave banded (local, own RoPE base) and global attention.
Which layers are banded is the attention backend's business (`ModelConfig.layer_windows`); this
module only picks each layer's RoPE table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from intentserve.worker.model import cpu_ops
from intentserve.worker.model.config import ModelConfig
from intentserve.worker.model.llama import AttentionBackend, DecoderBase, unset_embedding
from intentserve.worker.model.rope import RotaryEmbedding, apply_rotary
from torch import Tensor, nn


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + w). NOTE: `scale` holds 1 + w, kept in float32: the product is taken in
    float32 and rounded once, as transformers' Gemma3RMSNorm does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim, dtype=torch.float32))
        self.eps = eps
        self.gemma_ops = None  # the compiled CPU ops, set by cpu_ops.enable_fused_ops

    def forward(self, x: Tensor) -> Tensor:  # [..., dim]
        if self.gemma_ops is not None:
            done = cpu_ops.gemma_norm(self.gemma_ops, x, self.scale, self.eps)
            if done is not None:
                return done
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.scale).to(x.dtype)

    def add_to(self, h: Tensor, x: Tensor) -> Tensor:
        """x + norm(h); with the compiled op the sum is written into x in place."""
        if self.gemma_ops is not None:
            done = cpu_ops.gemma_norm(self.gemma_ops, h, self.scale, self.eps, residual=x)
            if done is not None:
                return done
        return x + self.forward(h)


class GemmaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        # Backends scale scores by head_dim ** -0.5; a different query_pre_attn_scalar is folded
        # into q (1.0 for every Gemma 3 but the 27B).
        scalar = config.query_pre_attn_scalar or config.head_dim
        self.q_multiplier = math.sqrt(config.head_dim / scalar)
        self.gemma_ops = None  # the compiled CPU ops, set by cpu_ops.enable_fused_ops

    def forward(
        self,
        x: Tensor,  # [T, hidden_size]
        cos_sin: tuple[Tensor, Tensor],  # each [T, 1, head_dim // 2]: this layer's RoPE table
        attn: AttentionBackend,
        meta: Any,
    ) -> Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (num_heads + 2 * num_kv_heads) * head_dim]
        if self.gemma_ops is not None and self._norm_rotate_in_place(qkv, cos_sin):
            q = qkv[:, : self.q_size].view(num_tokens, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(
                num_tokens, self.num_kv_heads, self.head_dim
            )
        else:
            q, k = self._norm_rotate(qkv, cos_sin)
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        out = attn.forward(self.layer_idx, q, k, v, meta)  # [T, num_heads, head_dim]
        return self.o_proj(out.reshape(num_tokens, self.q_size))

    def _norm_rotate_in_place(self, qkv: Tensor, cos_sin: tuple[Tensor, Tensor]) -> bool:
        """The compiled q/k norm + rotary (+ q's multiplier) on qkv's own rows; False, nothing
        touched, where the tensors do not suit it."""
        return cpu_ops.qk_norm_rotary_(
            self.gemma_ops,
            qkv,
            self.q_norm.scale,
            self.k_norm.scale,
            *cos_sin,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.q_norm.eps,
            self.q_multiplier,
        )

    def _norm_rotate(self, qkv: Tensor, cos_sin: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """q [T, num_heads, head_dim] and k [T, num_kv_heads, head_dim], normed per head,
        rotated, q times its multiplier: torch's ops, new tensors."""
        num_tokens = qkv.shape[0]
        q = self.q_norm(qkv[:, : self.q_size].view(num_tokens, self.num_heads, self.head_dim))
        k = self.k_norm(
            qkv[:, self.q_size : self.q_size + self.kv_size].view(
                num_tokens, self.num_kv_heads, self.head_dim
            )
        )
        qk = apply_rotary(torch.cat((q, k), dim=1), *cos_sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        if self.q_multiplier != 1.0:
            q = q * self.q_multiplier
        return q, k


class GemmaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gemma_ops = None  # the compiled CPU ops, set by cpu_ops.enable_fused_ops

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 * I]: gate | up
        if self.gemma_ops is not None:
            hidden = cpu_ops.gelu_and_mul(self.gemma_ops, gate_up)
            if hidden is not None:
                return self.down_proj(hidden)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)  # [T, I] each
        return self.down_proj(gelu_tanh(gate) * up)


def embedding_scale(config: ModelConfig, dtype: torch.dtype) -> Tensor:
    """The embeddings' factor: sqrt(hidden_size) rounded to the model dtype first, as the
    reference does (a 0-dim tensor of `dtype`)."""
    return torch.tensor(config.hidden_size**0.5, dtype=dtype)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU (tanh form), computed in float32 and rounded once to x's dtype.

    NOTE: bit-identical to torch's bfloat16 GELU for every bfloat16 input (tested), which
    computes in float32 too, but that kernel measured ~400x slower on this CPU (16 ms against
    40 us for [16, 2048]): most of a Gemma decode step.
    """
    return F.gelu(x.float(), approximate="tanh").to(x.dtype)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.is_local = config.layer_window(layer_idx) is not None
        eps = config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.self_attn = GemmaAttention(config, layer_idx)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.mlp = GemmaMLP(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(
        self, x: Tensor, cos_sin: tuple[Tensor, Tensor], attn: AttentionBackend, meta: Any
    ) -> Tensor:  # [T, hidden_size] -> [T, hidden_size]
        h = self.self_attn(self.input_layernorm(x), cos_sin, attn, meta)
        x = self.post_attention_layernorm.add_to(h, x)  # NOTE: x's rows, in place when fused
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return self.post_feedforward_layernorm.add_to(h, x)


class GemmaModel(DecoderBase):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not config.tie_word_embeddings:
            raise ValueError(f"{config.architecture}: an untied LM head is not supported")
        self.config = config
        self.embed_tokens = unset_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None  # tied: the embedding table is the projection (prepack may set one)
        self.rotary = RotaryEmbedding(config)
        self.rotary_local = RotaryEmbedding(config, local=True)
        # Every layer of a step of kernel rows in one compiled call (decode_layers.py), set by
        # the engine builder where the model and its attention backend allow it.
        self.compiled_decode = None

    @torch.inference_mode()
    def forward(
        self, input_ids: Tensor, positions: Tensor, attn: AttentionBackend, meta: Any
    ) -> Tensor:
        """input_ids, positions: [T] int64 -> final-normed hidden states [T, hidden_size]."""
        if self.compiled_decode is not None:
            done = self.compiled_decode.run(input_ids, positions, attn, meta)
            if done is not None:
                return done
        x = self.embed_tokens(input_ids)  # [T, hidden_size]
        x = x * embedding_scale(self.config, x.dtype)
        cos_sin_global = self.rotary(positions, x.dtype)
        cos_sin_local = self.rotary_local(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos_sin_local if layer.is_local else cos_sin_global, attn, meta)
        return self.norm(x)

    @classmethod
    def from_hf_weights(
        cls,
        config: ModelConfig,
        weights: Mapping[str, Tensor],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> GemmaModel:
        """Build from tensors named as in a transformers `Gemma3ForCausalLM` state dict (norm
        weights w, applied as 1 + w). ValueError names the first missing or unexpected weight."""
        return cls.from_fused_weights(
            config, _fuse_gemma_weights(config, weights, dtype, torch.device(device)), device
        )


_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "self_attn.q_norm",
    "self_attn.k_norm",
)


def _fuse_gemma_weights(
    config: ModelConfig, weights: Mapping[str, Tensor], dtype: torch.dtype, device: torch.device
) -> dict[str, Tensor]:
    """Rename to this module's names: q|k|v and gate|up concatenated, norms as 1 + w."""
    remaining = dict(weights)

    def take(*names: str, as_dtype: torch.dtype = dtype) -> Tensor:
        missing = [name for name in names if name not in remaining]
        if missing:
            raise ValueError(f"checkpoint has no weight {missing[0]!r}")
        parts = [remaining.pop(name) for name in names]
        return torch.cat(parts).to(device=device, dtype=as_dtype)

    def norm_scale(name: str) -> Tensor:
        return take(name, as_dtype=torch.float32) + 1.0

    fused = {
        "embed_tokens.weight": take("model.embed_tokens.weight"),
        "norm.scale": norm_scale("model.norm.weight"),
    }
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        fused[dst + "self_attn.qkv_proj.weight"] = take(
            attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"
        )
        fused[dst + "self_attn.o_proj.weight"] = take(attn + "o_proj.weight")
        fused[dst + "mlp.gate_up_proj.weight"] = take(
            src + "mlp.gate_proj.weight", src + "mlp.up_proj.weight"
        )
        fused[dst + "mlp.down_proj.weight"] = take(src + "mlp.down_proj.weight")
        for norm in _NORMS:
            fused[f"{dst}{norm}.scale"] = norm_scale(f"{src}{norm}.weight")
    remaining.pop("lm_head.weight", None)  # tied; some checkpoints still store the copy
    if remaining:
        raise ValueError(f"unexpected weight {next(iter(remaining))!r} for {config.architecture}")
    return fused
