"""Llama-family decoder (Llama, Mistral, SmolLM2, Qwen2/3, Phi-3) over a flattened varlen batch.

The model owns no KV cache: each layer hands its rotated q/k/v to an `AttentionBackend`, which
stores k/v wherever it keeps them and attends. One step's tokens from all sequences are
concatenated into T rows; which row belongs to which sequence is the backend's business (`meta`).

NOTE: the layers call their submodules' `forward` directly: no module here has hooks, and
`Module.__call__` cost ~1-5 us each, ~200 times a step, which at one sequence is a few percent
of a decode step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self

import torch
import torch.nn.functional as F
from intentserve.worker.model import cpu_ops
from intentserve.worker.model.config import ModelConfig
from intentserve.worker.model.rope import RotaryEmbedding, apply_rotary
from torch import Tensor, nn


class AttentionBackend(Protocol):
    def forward(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, meta: Any) -> Tensor:
        """q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim], already rotated.

        Returns [T, num_heads, head_dim]. NOTE: q, k and v are views into one fused projection
        output and are not contiguous; copy them if the kernel needs that.
        """
        ...


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.fused = None  # the compiled CPU ops, set by worker.model.cpu_ops.enable_fused_ops
        self.out_buffer = None  # a kept output buffer, set by step_buffers.keep_step_buffers

    def forward(self, x: Tensor) -> Tensor:
        # Normalize in float32 and scale in the model dtype, as transformers does (bf16 parity).
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def add_forward(self, x: Tensor, residual: Tensor | None) -> tuple[Tensor, Tensor]:
        """(norm(x + residual), x + residual); without a residual, (norm(x), x).

        NOTE: with the fused CPU op the sum is written into `residual` in place.
        """
        if self.fused is not None:
            done = cpu_ops.add_rmsnorm(
                self.fused, x, residual, self.weight, self.eps, self.out_buffer
            )
            if done is not None:
                return done
        total = x if residual is None else x + residual
        return self.forward(total), total


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        # q, k and v in one matmul: one pass over the activations instead of three.
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.fused = None  # the compiled CPU ops, set by worker.model.cpu_ops.enable_fused_ops
        # Qwen3 only: per-head RMSNorm of q and k; other families have no such weights.
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self,
        x: Tensor,  # [T, hidden_size]
        cos_sin: tuple[Tensor, Tensor],  # each [T, 1, head_dim // 2]
        attn: AttentionBackend,
        meta: Any,
    ) -> Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj.forward(x)  # [T, (num_heads + 2 * num_kv_heads) * head_dim]
        num_rotated = self.num_heads + self.num_kv_heads  # q and k: same angles, one pass
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, num_rotated, self.head_dim)
        if self.q_norm is not None:  # the normed heads are a new tensor: rotate that one
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = apply_rotary(torch.cat((self.q_norm(q), self.k_norm(k)), dim=1), *cos_sin)
        # The compiled op rotates qk in place (it is a view of qkv); else torch's ops, a copy.
        elif self.fused is None or not cpu_ops.rotary_(
            self.fused, qkv, *cos_sin, num_rotated, self.head_dim
        ):
            qk = apply_rotary(qk, *cos_sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        out = attn.forward(self.layer_idx, q, k, v, meta)  # [T, num_heads, head_dim]
        return self.o_proj.forward(out.reshape(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.fused = None  # the compiled CPU ops, set by worker.model.cpu_ops.enable_fused_ops
        self.act_buffer = None  # a kept output buffer, set by step_buffers.keep_step_buffers

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj.forward(x)  # [T, 2 * I]: gate | up
        if self.fused is not None:
            hidden = cpu_ops.silu_and_mul(self.fused, gate_up, self.act_buffer)
            if hidden is not None:
                return self.down_proj.forward(hidden)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)  # [T, I] each
        return self.down_proj.forward(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self,
        x: Tensor,  # [T, hidden_size]: the previous layer's MLP output (or the embeddings)
        residual: Tensor | None,  # [T, hidden_size]: the residual stream so far; None at layer 0
        cos_sin: tuple[Tensor, Tensor],  # each [T, 1, head_dim // 2]
        attn: AttentionBackend,
        meta: Any,
    ) -> tuple[Tensor, Tensor]:
        """Returns (this layer's MLP output, the residual stream it is still to be added to).

        NOTE: each residual add is deferred into the next norm (`add_forward`), so on the CPU
        the add and the RMSNorm are one fused pass. The sums, and where they are rounded, are
        those of `x = x + attn(norm(x)); x = x + mlp(norm(x))`.
        """
        h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn.forward(h, cos_sin, attn, meta)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp.forward(h), residual


def unset_embedding(num_embeddings: int, dim: int) -> nn.Embedding:
    """An embedding table whose values are the checkpoint's, assigned after construction.
    NOTE: nn.Embedding's own random init, run under the meta device (`from_fused_weights`),
    goes through torch._refs.normal_, whose first call imports torch._dynamo and sympy: 2.5 s
    of a worker's start. An empty table skips it."""
    return nn.Embedding(num_embeddings, dim, _weight=torch.empty(num_embeddings, dim))


class DecoderBase(nn.Module):
    """What every decoder here shares: its LM head (the embedding table when `lm_head` is None,
    i.e. tied) and how it is built from tensors already named as its parameters."""

    embed_tokens: nn.Embedding
    lm_head: nn.Module | None

    @property
    def device(self) -> torch.device:
        """Where the weights are (every decoder has norm parameters; the embedding may be blocks
        held as buffers, weights: native)."""
        return next(self.parameters()).device

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden: [N, hidden_size] -> logits [N, vocab_size] in float32."""
        if self.lm_head is None:  # tied head: the embedding table is the projection
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()

    @classmethod
    def from_fused_weights(
        cls, config: ModelConfig, fused: dict[str, Tensor], device: torch.device | str
    ) -> Self:
        with torch.device("meta"):  # skip random init: every parameter is replaced below
            model = cls(config)
        model.load_state_dict(fused, strict=True, assign=True)
        return model.to(device).eval()


class LlamaModel(DecoderBase):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not config.has_kv_cache:
            raise ValueError(f"{config.architecture} is not a decoder; no LlamaModel for it")
        self.config = config
        self.embed_tokens = unset_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rotary = RotaryEmbedding(config)
        # Every layer of a step of kernel rows (decodes, short prefill chunks) in one compiled
        # call (decode_layers.py), set by the engine builder where the model and its attention
        # backend allow it.
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
        cos_sin = self.rotary(positions, x.dtype)
        residual = None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, cos_sin, attn, meta)
        return self.norm.add_forward(x, residual)[0]

    @classmethod
    def from_hf_weights(
        cls,
        config: ModelConfig,
        weights: Mapping[str, Tensor],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> LlamaModel:
        """Build from tensors named as in a transformers `LlamaForCausalLM` state dict.

        ValueError names the first missing or unexpected weight.
        """
        return cls.from_fused_weights(
            config, fuse_hf_weights(config, weights, dtype, torch.device(device)), device
        )


def fuse_hf_weights(
    config: ModelConfig, weights: Mapping[str, Tensor], dtype: torch.dtype, device: torch.device
) -> dict[str, Tensor]:
    """Rename HF tensors to this module's names, concatenating q|k|v and gate|up."""
    remaining = dict(weights)

    def take(*names: str) -> Tensor:
        missing = [name for name in names if name not in remaining]
        if missing:
            raise ValueError(f"checkpoint has no weight {missing[0]!r}")
        parts = [remaining.pop(name) for name in names]
        return torch.cat(parts).to(device=device, dtype=dtype)

    def take_fused(fused_name: str, *part_names: str) -> Tensor:
        # Phi-3 checkpoints store q|k|v and gate|up already concatenated, in this module's order.
        return take(fused_name) if fused_name in remaining else take(*part_names)

    fused = {
        "embed_tokens.weight": take("model.embed_tokens.weight"),
        "norm.weight": take("model.norm.weight"),
    }
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        fused[dst + "self_attn.qkv_proj.weight"] = take_fused(
            attn + "qkv_proj.weight",
            attn + "q_proj.weight",
            attn + "k_proj.weight",
            attn + "v_proj.weight",
        )
        if config.qkv_bias:
            fused[dst + "self_attn.qkv_proj.bias"] = take_fused(
                attn + "qkv_proj.bias",
                attn + "q_proj.bias",
                attn + "k_proj.bias",
                attn + "v_proj.bias",
            )
        if config.qk_norm:
            fused[dst + "self_attn.q_norm.weight"] = take(attn + "q_norm.weight")
            fused[dst + "self_attn.k_norm.weight"] = take(attn + "k_norm.weight")
        fused[dst + "self_attn.o_proj.weight"] = take(attn + "o_proj.weight")
        fused[dst + "mlp.gate_up_proj.weight"] = take_fused(
            src + "mlp.gate_up_proj.weight",
            src + "mlp.gate_proj.weight",
            src + "mlp.up_proj.weight",
        )
        fused[dst + "mlp.down_proj.weight"] = take(src + "mlp.down_proj.weight")
        fused[dst + "input_layernorm.weight"] = take(src + "input_layernorm.weight")
        fused[dst + "post_attention_layernorm.weight"] = take(
            src + "post_attention_layernorm.weight"
        )
    if config.tie_word_embeddings:
        # Some tied checkpoints still store the (identical) head; it is not needed.
        remaining.pop("lm_head.weight", None)
    else:
        fused["lm_head.weight"] = take("lm_head.weight")
    # Old checkpoints persist the RoPE frequencies; this model recomputes them from the config.
    unexpected = [name for name in remaining if not name.endswith("rotary_emb.inv_freq")]
    if unexpected:
        raise ValueError(f"unexpected weight {unexpected[0]!r} for {config.architecture}")
    return fused
