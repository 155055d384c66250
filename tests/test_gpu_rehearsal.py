"""make gpu-rehearsal (bench/gpu_rehearsal.py): the lease's check in a venv of only what the lease's
image holds, with the carried wheels installed as the lease installs them. Run whole here (it
needs the package index, as `make test` does), so the check a lease runs has run in the lease's
environment before any lease."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench import gpu_attention
from bench.gpu_rehearsal import (
    LEASE_WITHOUT,
    check_imports,
    gpu_test_files,
    lease_image,
    normalize,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_image_list_reads_names_and_the_versions_a_session_saw():
    image = lease_image()
    assert image["torch"] == "2.11.0" and image["triton"] == "3.6.0"
    assert image["huggingface-hub"] == "1.33.0" and image["pytest"] == ""
    assert not {"ray", "pydantic", "llguidance", "fastapi"} & image.keys()  # carried, or not there
    assert normalize("Typing_Extensions") == "typing-extensions"


def test_the_imports_checked_include_those_inside_the_parts():
    modules = check_imports()
    assert {"bench.gpu_parts", "torch", "triton"} <= modules
    # The parts import these inside their functions (a missing one fails a part, not the import).
    assert any(m.startswith("intentserve.controller.") for m in modules)
    assert "intentserve.worker.engine.builder" in modules
    assert "bench.torch_api" not in modules  # the rehearsal's own, not the lease's


def test_the_gpu_layer_is_every_file_holding_a_gpu_test():
    files = gpu_test_files()
    assert "tests/worker/engine/test_triton_paged.py" in files
    assert "tests/worker/engine/test_cuda_backends.py" in files
    assert all("mark.gpu" in (ROOT / f).read_text() for f in files)
    # A file that only mentions the mark (this one) is not run: the rehearsal would run itself.
    assert "tests/test_gpu_rehearsal.py" not in files


@pytest.mark.integration
def test_the_rehearsal_passes_every_step_in_the_leases_environment(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "gpu-rehearsal", f"REHEARSAL={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    steps = json.loads((tmp_path / "rehearsal.json").read_text())["steps"]
    assert all(s["ok"] for s in steps.values()), steps
    # The image's versions where served here; the carried wheels were the ones imported.
    venv = steps["venv"]
    assert venv["versions"]["triton"] == "3.6.0" and venv["versions"]["torch"].startswith("2.13")
    assert str(tmp_path / "site") in steps["imports"]["intentserve_from"]
    assert steps["requirements"]["absent_by_design"] == LEASE_WITHOUT
    # The dry run's parts all ran from the carried wheels; the gpu layer's CUDA tests skipped
    # with their reasons, the CPU paths passed.
    assert {"gpu_tests", "engine_parity", "served_over_tls"} <= steps["lease_script"][
        "parts"
    ].keys()
    layer = steps["gpu_layer"]
    assert layer["gpu_tests"] > 0 and "failed" not in layer["summary"]
    assert any("needs a CUDA device" in reason for reason in layer["skips"])
    # Every torch name the GPU path uses is in the lease's torch.
    assert steps["torch_api"]["release"] == "2.11.0" and steps["torch_api"]["names"] > 100
    assert "| torch_api | True |" in (tmp_path / "rehearsal.md").read_text()

    # The dry run the lease script made (`make gpu-check DRY_RUN=1` through gpu_lease.sh, with
    # the carried wheels): every part ran on the CPU at small shapes and wrote its report; its
    # figures mean nothing here.
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
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

    # The lease host's parts, dry: the amx tests collected, not run; 1 and 2 routers measured.
    amx = parts["amx_kernels"]
    assert amx["ran"] is False and amx["selected"] > 0
    assert amx["reason"].startswith("dry run: the amx tests collected, not run")
    relay = parts["relay_routers"]
    assert list(relay["routers"]) == ["1", "2"]
    for row in relay["routers"].values():
        assert row["median_tokens_per_s"] > 0 and row["median_router_cpu_ms_per_1k_tokens"] > 0
    assert relay["routers"]["1"]["vs_one_router"] == 1.0
    # The gpu layer: the dry run's test part ran its files and said why each CUDA test skipped.
    tests_part = parts["gpu_tests"]
    assert "failed" not in tests_part["summary"]
    assert any("needs a CUDA device" in reason for reason in tests_part["skips"])
    assert set(tests_part["files"]) <= set(layer["files"]) | set(layer["run_by_the_dry_run"])

    # Triton's kernel and FlexAttention, dry: both against float64, then both timed.
    flex = parts["flex_vs_triton"]
    cases = [[r["batch"], r["context"]] for r in flex["rows"]]
    assert cases == [list(case) for case in gpu_attention.CASES["cpu"]]
    for row in flex["rows"]:
        assert set(row["max_error"]) == {"triton", "flex"}
        assert max(row["max_error"].values()) <= flex["atol"], row
        assert row["triton_ms"] > 0 and row["flex_ms"] > 0 and row["gather_ms"] > 0
        assert row["flex_over_triton"] == pytest.approx(row["flex_ms"] / row["triton_ms"], 1e-3)
    assert flex["auto_first"] == "not measured (dry run)"  # only a CUDA run orders `auto`
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| throughput | True |" in table and "## flex_vs_triton" in table
    assert f"All {len(parts)} parts ok." in table
