"""vllm-flash-attn over the paged KV pool (CUDA only).

The import is guarded: its failure text becomes the capability's reason, never a crash. One
`flash_attn_varlen_func(..., block_table=...)` call serves a step that mixes prefill chunks and
decodes (causal masking is aligned to the end of each sequence's context).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from intentserve.policy import BackendKind, BackendStatus, KvCacheDtype
from intentserve.worker.attention.batch import StepBatch
from intentserve.worker.attention.cuda_status import cuda_backend_status
from intentserve.worker.cache.kv_pool import KvPool
from torch import Tensor

FLASH_KV_DTYPES = frozenset({KvCacheDtype.BFLOAT16, KvCacheDtype.FLOAT16})


def import_flash_kernel() -> tuple[Callable | None, str]:
    """(flash_attn_varlen_func, "") or (None, why it is unavailable)."""
    try:
        from vllm_flash_attn import flash_attn_varlen_func
    except Exception as exc:  # noqa: BLE001 - any import failure is a capability fact
        return None, f"vllm_flash_attn does not import ({type(exc).__name__}: {exc})"
    return flash_attn_varlen_func, ""


def flash_status(device: torch.device) -> BackendStatus:
    return cuda_backend_status(
        BackendKind.FLASH_PAGED,
        "vllm-flash-attn",
        device,
        lambda: import_flash_kernel()[1],
        FLASH_KV_DTYPES,
    )


@dataclass(frozen=True)
class FlashMetadata:
    slot_mapping: Tensor  # [T] int64
    cu_seqlens_q: Tensor  # [B + 1] int32
    cu_seqlens_k: Tensor  # [B + 1] int32
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: Tensor  # [B, max_blocks] int32


class FlashPagedAttention:
    decode_impl = "vllm-flash-attn flash_attn_varlen_func"  # what runs decodes (start-up log)

    def __init__(
        self,
        pool: KvPool,
        kernel: Callable | None = None,
        layer_windows: Sequence[int | None] = (),
    ) -> None:
        """`layer_windows`: each layer's band (None: the whole context); empty: none anywhere."""
        if kernel is None:
            kernel, why = import_flash_kernel()
            if kernel is None:
                raise RuntimeError(why)
        if layer_windows and len(layer_windows) != len(pool.k):
            raise ValueError(
                f"layer_windows has {len(layer_windows)} entries for {len(pool.k)} layers"
            )
        self.pool = pool
        self.kernel = kernel  # injectable, so the plumbing is testable on a CPU
        # flash's (left, right) reach: a band of w tokens is w - 1 to the left, none to the right.
        self.window_sizes = tuple(
            (-1, -1) if w is None else (w - 1, 0) for w in (layer_windows or (None,) * len(pool.k))
        )

    def prepare(self, batch: StepBatch) -> FlashMetadata:
        device = batch.tables.device
        cu_k = [0]
        for n in batch.context_lens:
            cu_k.append(cu_k[-1] + n)
        return FlashMetadata(
            slot_mapping=batch.slot_mapping,
            cu_seqlens_q=torch.tensor(batch.query_start, dtype=torch.int32, device=device),
            cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=device),
            max_seqlen_q=max(batch.query_lens),
            max_seqlen_k=max(batch.context_lens),
            block_table=batch.tables.to(torch.int32),
        )

    def forward(
        self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, meta: FlashMetadata
    ) -> Tensor:
        k_flat, v_flat = self.pool.flat(layer_idx)
        k_flat.index_copy_(0, meta.slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, meta.slot_mapping, v.to(v_flat.dtype))
        return self.kernel(
            q.contiguous(),
            self.pool.k[layer_idx],  # [num_blocks, block_size, Hkv, D]
            self.pool.v[layer_idx],
            cu_seqlens_q=meta.cu_seqlens_q,
            cu_seqlens_k=meta.cu_seqlens_k,
            max_seqlen_q=meta.max_seqlen_q,
            max_seqlen_k=meta.max_seqlen_k,
            causal=True,
            window_size=self.window_sizes[layer_idx],
            block_table=meta.block_table,
        )
