"""The KV pool's memory is committed when the pool is built, on the host: every page of its
tensors is resident before the first request, so the budget is memory the worker holds (the next
worker's check of the host's available memory sees it as used) and no decode step stops to fault
pages in."""

from __future__ import annotations

import ctypes
import mmap
import sys

import pytest
import torch
from intentserve.policy import CacheKind
from intentserve.worker.cache.kv_pool import KvGeometry, KvPool

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="mincore(2), which counts resident pages, is Linux's",
)


def resident_fraction(tensor: torch.Tensor) -> float:
    """The fraction of the pages under `tensor` that are resident, from mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = tensor.data_ptr() // page * page
    end = -(-(tensor.data_ptr() + tensor.nbytes) // page) * page
    pages = (end - start) // page
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec) / pages


def test_fresh_host_memory_is_not_resident_until_touched():
    # The measure itself: a large fresh allocation is mapped but not resident (glibc maps
    # blocks over 32 MiB on their own), and is once written.
    t = torch.empty(64 << 20, dtype=torch.uint8)
    assert resident_fraction(t) < 0.05
    t.fill_(1)
    assert resident_fraction(t) == 1.0


def test_cpu_pool_pages_are_resident_when_built():
    # 2048 blocks x 16 tokens x 8 heads x 64 x 4 bytes: 64 MiB for each of K and V
    geometry = KvGeometry(num_layers=2, num_kv_heads=8, head_dim=64, dtype=torch.float32)
    pool = KvPool(CacheKind.PAGED, geometry, 2048, 16, torch.device("cpu"))
    for tensor in (*pool.k, *pool.v):
        assert tensor.nbytes == 64 << 20
        assert resident_fraction(tensor) == 1.0
        assert not tensor.any()  # committed as zeros
