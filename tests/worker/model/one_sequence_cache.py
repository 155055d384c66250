"""Test helper: the smallest attention backend with a KV cache, for one sequence.

It lets greedy decoding feed one token per step instead of recomputing the whole sequence, and
at the same time checks that the model passes positions and per-layer k/v through correctly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class OneSequenceKVCache:
    def __init__(self) -> None:
        self._keys: dict[int, Tensor] = {}  # layer -> [num_tokens, num_kv_heads, head_dim]
        self._values: dict[int, Tensor] = {}

    def forward(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, meta: Any = None) -> Tensor:
        keys = torch.cat([self._keys.get(layer_idx, k[:0]), k])
        values = torch.cat([self._values.get(layer_idx, v[:0]), v])
        self._keys[layer_idx], self._values[layer_idx] = keys, values
        num_new, num_total = q.shape[0], keys.shape[0]
        group = q.shape[1] // k.shape[1]
        # New query i sits at position num_total - num_new + i and sees keys up to it.
        query_pos = torch.arange(num_total - num_new, num_total)[:, None]
        mask = torch.arange(num_total)[None, :] <= query_pos  # [num_new, num_total]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            keys.transpose(0, 1).repeat_interleave(group, dim=0),
            values.transpose(0, 1).repeat_interleave(group, dim=0),
            attn_mask=mask,
        )
        return out.transpose(0, 1)  # [num_new, num_heads, head_dim]
