"""Realizing the KV cache the policy allows, then letting the guard pick the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from intentserve.policy import (
    BackendKind,
    CacheKind,
    Capability,
    KvCacheDtype,
    PagedAttentionConfig,
    RealizedCache,
    Reason,
    Resolution,
    SchedulerKind,
    select_scheduler,
)
from intentserve.worker.attention.flash_paged import FlashPagedAttention
from intentserve.worker.attention.torch_paged import TorchPagedAttention
from intentserve.worker.cache.block_allocator import BlockAllocator
from intentserve.worker.cache.kv_pool import KvGeometry, KvPool, plan_num_blocks
from intentserve.worker.engine.realized import RealizedReport
from intentserve.worker.model.loaded import LoadedModel
from intentserve.worker.sched.default_scheduler import DefaultScheduler
from intentserve.worker.sched.paged_scheduler import PagedScheduler
from intentserve.worker.sched.scheduler import Scheduler

# Share of free memory the KV cache takes when the operator sets no budget.
DEFAULT_KV_FRACTION = {"cpu": 0.1, "cuda": 0.8}
_KV_DTYPES = {
    KvCacheDtype.FLOAT32: torch.float32,
    KvCacheDtype.BFLOAT16: torch.bfloat16,
    KvCacheDtype.FLOAT16: torch.float16,
}


@dataclass(frozen=True)
class RealizedKv:
    pool: KvPool
    attention: TorchPagedAttention | FlashPagedAttention
    scheduler: Scheduler
    realized: RealizedReport


def _budget(
    requested: PagedAttentionConfig | None,
    default_budget: tuple[int | None, float | None],
    capability: Capability,
    device: torch.device,
) -> tuple[int, str]:
    """(bytes, where the number came from) for the error message when it is too small."""
    budget_bytes, fraction = default_budget
    if requested is not None and (requested.kv_cache_bytes or requested.kv_cache_fraction):
        budget_bytes, fraction = requested.kv_cache_bytes, requested.kv_cache_fraction
    if budget_bytes:
        return budget_bytes, "kv_cache_bytes"
    fraction = fraction or DEFAULT_KV_FRACTION[device.type]
    free = capability.free_memory_bytes
    return int(free * fraction), f"kv_cache_fraction={fraction} of {free} free bytes"


def realize_kv(
    *,
    requested: PagedAttentionConfig | None,
    paged: PagedAttentionConfig | None,
    resolution: Resolution,
    fallback_reasons: tuple[Reason, ...],
    loaded: LoadedModel,
    capability: Capability,
    device: torch.device,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    default_budget: tuple[int | None, float | None],
    model_ref: str,
) -> RealizedKv:
    """`requested` is the operator's policy; `paged` is what survived the fallback helper."""
    c = loaded.config
    kv_intent = paged.kv_cache_dtype if paged is not None else KvCacheDtype.AUTO
    kv_dtype = _KV_DTYPES.get(kv_intent, loaded.dtype)
    geometry = KvGeometry(c.num_layers, c.num_kv_heads, c.head_dim, kv_dtype)
    budget, source = _budget(requested, default_budget, capability, device)
    if paged is not None:
        block_size = paged.block_size
        num_blocks = plan_num_blocks(geometry, budget, block_size, max_model_len, source)
        kind, backend = CacheKind.PAGED, resolution.backend.kind
        max_seqs_at_max_len = num_blocks // -(-max_model_len // block_size)
        prefix_caching = resolution.prefix_caching.enabled
    else:
        # One block of max_model_len tokens per slot; never more slots than sequences allowed.
        block_size = max_model_len
        num_slots = plan_num_blocks(geometry, budget, block_size, max_model_len, source)
        num_blocks = max_seqs_at_max_len = min(num_slots, max_num_seqs)
        kind, backend, prefix_caching = CacheKind.CONTIGUOUS, BackendKind.CONTIGUOUS, False
    pool = KvPool(kind, geometry, num_blocks, block_size, device)
    realized = RealizedCache(
        kind=kind,
        backend=backend,
        prefix_caching=prefix_caching,
        block_size=block_size,
        num_blocks=num_blocks,
        kv_cache_bytes=pool.num_bytes,
        max_num_seqs=max_seqs_at_max_len,
        kv_cache_dtype=str(kv_dtype).removeprefix("torch."),
        fallback_reasons=fallback_reasons,
    )
    # Checkpoint 3: the guard, not this function, decides which scheduler runs.
    choice = select_scheduler(requested, realized)
    if choice.kind is SchedulerKind.PAGED:
        allocator = BlockAllocator(num_blocks, block_size, prefix_caching)
        scheduler: Scheduler = PagedScheduler(
            allocator, max_num_seqs, max_num_batched_tokens, max_model_len
        )
    else:
        scheduler = DefaultScheduler(num_blocks, max_model_len, max_num_batched_tokens)
    window = c.sliding_window
    attention = (
        FlashPagedAttention(pool, sliding_window=window)
        if backend is BackendKind.FLASH_PAGED
        else TorchPagedAttention(pool, sliding_window=window)
    )
    report = RealizedReport(
        cache=replace(
            realized,
            scheduler=choice.kind,
            dtype=str(loaded.dtype).removeprefix("torch."),
            max_model_len=max_model_len,
        ),
        model=model_ref,
        decode_attention=attention.decode_impl,
    )
    return RealizedKv(pool, attention, scheduler, report)


def realize_without_cache(
    *,
    requested: PagedAttentionConfig | None,
    fallback_reasons: tuple[Reason, ...],
    loaded: LoadedModel,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    model_ref: str,
) -> tuple[Scheduler, RealizedReport]:
    """The `no_kv_cache` debug mode: nothing to allocate; the guard still picks the scheduler."""
    realized = RealizedCache(
        kind=CacheKind.NONE, backend=BackendKind.CONTIGUOUS, fallback_reasons=fallback_reasons
    )
    choice = select_scheduler(requested, realized)
    # The default scheduler's slots are bookkeeping only here: no KV is reserved behind them.
    scheduler = DefaultScheduler(max_num_seqs, max_model_len, max_num_batched_tokens)
    report = RealizedReport(
        cache=replace(
            realized,
            scheduler=choice.kind,
            max_num_seqs=max_num_seqs,
            dtype=str(loaded.dtype).removeprefix("torch."),
            max_model_len=max_model_len,
        ),
        model=model_ref,
    )
    return scheduler, report
