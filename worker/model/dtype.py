"""The `dtype` setting: which torch dtype the weights and activations use on a device."""

from __future__ import annotations

from pathlib import Path

import torch

ALLOWED_DTYPES = ("auto", "float32", "bfloat16")
# CPU flags that give bf16 matmuls native speed; without them bf16 is emulated and slower than fp32.
_CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` -> bfloat16 where the device computes it natively, else float32."""
    if dtype not in ALLOWED_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not valid (allowed: {', '.join(ALLOWED_DTYPES)})")
    if dtype == "float32":
        return torch.float32
    if dtype == "bfloat16":
        return torch.bfloat16
    return torch.bfloat16 if device_supports_bf16(device) else torch.float32


def device_supports_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_flags() & _CPU_BF16_FLAGS)
    return False


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The feature flags of the first CPU (Linux); empty where /proc/cpuinfo does not exist."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()
