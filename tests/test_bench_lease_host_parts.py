"""bench/lease_host_parts.py: the AMX part says why not on a CPU without AMX, selects only the amx
variant's parametrizations and counts what pytest reports (on real pytest output); both
parts' dry runs are checked in the GPU rehearsal (tests/test_gpu_rehearsal.py), whose lease step
makes them."""

from __future__ import annotations

import pytest

from bench import lease_host_parts as parts
from bench.lease_host_parts import amx_kernels, amx_node_ids, pytest_summary, skip_reasons

AMX_FLAGS = " ".join(parts.variants.AMX.needs)
NO_AMX_FLAGS = " ".join(parts.variants.AVX512.needs)  # e.g. this host: Zen 4
HOST_HAS_AMX = not parts.amx_lacks(parts.cpu_flags())

# Lines of `pytest --collect-only -q` over the kernel tests (main, 2026-12): the amx variant's,
# the AMX path of another variant, x86-64-v3's, a GGUF run (path first), an unparametrized test.
COLLECTED = """\
tests/worker/model/test_bf16_gemm.py::test_the_kernel_is_the_float32_matmul_rounded_once_to_bfloat16[amx-AVX512-BF16-960-576-1]
tests/worker/model/test_bf16_gemm.py::test_the_kernel_is_the_float32_matmul_rounded_once_to_bfloat16[amx-AMX-960-576-1]
tests/worker/model/test_bf16_gemm.py::test_the_kernel_is_the_float32_matmul_rounded_once_to_bfloat16[avx512-AMX-960-576-1]
tests/worker/model/test_bf16_gemm.py::test_prepack_keeps_onednn_when_turned_off_and_where_the_kernel_is_missing
tests/worker/model/test_cpu_ops.py::test_add_rmsnorm_without_a_residual_normalizes_x[amx]
tests/worker/model/test_cpu_ops.py::test_add_rmsnorm_matches_the_torch_ops_and_updates_the_residual[x86-64-v3-dtype0]
tests/worker/model/test_gguf_gemm.py::test_dequantize_matches_gguf_bit_for_bit[AVX512-VNNI-amx-Q4_0]
tests/worker/model/test_gguf_gemm.py::test_dequantize_matches_gguf_bit_for_bit[AVX2-native-Q4_0]

8 tests collected in 4.25s
"""
AMX_IDS = [
    "tests/worker/model/test_bf16_gemm.py::"
    "test_the_kernel_is_the_float32_matmul_rounded_once_to_bfloat16[amx-AVX512-BF16-960-576-1]",
    "tests/worker/model/test_bf16_gemm.py::"
    "test_the_kernel_is_the_float32_matmul_rounded_once_to_bfloat16[amx-AMX-960-576-1]",
    "tests/worker/model/test_cpu_ops.py::test_add_rmsnorm_without_a_residual_normalizes_x[amx]",
    "tests/worker/model/test_gguf_gemm.py::test_dequantize_matches_gguf_bit_for_bit"
    "[AVX512-VNNI-amx-Q4_0]",
]
# The ends of real pytest runs (9.2): -q -rfEs with every outcome, the same undecorated by -q,
# and the kernel tests' -rs run on this host.
MIXED = """\
=========================== short test summary info ============================
FAILED test_mini.py::test_bad - assert 1 == 2
ERROR test_mini.py::test_err - RuntimeError: fixture broke
SKIPPED [1] test_mini.py:8: no AMX here
1 failed, 2 passed, 1 skipped, 1 xfailed, 1 warning, 1 error in 1.36s
"""
DECORATED = """\
ERROR test_mini.py::test_err - RuntimeError: fixture broke
==== 1 failed, 2 passed, 1 skipped, 1 xfailed, 1 warning, 1 error in 0.59s =====
"""
KERNEL_RUN = """\
SKIPPED [117] tests/worker/model/test_bf16_gemm.py:22: this CPU cannot run the amx kernels \
(lacks amx_tile, amx_bf16, amx_int8)
SKIPPED [96] tests/worker/model/test_bf16_gemm.py:28: this CPU, or the kernel's build for it, \
has no AMX tiles (AMX-BF16)
SKIPPED [12] tests/worker/model/test_cpu_ops.py:12: this CPU cannot run the amx kernels \
(lacks amx_tile, amx_bf16, amx_int8)
1854 passed, 1411 skipped, 5 deselected in 284.03s (0:04:44)
"""


def cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: A CPU\nflags\t\t: fpu {flags}\n\n")
    return path


def test_without_amx_the_part_says_which_flags_are_missing_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(parts, "run_capped", lambda *a, **k: pytest.fail("ran a command"))
    found = amx_kernels("cuda", cpuinfo=cpuinfo(tmp_path, NO_AMX_FLAGS))
    assert found == {
        "ran": False,
        "reason": "this CPU lacks amx_tile, amx_bf16, amx_int8: no amx test can run",
    }
    unreadable = amx_kernels("cuda", cpuinfo=tmp_path / "missing")
    assert unreadable["ran"] is False and "lacks cx16," in unreadable["reason"]


