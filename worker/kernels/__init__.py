"""The CPU kernels' ctypes face: each library's entry points, declared, behind one loader (built
and loaded once a process, or KernelUnavailable with the reason; `library.py` builds and caches,
`table.py` says which library serves which op, `variants.py` which ISA variant a process loads).
On a CPU with AMX the bf16 and int8 GEMMs run on its tiles; `INTENTSERVE_AMX=0` keeps them on
AVX512-BF16 and AVX512-VNNI.

Built ahead (an image): `python -m intentserve.worker.kernels --build --all-variants` fills the
cache.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from intentserve.worker.kernels import variants
from intentserve.worker.kernels.library import KernelUnavailable, chosen, load
from intentserve.worker.kernels.table import KERNEL_NAMES, kernel

__all__ = ["KERNEL_NAMES", "KernelUnavailable"]  # and the loaders and their entry points below

# "0" keeps the GEMMs off the AMX tiles on a CPU that has them (AVX512-BF16 and -VNNI paths).
AMX_ENV = "INTENTSERVE_AMX"


@dataclass(frozen=True)
class PagedDecodeKernel:
    """The entry points of paged_decode.c: decode attention by storage dtype, and the KV store."""

    f32: ctypes._CFuncPtr
    bf16: ctypes._CFuncPtr
    kv_store: ctypes._CFuncPtr
    path: Path


@dataclass(frozen=True)
class FusedOps:
    """The entry points of fused_ops.c, by storage dtype."""

    add_rmsnorm_f32: ctypes._CFuncPtr
    add_rmsnorm_bf16: ctypes._CFuncPtr
    silu_mul_f32: ctypes._CFuncPtr
    silu_mul_bf16: ctypes._CFuncPtr
    rotary_f32: ctypes._CFuncPtr
    rotary_bf16: ctypes._CFuncPtr
    quantize_rows_f32: ctypes._CFuncPtr
    quantize_rows_bf16: ctypes._CFuncPtr
    dequantize_rows_f32: ctypes._CFuncPtr
    dequantize_rows_bf16: ctypes._CFuncPtr
    max_argmax_rows_f32: ctypes._CFuncPtr
    path: Path


@dataclass(frozen=True)
class GemmaOps:
    """The entry points of gemma_ops.c (Gemma 3's norms, q/k norm + rotary, GELU * up), by
    storage dtype."""

    gemma_norm_f32: ctypes._CFuncPtr
    gemma_norm_bf16: ctypes._CFuncPtr
    qk_norm_rotary_f32: ctypes._CFuncPtr
    qk_norm_rotary_bf16: ctypes._CFuncPtr
    gelu_mul_f32: ctypes._CFuncPtr
    gelu_mul_bf16: ctypes._CFuncPtr
    path: Path


@dataclass(frozen=True)
class Int8Gemm:
    """The entry points of int8_gemm.c (AVX512-VNNI, or AMX-INT8 tiles where the CPU has them),
    by output dtype: the GEMM on quantized activations, and the whole w8a8 matmul (quantize, then
    the GEMM) in one call; and the tiles' switch, as `Bf16Gemm.amx`."""

    f32: ctypes._CFuncPtr
    bf16: ctypes._CFuncPtr
    linear_f32: ctypes._CFuncPtr
    linear_bf16: ctypes._CFuncPtr
    amx: ctypes._CFuncPtr
    path: Path

    def isa(self) -> str:
        """What the calls run on now, in words."""
        return "AMX" if self.amx(-1) else "AVX512-VNNI"


@dataclass(frozen=True)
class Bf16Gemm:
    """The entry point of bf16_gemm.c (AVX512-BF16, or AMX tiles where the CPU has them), and
    the switch between the two (`amx(-1)` asks, `amx(0)` / `amx(1)` turn the tiles off / on
    where possible; each returns whether the calls now run on the tiles)."""

    gemm: ctypes._CFuncPtr
    amx: ctypes._CFuncPtr
    path: Path

    def isa(self) -> str:
        """What the calls run on now, in words."""
        return "AMX" if self.amx(-1) else "AVX512-BF16"


@dataclass(frozen=True)
class F32Gemm:
    """The entry point of f32_gemm.c (AVX-512 fused multiply-adds), the same signature as
    `Bf16Gemm.gemm` with a float32 x and a float32 out."""

    gemm: ctypes._CFuncPtr
    path: Path

    def isa(self) -> str:
        """What the calls run on, in words."""
        return "AVX-512"


@dataclass(frozen=True)
class GgufGemm:
    """The entry points of gguf_kquant.c (gguf_gemm.c, and the K-quants' interleaved kernels):
    activations quantized per 32 values, the matmul on a GGUF tensor's own blocks (in the file's
    order or interleaved 8 channels at a time), the blocks dequantized, the interleaving; and the
    switch between its VNNI and AVX2 dot products (`vnni(-1)` asks, `vnni(0)` / `vnni(1)` sets
    where possible)."""

    quantize_rows: ctypes._CFuncPtr
    gemm: ctypes._CFuncPtr
    dequantize: ctypes._CFuncPtr
    interleave: ctypes._CFuncPtr
    row_bytes: ctypes._CFuncPtr
    vnni: ctypes._CFuncPtr
    path: Path

    def isa(self) -> str:
        """What the calls run on now, in words."""
        return "AVX512-VNNI" if self.vnni(-1) else "AVX2"


def _declare(fn: ctypes._CFuncPtr, argtypes: list, restype=None) -> ctypes._CFuncPtr:
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_DECODE_ARGS = [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _I64, _I64, _I64, _I64, _I64,
                _F32, _PTR]  # fmt: skip
_RMSNORM_ARGS = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32]
_SILU_MUL_ARGS = [_PTR, _PTR, _I64, _I64]
_ROTARY_ARGS = [_PTR, _I64, _PTR, _PTR, _I64, _I64, _I64]
_QUANTIZE_ARGS = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64]
_INT8_GEMM_ARGS = [_PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR]
_BF16_GEMM_ARGS = [_PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64]
_W8A8_LINEAR_ARGS = [_PTR, _PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR]
_DEQUANTIZE_ARGS = [_PTR, _PTR, _PTR, _PTR, _I64, _I64]


