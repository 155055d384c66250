"""torch backend over the KV pool: gather K/V through block tables, then scaled-dot-product
attention. Runs on any device; serves both the paged and the contiguous cache (they differ only in
block size and who hands out the blocks). A step may mix prefill chunks and decodes.

On the CPU, decodes go to a compiled kernel that reads K/V in place through the block table
(`worker/kernels/attention/paged_decode.c`) when it can be built; otherwise, and on other
devices, they gather K/V with `index_select` and run two matmuls. Prefill chunks use SDPA, except
short ones where the kernel is loaded: each of their query tokens is then one more kernel row,
attending its own causal context through the sequence's table (the chunk's K/V are stored
before attention runs). A chunk is short when its query tokens times its context tokens are at
most SHORT_PREFILL_READS: each token reads its context again, so this is only for small chunks,
where one SDPA call per sequence and layer costs more in overhead than the reads (64 prompts of
~12 tokens: 1,920 SDPA calls a step, ~27 us each). Whether a chunk is short depends on that chunk
alone, so a request's numbers never depend on its batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from intentserve.worker.attention.batch import StepBatch
from intentserve.worker.cache.kv_pool import KvPool
from intentserve.worker.kernels import (
    KernelUnavailable,
    PagedDecodeKernel,
    paged_decode_kernel,
)
from torch import Tensor

log = logging.getLogger(__name__)

SHORT_PREFILL_READS = 2048  # a chunk's query tokens x context tokens, for the kernel path

# Storage dtypes the compiled decode kernel reads (q, cache and output all in that dtype).
_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class DecodeGroup:
    rows: Tensor | None  # [B] rows of the decodes in the token batch; None when rows == 0..B-1
    # The gather path: flat cache rows of every context position (padding: position 0), [B * L];
    # and the bias, [B, 1, 1, L] float32: 0 where the key is attended, -inf where not.
    key_rows: Tensor | None
    bias: Tensor | None
    # The kernel path: block tables [B, W] and context lengths [B], both int64.
    tables: Tensor | None = None
    context_lens: Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.bias.shape[0] if self.bias is not None else self.context_lens.shape[0]


@dataclass(frozen=True)
class PrefillChunk:
    row_start: int
    row_end: int
    key_rows: Tensor | None  # [ctx] flat cache rows; None: the chunk is the whole context
    mask: Tensor | None  # [n, ctx] True where attended; None: plain causal


@dataclass(frozen=True)
class WindowPlan:
    """What one window's layers attend to this step (every layer with that window shares it)."""

    decode: DecodeGroup | None
    prefills: tuple[PrefillChunk, ...]


@dataclass(frozen=True)
class TorchPagedMetadata:
    slot_mapping: Tensor  # [T]
    plans: dict[int | None, WindowPlan]  # by window (None: the whole context)


