"""bench/engine.py --quick, without transformers, in the dtype `auto` gives this host (bfloat16
where the CPU computes it natively, else float32: emulated bf16 on an AVX2 host took 224 s of a
CI run here, for a test of the bench's plumbing, not of its figures): every measurement of the
engine bench runs once on SmolLM2 and lands in its results, which bench/report.py can render."""

import pytest
import torch
from intentserve.worker.model.dtype import resolve_dtype

from bench.report import throughput_table
from tests.bench_script import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_a_quick_run_measures_each_part_and_the_report_renders_it(tmp_path):
    dtype = str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
    args = ("--quick", "--skip-hf", "--dtypes", dtype)
    result, stdout = run_bench("engine", *args, cache=tmp_path)
    assert result["workload"]["max_tokens"] == 8
    assert result["roofline"][dtype]["matmul_flops"] > 0
    assert result["single_stream"][dtype]["ms_per_token"] > 0
    assert [(r["dtype"], r["concurrency"]) for r in result["throughput"]] == [
        (dtype, 1),
        (dtype, 4),
    ]
    for row in result["throughput"]:
        assert row["paged"] > 0 and row["default"] > 0 and "transformers" not in row
    assert 0 <= result["kv_waste"]["paged"]["waste_of_reserved"] < 1
    assert result["admission"]["ratio"] > 1  # paged admits more under one budget
    assert f"| {dtype} | 4 |" in throughput_table(result)
    assert f"[{dtype}] n=4" in stdout