@pytest.mark.skipif(HOST_HAS_AMX, reason="this CPU has AMX: the part runs the tests here")
def test_on_this_host_without_amx_the_lease_part_does_not_run():
    found = amx_kernels("cuda")
    assert found["ran"] is False and "amx_tile" in found["reason"]


def test_only_the_amx_variants_parametrizations_are_selected():
    assert amx_node_ids(COLLECTED) == AMX_IDS


def test_with_amx_the_selected_tests_run_on_the_amx_build_and_their_counts_are_reported(
    tmp_path, monkeypatch
):
    commands = []

    def fake(command, timeout_s, env=None):
        commands.append((command, env))
        if "--collect-only" in command:
            return 0, COLLECTED
        if "--build" in command:
            return 0, "fused_ops: fused_ops.so\n"
        return 0, "SKIPPED [1] tests/worker/model/t.py:9: no gemma3\n3 passed, 1 skipped in 2.0s\n"

    monkeypatch.setattr(parts, "run_capped", fake)
    monkeypatch.setattr(parts, "xdist_workers", lambda cores: 4)
    monkeypatch.setattr(parts.os, "cpu_count", lambda: 16)
    found = amx_kernels("cuda", cpuinfo=cpuinfo(tmp_path, AMX_FLAGS))
    assert {k: found[k] for k in ("ran", "selected", "passed", "failed", "skipped", "errors")} == {
        "ran": True,
        "selected": 4,
        "passed": 3,
        "failed": 0,
        "skipped": 1,
        "errors": 0,
    }
    assert found["skip_reasons"] == {"no gemma3": 1} and found["xdist_workers"] == 4
    (collect, _), (build, build_env), (run, run_env) = commands
    marks = ["-m", "not model and not integration"]
    assert collect[-len(parts.KERNEL_TESTS) - 2 :] == [*marks, *parts.KERNEL_TESTS]
    assert build[-3:] == ["-m", "intentserve.worker.kernels", "--build"]
    assert build_env["INTENTSERVE_KERNEL_VARIANT"] == "amx"
    assert run[-len(AMX_IDS) :] == AMX_IDS and run[run.index("-n") + 1] == "4"
    assert run_env["OMP_NUM_THREADS"] == "4"


def _collects_then(result):
    """A stand-in for run_capped: the amx tests collected, then their run answers `result`."""

    def fake(command, timeout_s, env=None):
        return (0, COLLECTED) if "--collect-only" in command else result

    return fake


def test_a_failing_amx_test_fails_the_part_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(parts, "run_capped", _collects_then((1, MIXED)))
    with pytest.raises(RuntimeError, match="test_mini.py::test_bad - assert 1 == 2"):
        amx_kernels("cuda", cpuinfo=cpuinfo(tmp_path, AMX_FLAGS))


@pytest.mark.parametrize(
    ("output", "counts"),
    [
        (MIXED, dict(failed=1, passed=2, skipped=1, xfailed=1, warnings=1, errors=1)),
        (DECORATED, dict(failed=1, passed=2, skipped=1, xfailed=1, warnings=1, errors=1)),
        (KERNEL_RUN, dict(passed=1854, skipped=1411, deselected=5)),
        ("2 passed, 4 deselected, 1 warning in 0.68s\n", dict(passed=2, deselected=4, warnings=1)),
        ("\n6 deselected in 0.73s\n", dict(deselected=6)),
        ("ImportError while loading conftest\n", {}),
    ],
)
def test_the_summary_line_is_read_by_outcome(output, counts):
    assert pytest_summary(output) == counts


def test_skip_reasons_are_counted_by_reason():
    amx = "this CPU cannot run the amx kernels (lacks amx_tile, amx_bf16, amx_int8)"
    tiles = "this CPU, or the kernel's build for it, has no AMX tiles (AMX-BF16)"
    assert skip_reasons(KERNEL_RUN) == {amx: 129, tiles: 96}


def test_with_nothing_passed_the_part_fails_with_the_skip_reasons(tmp_path, monkeypatch):
    skipped = (
        "SKIPPED [4] tests/worker/model/kernel_paths.py:19: no C compiler\n4 skipped in 1.0s\n"
    )
    monkeypatch.setattr(parts, "run_capped", _collects_then((0, skipped)))
    with pytest.raises(RuntimeError, match="no amx kernel test passed: .*no C compiler"):
        amx_kernels("cuda", cpuinfo=cpuinfo(tmp_path, AMX_FLAGS))


@pytest.mark.parametrize(
    ("cpus", "routers", "others"),
    [
        (list(range(16)), [0, 1, 2, 3], list(range(4, 16))),  # the lease: a core each, 12 spare
        ([0, 1], [0, 1], []),  # this host: everything shares both
        ([0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3], []),  # too few left for the clients and workers
        ([2, 3, 5, 7, 8, 9, 10, 11], [2, 3, 5, 7], [8, 9, 10, 11]),  # an affinity mask
    ],
)
def test_each_router_gets_a_core_of_its_own_where_enough_are_left(cpus, routers, others):
    assert parts.pinning(cpus, 4) == (routers, others)
