"""bench/native_gguf.py in its quick mode: the engine's rows (native and dequantized on
SmolLM2's file, 1 and 4 streams) with every ratio the issue asks for, and llama.cpp's beside
them where its venv is installed (skipped, naming the path, where not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.native_gguf import DEFAULT_LLAMA_PYTHON, main

pytestmark = pytest.mark.integration


def check_rows(report: dict) -> None:
    assert [(r["file"], r["streams"]) for r in report["rows"]] == [
        ("smollm2-Q4_1", 1),
        ("smollm2-Q4_1", 4),
    ]
    for row in report["rows"]:
        native, dequantized = row["native"], row["dequantized"]
        assert native["tok_s"] > 0 and dequantized["tok_s"] > 0
        assert native["weight_bytes"] < dequantized["weight_bytes"] / 2.5
        assert "GGUF block kernel" in native["matmuls"]
        assert row["ratios"]["native_over_dequantized"] > 0
        assert "load average" in row["uptime"]


def test_quick_run_without_llama_cpp_says_why(tmp_path):
    missing = str(tmp_path / "no-venv" / "python")
    report = main(["--quick", "--llama-python", missing])
    check_rows(report)
    for row in report["rows"]:
        assert row["llama_cpp"] == {
            "skipped": f"no llama-cpp-python interpreter at {missing} (--llama-python)"
        }
        assert "native_over_llama_cpp" not in row["ratios"]


@pytest.mark.skipif(
    not Path(DEFAULT_LLAMA_PYTHON).exists(),
    reason=f"llama-cpp-python is not installed at {DEFAULT_LLAMA_PYTHON} "
    "(python -m venv /tmp/llamavenv && /tmp/llamavenv/bin/pip install llama-cpp-python)",
)
def test_quick_run_against_llama_cpp():
    report = main(["--quick"])
    check_rows(report)
    for row in report["rows"]:
        assert row["llama_cpp"]["tok_s"] > 0, row["llama_cpp"]
        assert row["ratios"]["native_over_llama_cpp"] > 0
