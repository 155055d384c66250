"""The kernels for fixtures: built, or skipped with the reason; the GEMMs' two paths (AVX512, and
AMX tiles where the CPU has them), to run each kernel test on both; and the kernels of a forced
ISA variant, to run a test on each variant this CPU runs whose build has the kernel."""

import contextlib
import shutil

import pytest
from intentserve.worker.kernels import KernelUnavailable, library, variants

VARIANT_NAMES = tuple(variants.VARIANTS)
HAS_CC = any(shutil.which(name) for name in ("cc", "gcc", "clang"))
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler (cc, gcc or clang)")

# The kernel paths (by their `isa()` names) a variant's build leaves out on every CPU: its -march
# lacks their instructions (the #if of bf16_gemm.c, f32_gemm.c, int8_gemm.c and gguf_gemm.c), so
# the library builds and refuses them (table.py). No host runs a test there: each refusal is one
# test instead (test_variant_refusals.py).
NOT_BUILT = {"x86-64-v3": frozenset({"AVX512-BF16", "AVX-512", "AVX512-VNNI"})}


def variants_with(path: str | None) -> tuple[str, ...]:
    """The variants whose build has a kernel's `path` (every variant for None)."""
    return tuple(name for name in VARIANT_NAMES if path not in NOT_BUILT.get(name, ()))


def variant_fixture(path: str | None = None):
    """A module-scoped `kernel_variant` fixture: runs a module's (or a test's) kernel tests once
    per ISA variant whose build has `path` (the kernel's base path, e.g. "AVX512-BF16"), each with
    that variant's kernels (INTENTSERVE_KERNEL_VARIANT); a variant this CPU cannot run skips with
    the reason. A module that needs a path defines `kernel_variant = variant_fixture(path)`."""

    @pytest.fixture(scope="module", params=variants_with(path))
    def kernel_variant(request):
        with forced_variant(request.param):
            yield request.param

    return kernel_variant


def built_or_skip(build, what: str):
    """`build()` (a kernel loader such as f32_gemm_kernel), or a skip naming why not: no C
    compiler, or the kernel unavailable on this CPU (its reason)."""
    if not HAS_CC:
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
