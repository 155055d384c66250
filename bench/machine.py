"""What a bench result ran on: the CPU's model and the instruction sets the compiled kernels
choose by, and its cores. Machines of one kind here are not all alike (AMD without AMX, Xeons
with it), so two results are only comparable when these agree."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The CPU flags (as /proc/cpuinfo spells them) that decide which GEMM and attention paths run.
KERNEL_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def machine_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """{"cpu": model name, "cores": logical CPUs, "isa": the KERNEL_FLAGS this CPU has}."""
    model, flags = "", set()
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
            if model and flags:
                break
    except OSError:  # not Linux: the model from platform, no flags
        pass
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "isa": [flag for flag in KERNEL_FLAGS if flag in flags],
    }


def describe(info: dict) -> str:
    """One line: `Intel(R) Xeon(R) Processor, 2 cores, avx512f avx512_bf16 ... amx_int8`; what a
    result from before these fields were recorded lacks is said, not guessed."""
    parts = [info.get("cpu", "CPU not recorded")]
    if "cores" in info:
        parts.append(f"{info['cores']} cores")
    if "isa" not in info:
        parts.append("instruction sets not recorded")
    else:
        parts.append(" ".join(info["isa"]) or "no AVX-512 or AMX")
    return ", ".join(parts)
