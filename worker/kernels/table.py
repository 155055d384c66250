"""The one table of the CPU kernels: which library serves which ops, from which source, and the
instructions its fast path needs (which ISA variant has them: variants.py).

A library is one C file (plus the shared headers) compiled into one shared object; its loader in
`__init__.py` declares the entry points. Sources live one folder per concern: `attention/` (paged
decode attention and the KV store), `gemm/` (the projections' matmuls; `amx.h`, the x86 AMX tile
code, beside them), `ops/` (norms, rotary, SiLU, w8a8 quantization, max/argmax; Gemma's norms
and GELU), `layers/` (a decode step's layers in one call, Llama's and Gemma 3's, and the header
they share) and `common/` (the headers every folder includes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    """One library: its name (the cache's and the loader's key), its C source (relative to the
    kernels' folder) and the ops it serves. `isa` is the instructions its fast path is written
    for: a variant without them (variants.py) builds the library, which then refuses its calls,
    naming them. "": generic vectors, as wide as the variant's registers (x86-64-v3: AVX2;
    avx512 and amx: AVX-512, and paged_decode's dot products on AVX512-BF16). The AMX tiles serve
    the bf16 and int8 GEMMs in the amx variant (and native on a CPU with them); elsewhere their
    AVX-512 paths do."""

    name: str
    source: str
    ops: tuple[str, ...]
    isa: str = ""
    includes: tuple[str, ...] = ()  # the other C sources `source` includes (the cache key's too)
    # Beside the variant's flags where its vectors are narrower than the code's 16 lanes (no
    # AVX-512: each vec16 is two AVX2 registers), for a compile that otherwise takes too long.
    narrow_cflags: tuple[str, ...] = ()


KERNELS = (
    Kernel(
        "paged_decode",
        "attention/paged_decode.c",
        ("decode attention", "KV store"),
        # For x86-64-v3, GCC's PRE and its CSE after reload took 42 of its 43 s on the inlined
        # per-head-size copies (-ftime-report); without them 8 s, the same bits out, and decode
        # within +-8% (noise) at head sizes 64, 128 and 256 (an A/B of both builds in one
        # process, three runs, Zen 3).
        narrow_cflags=("-fno-gcse", "-fno-gcse-after-reload"),
    ),
    Kernel(
        "fused_ops",
        "ops/fused_ops.c",
        ("add + RMSNorm", "SiLU * up", "rotary", "w8a8 (de)quantize", "max/argmax"),
    ),
    Kernel(
        "int8_gemm",
        "gemm/int8_gemm.c",
        ("w8a8 matmul",),
        "AVX512-VNNI int8 dot products",
    ),
    Kernel("bf16_gemm", "gemm/bf16_gemm.c", ("bf16 matmul",), "AVX512-BF16 dot products"),
    Kernel("f32_gemm", "gemm/f32_gemm.c", ("float32 matmul",), "AVX-512"),
    Kernel(
        "gemma_ops",
        "ops/gemma_ops.c",
        ("Gemma's (1 + w) norms", "q/k norm + rotary", "GELU * up"),
    ),
    Kernel("decode_layers", "layers/decode_layers.c", ("a decode step's layers",)),
    Kernel("gemma_layers", "layers/gemma_layers.c", ("a Gemma 3 decode step's layers",)),
    Kernel(
        "gguf_gemm",
        "gemm/gguf_kquant.c",
        ("GGUF-block matmul",),
        "AVX2 (with F16C and FMA) int8 dot products",
        ("gemm/gguf_gemm.c",),
    ),
)
KERNEL_NAMES = tuple(kernel.name for kernel in KERNELS)
_BY_NAME = {kernel.name: kernel for kernel in KERNELS}


def kernel(name: str) -> Kernel:
    """The table's row for library `name`."""
    return _BY_NAME[name]
