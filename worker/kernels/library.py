"""One kernel library: its C source compiled on the host with the system's C compiler into a
shared library, cached by source, flags and CPU, and loaded once a process (`load`).

A library that cannot be built is not an error: the caller keeps its pure-torch path and says why
(`KernelUnavailable.reason`). `INTENTSERVE_CPU_KERNELS=0` turns them off; `INTENTSERVE_KERNEL_CACHE`
moves the cache (default `~/.cache/intentserve/kernels`).

Each library is built per ISA variant (`variants.py`); a process loads the variant `chosen()` for
it. A portable variant's library is keyed by the variant instead of this CPU: built ahead (every
variant, by an image), it is found on any host that runs the variant, without a compiler, which
the key does not include.

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
from functools import cache
from pathlib import Path

from intentserve.worker.kernels import variants
from intentserve.worker.kernels.table import kernel

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
# The headers every folder shares, found by name (their text is in the cache key, their place not).
COMMON_DIR = SOURCE_DIR / "common"
CFLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")  # plus the variant's
COMPILE_TIMEOUT_S = 120


class KernelUnavailable(RuntimeError):
    """The kernel could not be built or loaded; `reason` says why in one sentence."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _cpu_signature() -> str:
    """What -march=native depends on: the machine and its CPU flags."""
    return f"{platform.machine()}|{variants.cpu_flags_line()}"


def chosen() -> variants.Choice:
    """The variant this process loads (variants.choose), a refusal as KernelUnavailable: a kernel
    user keeps its torch path and says why; the engine refuses to start (builder.py)."""
    try:
        return variants.choose()
    except variants.KernelVariantError as error:
        raise KernelUnavailable(str(error)) from error


def _cache_dir() -> Path:
    root = os.environ.get("INTENTSERVE_KERNEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "intentserve" / "kernels"


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise KernelUnavailable("no C compiler found (set CC, or install gcc)")


def _plan(name: str, variant: variants.Variant) -> tuple[Path, tuple[str, ...], Path]:
    """Library `name`'s C source, the flags it is compiled with for `variant` and where that
    library is cached."""
    source = SOURCE_DIR / kernel(name).source
    narrow = () if "avx512f" in variant.needs else kernel(name).narrow_cflags
    flags = (*CFLAGS, *variant.cflags, *narrow)
    # The shared headers, and the C sources the library includes, are part of what gets compiled,
    # so they are part of the cache key; the CPU is, only where the code is built for this one
    # (native).
    included = [SOURCE_DIR / path for path in kernel(name).includes]
    headers = sorted(SOURCE_DIR.rglob("*.h"))
    text = b"\0".join(path.read_bytes() for path in [source, *included, *headers])
    runs_on = variant.name if variant.portable else _cpu_signature()
    key = hashlib.sha256(b"\0".join([text, " ".join(flags).encode(), runs_on.encode()]))
    return source, flags, _cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"


def cached(name: str) -> Path | None:
    """Library `name` as this process would load it from the cache, or None if not built."""
    target = _plan(name, chosen().variant)[2]
    return target if target.exists() else None


def build(name: str, variant: variants.Variant | None = None) -> Path:
    """The path of library `name` compiled for `variant` (default: the one this process loads),
    building it if the cache lacks it. Any variant builds on any host; only loading needs one
    this CPU runs."""
    variant = variant or chosen().variant
    source, flags, target = _plan(name, variant)
    if target.exists():
        return target
    compiler = _compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info(
        "compiling CPU kernel %s (%s) with %s -> %s", source.name, variant.name, compiler, target
    )
    # Build beside the target and rename: concurrent workers never load a half-written file.
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *flags, f"-I{COMMON_DIR}", str(source), "-o", tmp, "-lm"],
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


def load(name: str) -> ctypes.CDLL:
    """Library `name`, built and loaded, or KernelUnavailable with the reason."""
    result = _load_library(name)
    if isinstance(result, KernelUnavailable):
        raise result
    return result


@cache
def _load_library(name: str) -> ctypes.CDLL | KernelUnavailable:
    """Library `name` built and loaded, once a process; a failure is cached too (as its reason)."""
    if os.environ.get("INTENTSERVE_CPU_KERNELS", "1").strip().lower() in ("0", "false", "off"):
        return KernelUnavailable("CPU kernels are turned off (INTENTSERVE_CPU_KERNELS=0)")
    import torch  # noqa: F401  (NOTE: torch's libgomp must be loaded before the kernel's)

    try:
        return ctypes.CDLL(str(build(name)))
    except KernelUnavailable as exc:
        return exc
    except OSError as exc:
        return KernelUnavailable(f"cannot build or load the CPU kernel {name}: {exc}")
