"""The capability probe: what this worker can do, measured before anything heavy is loaded."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from intentserve.policy import (
    BackendKind,
    BackendStatus,
    Capability,
    DeviceKind,
    KvCacheDtype,
    ModelFacts,
    WeightFormatStatus,
)
from intentserve.worker.attention.flash_paged import flash_status
from intentserve.worker.attention.triton_paged import triton_status
from intentserve.worker.memory import SYSTEM_FILES, MemoryFiles, device_memory
from intentserve.worker.model.weight_format import weight_format_statuses

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
        triton_status(device),
        torch_paged_status(),
        BackendStatus(BackendKind.CONTIGUOUS, True, "", TORCH_KV_DTYPES),
    )


def probe_capability(
    device: torch.device | str,
    model: ModelFacts,
    *,
    device_map: Sequence[str] = (),
    no_kv_cache: bool = False,
    backends: tuple[BackendStatus, ...] | None = None,
    weight_formats: tuple[WeightFormatStatus, ...] | None = None,
    memory_files: MemoryFiles = SYSTEM_FILES,
) -> Capability:
    """`backends` and `weight_formats` may be injected (tests describe a CUDA build on a CPU
    machine that way), and so may the files memory is read from. `free_memory_bytes` is what
    this worker can use: the device's free memory, or the host's available memory within its
    cgroup's limit."""
    device = torch.device(device)
    memory = device_memory(device, memory_files)
    return Capability(
        device_kind=device_kind(device),
        model=model,
        backends=probe_backends(device) if backends is None else backends,
        layer_devices=tuple(device_kind(d) for d in device_map),
        total_memory_bytes=memory.total_bytes,
        free_memory_bytes=memory.usable_bytes,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda or "",
        no_kv_cache=no_kv_cache,
        weight_formats=weight_format_statuses(device) if weight_formats is None else weight_formats,
    )
