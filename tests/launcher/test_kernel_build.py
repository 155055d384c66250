"""`up` compiles the workers' CPU kernels while Ray starts (controller/launch/kernels.py): what it
says for a build that worked, one that could not build a kernel, and one that hangs; and the real
build, run as `up` runs it, filling the cache the workers read."""

from __future__ import annotations

import shutil
import sys

import pytest
from intentserve.controller.launch.kernels import KernelBuild

HAS_CC = any(shutil.which(name) for name in ("cc", "gcc", "clang"))


def script(text: str, code: int = 0) -> list[str]:
    return [sys.executable, "-c", f"import sys; print({text!r}); sys.exit({code})"]


def test_a_build_that_worked_says_how_long_and_where():
    said = KernelBuild.start(script("cache /k, -march=native\nfused_ops: /k/f.so")).finish()
    assert said.startswith("ready for this host in ")
    assert said.endswith(" s (cache /k, -march=native)")


def test_a_kernel_that_cannot_be_built_is_said_with_its_reason_and_up_goes_on():
    out = (
        "cache /k, -march=native\n"
        "paged_decode: unavailable: no C compiler found (set CC, or install gcc)\n"
        "fused_ops: unavailable: no C compiler found (set CC, or install gcc)"
    )
    said = KernelBuild.start(script(out, code=1)).finish()
    assert said == (
        "paged_decode and 1 more not built here: no C compiler found (set CC, or install gcc); "
        "each worker reports what it runs without (cache /k, -march=native)"
    )


def test_a_build_that_dies_says_its_last_words():
    said = KernelBuild.start(script("Traceback ...\nImportError: no torch", code=1)).finish()
    assert said == "the build exited 1: ImportError: no torch"


def test_a_build_that_hangs_is_stopped_and_left_to_the_workers():
    build = KernelBuild.start([sys.executable, "-c", "import time; time.sleep(60)"])
    assert build.finish(timeout_s=0.5) == (
        "not ready after 0.5 s, stopped; each worker compiles its own"
    )
    assert build.process.returncode is not None  # not left running


def test_a_build_up_no_longer_wants_is_stopped():
    build = KernelBuild.start([sys.executable, "-c", "import time; time.sleep(60)"])
    build.stop()
    assert build.process.returncode is not None


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine (cc, gcc or clang)")
@pytest.mark.integration
def test_the_real_build_fills_the_cache_the_workers_read(tmp_path, monkeypatch):
    monkeypatch.setenv("INTENTSERVE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("INTENTSERVE_KERNEL_MARCH", raising=False)
    said = KernelBuild.start().finish()
    assert said.startswith("ready for this host") and f"(cache {tmp_path}, -march=native)" in said
    from intentserve.worker.attention import cpu_kernels  # the worker's side: found, not built

    names = sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.glob("*.so"))
    assert names == sorted(cpu_kernels.KERNEL_NAMES)
    assert all(cpu_kernels.cached(name) is not None for name in cpu_kernels.KERNEL_NAMES)
