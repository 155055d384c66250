"""Realizing the KV cache the policy allows, then letting the guard pick the scheduler.

budget -> plan the cache (RealizedCache) -> the guard picks the scheduler -> allocate the pool
-> build the scheduler and the attention backend over it
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from intentserve.policy import (
    BackendKind,
    CacheKind,
    KvBudget,
    KvCacheDtype,
    PagedAttentionConfig,
    RealizedCache,
    Reason,
    Resolution,
    SchedulerChoice,
    SchedulerKind,
    select_scheduler,
)
from intentserve.worker.attention.flash_paged import FlashPagedAttention
from intentserve.worker.attention.torch_paged import TorchPagedAttention
from intentserve.worker.attention.triton_paged import TritonPagedAttention
from intentserve.worker.cache.block_allocator import BlockAllocator
from intentserve.worker.cache.kv_pool import KvGeometry, KvPool, plan_num_blocks
from intentserve.worker.model.loaded import LoadedModel
from intentserve.worker.sched.default_scheduler import DefaultScheduler
from intentserve.worker.sched.paged_scheduler import PagedScheduler
from intentserve.worker.sched.scheduler import Scheduler


class KvBudgetTooLargeError(ValueError):
    """The KV budget is more than the memory this worker can use: a pool that size would be
    promised in the realized report, then paid for by the OOM killer as it fills."""


log = logging.getLogger(__name__)

# Share of free memory the KV cache takes when the operator sets no budget.
DEFAULT_KV_FRACTION = {"cpu": 0.1, "cuda": 0.8}
_KV_DTYPES = {
    KvCacheDtype.FLOAT32: torch.float32,
    KvCacheDtype.BFLOAT16: torch.bfloat16,
    KvCacheDtype.FLOAT16: torch.float16,
    KvCacheDtype.FP8_E4M3: torch.float8_e4m3fn,  # only backends that list them can be asked
    KvCacheDtype.FP8_E5M2: torch.float8_e5m2,
}


@dataclass(frozen=True)
class SchedulerLimits:
    max_model_len: int  # longest sequence (prompt + output)
    max_num_seqs: int  # sequences running at once
    max_num_batched_tokens: int  # tokens per step


@dataclass(frozen=True)
class KvRequest:
    """What the cache must realize: the operator's policy, what survived the fallback helper,
    the controller's decisions, the reasons recorded so far, the budget and the limits."""

    requested: PagedAttentionConfig | None
    paged: PagedAttentionConfig | None
    resolution: Resolution
    fallback_reasons: tuple[Reason, ...]
    budget: KvBudget
    limits: SchedulerLimits


@dataclass(frozen=True)
class RealizedKv:
    pool: KvPool | None  # None in the no_kv_cache debug mode
    attention: TorchPagedAttention | FlashPagedAttention | TritonPagedAttention | None
    scheduler: Scheduler
    cache: RealizedCache  # what was built, with the scheduler the guard chose


def realize_kv(
    request: KvRequest, loaded: LoadedModel, free_memory_bytes: int, device: torch.device
) -> RealizedKv:
    geometry = _geometry(loaded, request.paged)
    budget_bytes, source = budget_in_bytes(request.budget, free_memory_bytes, device)
    planned = _plan(request, geometry, budget_bytes, source)
    choice = select_scheduler(request.requested, planned)  # checkpoint 3: the guard decides
    pool = KvPool(planned.kind, geometry, planned.num_blocks, planned.block_size, device)
    if pool.commit_seconds:
        log.info(
            "KV cache: %d MiB committed on the host in %.2f s (%d blocks of %d tokens)",
            pool.num_bytes >> 20,
            pool.commit_seconds,
            planned.num_blocks,
            planned.block_size,
        )
    scheduler = _scheduler(choice, planned, request.limits)
    attention = _attention(planned.backend, pool, loaded)
    built = replace(planned, kv_cache_bytes=pool.num_bytes)
    return RealizedKv(pool, attention, scheduler, _finish(built, choice, loaded, request.limits))


def _attention(backend: BackendKind, pool: KvPool, loaded: LoadedModel):
    """The backend the plan names, over the pool (the contiguous cache uses the torch one)."""
    windows = loaded.config.layer_windows
    if backend is BackendKind.FLASH_PAGED:
        return FlashPagedAttention(pool, layer_windows=windows)
    if backend is BackendKind.TRITON_PAGED:
        return TritonPagedAttention(pool, loaded.config.num_heads, layer_windows=windows)
    return TorchPagedAttention(pool, layer_windows=windows)


