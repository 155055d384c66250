"""bench/gpu_parts.py's gpu_tests part when its pytest outlives its time: the part fails with
what pytest had printed, the test that hung last (its run itself is the dry run's)."""

from __future__ import annotations

import subprocess

import pytest

from bench import gpu_parts


def test_a_gpu_layer_that_hangs_fails_the_part_showing_where(monkeypatch):
    def hangs(command, **kwargs):
        printed = b"tests/worker/engine/test_triton_paged.py::test_decode[cuda] "
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], output=printed)

    monkeypatch.setattr(subprocess, "run", hangs)
    with pytest.raises(RuntimeError) as failed:
        gpu_parts.gpu_tests("cuda")
    message = str(failed.value)
    assert message.startswith(f"pytest ran past {gpu_parts.GPU_TESTS_TIMEOUT_S} s")
    assert message.endswith("test_triton_paged.py::test_decode[cuda] ")


def test_the_driver_is_nvidia_smis_answer_else_the_kernel_modules_line(tmp_path):
    def smi(answer: str, code: int = 0):
        return lambda *a, **k: subprocess.CompletedProcess(a, code, stdout=answer, stderr="")

    assert gpu_parts.driver_version(run=smi("580.159.04\n")) == "580.159.04"
    proc = tmp_path / "version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"
    )

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    assert gpu_parts.driver_version(run=missing, proc=proc) == "580.159.04"
    assert gpu_parts.driver_version(run=smi("", 9), proc=proc) == "580.159.04"
    gone = gpu_parts.driver_version(run=missing, proc=tmp_path / "absent")
    assert gone.startswith("unknown")


def test_the_cpu_facts_say_the_model_the_cores_and_amx(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Xeon Max\nflags\t\t: fpu avx512f amx_tile amx_bf16\n")
    facts = gpu_parts.cpu_facts(cpuinfo)
    assert facts["cpu"] == "Xeon Max" and facts["amx"] is True and facts["cores"] >= 1
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx512f\n")
    assert gpu_parts.cpu_facts(cpuinfo)["amx"] is False
