"""bench/security.py, one round at a few short streams: the same deployment secure and
insecure, each served and measured, their ratio recorded."""

import pytest

from tests.bench_script import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_one_round_serves_both_modes_and_records_the_cost(tmp_path):
    args = ("--rounds", "1", "--repeats", "1", "--streams", "2", "--max-tokens", "8")
    result, stdout = run_bench("security", *args, cache=tmp_path)
    (round_,) = result["rounds"]
    for mode in ("secure", "insecure"):
        assert round_[mode]["tok_s"] > 0 and len(round_[mode]["runs_tok_s"]) == 1
    ratio = round_["secure"]["tok_s"] / round_["insecure"]["tok_s"]
    assert round_["secure_over_insecure"] == pytest.approx(ratio)
    assert result["cost_percent"] == pytest.approx(100 * (1 - ratio))
    assert "security costs" in stdout
