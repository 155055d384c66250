"""A fork's copy of a block: every layer's K and V rows of the source block land in the
destination, bit for bit, whatever the KV dtype; other blocks are untouched."""

from __future__ import annotations

import pytest
import torch
from intentserve.policy import CacheKind
from intentserve.worker.cache.kv_pool import KvGeometry, KvPool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_copy_blocks_copies_every_layers_k_and_v(dtype):
    geometry = KvGeometry(num_layers=2, num_kv_heads=2, head_dim=4, dtype=dtype)
    pool = KvPool(CacheKind.PAGED, geometry, num_blocks=5, block_size=4, device=torch.device("cpu"))
    for tensor in (*pool.k, *pool.v):
        tensor.copy_(torch.randn(tensor.shape).to(dtype))
    before = [t.clone() for t in (*pool.k, *pool.v)]
    pool.copy_blocks(((1, 3), (2, 4)))
    for old, new in zip(before, (*pool.k, *pool.v), strict=True):
        old, new = old.view(torch.uint8), new.view(torch.uint8)
        assert torch.equal(new[3], old[1]) and torch.equal(new[4], old[2])
        assert torch.equal(new[:3], old[:3])
