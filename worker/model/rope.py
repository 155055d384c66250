"""Rotary position embedding (HF rotate-half layout) with optional frequency scaling."""

from __future__ import annotations

import math

import torch
from intentserve.worker.model.config import ModelConfig, RopeScaling, RopeScalingType
from torch import Tensor, nn


def inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None, device: torch.device | str = "cpu"
) -> Tensor:  # [head_dim // 2] float32
    """Per-pair rotation speeds, computed as transformers does so the tables match bit for bit."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.type is RopeScalingType.LINEAR:
        return inv_freq / scaling.factor
    if scaling.type is RopeScalingType.FREQ_FACTORS:
        return inv_freq / torch.tensor(scaling.freq_factors, dtype=torch.float32, device=device)
    return _llama3_scaled(inv_freq, scaling)


def _llama3_scaled(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context_len / scaling.low_freq_factor
    high_freq_wavelen = old_context_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin precomputed for every position below `max_position_embeddings`.

    NOTE: the table holds only the first half of the head dimension; rotate-half uses the same
    angle for element i and i + head_dim/2, so the second half would be a copy.
    """

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        # NOTE: every tensor gets an explicit device, so that building the model under
        # torch.device("meta") still computes real tables.
        inv_freq = inverse_frequencies(
            config.head_dim, config.rope_theta, config.rope_scaling, device
        )
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32, device=device)
        angles = torch.outer(positions, inv_freq)  # [max_pos, head_dim // 2]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin for positions: [T] (int64), each [T, 1, head_dim // 2] in `dtype`.

        Gathered once per step and shared by every layer. NOTE: positions must be below
        max_position_embeddings; the caller (scheduler) enforces the context length.
        """
        cos = self.cos[positions].unsqueeze(1).to(dtype)
        sin = self.sin[positions].unsqueeze(1).to(dtype)
        return cos, sin


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x: [T, num_heads, head_dim] (rotate-half layout); returns the same shape."""
    x1, x2 = x.chunk(2, dim=-1)
    # cos/sin are cast to x's dtype before multiplying, as transformers does (bf16 parity).
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
