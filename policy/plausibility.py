"""A realized report checked against what the worker said it can do and what it was asked:
a report that cannot be true is a rejection of its own, whatever the policy mode.

    KV bytes        within the memory the worker reported free, and within the KV budget
    geometry        kv_cache_bytes == num_blocks x block_size x bytes per token of the model
    backend, dtype  among those the capability lists as available
    weights         a format the capability lists as available, within the worker's memory
    slots           at least one sequence slot (the controller admits that many requests to it)
"""

from __future__ import annotations

from intentserve.policy.budget import KvBudget
from intentserve.policy.capability import Capability
from intentserve.policy.guard import CacheKind, RealizedCache
from intentserve.policy.modes import KvCacheDtype
from intentserve.policy.reasons import Reason, ReasonCode

# Element bytes of the KV dtypes a worker reports (torch's names, as the engine stores them).
ELEMENT_BYTES: dict[str, tuple[KvCacheDtype, int]] = {
    "float32": (KvCacheDtype.FLOAT32, 4),
    "bfloat16": (KvCacheDtype.BFLOAT16, 2),
    "float16": (KvCacheDtype.FLOAT16, 2),
    "float8_e4m3fn": (KvCacheDtype.FP8_E4M3, 1),
    "float8_e5m2": (KvCacheDtype.FP8_E5M2, 1),
}


def _implausible(message: str) -> Reason:
    return Reason(ReasonCode.REALIZED_REPORT_IMPLAUSIBLE, message)


def check_plausible(
    realized: RealizedCache, capability: Capability, budget: KvBudget
) -> Reason | None:
    """Why the report cannot be true; None when it is consistent."""
    if realized.max_num_seqs < 1:
        return _implausible(
            f"it reports no sequence slots (max_num_seqs {realized.max_num_seqs}): it could "
            "serve no request"
        )
    return _weights_implausible(realized, capability) or _cache_implausible(
        realized, capability, budget
    )


def _weights_implausible(realized: RealizedCache, capability: Capability) -> Reason | None:
    status = capability.weight_format(realized.weight_format)
    if not status.available:
        return _implausible(
            f"it reports {realized.weight_format.value} weights, which its capability lists as "
            f"unavailable ({status.reason})"
        )
    total = capability.total_memory_bytes
    if total and realized.weight_bytes > total:
        return _implausible(
            f"{realized.weight_bytes} weight bytes reported, but the worker has {total} bytes"
        )
    return None


def _cache_implausible(
    realized: RealizedCache, capability: Capability, budget: KvBudget
) -> Reason | None:
    kv = realized.kv_cache_bytes
    if realized.kind is CacheKind.NONE:
        return None if kv == 0 else _implausible(f"no KV cache, but {kv} KV bytes reported")
    backend = capability.backend(realized.backend)
    if not backend.available:
        return _implausible(
            f"it reports the {realized.backend.value} backend, which its capability lists as "
            f"unavailable ({backend.reason})"
        )
    dtype = ELEMENT_BYTES.get(realized.kv_cache_dtype)
    if dtype is None or dtype[0] not in backend.kv_cache_dtypes:
        return _implausible(
            f"its {realized.backend.value} cache cannot store kv dtype "
            f"{realized.kv_cache_dtype!r} (it stores "
            f"{', '.join(sorted(d.value for d in backend.kv_cache_dtypes)) or 'nothing'})"
        )
    free = capability.free_memory_bytes
    if kv > free:
        return _implausible(f"{kv} KV bytes reported, but only {free} bytes of memory are free")
    if budget.num_bytes is not None and kv > budget.num_bytes:
        return _implausible(f"{kv} KV bytes reported, over the budget of {budget.num_bytes}")
    if budget.fraction is not None and kv > budget.fraction * free:
        return _implausible(
            f"{kv} KV bytes reported, over the budget of {budget.fraction:.0%} of {free} free"
        )
    model = capability.model
    per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * dtype[1]
    expected = realized.num_blocks * realized.block_size * per_token
    if per_token == 0 or kv != expected:
        return _implausible(
            f"{kv} KV bytes reported for {realized.num_blocks} blocks x {realized.block_size} "
            f"tokens x {per_token} bytes per token of the model ({expected} bytes)"
        )
    return None
