"""The simplest correct attention backend: one sequence, no cache, full causal attention.

Every call attends over exactly the tokens it is given, so a caller that wants the next token
recomputes the whole sequence. Used as the oracle the cached backends are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from intentserve.worker.model.llama import LlamaModel
from torch import Tensor


class CausalAttention:
    def __init__(self, layer_windows: Sequence[int | None] = ()) -> None:
        """`layer_windows`: each layer's band (None: the whole context); empty: none anywhere."""
        self.layer_windows = tuple(layer_windows)

    def forward(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, meta: Any = None) -> Tensor:
        """q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] of ONE sequence."""
        num_queries_per_kv = q.shape[1] // k.shape[1]
        q = q.transpose(0, 1)  # [num_heads, T, head_dim]
        k = k.transpose(0, 1).repeat_interleave(num_queries_per_kv, dim=0)  # [num_heads, T, D]
        v = v.transpose(0, 1).repeat_interleave(num_queries_per_kv, dim=0)
        window = self.layer_windows[layer_idx] if self.layer_windows else None
        if window is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=_banded_mask(q.shape[1], window, q.device)
            )
        return out.transpose(0, 1)  # [T, num_heads, head_dim]


def _banded_mask(num_tokens: int, window: int, device: torch.device) -> Tensor:
    # True where query i may see key j: causal, and at most window - 1 tokens back.
    idx = torch.arange(num_tokens, device=device)
    distance = idx[:, None] - idx[None, :]  # [T, T]
    return (distance >= 0) & (distance < window)


@torch.inference_mode()
def reference_logits(model: LlamaModel, token_ids: list[int]) -> Tensor:  # [T, vocab] float32
    """The model over one whole sequence with this backend: logits at every position."""
    ids = torch.tensor(token_ids, device=model.embed_tokens.weight.device)
    positions = torch.arange(len(token_ids), device=ids.device)
    hidden = model(ids, positions, CausalAttention(model.config.layer_windows), None)
    return model.compute_logits(hidden)
