"""bench/gpu_check.py without a GPU: it says how to run it dry, and the worker process its
served_over_tls part starts (bench/lease_worker.py) refuses a bad spec. The dry run itself
(`make gpu-check DRY_RUN=1`: every part on the CPU at small shapes) is checked part by part in
tests/test_gpu_rehearsal.py, on the run the rehearsal makes through the lease's own script:
running it here too repeated the same 155 s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def test_without_cuda_and_without_dry_run_it_says_how_to_run_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "no CUDA device here: run it with --dry-run (make gpu-check DRY_RUN=1)" in done.stderr


def test_the_lease_worker_refuses_a_spec_it_does_not_know_naming_the_keys():
    done = subprocess.run(
        [sys.executable, "bench/lease_worker.py"],
        cwd=ROOT,
        input='{"worker_id": "w", "controller_address": "127.0.0.1:1", "colour": "red"}\n',
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "worker spec: unknown keys ['colour']" in done.stderr
    assert done.stdout == ""
