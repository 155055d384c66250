"""The KV-cache memory budget as an operator writes it: bytes (`268435456`, `256Mi`, `1Gi`) or a
share of free device memory (`10%`). One parser serves the manifest, the CLI and the SDK."""

from __future__ import annotations

import re

from intentserve.policy.errors import IntentError

KV_MEMORY_FORMS = "bytes (268435456, 256Mi, 1Gi) or a share of free device memory (10%)"
_QUANTITY = re.compile(r"(\d+)\s*(Ki|Mi|Gi|Ti|K|M|G|T)?")
_UNITS = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_kv_memory(value: int | str | None) -> tuple[int | None, float | None]:
    """`kv_cache_memory` -> (kv_cache_bytes, kv_cache_fraction); at most one is set.

    IntentError naming `kv_cache_memory` when the value is none of the allowed forms."""
    if value is None:
        return None, None
    text = str(value).strip()
    if not isinstance(value, bool) and text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            percent = -1.0
        if 0.0 < percent <= 100.0:
            return None, percent / 100.0
    match = _QUANTITY.fullmatch(text)
    if not isinstance(value, bool | float) and match and int(match.group(1)) > 0:
        return int(match.group(1)) * _UNITS[match.group(2)], None
    raise IntentError("kv_cache_memory", f"invalid value {value!r}; allowed: {KV_MEMORY_FORMS}")