def paged_decode_kernel() -> PagedDecodeKernel:
    """The compiled paged decode kernel, or KernelUnavailable; built and loaded once a process."""
    lib = load("paged_decode")
    return PagedDecodeKernel(
        _declare(lib.paged_decode_f32, _DECODE_ARGS, ctypes.c_int),
        _declare(lib.paged_decode_bf16, _DECODE_ARGS, ctypes.c_int),
        _declare(lib.kv_store, [_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64]),
        Path(lib._name),
    )


def fused_ops() -> FusedOps:
    """The compiled fused elementwise ops, or KernelUnavailable; built and loaded once."""
    lib = load("fused_ops")
    return FusedOps(
        _declare(lib.add_rmsnorm_f32, _RMSNORM_ARGS),
        _declare(lib.add_rmsnorm_bf16, _RMSNORM_ARGS),
        _declare(lib.silu_mul_f32, _SILU_MUL_ARGS),
        _declare(lib.silu_mul_bf16, _SILU_MUL_ARGS),
        _declare(lib.rotary_f32, _ROTARY_ARGS),
        _declare(lib.rotary_bf16, _ROTARY_ARGS),
        _declare(lib.quantize_rows_f32, _QUANTIZE_ARGS),
        _declare(lib.quantize_rows_bf16, _QUANTIZE_ARGS),
        _declare(lib.dequantize_rows_f32, _DEQUANTIZE_ARGS),
        _declare(lib.dequantize_rows_bf16, _DEQUANTIZE_ARGS),
        _declare(lib.max_argmax_rows_f32, [_PTR, _I64, _I64, _PTR, _PTR]),
        Path(lib._name),
    )


def gemma_ops() -> GemmaOps:
    """The compiled Gemma 3 elementwise ops, or KernelUnavailable; built and loaded once."""
    lib = load("gemma_ops")
    qk_args = [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _F32, _F32]
    return GemmaOps(
        _declare(lib.gemma_norm_f32, _RMSNORM_ARGS),
        _declare(lib.gemma_norm_bf16, _RMSNORM_ARGS),
        _declare(lib.qk_norm_rotary_f32, qk_args),
        _declare(lib.qk_norm_rotary_bf16, qk_args),
        _declare(lib.gelu_mul_f32, _SILU_MUL_ARGS),
        _declare(lib.gelu_mul_bf16, _SILU_MUL_ARGS),
        Path(lib._name),
    )


def decode_layers_kernel(gemma: bool = False) -> ctypes._CFuncPtr:
    """The entry point of decode_layers.c (every Llama-family layer of a decode step in one
    call) or, `gemma`, of gemma_layers.c (Gemma 3's), or KernelUnavailable; the caller passes
    the other kernels to it as function pointers."""
    args = [_PTR, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR]
    if gemma:
        return _declare(load("gemma_layers").decode_gemma_layers, args, ctypes.c_int)
    return _declare(load("decode_layers").decode_layers, args, ctypes.c_int)


