"""bench/structured.py runs a JSON schema on every request against the same requests free on a
real engine, and reports both throughputs, their ratio and the compile times."""

import json

import pytest

from bench.structured import RUNS, main

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_a_quick_run_reports_both_workloads_the_ratio_and_the_compiles(tmp_path, capsys):
    out = tmp_path / "structured.json"
    assert main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["median_tokens_per_s"]) == set(RUNS)
    assert all(v > 0 for v in result["median_tokens_per_s"].values())
    assert result["ratio_schema_over_free"] > 0
    assert set(result["compile_s"]) == {"vocabulary_and_first_schema", "schema", "schema_cached"}
    assert "wrote" in capsys.readouterr().out


def test_bad_sizes_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--max-tokens", "0"])
    assert "--max-tokens" in capsys.readouterr().err
