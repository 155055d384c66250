"""The `dtype` setting: which torch dtype the weights and activations use on a device."""

from __future__ import annotations

from pathlib import Path

import torch

ALLOWED_DTYPES = ("auto", "float32", "bfloat16", "float16")
# CPU flags that give bf16 matmuls native speed; without them bf16 is emulated and slower than fp32.
_CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# Likewise for fp16 (oneDNN's packed fp16 linears need one of these too). Without them fp16 is
# converted element by element: measured on an AVX-512 + avx512_bf16 EPYC (2 threads, 64 rows,
# SmolLM2 shapes), F.linear in fp16 ran 1.1-2.2x slower than fp32 and 8-12x slower than bf16.
_CPU_FP16_FLAGS = frozenset({"avx512_fp16", "amx_fp16"})
# oneDNN packs (reorders) a bf16 weight only with one of these sets of flags; elsewhere its reorder
# raises (mkldnn_reorder_linear_weight), while F.linear on the plain bf16 weight still runs.
_ONEDNN_BF16_PACK_FLAGS = (
    frozenset({"avx_ne_convert"}),
    frozenset({"avx512bw", "avx512vl", "avx512dq"}),
)
_NAMED = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` -> bfloat16 where the device computes it natively, else float32.

    `float16` is only taken by request (it never comes from `auto`: fp16's narrow range
    overflows in some checkpoints' activations where bf16 does not), and only where the device
    computes it: ValueError names the field and the reason elsewhere.
    """
    if dtype not in ALLOWED_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not valid (allowed: {', '.join(ALLOWED_DTYPES)})")
    if dtype == "float16" and not device_supports_fp16(device):
        raise ValueError(f"dtype 'float16' is refused on this device: {_fp16_refusal(device)}")
    if dtype != "auto":
        return _NAMED[dtype]
    return torch.bfloat16 if device_supports_bf16(device) else torch.float32


def device_supports_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_flags() & _CPU_BF16_FLAGS)
    return False


def cpu_packs_bf16_for_onednn() -> tuple[bool, str]:
    """(True, "") where oneDNN can pack this CPU's bf16 weights, else (False, why)."""
    if any(needed <= cpu_flags() for needed in _ONEDNN_BF16_PACK_FLAGS):
        return True, ""
    return False, "oneDNN packs bf16 only with avx_ne_convert or avx512bw+avx512vl+avx512dq"


def device_supports_fp16(device: torch.device) -> bool:
    if device.type == "cuda":
        return True  # every CUDA GPU torch supports has fp16 arithmetic
    if device.type == "cpu":
        return bool(cpu_flags() & _CPU_FP16_FLAGS)
    return False


def _fp16_refusal(device: torch.device) -> str:
    if device.type != "cpu":
        return f"float16 is supported on cpu (with native fp16) and cuda, not {device.type}"
    return (
        f"the CPU has none of {sorted(_CPU_FP16_FLAGS)}, so float16 matmuls are emulated and "
        "slower than float32; use float32, or bfloat16 / auto "
        f"({'native here' if device_supports_bf16(device) else 'emulated here too'})"
    )


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
