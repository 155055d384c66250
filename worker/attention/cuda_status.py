"""What a CUDA-only attention backend reports: the device, then its import, then the GPU's compute
capability, the first that fails being the reason (a capability fact, never a crash)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from intentserve.policy import BackendKind, BackendStatus, KvCacheDtype

# bf16 products and the fp8 conversions need Ampere or newer (vllm-flash-attn asks the same).
MIN_COMPUTE_CAPABILITY = (8, 0)


def cuda_backend_status(
    kind: BackendKind,
    what: str,
    device: torch.device,
    import_problem: Callable[[], str],
    kv_cache_dtypes: frozenset[KvCacheDtype],
) -> BackendStatus:
    """`what` names the backend in the reason; `import_problem()` is "" when it imports."""
    if device.type != "cuda":
        return BackendStatus(
            kind, False, f"{what} needs a CUDA device; this worker is {device.type}"
        )
    why = import_problem()
    if why:
        return BackendStatus(kind, False, why)
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_COMPUTE_CAPABILITY:
        return BackendStatus(
            kind, False, f"{what} needs compute capability >= 8.0, the GPU has {capability}"
        )
    return BackendStatus(kind, True, "", kv_cache_dtypes)
