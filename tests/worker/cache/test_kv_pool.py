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


def resident_fraction(address: int, num_bytes: int) -> float:
    """The fraction of the pages under [address, address + num_bytes) that are resident, from
    mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = address // page * page
    end = -(-(address + num_bytes) // page) * page
    pages = (end - start) // page
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec) / pages


def tensor_resident_fraction(tensor: torch.Tensor) -> float:
    return resident_fraction(tensor.data_ptr(), tensor.nbytes)


def test_fresh_host_memory_is_not_resident_until_touched():
    # The measure itself, on a mapping of its own (torch's allocator may hand back memory an
    # earlier test already touched): mapped, not resident; resident once written.
    size = 64 << 20
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    assert resident_fraction(address, size) < 0.05
    mapping.write(b"\1" * size)
    assert resident_fraction(address, size) == 1.0


def test_cpu_pool_pages_are_resident_when_built():
    # 2048 blocks x 16 tokens x 8 heads x 64 x 4 bytes: 64 MiB for each of K and V
    geometry = KvGeometry(num_layers=2, num_kv_heads=8, head_dim=64, dtype=torch.float32)
    pool = KvPool(CacheKind.PAGED, geometry, 2048, 16, torch.device("cpu"))
    for tensor in (*pool.k, *pool.v):
        assert tensor.nbytes == 64 << 20
        assert tensor_resident_fraction(tensor) == 1.0
        assert not tensor.any()  # committed as zeros (reused memory would hold old bytes)
