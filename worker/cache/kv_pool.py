"""The KV tensors: one [num_blocks, block_size, num_kv_heads, head_dim] pair per layer.

Both cache kinds share this layout. The paged cache has many small blocks handed out by the block
allocator; the contiguous cache has one block of max_model_len tokens per sequence slot. So a key
at position p lives at flat row `table[p // block_size] * block_size + p % block_size`, where
`table` is the sequence's block table (paged) or `(slot,)` (contiguous).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from intentserve.policy import CacheKind


class KvBudgetError(ValueError):
    """The KV budget cannot hold even one max-length sequence (an error in every mode)."""


@dataclass(frozen=True)
class KvGeometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token over all layers."""
        element_bytes = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_bytes


def plan_num_blocks(
    geometry: KvGeometry, budget_bytes: int, block_size: int, max_model_len: int, budget_source: str
) -> int:
    """How many blocks of `block_size` tokens fit; a KvBudgetError with the numbers when not one
    max-length sequence fits."""
    block_bytes = geometry.bytes_per_token * block_size
    num_blocks = budget_bytes // block_bytes
    blocks_per_seq = -(-max_model_len // block_size)
    if num_blocks < blocks_per_seq:
        needed = blocks_per_seq * block_bytes
        # The longest sequence this budget holds: whole blocks for the paged cache; any length
        # for a contiguous slot (its "block" is the whole max_model_len).
        fitting_tokens = budget_bytes // geometry.bytes_per_token
        paged = block_size < max_model_len
        largest = fitting_tokens // block_size * block_size if paged else fitting_tokens
        raise KvBudgetError(
            f"KV cache budget too small: one sequence of max_model_len={max_model_len} needs "
            f"{needed} bytes ({blocks_per_seq} blocks of {block_size} tokens x "
            f"{geometry.bytes_per_token} bytes/token), but {budget_source} gives {budget_bytes} "
            f"bytes; the largest max_model_len that fits is {largest} "
            "(raise the KV budget or lower max_model_len)"
        )
    return int(num_blocks)


class KvPool:
    """Owns the KV tensors; attention backends write and read them through flat row indices."""

    def __init__(
        self,
        kind: CacheKind,
        geometry: KvGeometry,
        num_blocks: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.kind = kind
        self.geometry = geometry
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks, block_size, geometry.num_kv_heads, geometry.head_dim)
        self.k = [
            torch.empty(shape, dtype=geometry.dtype, device=device)
            for _ in range(geometry.num_layers)
        ]
        self.v = [
            torch.empty(shape, dtype=geometry.dtype, device=device)
            for _ in range(geometry.num_layers)
        ]
        self.commit_seconds = self._commit() if device.type == "cpu" else 0.0

    def _commit(self) -> float:
        """Write every page of the host tensors once (zeros; torch's threads share the fill), so
        the pool is memory the worker holds from the start; returns the seconds it took.

        A fresh host mapping is only reserved: its pages are taken and zeroed by the kernel at
        their first write. Left that way, the budget would be memory no one holds: the next
        worker's check of the host's available memory counts it as free, an overcommitted host
        fails mid-traffic instead of at start-up, and the first requests to reach each block pay
        its page faults inside decode steps (64 fresh streams, bf16: 6% of a run's samples were
        the kernel clearing pages; docs/engine.md). GPU memory is committed when allocated."""
        start = time.perf_counter()
        for tensor in (*self.k, *self.v):
            tensor.zero_()
        return time.perf_counter() - start

    @property
    def num_bytes(self) -> int:
        """The bytes of the K and V tensors as allocated (what the realized report states)."""
        return sum(t.nbytes for t in (*self.k, *self.v))

    @property
    def num_token_rows(self) -> int:
        return self.num_blocks * self.block_size

    def copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        """Copies each (source, destination) block's K and V rows, in every layer (fork).

        NOTE: as bytes: index_copy_ has no float8 kernel (on the CPU, at least)."""
        if not copies:
            return
        device = self.k[0].device
        src = torch.tensor([s for s, _ in copies], dtype=torch.int64, device=device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.int64, device=device)
        for tensor in (*self.k, *self.v):
            raw = tensor.view(torch.uint8)  # [num_blocks, block_size, Hkv, D * element bytes]
            raw.index_copy_(0, dst, raw.index_select(0, src))

    def flat(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_blocks * block_size, num_kv_heads, head_dim] views of one layer's K and V."""
        rows = self.num_token_rows
        g = self.geometry
        return (
            self.k[layer_idx].view(rows, g.num_kv_heads, g.head_dim),
            self.v[layer_idx].view(rows, g.num_kv_heads, g.head_dim),
        )
