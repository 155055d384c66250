"""bench/gpu_check.py, dry (`make gpu-check DRY_RUN=1`): every part runs on the CPU at small shapes,
so the script a GPU lease runs has run before the lease; its figures mean nothing here. And the
worker process its served_over_tls part starts (bench/lease_worker.py) refusing a bad spec."""

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
    parts = report["parts"]
    assert list(parts) == report["asked"]  # every part started within the default budget
    assert report["asked"][:5] == [
        "gpu_tests",
        "engine_parity",
        "throughput",
        "served_over_tls",
        "flex_vs_triton",
    ]
    assert all(p["ok"] for p in parts.values()), {k: p.get("error") for k, p in parts.items()}
    assert report["rerun"] == {}

    cases = parts["engine_parity"]["cases"]
    assert {c["realized"] for c in cases.values()} == {"triton_paged", "torch_paged"}
    assert all(c["equal_transformers"] and c["equal_cpu_engine"] for c in cases.values())

    served = parts["served_over_tls"]["cases"]
    assert served["torch"]["worker_state"] == "ready"
    assert served["torch"]["realized_backend"] == "torch_paged"
    assert served["torch"]["tokens_over_tls"] == 4
    assert served["flash"]["worker_state"] == "rejected" and "vllm" in served["flash"]["problem"]
    assert served["torch"]["worker_pid"] != served["flash"]["worker_pid"]  # a process each

    rows = parts["throughput"]["rows"]
    assert [r["streams"] for r in rows] == [1, 4]
    # 8-token prompts, 4 tokens each: the timed steps make tokens 2-4 over contexts of 9-11;
    # the dry 1B shape's K/V is 2 layers x 8 heads x 16 x 2 x 2 bytes = 1024 bytes a token.
    assert [r["mean_context_tokens"] for r in rows] == [10, 10]
    assert [r["kv_bytes_per_step"] for r in rows] == [10 * 1024, 4 * 10 * 1024]

    flex = parts["flex_vs_triton"]
    assert all(max(r["max_error"].values()) <= flex["atol"] for r in flex["rows"])
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| throughput | True |" in table and "## flex_vs_triton" in table
    assert f"All {len(parts)} parts ok." in table


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
