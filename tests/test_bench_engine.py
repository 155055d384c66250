"""bench/engine.py --quick, bf16 without transformers: every measurement of the engine bench
runs once on SmolLM2 and lands in its results, which bench/report.py can render."""

import pytest

from bench.report import throughput_table
from tests.bench_script import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_a_quick_run_measures_each_part_and_the_report_renders_it(tmp_path):
    args = ("--quick", "--skip-hf", "--dtypes", "bfloat16")
    result, stdout = run_bench("engine", *args, cache=tmp_path)
    assert result["workload"]["max_tokens"] == 8
    assert result["roofline"]["bfloat16"]["matmul_flops"] > 0
    assert result["single_stream"]["bfloat16"]["ms_per_token"] > 0
    assert [(r["dtype"], r["concurrency"]) for r in result["throughput"]] == [
        ("bfloat16", 1),
        ("bfloat16", 4),
    ]
    for row in result["throughput"]:
        assert row["paged"] > 0 and row["default"] > 0 and "transformers" not in row
    assert 0 <= result["kv_waste"]["paged"]["waste_of_reserved"] < 1
    assert result["admission"]["ratio"] > 1  # paged admits more under one budget
    assert "| bfloat16 | 4 |" in throughput_table(result)
    assert "[bfloat16] n=4" in stdout
