"""The run-time build of CPU kernels: cached by source and CPU, and a clear reason when a kernel
cannot be had (no compiler, a compiler error, turned off), never a crash."""

import shutil
import time

import pytest
from intentserve.worker import kernels
from intentserve.worker.kernels import KernelUnavailable, library, variants
from intentserve.worker.kernels.__main__ import main as kernels_main
from intentserve.worker.kernels.library import build
from intentserve.worker.kernels.table import KERNEL_NAMES

from tests.worker.model.kernel_paths import forced_variant

HAS_CC = any(shutil.which(name) for name in ("cc", "gcc", "clang"))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INTENTSERVE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("INTENTSERVE_KERNEL_VARIANT", raising=False)
    library._load_library.cache_clear()
    yield tmp_path
    library._load_library.cache_clear()


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine (cc, gcc or clang)")
@pytest.mark.integration
def test_build_compiles_once_then_reuses_the_cached_library_and_loads_it(fresh_cache):
    first = build("paged_decode")
    assert first.parent == fresh_cache and first.suffix == ".so"
    mtime = first.stat().st_mtime_ns
    assert build("paged_decode") == first
    assert first.stat().st_mtime_ns == mtime  # not rebuilt
    assert not list(fresh_cache.glob("*.tmp"))  # no half-written leftovers
    kernel = kernels.paged_decode_kernel()  # the cached library, loaded
    assert kernel.path == first and first.stat().st_mtime_ns == mtime


def test_paged_decode_drops_the_slow_passes_only_where_vectors_are_narrow():
    """Without AVX-512 each 16-lane vector is two registers and GCC's PRE and CSE after reload
    took 42 of 43 s of paged_decode's compile (x86-64-v3); the AVX-512 variants keep -O3 whole."""
    slow = ("-fno-gcse", "-fno-gcse-after-reload")
    narrow = library._plan("paged_decode", variants.X86_64_V3)
    wide = library._plan("paged_decode", variants.AVX512)
    assert narrow[1][-2:] == slow and not set(slow) & set(wide[1])
    assert narrow[2] != library._plan("fused_ops", variants.X86_64_V3)[2]
    assert not set(slow) & set(library._plan("fused_ops", variants.X86_64_V3)[1])


def test_a_missing_compiler_is_a_reason_not_a_crash(fresh_cache, monkeypatch):
    monkeypatch.setattr(library.shutil, "which", lambda name: None)
    with pytest.raises(KernelUnavailable, match="no C compiler found"):
        kernels.paged_decode_kernel()


@pytest.mark.integration
def test_a_failing_compiler_is_a_reason_naming_it(fresh_cache, monkeypatch, tmp_path):
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken-cc: fatal error: no input' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(KernelUnavailable) as info:
        kernels.paged_decode_kernel()
    assert "failed on paged_decode.c" in info.value.reason
    assert "fatal error: no input" in info.value.reason
    assert not list(fresh_cache.glob("*.so*"))


def test_turned_off_by_the_environment(fresh_cache, monkeypatch):
    monkeypatch.setenv("INTENTSERVE_CPU_KERNELS", "0")
    with pytest.raises(KernelUnavailable, match="INTENTSERVE_CPU_KERNELS=0"):
        kernels.paged_decode_kernel()


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


def test_the_cache_report_says_what_is_not_built(fresh_cache, capsys):
    assert kernels_main([]) == 0
    out = capsys.readouterr().out
    assert f"cache {fresh_cache}, variant {library.chosen().describe()}" in out
    assert "paged_decode: not built (run with --build)" in out


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine (cc, gcc or clang)")
@pytest.mark.integration
def test_build_ahead_compiles_the_missing_kernels_side_by_side(fresh_cache, monkeypatch, capsys):
    """`--jobs 2`: the compilers of two kernels run at once (what `intentserve up` does while Ray
    starts), each into the cache as `build` alone would, then each is loaded."""
    running, most = [], []
    real_run = library.subprocess.run

    def counting_run(*args, **kwargs):
        running.append(1)
        most.append(len(running))
        time.sleep(0.2)  # so that two compilers overlap however fast the first one is
        try:
            return real_run(*args, **kwargs)
        finally:
            running.pop()

    monkeypatch.setattr(library.subprocess, "run", counting_run)
    assert kernels_main(["--build", "--jobs", "2"]) == 0
    built = sorted(p.name.rsplit("-", 1)[0] for p in fresh_cache.glob("*.so"))
    assert built == sorted(KERNEL_NAMES)
    assert len(most) == len(KERNEL_NAMES) and max(most) == 2
    out = capsys.readouterr().out
    assert all(f"{name}: {fresh_cache}" in out for name in KERNEL_NAMES)
    assert kernels_main(["--build", "--jobs", "2"]) == 0  # all cached: nothing compiles again
    assert len(most) == len(KERNEL_NAMES)


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_must_be_a_positive_count(jobs, capsys):
    with pytest.raises(SystemExit) as exit_:
        kernels_main(["--build", "--jobs", jobs])
    assert exit_.value.code == 2
    assert "--jobs" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine (cc, gcc or clang)")
@pytest.mark.integration
def test_kernels_built_ahead_load_where_no_compiler_is_installed(monkeypatch, capsys):
    """What an image does: build a portable variant at build time; its workers, which have no
    compiler, find the libraries in the cache."""
    with forced_variant("x86-64-v3"):
        assert kernels_main(["--build"]) == 0
        built = [library.cached(name) for name in KERNEL_NAMES]
        assert (
            all(built)
            and "fused_ops: " + str(library.cached("fused_ops")) in capsys.readouterr().out
        )
        library._load_library.cache_clear()
        monkeypatch.setattr(library.shutil, "which", lambda name: None)
        assert kernels.paged_decode_kernel().path in built
        assert kernels.fused_ops().path in built
        # The GEMMs build for a variant without their instructions, and say so when asked for.
        for kernel, isa in (
            (kernels.bf16_gemm_kernel, "AVX512-BF16"),
            (kernels.int8_gemm_kernel, "AVX512-VNNI"),
        ):
            with pytest.raises(KernelUnavailable, match=f"the x86-64-v3 variant .*no {isa}"):
                kernel()
        assert kernels_main([]) == 0
