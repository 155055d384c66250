"""bench/refused_cost.py at its smallest: one run of two short innocent streams beside one client
sending the 1.3M-word chat message, on one deployment; the message is refused naming a field."""

import pytest

from tests.bench_script import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_one_run_beside_one_refused_kind(tmp_path):
    args = ("--runs", "1", "--kinds", "long_message", "--streams", "2", "--clients", "1")
    result, stdout = run_bench("refused_cost", *args, "--max-tokens", "8", cache=tmp_path)
    (run,) = result["runs"]
    kind = run["kinds"]["long_message"]
    assert kind["ratio"] == pytest.approx(kind["beside"]["itl_p99_s"] / kind["alone_itl_p99_s"])
    assert kind["refused"]["num"] > 0 and kind["refused"]["all_refused_naming_a_field"]
    assert result["answered_as_expected"] == {"long_message": True}
    assert result["host"]["cores"] and "host: " in stdout and "ITL p99 beside / alone" in stdout