def _missing_isa(name: str) -> KernelUnavailable:
    """Library `name` built without the instructions of its fast path (the table's), in words."""
    what = kernel(name).isa
    choice = chosen()
    if not choice.variant.portable:
        return KernelUnavailable(f"this CPU has no {what}")
    return KernelUnavailable(
        f"the kernels loaded are built for the {choice.variant.name} variant ({choice.how}), "
        f"which has no {what}"
    )


def loaded_variant() -> str:
    """The ISA variant this process's CPU kernels are built for ("" where none loads: turned off,
    or no compiler). KernelVariantError (a ValueError naming INTENTSERVE_KERNEL_VARIANT) for a
    forced variant this CPU cannot run or an unknown one: an explicit choice is honoured or
    refused, never replaced."""
    variant = variants.choose().variant
    try:
        load("fused_ops")
    except KernelUnavailable:
        return ""
    return variant.name


def bf16_gemm_kernel() -> Bf16Gemm:
    """The compiled bf16 matmul, or KernelUnavailable (also where this CPU has no AVX512-BF16)."""
    lib = load("bf16_gemm")
    if not _declare(lib.bf16_gemm_available, [], ctypes.c_int)():
        raise _missing_isa("bf16_gemm")
    gemm = _declare(lib.bf16_gemm, _BF16_GEMM_ARGS, ctypes.c_int)
    return Bf16Gemm(gemm, _amx_switch(lib.bf16_gemm_amx), Path(lib._name))


def f32_gemm_kernel() -> F32Gemm:
    """The compiled float32 matmul, or KernelUnavailable (also where this CPU has no AVX-512)."""
    lib = load("f32_gemm")
    if not _declare(lib.f32_gemm_available, [], ctypes.c_int)():
        raise _missing_isa("f32_gemm")
    return F32Gemm(_declare(lib.f32_gemm, _BF16_GEMM_ARGS, ctypes.c_int), Path(lib._name))


def int8_gemm_kernel() -> Int8Gemm:
    """The compiled int8 matmul, or KernelUnavailable (also where this CPU has no VNNI)."""
    lib = load("int8_gemm")
    if not _declare(lib.int8_gemm_vnni, [], ctypes.c_int)():
        raise _missing_isa("int8_gemm")
    return Int8Gemm(
        _declare(lib.int8_gemm_f32, _INT8_GEMM_ARGS, ctypes.c_int),
        _declare(lib.int8_gemm_bf16, _INT8_GEMM_ARGS, ctypes.c_int),
        _declare(lib.w8a8_linear_f32, _W8A8_LINEAR_ARGS, ctypes.c_int),
        _declare(lib.w8a8_linear_bf16, _W8A8_LINEAR_ARGS, ctypes.c_int),
        _amx_switch(lib.int8_gemm_amx),
        Path(lib._name),
    )


def gguf_gemm_kernel() -> GgufGemm:
    """The compiled GGUF-block matmul, or KernelUnavailable (also where this CPU has no AVX2,
    F16C and FMA)."""
    lib = load("gguf_gemm")
    if not _declare(lib.gguf_gemm_isa, [], ctypes.c_int)():
        raise _missing_isa("gguf_gemm")
    return GgufGemm(
        _declare(lib.gguf_quantize_rows, [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR]),
        _declare(
            lib.gguf_native_gemm,
            [_I64, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _I64, _I64],
            ctypes.c_int,
        ),  # fmt: skip
        _declare(
            lib.gguf_native_dequantize,
            [_I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _I64],
            ctypes.c_int,
        ),
        _declare(lib.gguf_native_interleave, [_I64, _PTR, _I64, _I64, _PTR], ctypes.c_int),
        _declare(lib.gguf_row_bytes, [_I64, _I64], _I64),
        _declare(lib.gguf_gemm_vnni, [_I64], ctypes.c_int),
        Path(lib._name),
    )


def _amx_switch(fn: ctypes._CFuncPtr) -> ctypes._CFuncPtr:
    """A kernel library's AMX switch, declared, turned off where INTENTSERVE_AMX says so."""
    amx = _declare(fn, [_I64], ctypes.c_int)
    if os.environ.get(AMX_ENV, "1").strip().lower() in ("0", "false", "off"):
        amx(0)
    return amx
