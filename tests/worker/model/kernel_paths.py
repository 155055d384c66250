"""The GEMM kernels for fixtures: built, or skipped with the reason; and their two paths (AVX512,
and AMX tiles where the CPU has them), to run each kernel test on both."""

import shutil

import pytest
from intentserve.worker.kernels import KernelUnavailable


def built_or_skip(build, what: str):
    """`build()` (a kernel loader such as f32_gemm_kernel), or a skip naming why not: no C
    compiler, or the kernel unavailable on this CPU (its reason)."""
    if not any(shutil.which(n) for n in ("cc", "gcc", "clang")):
        pytest.skip(f"no C compiler (cc, gcc or clang) to build the {what}")
    try:
        return build()
    except KernelUnavailable as error:
        pytest.skip(f"the {what} is unavailable here: {error.reason}")


def on_path(kernel, path: str, tiles: str):
    """Yields `kernel` (a Bf16Gemm or Int8Gemm) switched to `path` ("AMX" or its AVX512 path's
    name), and switches it back after. Skips, with the reason, where AMX is asked for and this
    CPU or the kernel's build for it has no `tiles` (e.g. "AMX-BF16")."""
    was = kernel.amx(-1)
    if path == "AMX" and not kernel.amx(1):
        pytest.skip(f"this CPU, or the kernel's build for it, has no AMX tiles ({tiles})")
    if path != "AMX":
        kernel.amx(0)
    assert kernel.isa() == path
    yield kernel
    kernel.amx(was)
