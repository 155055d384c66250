"""The kernels for fixtures: built, or skipped with the reason; the GEMMs' two paths (AVX512, and
AMX tiles where the CPU has them), to run each kernel test on both; and the kernels of a forced
ISA variant, to run a test on each variant this CPU runs."""

import contextlib
import shutil

import pytest
from intentserve.worker.kernels import KernelUnavailable, library, variants

VARIANT_NAMES = tuple(variants.VARIANTS)


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


@contextlib.contextmanager
def forced_variant(name: str):
    """The kernels as a process with INTENTSERVE_KERNEL_VARIANT=`name` loads them, from the usual
    cache (each variant's libraries are keyed apart there, so each compiles once, then is found);
    skips, with the reason, a variant this CPU cannot run (its refusal is tested on its own)."""
    lacks = variants.missing(variants.VARIANTS[name])
    if lacks:
        pytest.skip(f"this CPU cannot run the {name} kernels (lacks {', '.join(lacks)})")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(variants.VARIANT_ENV, name)
        library._load_library.cache_clear()
        try:
            yield
        finally:
            library._load_library.cache_clear()
