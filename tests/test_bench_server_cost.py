"""bench/server_cost.py, one round: each server mode in its own process, every message counted."""

import math

import pytest

from tests.bench_script import run_bench

pytestmark = pytest.mark.integration


def test_one_round_measures_both_servers_and_writes_outside_the_tree(tmp_path):
    result, stdout = run_bench("server_cost", "--rounds", "1", cache=tmp_path)
    assert {mode: len(runs) for mode, runs in result["runs"].items()} == {"sync": 1, "async": 1}
    for mode in ("sync", "async"):
        assert result["median"][mode] == result["runs"][mode][0]
        assert math.isfinite(result["median"][mode]) and result["median"][mode] > 0
    assert "round 1  sync:" in stdout and "median: sync" in stdout
