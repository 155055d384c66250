"""The one table of the CPU kernels: which library serves which ops, from which source, and the
instructions its fast path needs.

A library is one C file (plus the shared headers) compiled into one shared object; its loader in
`__init__.py` declares the entry points. Sources live one folder per concern: `attention/` (paged
decode attention and the KV store), `gemm/` (the projections' matmuls; `amx.h`, the x86 AMX tile
code, beside them), `ops/` (norms, rotary, SiLU, w8a8 quantization, max/argmax), `layers/` (a
decode step's layers in one call) and `common/` (the headers every folder includes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    """One library: its name (the cache's and the loader's key), its C source (relative to the
    kernels' folder) and the ops it serves. `needs` is the CPU feature (a /proc/cpuinfo flag) its
    fast path is written for, `isa` that path in words: a build without it loads but refuses its
    calls, by `isa`. "" for both: generic vectors, as wide as the build's registers (those of
    paged_decode take vdpbf16ps dot products where the build has AVX512-BF16; the AMX tiles serve
    the bf16 and int8 GEMMs where the build and the CPU have them)."""

    name: str
    source: str
    ops: tuple[str, ...]
    needs: str = ""
    isa: str = ""


KERNELS = (
    Kernel("paged_decode", "attention/paged_decode.c", ("decode attention", "KV store")),
    Kernel(
        "fused_ops",
        "ops/fused_ops.c",
        ("add + RMSNorm", "SiLU * up", "rotary", "w8a8 (de)quantize", "max/argmax"),
    ),
    Kernel(
        "int8_gemm",
        "gemm/int8_gemm.c",
        ("w8a8 matmul",),
        "avx512_vnni",
        "AVX512-VNNI int8 dot products",
    ),
    Kernel(
        "bf16_gemm", "gemm/bf16_gemm.c", ("bf16 matmul",), "avx512_bf16", "AVX512-BF16 dot products"
    ),
    Kernel("f32_gemm", "gemm/f32_gemm.c", ("float32 matmul",), "avx512f", "AVX-512"),
    Kernel("decode_layers", "layers/decode_layers.c", ("a decode step's layers",)),
    Kernel(
        "gguf_gemm",
        "gemm/gguf_gemm.c",
        ("GGUF-block matmul",),
        "avx2",
        "AVX2 (with F16C and FMA) int8 dot products",
    ),
)
KERNEL_NAMES = tuple(kernel.name for kernel in KERNELS)
_BY_NAME = {kernel.name: kernel for kernel in KERNELS}


def kernel(name: str) -> Kernel:
    """The table's row for library `name`."""
    return _BY_NAME[name]
