"""The GEMM kernels' two paths (AVX512, and AMX tiles where the CPU has them), for fixtures that
run each kernel test on both."""

import pytest


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
