"""Model hyper-parameters: what the decoder, the KV-cache sizing and the policy layer need."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class RopeScalingType(str, Enum):
    LINEAR = "linear"
    LLAMA3 = "llama3"
    # llama.cpp's form: one divisor per rotary pair (GGUF tensor `rope_freqs.weight`); its
    # converter writes Llama 3.1's `llama3` recipe this way.
    FREQ_FACTORS = "freq_factors"


# The kinds a Hugging Face `config.json` can name; FREQ_FACTORS only comes from a GGUF tensor.
HF_ROPE_SCALING_TYPES = (RopeScalingType.LINEAR.value, RopeScalingType.LLAMA3.value)


@dataclass(frozen=True)
class RopeScaling:
    """How the RoPE frequencies are stretched for long contexts.

    `linear` divides every frequency by `factor` (position interpolation); `llama3` divides only
    the low frequencies and blends in between (the Llama 3.1 recipe, with its own fields below);
    `freq_factors` divides frequency i by `freq_factors[i]` (`factor` is unused, 1.0).
    """

    type: RopeScalingType
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple[float, ...] = ()

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any] | None) -> RopeScaling | None:
        """Parse `config.json`'s `rope_scaling` / `rope_parameters`; ValueError if unsupported."""
        if not raw:
            return None
        kind = raw.get("rope_type", raw.get("type"))
        if kind in (None, "default"):
            return None
        if kind not in HF_ROPE_SCALING_TYPES:
            allowed = list(HF_ROPE_SCALING_TYPES)
            raise ValueError(f"rope_scaling type {kind!r} is not supported (allowed: {allowed})")
        if kind == RopeScalingType.LINEAR.value:
            return cls(type=RopeScalingType.LINEAR, factor=float(raw["factor"]))
        return cls(
            type=RopeScalingType.LLAMA3,
            factor=float(raw["factor"]),
            low_freq_factor=float(raw["low_freq_factor"]),
            high_freq_factor=float(raw["high_freq_factor"]),
            original_max_position_embeddings=int(raw["original_max_position_embeddings"]),
        )


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of one checkpoint.

    NOTE: for an encoder-only checkpoint (`has_kv_cache=False`) only the size fields are
    meaningful; the RoPE and norm fields keep their defaults and no decoder is built from it.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    # Qwen2 puts a bias on the q/k/v projections; Llama and Mistral do not.
    qkv_bias: bool = False
    # Qwen3 RMS-normalizes each head of q and k (over head_dim) before RoPE.
    qk_norm: bool = False
    # Mistral-style banded attention: each token sees at most this many previous tokens.
    sliding_window: int | None = None
    has_kv_cache: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V one token occupies across all layers (0 for encoder-only models)."""
        if not self.has_kv_cache:
            return 0
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes
