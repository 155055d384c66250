"""CPU kernels compiled on the host at first use: C sources built with the system's C compiler
into a shared library (cached by source and CPU), called through ctypes.

A kernel that cannot be built is not an error: the caller keeps its pure-torch path and says why
(`KernelUnavailable.reason`). `INTENTSERVE_CPU_KERNELS=0` turns them off; `INTENTSERVE_KERNEL_CACHE`
moves the cache (default `~/.cache/intentserve/kernels`). On a CPU with AMX the bf16 and int8
GEMMs run on its tiles; `INTENTSERVE_AMX=0` keeps them on AVX512-BF16 and AVX512-VNNI.

Built ahead (an image): `python -m intentserve.worker.attention.cpu_kernels --build` fills the
cache. `-march=native` fits only the machine that compiled, so an image sets
`INTENTSERVE_KERNEL_MARCH` to a portable target (`x86-64-v3`): the library is then keyed by that
target instead of this CPU, found on any host that has the target's features (checked before
loading), and found without a compiler, which the key does not include.

NOTE: the library is built with -fopenmp and so links `libgomp.so.1`; torch's CPU wheels ship
their own `libgomp.so.1`, which is already loaded by then, so the dynamic loader binds the kernel
to torch's OpenMP runtime: one thread pool, sized by `torch.set_num_threads`.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
KERNEL_NAMES = (
    "paged_decode",
    "fused_ops",
    "int8_gemm",
    "bf16_gemm",
    "f32_gemm",
    "decode_layers",
    "gguf_gemm",
)
CFLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")  # plus -march=<_march()>
COMPILE_TIMEOUT_S = 120
MARCH_ENV = "INTENTSERVE_KERNEL_MARCH"
# "0" keeps the GEMMs off the AMX tiles on a CPU that has them (AVX512-BF16 and -VNNI paths).
AMX_ENV = "INTENTSERVE_AMX"
NATIVE = "native"
# The x86-64 micro-architecture levels a portable build may target, with the /proc/cpuinfo flags
# each needs (`abm` is LZCNT). Other targets (e.g. arm's) are trusted as the operator names them.
_X86_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_X86_V3 = (*_X86_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_X86_LEVEL_FLAGS = {
    "x86-64": (),
    "x86-64-v2": _X86_V2,
    "x86-64-v3": _X86_V3,
    "x86-64-v4": (*_X86_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}


class KernelUnavailable(RuntimeError):
    """The kernel could not be built or loaded; `reason` says why in one sentence."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _cpu_flags_line() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def _cpu_signature() -> str:
    """What -march=native depends on: the machine and its CPU flags."""
    return f"{platform.machine()}|{_cpu_flags_line()}"


def _march() -> str:
    return os.environ.get(MARCH_ENV, "").strip() or NATIVE


def _check_host_runs(march: str) -> None:
    """KernelUnavailable when this CPU lacks a feature of the x86-64 level `march` (a library
    built for it would die of an illegal instruction here)."""
    needed = _X86_LEVEL_FLAGS.get(march)
    if needed is None:
        return
    have = set(_cpu_flags_line().partition(":")[2].split())
    missing = [flag for flag in needed if flag not in have]
    if platform.machine() not in ("x86_64", "AMD64") or missing:
        lacks = ", ".join(missing) or "an x86-64 CPU"
        raise KernelUnavailable(f"this CPU cannot run {MARCH_ENV}={march} code (lacks {lacks})")


def _cache_dir() -> Path:
    root = os.environ.get("INTENTSERVE_KERNEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "intentserve" / "kernels"


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise KernelUnavailable("no C compiler found (set CC, or install gcc)")


def _plan(name: str) -> tuple[Path, tuple[str, ...], Path]:
    """`<name>.c`, the flags it is compiled with and where its library is cached for this host
    (or for the portable target that INTENTSERVE_KERNEL_MARCH names)."""
    source = SOURCE_DIR / f"{name}.c"
    march = _march()
    if march != NATIVE:
        _check_host_runs(march)
    flags = (*CFLAGS, f"-march={march}")
    # The shared headers are part of what gets compiled, so they are part of the cache key; the
    # CPU is, only where the code is built for this one (native).
    text = b"\0".join(path.read_bytes() for path in [source, *sorted(SOURCE_DIR.glob("*.h"))])
    runs_on = _cpu_signature() if march == NATIVE else march
    key = hashlib.sha256(b"\0".join([text, " ".join(flags).encode(), runs_on.encode()]))
    return source, flags, _cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"


def cached(name: str) -> Path | None:
    """The library of `<name>.c` this host would load from the cache, or None if not built."""
    target = _plan(name)[2]
    return target if target.exists() else None


def build(name: str) -> Path:
    """The path of `<name>.c` compiled for this host, building it if the cache lacks it."""
    source, flags, target = _plan(name)
    if target.exists():
        return target
    compiler = _compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("compiling CPU kernel %s with %s -> %s", source.name, compiler, target)
    # Build beside the target and rename: concurrent workers never load a half-written file.
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *flags, str(source), "-o", tmp, "-lm"],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise KernelUnavailable(f"{compiler} failed on {source.name}: {last}")
        os.replace(tmp, target)
    except subprocess.TimeoutExpired as exc:
        raise KernelUnavailable(f"{compiler} took over {COMPILE_TIMEOUT_S} s") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


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
    """The entry points of gguf_gemm.c: activations quantized per 32 values, the matmul on a GGUF
    tensor's own blocks, the blocks dequantized; and the switch between its VNNI and AVX2 dot
    products (`vnni(-1)` asks, `vnni(0)` / `vnni(1)` sets where possible)."""

    quantize_rows: ctypes._CFuncPtr
    gemm: ctypes._CFuncPtr
    dequantize: ctypes._CFuncPtr
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
    lib = _load("paged_decode")
    return PagedDecodeKernel(
        _declare(lib.paged_decode_f32, _DECODE_ARGS, ctypes.c_int),
        _declare(lib.paged_decode_bf16, _DECODE_ARGS, ctypes.c_int),
        _declare(lib.kv_store, [_PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64]),
        Path(lib._name),
    )


def fused_ops() -> FusedOps:
    """The compiled fused elementwise ops, or KernelUnavailable; built and loaded once."""
    lib = _load("fused_ops")
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


def decode_layers_kernel() -> ctypes._CFuncPtr:
    """decode_layers.c's entry point (every layer of a decode step in one call), or
    KernelUnavailable; the caller passes the other kernels to it as function pointers."""
    lib = _load("decode_layers")
    args = [_PTR, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR]
    return _declare(lib.decode_layers, args, ctypes.c_int)


def _missing_isa(what: str) -> KernelUnavailable:
    march = _march()
    if march == NATIVE:
        return KernelUnavailable(f"this CPU has no {what}")
    return KernelUnavailable(
        f"the kernels are built for -march={march} (INTENTSERVE_KERNEL_MARCH), which has no {what}"
    )


def bf16_gemm_kernel() -> Bf16Gemm:
    """The compiled bf16 matmul, or KernelUnavailable (also where this CPU has no AVX512-BF16)."""
    lib = _load("bf16_gemm")
    if not _declare(lib.bf16_gemm_available, [], ctypes.c_int)():
        raise _missing_isa("AVX512-BF16 dot products")
    gemm = _declare(lib.bf16_gemm, _BF16_GEMM_ARGS, ctypes.c_int)
    return Bf16Gemm(gemm, _amx_switch(lib.bf16_gemm_amx), Path(lib._name))


def f32_gemm_kernel() -> F32Gemm:
    """The compiled float32 matmul, or KernelUnavailable (also where this CPU has no AVX-512)."""
    lib = _load("f32_gemm")
    if not _declare(lib.f32_gemm_available, [], ctypes.c_int)():
        raise _missing_isa("AVX-512")
    return F32Gemm(_declare(lib.f32_gemm, _BF16_GEMM_ARGS, ctypes.c_int), Path(lib._name))


def int8_gemm_kernel() -> Int8Gemm:
    """The compiled int8 matmul, or KernelUnavailable (also where this CPU has no VNNI)."""
    lib = _load("int8_gemm")
    if not _declare(lib.int8_gemm_vnni, [], ctypes.c_int)():
        raise _missing_isa("AVX512-VNNI int8 dot products")
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
    lib = _load("gguf_gemm")
    if not _declare(lib.gguf_gemm_isa, [], ctypes.c_int)():
        raise _missing_isa("AVX2 (with F16C and FMA) int8 dot products")
    return GgufGemm(
        _declare(lib.gguf_quantize_rows, [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR]),
        _declare(
            lib.gguf_gemm,
            [_I64, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _I64],
            ctypes.c_int,
        ),  # fmt: skip
        _declare(lib.gguf_dequantize, [_I64, _PTR, _I64, _PTR, _I64, _PTR, _I64], ctypes.c_int),
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


def _load(name: str) -> ctypes.CDLL:
    result = _load_library(name)
    if isinstance(result, KernelUnavailable):
        raise result
    return result


@cache
def _load_library(name: str) -> ctypes.CDLL | KernelUnavailable:
    """`<name>.c` built and loaded, once a process; a failure is cached too (as its reason)."""
    if os.environ.get("INTENTSERVE_CPU_KERNELS", "1").strip().lower() in ("0", "false", "off"):
        return KernelUnavailable("CPU kernels are turned off (INTENTSERVE_CPU_KERNELS=0)")
    import torch  # noqa: F401  (NOTE: torch's libgomp must be loaded before the kernel's)

    try:
        return ctypes.CDLL(str(build(name)))
    except KernelUnavailable as exc:
        return exc
    except OSError as exc:
        return KernelUnavailable(f"cannot build or load the CPU kernel {name}: {exc}")
