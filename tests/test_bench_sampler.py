"""bench/sampler.py runs both samplers (this tree's and the baseline's from git) on a real engine
and reports each workload's throughput and the ratios its targets are judged by."""

import json
import shutil

import pytest

from bench.sampler import RUNS, main

pytestmark = [
    pytest.mark.integration,
    pytest.mark.model,
    pytest.mark.skipif(shutil.which("git") is None, reason="the baseline sampler is read from git"),
]


def test_a_quick_run_reports_every_workload_and_ratio(tmp_path, capsys):
    out = tmp_path / "sampler.json"
    assert main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["median_tokens_per_s"]) == {name for name, _, _ in RUNS}
    assert all(v > 0 for v in result["median_tokens_per_s"].values())
    assert set(result["ratios"]) == {
        "greedy new/old",
        "sampled new/old",
        "options new / sampled old",
    }
    assert "wrote" in capsys.readouterr().out


def test_bad_sizes_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--rounds", "0"])
    assert "--rounds" in capsys.readouterr().err
