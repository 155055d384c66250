"""Attention in float64 over a whole context: what the paged backends are checked against."""

import math

import torch


def float64_attention(q, k, v, window=None):
    """q: [n, H, D] for the last n positions of a context whose k, v are [ctx, Hkv, D]; computed
    on q's device (the `gpu` layer checks CUDA outputs against it there)."""
    q, k, v = q.double(), k.double(), v.double()
    n, ctx, heads = q.shape[0], k.shape[0], q.shape[1]
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    qpos = torch.arange(ctx - n, ctx, device=q.device)[:, None]
    kpos = torch.arange(ctx, device=q.device)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= kpos > qpos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
