"""bench/weights.py --quick on two formats: each loaded, judged against dequantized and timed
on SmolLM2, and the run's results say so. In the dtype `auto` gives this host (emulated bf16 on
an AVX2 host made this a 250 s test of the bench's plumbing)."""

import pytest
import torch
from intentserve.worker.model.dtype import resolve_dtype

from bench.weights import main
from tests.bench_script import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_a_quick_run_judges_and_times_each_format_asked_for(tmp_path):
    dtype = str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
    args = ("--quick", "--formats", "dequantized,w8a8", "--dtype", dtype)
    result, stdout = run_bench("weights", *args, cache=tmp_path, timeout=600)
    rows = {row["format"]: row for row in result["weight_formats"]}
    assert list(rows) == ["dequantized", "w8a8"]
    assert result["workload"]["concurrency"] == [1, 4]
    assert set(result["roofline"]) == {dtype, "int8"}
    for row in rows.values():
        assert row["perplexity"] > 1 and row["passage_tokens"] == 128
        assert set(row["tokens_per_s"]) == {"1", "4"} and min(row["tokens_per_s"].values()) > 0
    agreement = rows["w8a8"]["agreement"]
    assert 0 <= agreement["identical_overall"] <= 1 and "agreement" not in rows["dequantized"]
    assert rows["w8a8"]["weight_bytes"] < rows["dequantized"]["weight_bytes"]
    assert "wrote" in stdout


def test_formats_must_start_with_the_reference(capsys):
    with pytest.raises(SystemExit):
        main(["--formats", "w8a8,dequantized"])
    assert "--formats: dequantized first" in capsys.readouterr().err
