"""The capability probe: what this worker can do, measured before anything heavy is loaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from intentserve.policy import (
    BackendKind,
    BackendStatus,
    Capability,
    DeviceKind,
    KvCacheDtype,
    ModelFacts,
)
from intentserve.worker.attention.flash_paged import flash_status

TORCH_KV_DTYPES = frozenset({KvCacheDtype.FLOAT32, KvCacheDtype.BFLOAT16, KvCacheDtype.FLOAT16})


def device_kind(device: torch.device | str) -> DeviceKind:
    kind = torch.device(device).type
    try:
        return DeviceKind(kind)
    except ValueError:
        raise ValueError(f"device: {kind!r} is not supported (allowed: cpu, cuda)") from None


def torch_paged_status() -> BackendStatus:
    if not hasattr(F, "scaled_dot_product_attention"):
        return BackendStatus(
            BackendKind.TORCH_PAGED,
            False,
            f"torch {torch.__version__} has no scaled_dot_product_attention",
        )
    return BackendStatus(BackendKind.TORCH_PAGED, True, "", TORCH_KV_DTYPES)


def probe_backends(device: torch.device) -> tuple[BackendStatus, ...]:
    return (
        flash_status(device),
        torch_paged_status(),
        BackendStatus(BackendKind.CONTIGUOUS, True, "", TORCH_KV_DTYPES),
    )


def memory_bytes(device: torch.device, meminfo: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    """(total, free) bytes of the device's memory."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free
    fields = {}
    for line in meminfo.read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024
    return fields["MemTotal"], fields.get("MemAvailable", fields["MemFree"])


def probe_capability(
    device: torch.device | str,
    model: ModelFacts,
    *,
    device_map: Sequence[str] = (),
    no_kv_cache: bool = False,
    backends: tuple[BackendStatus, ...] | None = None,
) -> Capability:
    """`backends` may be injected (tests describe a CUDA build on a CPU machine that way)."""
    device = torch.device(device)
    total, free = memory_bytes(device)
    return Capability(
        device_kind=device_kind(device),
        model=model,
        backends=probe_backends(device) if backends is None else backends,
        layer_devices=tuple(device_kind(d) for d in device_map),
        total_memory_bytes=total,
        free_memory_bytes=free,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda or "",
        no_kv_cache=no_kv_cache,
    )
