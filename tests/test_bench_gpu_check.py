"""bench/gpu_check.py, dry (`make gpu-check DRY_RUN=1`): every part runs on the CPU at small shapes,
so the script a GPU lease runs has run before the lease; its figures mean nothing here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def test_the_dry_run_passes_every_part_and_writes_its_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script sets it
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--dry-run", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = ("gpu_tests", "engine_parity", "served_over_tls", "throughput")
    assert all(report[p]["ok"] for p in parts), report
    cases = report["engine_parity"]["cases"]
    assert {c["realized"] for c in cases.values()} == {"triton_paged", "torch_paged"}
    assert all(c["equal_float32"] for c in cases.values())
    served = report["served_over_tls"]["cases"]
    assert served["torch"]["worker_state"] == "ready"
    assert served["flash"]["worker_state"] == "rejected" and "vllm" in served["flash"]["problem"]
    assert [r["streams"] for r in report["throughput"]["rows"]] == [1, 4]
    assert "| throughput | True |" in (tmp_path / "gpu_check.md").read_text()


def test_without_cuda_and_without_dry_run_it_says_how_to_run_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "no CUDA device here: run it with --dry-run (make gpu-check DRY_RUN=1)" in done.stderr
