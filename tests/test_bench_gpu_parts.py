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