def _key_rows(tables: Tensor, block_size: int, num_positions: int) -> Tensor:
    """[B, num_positions] flat cache rows of positions 0..num_positions-1 of each sequence."""
    pos = torch.arange(num_positions, device=tables.device)
    blocks = tables.gather(1, (pos // block_size).expand(tables.shape[0], -1))
    return blocks * block_size + pos % block_size


def _in_dtype(t: Tensor, dtype: torch.dtype) -> Tensor:
    """NOTE: `t.to(dtype)` is a dispatched op even where it changes nothing; a decode step calls
    this twice per layer."""
    return t if t.dtype == dtype else t.to(dtype)


def _window_floor(query_pos: Tensor, window: int | None) -> Tensor | None:
    return None if window is None else query_pos - window + 1


def _decode_kernel_for(pool: KvPool, use_kernel: bool) -> tuple[PagedDecodeKernel | None, str]:
    """(kernel, "") when decodes on this pool can use the compiled kernel, else (None, why)."""
    if not use_kernel:
        return None, "the compiled decode kernel was not asked for"
    k_cache = pool.k[0]
    if k_cache.device.type != "cpu":
        return None, f"the compiled decode kernel is CPU-only (the cache is on {k_cache.device})"
    if k_cache.dtype not in _KERNEL_DTYPES:
        return None, f"the compiled decode kernel does not read a {k_cache.dtype} cache"
    head_dim = k_cache.shape[-1]
    if head_dim % 16 or head_dim > 256:
        return (
            None,
            f"the compiled decode kernel needs head_dim a multiple of 16 up to 256, not {head_dim}",
        )
    try:
        return paged_decode_kernel(), ""
    except KernelUnavailable as exc:
        return None, exc.reason


class TorchPagedAttention:
    def __init__(
        self, pool: KvPool, layer_windows: Sequence[int | None] = (), use_kernel: bool = True
    ) -> None:
        """`layer_windows`: each layer's band (None: the whole context); empty: none anywhere.

        NOTE: a banded layer still keeps K/V for the whole context: every layer shares one
        block table, so blocks behind the window are not freed; the band is only a mask.
        """
        if layer_windows and len(layer_windows) != len(pool.k):
            raise ValueError(
                f"layer_windows has {len(layer_windows)} entries for {len(pool.k)} layers"
            )
        self.pool = pool
        self.layer_windows = tuple(layer_windows) or (None,) * len(pool.k)
        self.kernel, why_not = _decode_kernel_for(pool, use_kernel)
        if self.kernel is None and use_kernel:
            # On the CPU the kernel was expected, so its absence is worth a warning.
            log.log(
                logging.WARNING if pool.k[0].device.type == "cpu" else logging.INFO,
                "decode attention uses index_select + matmul: %s",
                why_not,
            )
        # What runs a step's decodes, for the start-up log and the benchmark.
        self.decode_impl = "compiled CPU kernel" if self.kernel else f"torch gather ({why_not})"

    def prepare(self, batch: StepBatch) -> TorchPagedMetadata:
        # The kernel's rows do not depend on the window (the kernel takes it as an argument):
        # built once a step, shared by every window's plan.
        kernel = self._kernel_group(batch) if self.kernel is not None else None
        plans = {w: self._plan(batch, w, kernel) for w in dict.fromkeys(self.layer_windows)}
        return TorchPagedMetadata(batch.slot_mapping, plans)

    @staticmethod
    def _kernel_group(batch: StepBatch) -> tuple[DecodeGroup | None, set[int]]:
        """Decodes and short prefill chunks as the kernel's rows, one per query token in batch
        order (None when there are none), and the sequences they cover."""
        kernel_seqs = [
            i
            for i, n in enumerate(batch.query_lens)
            if n == 1 or n * batch.context_lens[i] <= SHORT_PREFILL_READS
        ]
        kernel_rows, contexts, owners = [], [], []
        for i in kernel_seqs:
            n, ctx = batch.query_lens[i], batch.context_lens[i]
            kernel_rows += range(batch.query_start[i], batch.query_start[i + 1])
            contexts += range(ctx - n + 1, ctx + 1)  # causal: up to and with the token
            owners += [i] * n
        if not kernel_rows:
            return None, set()
        in_order = kernel_rows == list(range(len(kernel_rows)))
        same_tables = owners == list(range(batch.num_seqs))
        group = DecodeGroup(
            rows=None if in_order else torch.tensor(kernel_rows, device=batch.tables.device),
            key_rows=None,
            bias=None,
            tables=(batch.tables if same_tables else batch.tables[owners]).contiguous(),
            context_lens=torch.tensor(contexts),
        )
        return group, set(kernel_seqs)

    def _plan(
        self,
        batch: StepBatch,
        window: int | None,
        kernel: tuple[DecodeGroup | None, set[int]] | None,
    ) -> WindowPlan:
        """`kernel`: `_kernel_group`'s result where the kernel is loaded, else None."""
        device = batch.tables.device
        decode_idx = [i for i, n in enumerate(batch.query_lens) if n == 1]
        prefill_idx = [i for i, n in enumerate(batch.query_lens) if n > 1]
        decode = None
        if kernel is not None:
            decode, on_kernel = kernel
            prefill_idx = [i for i in prefill_idx if i not in on_kernel]
        elif decode_idx:
            # The decodes' rows in the token batch; None when they are rows 0..B-1 (the usual
            # case).
            rows = (
                None
                if decode_idx == list(range(len(decode_idx)))
                else torch.tensor([batch.query_start[i] for i in decode_idx], device=device)
            )
            ctx = torch.tensor([batch.context_lens[i] for i in decode_idx], device=device)
            length = int(ctx.max())
            key_rows = _key_rows(batch.tables[decode_idx], batch.block_size, length)
            pos = torch.arange(length, device=device)
            mask = pos < ctx[:, None]  # [B, L]
            # NOTE: the pool is torch.empty; a padded position must still read a written row,
            # because softmax weight 0 times a garbage NaN is NaN. Position 0 always is one.
            key_rows = torch.where(mask, key_rows, key_rows[:, :1])
            floor = _window_floor(ctx - 1, window)
            if floor is not None:
                mask &= pos >= floor[:, None]
            bias = torch.zeros(mask.shape, dtype=torch.float32, device=device)
            bias.masked_fill_(~mask, float("-inf"))
            decode = DecodeGroup(rows, key_rows.reshape(-1), bias[:, None, None, :])
        prefills = []
        for i in prefill_idx:
            n, ctx = batch.query_lens[i], batch.context_lens[i]
            start = ctx - n
            windowed = window is not None and ctx > window
            if start == 0 and not windowed:
                prefills.append(
                    PrefillChunk(batch.query_start[i], batch.query_start[i + 1], None, None)
                )
                continue
            key_rows = _key_rows(batch.tables[i : i + 1], batch.block_size, ctx)[0]
            query_pos = torch.arange(start, ctx, device=device)[:, None]
            key_pos = torch.arange(ctx, device=device)[None, :]
            mask = key_pos <= query_pos
            floor = _window_floor(query_pos, window)
            if floor is not None:
                mask &= key_pos >= floor
            prefills.append(
                PrefillChunk(batch.query_start[i], batch.query_start[i + 1], key_rows, mask)
            )
        return WindowPlan(decode, tuple(prefills))

    def _decode_kernel(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        d: DecodeGroup,
        window: int | None,
        out: Tensor,
    ) -> None:
        """The compiled kernel: K/V read in place, float32 softmax, one (sequence, kv head) per
        task. NOTE: q may be a strided view of the fused projection; rows must be dense."""
        batch = d.num_seqs
        qd = q if d.rows is None else q[d.rows]
        if qd.shape[0] != batch:
            qd = qd[:batch]
        if qd.dtype != k_cache.dtype or qd.stride(2) != 1 or qd.stride(1) != qd.shape[2]:
            qd = qd.to(k_cache.dtype).contiguous()
        direct = d.rows is None and out.dtype == k_cache.dtype  # write straight into `out`
        if direct:
            result = out if out.shape[0] == batch else out[:batch]
        else:
            result = torch.empty(qd.shape, dtype=k_cache.dtype)
        fn = self.kernel.bf16 if k_cache.dtype == torch.bfloat16 else self.kernel.f32
        num_heads, head_dim = qd.shape[1], qd.shape[2]
        code = fn(
            qd.data_ptr(),
            qd.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            d.tables.data_ptr(),
            d.tables.shape[1],
            d.context_lens.data_ptr(),
            batch,
            num_heads,
            k_cache.shape[1],
            head_dim,
            self.pool.block_size,
            window or 0,
            head_dim**-0.5,
            result.data_ptr(),
        )
        if code != 0:
            raise RuntimeError(f"paged decode kernel failed (code {code})")
        if not direct:
            if d.rows is None:
                out[:batch] = result
            else:
                out[d.rows] = result.to(out.dtype)

    @staticmethod
    def _decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, d: DecodeGroup, out: Tensor) -> None:
        """One new token per sequence, written into `out`. Matmuls over [B, Hkv, G, D] x
        [B, Hkv, L, D]: the G query heads of a kv head act as G query rows, so grouped-query
        attention needs no repeat. NOTE: on this CPU, index_select + two matmuls measured ~1.3x
        faster than fancy indexing + SDPA for these tiny per-head problems."""
        batch, length = d.bias.shape[0], d.bias.shape[-1]
        num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
        group = q.shape[1] // num_kv_heads
        qd = (q if d.rows is None else q[d.rows])[:batch]
        qd = qd.reshape(batch, num_kv_heads, group, head_dim)

        def gather(cache: Tensor) -> Tensor:  # -> [B, Hkv, L, D]
            rows = cache.index_select(0, d.key_rows).view(batch, length, num_kv_heads, head_dim)
            return rows.transpose(1, 2).contiguous().to(q.dtype)

        scores = torch.matmul(qd, gather(k_cache).transpose(-1, -2)).float()  # [B, Hkv, G, L]
        scores = scores.mul_(head_dim**-0.5).add_(d.bias)
        attended = torch.matmul(scores.softmax(-1).to(q.dtype), gather(v_cache))
        attended = attended.reshape(batch, num_kv_heads * group, head_dim)
        if d.rows is None:
            out[:batch] = attended
        else:
            out[d.rows] = attended

    def _store_in_c(self, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots) -> bool:
        """The new K/V rows into the cache in one compiled call (two index_copy_ took ~3 us
        each per layer at one row, far more at 64); False, nothing written, where the kernel is
        not loaded or the rows are not laid out as it reads them (then index_copy_ does it)."""
        if self.kernel is None or k.dtype != k_cache.dtype or v.dtype != k_cache.dtype:
            return False
        head_dim = k.shape[2]
        dense = (k.stride(2), k.stride(1), v.stride(2), v.stride(1)) == (1, head_dim) * 2
        if not dense or k.stride(0) != v.stride(0) or slots.dtype != torch.int64:
            return False
        if not (slots.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()):
            return False
        size = k.element_size()
        self.kernel.kv_store(
            k.data_ptr(),
            v.data_ptr(),
            k.stride(0) * size,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            slots.data_ptr(),
            k.shape[0],
            k.shape[1] * head_dim * size,
        )
        return True

    def forward(
        self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor, meta: TorchPagedMetadata
    ) -> Tensor:
        k_cache, v_cache = self.pool.flat(layer_idx)  # [rows, Hkv, D]
        if not self._store_in_c(k, v, k_cache, v_cache, meta.slot_mapping):
            k_cache.index_copy_(0, meta.slot_mapping, _in_dtype(k, k_cache.dtype))
            v_cache.index_copy_(0, meta.slot_mapping, _in_dtype(v, v_cache.dtype))
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, H, D], dense
        window = self.layer_windows[layer_idx]
        plan = meta.plans[window]
        if plan.decode is not None and plan.decode.tables is not None:
            self._decode_kernel(q, k_cache, v_cache, plan.decode, window, out)
        elif plan.decode is not None:
            self._decode(q, k_cache, v_cache, plan.decode, out)
        for chunk in plan.prefills:
            qp = q[chunk.row_start : chunk.row_end].transpose(0, 1)[None]  # [1, H, n, D]
            if chunk.key_rows is None:
                keys = k[chunk.row_start : chunk.row_end]
                values = v[chunk.row_start : chunk.row_end]
            else:
                keys = k_cache[chunk.key_rows].to(q.dtype)
                values = v_cache[chunk.key_rows].to(q.dtype)
            attended = F.scaled_dot_product_attention(
                qp,
                keys.transpose(0, 1)[None],  # [1, Hkv, ctx, D]
                values.transpose(0, 1)[None],
                attn_mask=chunk.mask,
                is_causal=chunk.mask is None,
                enable_gqa=True,
            )
            out[chunk.row_start : chunk.row_end] = attended[0].transpose(0, 1)
        return out
