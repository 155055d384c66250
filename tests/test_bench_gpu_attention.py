"""bench/gpu_attention.py, the GPU check's flex_vs_triton part, dry: the Triton paged kernel
(under the interpreter) and FlexAttention (eager on the CPU) over scattered blocks, both checked
against float64 attention before they are timed; a wrong output or a flex that cannot run is
reported as such. Its timings mean nothing here. The whole part's dry run is checked in the GPU
rehearsal (tests/test_gpu_rehearsal.py), whose lease step makes it."""

from __future__ import annotations

import pytest
import torch

from bench import gpu_attention
from bench.gpu_attention import ATOL, flex_vs_triton, make_case, max_errors, triton_decode
from bench.gpu_parts import PartFailed

ONE_CASE = {"cpu": [(3, 40)]}
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def test_the_blocks_are_scattered_and_the_contexts_differ():
    case = make_case(4, 80, "cpu")
    assert sorted(case.tables.flatten().tolist()) == list(range(4 * 5))
    assert case.tables.flatten().tolist() != list(range(4 * 5))
    assert len(set(case.context_lens)) == 4 and max(case.context_lens) == 80


def test_an_output_off_from_float64_is_caught():
    case = make_case(2, 40, "cpu")
    right = triton_decode(case)
    wrong = right.clone()
    wrong[1, 3] += 0.1  # one head of a sequence the check reads
    errors = max_errors(case, {"triton": right, "wrong": wrong})
    assert errors["triton"] <= ATOL < errors["wrong"]


def test_a_wrong_flex_fails_the_part_naming_the_case(monkeypatch):
    monkeypatch.setattr(gpu_attention, "CASES", ONE_CASE)
    monkeypatch.setattr(
        gpu_attention, "flex_decode", lambda case, device: lambda: torch.zeros_like(case.q)
    )
    with pytest.raises(PartFailed) as failed:
        flex_vs_triton("cpu")
    assert str(failed.value).startswith("flex at batch 3, context 40: off by")
    assert failed.value.found["rows"][0]["max_error"]["triton"] <= ATOL


def test_a_flex_that_cannot_run_is_recorded_with_its_reason_and_not_tried_again(monkeypatch):
    tried = []

    def unavailable(case, device):
        tried.append(case)
        raise RuntimeError("flex_attention is not built here")

    monkeypatch.setattr(gpu_attention, "CASES", {"cpu": [(1, 32), (2, 16)]})
    monkeypatch.setattr(gpu_attention, "flex_decode", unavailable)
    found = flex_vs_triton("cpu")
    assert len(tried) == 1
    assert found["flex"] == "did not run: RuntimeError: flex_attention is not built here"
    assert all("flex_ms" not in row and row["triton_ms"] > 0 for row in found["rows"])
