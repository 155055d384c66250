"""The ISA variants the CPU kernels are built for, and the one a process loads.

A portable variant is a set of compiler flags plus the CPU features (/proc/cpuinfo flags) a host
needs to run its code, so one build serves every host that has them (an image builds them all);
`native` is this CPU's every feature, built here for here only (the only choice off x86-64).
`auto`, the default, takes the fastest portable variant this CPU runs (as ggml-cpu's
GGML_CPU_ALL_VARIANTS does), else native. `INTENTSERVE_KERNEL_VARIANT` forces one; a forced
variant this CPU cannot run is refused by name (`KernelVariantError`), never loaded.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

VARIANT_ENV = "INTENTSERVE_KERNEL_VARIANT"
AUTO = "auto"

# The x86-64 micro-architecture levels' /proc/cpuinfo flags (`abm` is LZCNT).
_X86_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_X86_V3 = (*_X86_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_X86_V4 = (*_X86_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")


@dataclass(frozen=True)
class Variant:
    name: str
    cflags: tuple[str, ...]  # beside the kernels' common flags
    needs: tuple[str, ...]  # the CPU flags a host must have to run the code
    summary: str

    @property
    def portable(self) -> bool:
        """Built for the variant's features, not for the compiling CPU: runs on any host that
        has them, so its cache key is the variant's name, not this CPU."""
        return self.name != NATIVE.name


X86_64_V3 = Variant("x86-64-v3", ("-march=x86-64-v3",), _X86_V3, "AVX2 and FMA")
AVX512 = Variant(
    "avx512",
    ("-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni"),
    (*_X86_V4, "avx512_bf16", "avx512_vnni"),
    "AVX-512 with BF16 and VNNI (e.g. Zen 4, Sapphire Rapids without AMX)",
)
AMX = Variant(
    "amx",
    (*AVX512.cflags, "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
    (*AVX512.needs, "amx_tile", "amx_bf16", "amx_int8"),
    "AVX-512 and the AMX tiles (Sapphire Rapids and later)",
)
NATIVE = Variant("native", ("-march=native",), (), "this CPU's own features, built here")
PORTABLE = (AMX, AVX512, X86_64_V3)  # fastest first
VARIANTS = {variant.name: variant for variant in (*PORTABLE, NATIVE)}


class KernelVariantError(ValueError):
    """`INTENTSERVE_KERNEL_VARIANT` names no variant, or one this CPU cannot run."""


@dataclass(frozen=True)
class Choice:
    """The variant a process loads, and whether the operator forced it."""

    variant: Variant
    forced: bool

    @property
    def how(self) -> str:
        return f"forced by {VARIANT_ENV}" if self.forced else "the fastest this CPU runs"

    def describe(self) -> str:
        return f"{self.variant.name} ({self.how})"


def cpu_flags_line() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def missing(variant: Variant) -> list[str]:
    """What this CPU lacks to run `variant`'s code (nothing for native)."""
    if not variant.portable:
        return []
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["an x86-64 CPU"]
    have = set(cpu_flags_line().partition(":")[2].split())
    return [flag for flag in variant.needs if flag not in have]


def choose() -> Choice:
    """The variant this process loads: `INTENTSERVE_KERNEL_VARIANT` when set, else `auto`."""
    name = os.environ.get(VARIANT_ENV, "").strip().lower() or AUTO
    if name == AUTO:
        runnable = [variant for variant in PORTABLE if not missing(variant)]
        return Choice(runnable[0] if runnable else NATIVE, forced=False)
    variant = VARIANTS.get(name)
    if variant is None:
        allowed = ", ".join((AUTO, *VARIANTS))
        raise KernelVariantError(f"{VARIANT_ENV}={name!r}: allowed: {allowed}")
    lacks = missing(variant)
    if lacks:
        raise KernelVariantError(
            f"{VARIANT_ENV}={name}: this CPU cannot run the {name} kernels "
            f"(lacks {', '.join(lacks)})"
        )
    return Choice(variant, forced=True)
