"""The KV-cache memory budget: what one worker's KV cache may take, in every mode (the contiguous
cache takes its slots from it too). One parser reads it as an operator writes it, bytes
(`268435456`, `256Mi`, `1Gi`) or a share of free device memory (`10%`), for the manifest, the
CLI and the SDK."""

from __future__ import annotations

import re
from dataclasses import dataclass

from intentserve.policy.errors import IntentError

KV_MEMORY_FORMS = "bytes (268435456, 256Mi, 1Gi) or a share of free device memory (10%)"
_QUANTITY = re.compile(r"(\d+)\s*(Ki|Mi|Gi|Ti|K|M|G|T)?")
_UNITS = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@dataclass(frozen=True)
class KvBudget:
    """The memory one worker's KV cache may take, whatever the mode: `num_bytes`, or a `fraction`
    of the device's free memory; neither means the device's default share."""

    num_bytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if self.num_bytes is not None and self.fraction is not None:
            raise IntentError("kv_cache_memory", "give either bytes or a fraction, not both")
        if self.num_bytes is not None and (
            isinstance(self.num_bytes, bool)
            or not isinstance(self.num_bytes, int)
            or self.num_bytes <= 0
        ):
            raise IntentError(
                "kv_cache_memory", f"bytes must be a positive integer, got {self.num_bytes!r}"
            )
        if self.fraction is not None and not 0.0 < self.fraction <= 1.0:
            raise IntentError(
                "kv_cache_memory", f"a fraction must be in (0, 1], got {self.fraction!r}"
            )

    def describe(self) -> str:
        if self.num_bytes is not None:
            return f"{self.num_bytes} bytes"
        if self.fraction is not None:
            return f"{self.fraction:.0%} of free memory"
        return "the device's default share of free memory"


def overcommitted(budget: KvBudget, num_sharing: int, pool: str) -> str | None:
    """Why `num_sharing` workers, each with `budget`, cannot share the free memory of one `pool`
    (a node, a GPU), or None when they can: shares (`60%`) must add up to 100% at most. A size in
    bytes is checked by each worker against the memory it finds."""
    if budget.fraction is None or num_sharing * budget.fraction <= 1.0 + 1e-9:
        return None
    return (
        f"{num_sharing} replicas share one {pool}'s free memory: {num_sharing} x "
        f"{budget.fraction:.0%} is {num_sharing * budget.fraction:.0%} (at most 100%); give each "
        f"at most {100 // num_sharing}%, or a size in bytes"
    )


def parse_kv_memory(value: object) -> KvBudget:
    """`kv_cache_memory` as written -> the budget; IntentError naming `kv_cache_memory` when the
    value is none of the allowed forms."""
    if value is None:
        return KvBudget()
    text = str(value).strip()
    if not isinstance(value, bool) and text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            percent = -1.0
        if 0.0 < percent <= 100.0:
            return KvBudget(fraction=percent / 100.0)
    match = _QUANTITY.fullmatch(text)
    if not isinstance(value, bool | float) and match and int(match.group(1)) > 0:
        return KvBudget(num_bytes=int(match.group(1)) * _UNITS[match.group(2)])
    raise IntentError("kv_cache_memory", f"invalid value {value!r}; allowed: {KV_MEMORY_FORMS}")