def realize_without_cache(request: KvRequest, loaded: LoadedModel) -> RealizedKv:
    """The `no_kv_cache` debug mode: nothing to allocate; the guard still picks the scheduler."""
    planned = RealizedCache(
        kind=CacheKind.NONE,
        backend=BackendKind.CONTIGUOUS,
        max_num_seqs=request.limits.max_num_seqs,
        fallback_reasons=request.fallback_reasons,
    )
    choice = select_scheduler(request.requested, planned)
    # The default scheduler's slots are bookkeeping only here: no KV is reserved behind them.
    limits = request.limits
    scheduler = DefaultScheduler(
        limits.max_num_seqs, limits.max_model_len, limits.max_num_batched_tokens
    )
    return RealizedKv(None, None, scheduler, _finish(planned, choice, loaded, limits))


def budget_in_bytes(
    budget: KvBudget, free_memory_bytes: int, device: torch.device
) -> tuple[int, str]:
    """(bytes, where the number came from) for the error message when it is too small.

    `free_memory_bytes` is what the worker can use (the capability's: free device memory, or
    the host's available memory within its cgroup's limit); a budget beyond it is refused."""
    if budget.num_bytes is not None:
        if budget.num_bytes > free_memory_bytes:
            usable = (
                "free device memory"
                if device.type == "cuda"
                else "the host's available memory, within its cgroup's limit"
            )
            raise KvBudgetTooLargeError(
                "KV cache budget too large: kv_cache_memory (spec.pagedAttention.kvCacheMemory) "
                f"asks for {budget.num_bytes} bytes ({_gib(budget.num_bytes)}), but this worker "
                f"can use at most {free_memory_bytes} bytes ({_gib(free_memory_bytes)}: {usable}); "
                "lower the KV budget or give the worker more memory"
            )
        return budget.num_bytes, "kv_cache_memory"
    fraction = budget.fraction or DEFAULT_KV_FRACTION[device.type]
    return (
        int(free_memory_bytes * fraction),
        f"kv_cache_memory={fraction:.0%} of {free_memory_bytes} free bytes",
    )


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 30):.1f} GiB"


def _geometry(loaded: LoadedModel, paged: PagedAttentionConfig | None) -> KvGeometry:
    c = loaded.config
    kv_intent = paged.kv_cache_dtype if paged is not None else KvCacheDtype.AUTO
    kv_dtype = _KV_DTYPES.get(kv_intent, loaded.dtype)
    return KvGeometry(c.num_layers, c.num_kv_heads, c.head_dim, kv_dtype)


def _plan(request: KvRequest, geometry: KvGeometry, budget: int, source: str) -> RealizedCache:
    """The cache to build, as the report will state it (before the guard's scheduler)."""
    max_model_len = request.limits.max_model_len
    kv_cache_dtype = str(geometry.dtype).removeprefix("torch.")
    if request.paged is not None:
        block_size = request.paged.block_size
        num_blocks = plan_num_blocks(geometry, budget, block_size, max_model_len, source)
        return RealizedCache(
            kind=CacheKind.PAGED,
            backend=request.resolution.backend.kind,
            prefix_caching=request.resolution.prefix_caching.enabled,
            block_size=block_size,
            num_blocks=num_blocks,
            # The scheduler's slots; free blocks decide how many of them run at once.
            max_num_seqs=request.limits.max_num_seqs,
            kv_cache_dtype=kv_cache_dtype,
            fallback_reasons=request.fallback_reasons,
        )
    # One block of max_model_len tokens per slot; never more slots than sequences allowed.
    num_slots = plan_num_blocks(geometry, budget, max_model_len, max_model_len, source)
    num_slots = min(num_slots, request.limits.max_num_seqs)
    return RealizedCache(
        kind=CacheKind.CONTIGUOUS,
        backend=BackendKind.CONTIGUOUS,
        block_size=max_model_len,
        num_blocks=num_slots,
        max_num_seqs=num_slots,
        kv_cache_dtype=kv_cache_dtype,
        fallback_reasons=request.fallback_reasons,
    )


def _scheduler(choice: SchedulerChoice, cache: RealizedCache, limits: SchedulerLimits) -> Scheduler:
    if choice.kind is SchedulerKind.PAGED:
        allocator = BlockAllocator(cache.num_blocks, cache.block_size, cache.prefix_caching)
        return PagedScheduler(
            allocator, limits.max_num_seqs, limits.max_num_batched_tokens, limits.max_model_len
        )
    return DefaultScheduler(cache.num_blocks, limits.max_model_len, limits.max_num_batched_tokens)


def _finish(
    cache: RealizedCache, choice: SchedulerChoice, loaded: LoadedModel, limits: SchedulerLimits
) -> RealizedCache:
    windows = [w for w in loaded.config.layer_windows if w is not None]
    return replace(
        cache,
        scheduler=choice.kind,
        dtype=str(loaded.dtype).removeprefix("torch."),
        max_model_len=limits.max_model_len,
        sliding_window=max(windows, default=0),
        num_windowed_layers=len(windows),
    )
