"""The `triton_paged` backend: intentserve's own Triton kernel over the paged KV pool (CUDA).

It installs with torch's CUDA wheels (Triton ships with them), so it is the CUDA paged path
beside a current torch where vllm-flash-attn (which pins torch 2.4) cannot be installed. A step's
prefill chunks and decodes go through one launch a layer; sliding windows are a band in the
kernel's mask; the pool may be stored in fp8 (e4m3 or e5m2, scale 1), widened as it is read.

`prepare` cuts each sequence's new tokens into tiles on the host; everything the kernels read is
a tensor, so a decode step's launches can be captured in a CUDA graph (cuda_graphs.py) once the
tile tensors are fixed for a batch size.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from intentserve.policy import BackendKind, BackendStatus, KvCacheDtype
from intentserve.worker.attention.batch import StepBatch
from intentserve.worker.attention.cuda_status import cuda_backend_status
from intentserve.worker.cache.kv_pool import KvPool
from torch import Tensor

TRITON_KV_DTYPES = frozenset(
    {
        KvCacheDtype.FLOAT32,
        KvCacheDtype.BFLOAT16,
        KvCacheDtype.FLOAT16,
        KvCacheDtype.FP8_E4M3,
        KvCacheDtype.FP8_E5M2,
    }
)
ROWS_PER_DECODE_TILE = 16  # tl.dot's smallest M: one decode token's heads, padded
ROWS_PER_PREFILL_TILE = 64


def _import_triton() -> str:
    """ "" when Triton imports and can build its launcher, else why not."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure is a capability fact
        return f"triton does not import ({type(exc).__name__}: {exc})"
    # Triton compiles a small C launcher at a kernel's first launch, with $CC or else gcc or
    # clang from PATH (as its runtime looks for them): without one the first step would fail.
    if not os.environ.get("CC") and not any(shutil.which(c) for c in ("gcc", "clang")):
        return (
            "triton needs a C compiler to build its launcher at the first launch: set CC or "
            "install gcc or clang (the CUDA image has gcc)"
        )
    return ""


def triton_status(device: torch.device) -> BackendStatus:
    return cuda_backend_status(
        BackendKind.TRITON_PAGED,
        "the Triton paged kernel",
        device,
        _import_triton,
        TRITON_KV_DTYPES,
    )


def _pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, 1 << (n - 1).bit_length())


@dataclass(frozen=True)
class TritonMetadata:
    slot_mapping: Tensor  # [T] int64
    tables: Tensor  # [B, W] int32
    context_lens: Tensor  # [B] int32
    query_start: Tensor  # [B + 1] int32
    tile_seq: Tensor  # [num_tiles] int32
    tile_q0: Tensor  # [num_tiles] int32
    block_q: int  # query tokens per tile


def cut_tiles(query_lens: Sequence[int], block_q: int) -> tuple[list[int], list[int]]:
    """(sequence, first query token) of each tile of `block_q` tokens, in batch order."""
    tile_seq, tile_q0 = [], []
    for i, n in enumerate(query_lens):
        for q0 in range(0, n, block_q):
            tile_seq.append(i)
            tile_q0.append(q0)
    return tile_seq, tile_q0


class TritonPagedAttention:
    def __init__(
        self,
        pool: KvPool,
        num_heads: int,
        layer_windows: Sequence[int | None] = (),
        kernels=None,
    ) -> None:
        """`num_heads`: the model's query heads. `kernels`: `load_kernels()`'s when None (under
        TRITON_INTERPRET=1 they run on a CPU: tests, `make gpu-check DRY_RUN=1`)."""
        from intentserve.worker.attention.triton_kernels import NO_WINDOW, load_kernels

        if layer_windows and len(layer_windows) != len(pool.k):
            raise ValueError(
                f"layer_windows has {len(layer_windows)} entries for {len(pool.k)} layers"
            )
        self.pool = pool
        self.kernels = kernels if kernels is not None else load_kernels()
        self.windows = tuple(NO_WINDOW if w is None else w for w in layer_windows) or (
            NO_WINDOW,
        ) * len(pool.k)
        self.decode_impl = self.kernels.impl  # what runs a step's attention (start-up log)
        g = pool.geometry
        self.num_kv_heads, self.head_dim = g.num_kv_heads, g.head_dim
        self.head_dim_pad = _pow2_at_least(g.head_dim, 16)
        self.block_n = 32 if self.head_dim_pad > 128 else 64
        if num_heads % g.num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not share {g.num_kv_heads} KV heads")
        self.group = num_heads // g.num_kv_heads  # query heads per KV head
        self.group_pad = _pow2_at_least(self.group)

    def block_q(self, decode_only: bool) -> int:
        """Query tokens per tile: a decode-only step's tiles are as small as tl.dot allows."""
        rows = ROWS_PER_DECODE_TILE if decode_only else ROWS_PER_PREFILL_TILE
        return max(1, rows // self.group_pad)

    def prepare(self, batch: StepBatch) -> TritonMetadata:
        device = batch.tables.device
        block_q = self.block_q(all(n == 1 for n in batch.query_lens))
        tile_seq, tile_q0 = cut_tiles(batch.query_lens, block_q)

        def int32(values) -> Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        return TritonMetadata(
            slot_mapping=batch.slot_mapping,
            tables=batch.tables.to(torch.int32),
            context_lens=int32(batch.context_lens),
            query_start=int32(batch.query_start),
            tile_seq=int32(tile_seq),
            tile_q0=int32(tile_q0),
            block_q=block_q,
        )

    def store(self, layer_idx: int, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
        k_cache, v_cache = self.pool.flat(layer_idx)
        if k.dtype != k_cache.dtype:
            # NOTE: torch rounds to the pool's dtype (round to nearest even, fp8 included); the
            # kernel then only moves the rows. Triton's interpreter rounds to fp8 wrongly
            # (0.4987 -> 0.25 in e5m2, Triton 3.9), so the tests could not vouch for its cast.
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        self.kernels.store_kv[(k.shape[0], self.num_kv_heads)](
            k,
            v,
            k_cache,
            v_cache,
            slot_mapping,
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            HEAD_DIM=self.head_dim,
            HEAD_DIM_PAD=self.head_dim_pad,
        )

    def attend(self, layer_idx: int, q: Tensor, meta: TritonMetadata, out: Tensor) -> None:
        """Attention of q's rows over the pool as `meta` describes it, written into `out`."""
        k_cache, v_cache = self.pool.flat(layer_idx)
        dot_dtype, precision = self.kernels.dot_inputs(q.dtype)
        self.kernels.paged_attention[(meta.tile_seq.shape[0], self.num_kv_heads)](
            q,
            k_cache,
            v_cache,
            out,
            meta.tables,
            meta.context_lens,
            meta.query_start,
            meta.tile_seq,
            meta.tile_q0,
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            meta.tables.stride(0),
            self.head_dim**-0.5,
            self.windows[layer_idx],
            self.pool.block_size,
            GROUP=self.group,
            GROUP_PAD=self.group_pad,
            BLOCK_Q=meta.block_q,
            HEAD_DIM=self.head_dim,
            HEAD_DIM_PAD=self.head_dim_pad,
            BLOCK_N=self.block_n,
            DOT_DTYPE=dot_dtype,
            PRECISION=precision,
        )

    def forward(
        self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, meta: TritonMetadata
    ) -> Tensor:
        """q: [T, H, D]; k, v: [T, Hkv, D] (strided views are read in place)."""
        self.store(layer_idx, k, v, meta.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, H, D], dense
        self.attend(layer_idx, q, meta, out)
        return out
