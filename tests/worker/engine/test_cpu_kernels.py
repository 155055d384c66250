"""The run-time build of CPU kernels: cached by source and CPU, and a clear reason when a kernel
cannot be had (no compiler, a compiler error, turned off), never a crash."""

import shutil

import pytest
from intentserve.worker.attention import cpu_kernels
from intentserve.worker.attention.cpu_kernels import KernelUnavailable, build

HAS_CC = any(shutil.which(name) for name in ("cc", "gcc", "clang"))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INTENTSERVE_KERNEL_CACHE", str(tmp_path))
    cpu_kernels._load_library.cache_clear()
    yield tmp_path
    cpu_kernels._load_library.cache_clear()


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine (cc, gcc or clang)")
@pytest.mark.integration
def test_build_compiles_once_then_reuses_the_cached_library(fresh_cache):
    first = build("paged_decode")
    assert first.parent == fresh_cache and first.suffix == ".so"
    mtime = first.stat().st_mtime_ns
    assert build("paged_decode") == first
    assert first.stat().st_mtime_ns == mtime  # not rebuilt
    assert not list(fresh_cache.glob("*.tmp"))  # no half-written leftovers


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine (cc, gcc or clang)")
@pytest.mark.integration
def test_the_kernel_loads_where_a_compiler_exists(fresh_cache):
    kernel = cpu_kernels.paged_decode_kernel()
    assert kernel.path.exists()


def test_a_missing_compiler_is_a_reason_not_a_crash(fresh_cache, monkeypatch):
    monkeypatch.setattr(cpu_kernels.shutil, "which", lambda name: None)
    with pytest.raises(KernelUnavailable, match="no C compiler found"):
        cpu_kernels.paged_decode_kernel()


@pytest.mark.integration
def test_a_failing_compiler_is_a_reason_naming_it(fresh_cache, monkeypatch, tmp_path):
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken-cc: fatal error: no input' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(KernelUnavailable) as info:
        cpu_kernels.paged_decode_kernel()
    assert "failed on paged_decode.c" in info.value.reason
    assert "fatal error: no input" in info.value.reason
    assert not list(fresh_cache.glob("*.so*"))


def test_turned_off_by_the_environment(fresh_cache, monkeypatch):
    monkeypatch.setenv("INTENTSERVE_CPU_KERNELS", "0")
    with pytest.raises(KernelUnavailable, match="INTENTSERVE_CPU_KERNELS=0"):
        cpu_kernels.paged_decode_kernel()


def test_the_backend_says_why_it_gathers_when_the_kernel_is_off(fresh_cache, monkeypatch, caplog):
    import torch
    from intentserve.policy import CacheKind
    from intentserve.worker.attention.torch_paged import TorchPagedAttention
    from intentserve.worker.cache.kv_pool import KvGeometry, KvPool

    monkeypatch.setenv("INTENTSERVE_CPU_KERNELS", "0")
    pool = KvPool(CacheKind.PAGED, KvGeometry(1, 2, 16, torch.float32), 4, 4, torch.device("cpu"))
    backend = TorchPagedAttention(pool)
    assert backend.kernel is None
    assert (
        backend.decode_impl
        == "torch gather (CPU kernels are turned off (INTENTSERVE_CPU_KERNELS=0))"
    )
    assert "INTENTSERVE_CPU_KERNELS=0" in caplog.text
